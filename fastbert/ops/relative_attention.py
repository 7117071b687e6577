"""Attention with relative position terms: MPNet's bucketed bias and DeBERTa's disentangled c2p/p2c.

Both take packed (tokens, heads, head_dim) q, k, v with flash-attention's varlen layout
(cu_seqlens, max_seqlen) and `positions` (tokens,): the coordinate of each token that relative
distances are measured in (0..len-1 per sequence on packed input; the padded column on a padded
batch, which is what transformers measures, so a mask with holes gives its distances too).

    MPNet   scores[i, j] = q_i.k_j * scale + table[bucket(p_j - p_i), head]
    DeBERTa scores[i, j] = (q_i.k_j + q_i.pos_key[c(i, j)] + k_j.pos_query[c'(j, i)]) / sqrt(d * factor)
            c(i, j) = clamp(r(p_i - p_j) + span, 0, 2 span - 1), c'(j, i) = clamp(-r(p_j - p_i) + span, ...),
            r the identity or DeBERTa's log buckets; pos_key / pos_query are (2 span, heads, head_dim)
            projections of the relative embeddings, gathered per (i, j) as transformers does.

`relative_bias_attention` / `disentangled_attention` run the flash kernel of
fastbert.kernels.relative_attention (CUDA, or backend="triton" under the interpreter), which adds the
terms tile by tile, forward, backward and attention dropout (a seed tensor drawn from torch's generator
for the device, so `torch.manual_seed` makes a call reproducible; the kernel and the torch path draw
different masks); on CPU they run a blocked torch path (query blocks, no (batch, heads, L, L) tensor).
The `*_ref` / `*_padded` functions are the plain references: they repad each sequence to max_seqlen and
materialise the (batch, heads, L, L) scores and bias (plus (batch, heads, L, 2 span) c2p/p2c products),
as transformers' eager attention does. Autograd flows through plain torch ops there.
"""
import math
from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

from fastbert.ops._dispatch import dropout_seed, run_kernel, triton_op
from fastbert.ops.attention import _use_kernel, seqlen_int
from fastbert.ops.varlen import check_cu_seqlens_shape, check_packed_qkv, repad_index, unpad_index


def _check_packed(q, k, v, cu_seqlens, positions) -> None:
    check_packed_qkv(q, k, v)
    check_cu_seqlens_shape(cu_seqlens)
    if positions.shape != q.shape[:1] or positions.is_floating_point():
        raise ValueError(f"positions must be integer (tokens,) = ({q.shape[0]},), got {positions.dtype} "
                         f"shape {tuple(positions.shape)}")


def _compute(t: torch.Tensor) -> torch.dtype:
    """Scores are computed in fp32 (fp64 stays fp64)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _softmax_attend(scores, vh, key_mask, dropout_p: float, drop_keep=None):
    """softmax over real keys (rows without one are zeros), dropout, @ v. scores (b, h, L, L); drop_keep
    (b, h, L, L) bool fixes the dropout mask (tests replay a kernel's mask), else F.dropout draws one."""
    keep = key_mask[:, None, None, :]
    any_key = keep.any(-1, keepdim=True)
    scores = scores.masked_fill(~keep, float("-inf")).masked_fill(~any_key, 0.0)
    probs = torch.softmax(scores, dim=-1) * any_key
    if drop_keep is not None:
        dropped = probs * drop_keep / (1.0 - dropout_p)
    else:
        dropped = F.dropout(probs, dropout_p, training=True) if dropout_p > 0 else probs
    return torch.matmul(dropped, vh), probs


def _run_varlen(core, q, k, v, cu_seqlens, max_seqlen, positions, **kwargs):
    """Repad packed inputs per sequence, run the padded core, pack the output back."""
    if q.shape[0] == 0:
        return q * 0 + k * 0 + v * 0
    batch = cu_seqlens.numel() - 1
    src, mask = repad_index(cu_seqlens, max_seqlen)

    def pad(t):
        return t.index_select(0, src).view(batch, max_seqlen, *t.shape[1:])

    out, _ = core(pad(q), pad(k), pad(v), mask, pad(positions), **kwargs)
    out = out.reshape(batch * max_seqlen, *q.shape[1:])
    return out.index_select(0, unpad_index(cu_seqlens, max_seqlen, q.shape[0]))


# ---- MPNet: bucketed relative bias (T5-style buckets, as transformers' MPNet) -------------------------
def mpnet_bucket(relative: torch.Tensor, num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """Bucket of each relative distance (key position - query position), transformers' MPNet formula."""
    n = -relative
    half = num_buckets // 2
    ret = (n < 0).to(torch.long) * half
    n = torch.abs(n)
    max_exact = half // 2
    large = max_exact + (torch.log(n.float() / max_exact) / math.log(max_distance / max_exact)
                         * (half - max_exact)).to(torch.long)
    large = torch.clamp(large, max=half - 1)
    return ret + torch.where(n < max_exact, n, large)


def relative_bias_attention_padded(q, k, v, key_mask, positions, table, *, num_buckets: int = 32,
                                   max_distance: int = 128, scale: Optional[float] = None,
                                   dropout_p: float = 0.0, _drop_keep=None):
    """(batch, L, heads, d) q, k, v; key_mask (batch, L) bool; positions (batch, L); table (buckets, heads)
    -> (out (batch, L, heads, d), probs (batch, heads, L, L)). Materialises the (batch, heads, L, L) bias.
    _drop_keep (batch, heads, L, L) bool: a fixed dropout mask (tests)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    c = _compute(q)
    qh, kh, vh = (t.transpose(1, 2).to(c) for t in (q, k, v))       # (batch, heads, L, d)
    bucket = mpnet_bucket(positions[:, None, :] - positions[:, :, None], num_buckets, max_distance)
    bias = F.embedding(bucket, table).permute(0, 3, 1, 2)           # (batch, heads, L, L)
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * scale + bias.to(qh.dtype)
    out, probs = _softmax_attend(scores, vh, key_mask, dropout_p, _drop_keep)
    return out.transpose(1, 2).to(q.dtype), probs.to(q.dtype)


def relative_bias_attention_ref(q, k, v, cu_seqlens, max_seqlen: int, positions, table, *, num_buckets: int = 32,
                                max_distance: int = 128, scale: Optional[float] = None, dropout_p: float = 0.0,
                                _drop_keep=None):
    """The plain oracle of relative_bias_attention: repads and materialises (batch, heads, L, L)."""
    return _run_varlen(relative_bias_attention_padded, q, k, v, cu_seqlens, max_seqlen, positions, table=table,
                       num_buckets=num_buckets, max_distance=max_distance, scale=scale, dropout_p=dropout_p,
                       _drop_keep=_drop_keep)


# ---- DeBERTa: disentangled attention ------------------------------------------------------------------
def deberta_log_bucket(relative: torch.Tensor, bucket_size: int, max_position: int) -> torch.Tensor:
    """DeBERTa's log-bucketed relative position (transformers' make_log_bucket_position), as long."""
    sign = torch.sign(relative)
    mid = bucket_size // 2
    abs_pos = torch.where((relative < mid) & (relative > -mid),
                          torch.tensor(mid - 1, device=relative.device).type_as(relative), torch.abs(relative))
    log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid,
                                                                           device=relative.device))
                         * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, relative.type_as(log_pos), log_pos * sign).to(torch.long)


def deberta_relative(positions: torch.Tensor, position_buckets: int, max_relative_positions: int):
    """(batch, L, L) relative position r(p_i - p_j), log-bucketed when both limits are positive."""
    rel = positions[:, :, None] - positions[:, None, :]
    if position_buckets > 0 and max_relative_positions > 0:
        rel = deberta_log_bucket(rel, position_buckets, max_relative_positions)
    return rel


def disentangled_attention_padded(q, k, v, key_mask, positions, pos_key=None, pos_query=None, *, span: int,
                                  position_buckets: int = -1, max_relative_positions: int = -1,
                                  scale_factor: int = 1, dropout_p: float = 0.0, _drop_keep=None):
    """(batch, L, heads, d) q, k, v; key_mask (batch, L) bool; positions (batch, L); pos_key / pos_query
    (2 span, heads, d) or None (no c2p / no p2c term) -> (out (batch, L, heads, d), probs (b, h, L, L)).
    _drop_keep (batch, heads, L, L) bool: a fixed dropout mask (tests)."""
    d, c = q.shape[-1], _compute(q)
    qh, kh, vh = (t.transpose(1, 2).to(c) for t in (q, k, v))       # (batch, heads, L, d)
    b, h, n, _ = qh.shape
    scale = torch.sqrt(torch.tensor(float(d * scale_factor), dtype=c))   # as transformers (fp64 stays fp64)
    scores = torch.matmul(qh, kh.transpose(-1, -2) / scale)          # (batch, heads, L, L)
    rel = deberta_relative(positions, position_buckets, max_relative_positions)    # (batch, L, L)
    if pos_key is not None:                                          # content -> position
        c2p = torch.matmul(qh, pos_key.to(c).permute(1, 2, 0))             # (batch, heads, L, 2 span)
        index = torch.clamp(rel + span, 0, 2 * span - 1)[:, None].expand(b, h, n, n)
        scores = scores + torch.gather(c2p, -1, index) / scale
    if pos_query is not None:                                        # position -> content
        p2c = torch.matmul(kh, pos_query.to(c).permute(1, 2, 0))           # (batch, heads, L (keys), 2 span)
        index = torch.clamp(-rel + span, 0, 2 * span - 1)[:, None].expand(b, h, n, n)
        scores = scores + torch.gather(p2c, -1, index).transpose(-1, -2) / scale
    out, probs = _softmax_attend(scores, vh, key_mask, dropout_p, _drop_keep)
    return out.transpose(1, 2).to(q.dtype), probs.to(q.dtype)


def disentangled_attention_ref(q, k, v, cu_seqlens, max_seqlen: int, positions, pos_key=None, pos_query=None, *,
                               span: int, position_buckets: int = -1, max_relative_positions: int = -1,
                               scale_factor: int = 1, dropout_p: float = 0.0, _drop_keep=None):
    """The plain oracle of disentangled_attention: repads and materialises (batch, heads, L, L)."""
    return _run_varlen(disentangled_attention_padded, q, k, v, cu_seqlens, max_seqlen, positions,
                       pos_key=pos_key, pos_query=pos_query, span=span, position_buckets=position_buckets,
                       max_relative_positions=max_relative_positions, scale_factor=scale_factor,
                       dropout_p=dropout_p, _drop_keep=_drop_keep)


# ---- Distance tables shared by the kernel and the blocked torch path --------------------------------
# Both index by d = clamp(p_i - p_j, -R, R) + R, with R where the relative index stops changing, so the
# clamp is exact for any positions. Models build theirs once and hold it (DistanceCache); this module
# keeps none: an op call without one builds it for that call.
class DistanceTable(NamedTuple):
    """index (2R + 1,): the relative index of each clamped distance d; radius: R."""
    index: torch.Tensor
    radius: int


class DistanceCache:
    """A model's distance table: built on the CPU once, when the model is built (a meta-device build too),
    and copied to the device of a call the first time that device is seen. Only the latest device's copy
    is kept, so moving the model (`.to()`) drops the old one at its next call."""

    def __init__(self, table: DistanceTable):
        self._cpu = self._here = DistanceTable(table.index.cpu(), table.radius)

    def on(self, device: torch.device) -> DistanceTable:
        if self._here.index.device != device:
            self._here = DistanceTable(self._cpu.index.to(device), self._cpu.radius)
        return self._here


def mpnet_distances(num_buckets: int = 32, max_distance: int = 128, device=None) -> DistanceTable:
    """index (2R + 1,) long bucket of each clamped distance: the bias of pair (i, j) is table[index[d]]."""
    radius = max(int(max_distance), 1)                      # buckets saturate at |p_j - p_i| >= max_distance
    d = torch.arange(-radius, radius + 1, device="cpu")     # built on the CPU, also in a meta-device context
    return DistanceTable(mpnet_bucket(-d, num_buckets, max_distance).to(device or "cpu"), radius)


def _saturation_guess(span: int, position_buckets: int, max_relative_positions: int) -> int:
    """A distance past which DeBERTa's clamped relative index no longer changes (closed form)."""
    if not (position_buckets > 0 and max_relative_positions > 0):
        return span + 1
    mid = position_buckets // 2
    if mid < 2 or max_relative_positions - 1 <= mid:
        return 4 * max(span, max_relative_positions) + 2
    # r(a) = ceil(log(a / mid) / log((maxpos - 1) / mid) * (mid - 1)) + mid reaches span - 1 here
    power = max(span - 1 - mid, 0) / (mid - 1)
    return int(mid * ((max_relative_positions - 1) / mid) ** power * 1.05) + max(span, mid) + 2


def deberta_lut(span: int, position_buckets: int, max_relative_positions: int, device=None) -> DistanceTable:
    """index (2R + 1,) int32 c2p index clamp(r(d) + span, 0, 2 span - 1) of each clamped distance, R; the
    p2c index of pair (i, j) is the same lut[d] (transformers gathers p2c at -r(p_j - p_i) = r(p_i - p_j)).
    Built on the CPU (also in a meta-device context) and checked eagerly; a model builds it once, so a
    torch.compile trace reads the model's table (no data-dependent branch in the graph)."""
    radius = _saturation_guess(span, position_buckets, max_relative_positions)
    for _ in range(8):
        d = torch.arange(-2 * radius, 2 * radius + 1, device="cpu")
        r = (deberta_log_bucket(d, position_buckets, max_relative_positions)
             if position_buckets > 0 and max_relative_positions > 0 else d)
        wide = torch.clamp(r + span, 0, 2 * span - 1)
        lut = wide[radius:3 * radius + 1]
        # r is monotone in d: equal ends at R and 2R mean it no longer changes (clamped or constant)
        if torch.compiler.is_compiling() or (lut[0] == wide[0] and lut[-1] == wide[-1]):
            break
        radius *= 2
    else:
        raise ValueError(f"DeBERTa relative positions (position_buckets={position_buckets}, max_relative_positions="
                         f"{max_relative_positions}, span={span}) do not saturate within {radius} tokens")
    return DistanceTable(lut.to(torch.int32).to(device or "cpu"), radius)


# ---- Blocked torch path (CPU): scores for one block of query rows at a time ---------------------------
BLOCK_BUDGET = 1 << 23   # elements of one (batch, heads, rows, L) block tensor (32 MiB in fp32)


def _banded_ok(pos, mask, lut, pos_key, pos_query, bias, q, k, v) -> bool:
    """The banded fast path: DeBERTa c2p + p2c, CPU, no autograd, eager (a host check, never traced), and every
    real token at position = its column (packed input with default positions: the distance of (i, j) is i - j)."""
    if (lut is None or pos_key is None or pos_query is None or bias is not None or q.device.type != "cpu"
            or torch.compiler.is_compiling()):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, pos_key, pos_query)):
        return False
    column = torch.arange(pos.shape[1]).expand_as(pos)
    return bool((pos == column).logical_or_(~mask).all())


def _saturation(lut: torch.Tensor, radius: int) -> int:
    """S such that lut[d + R] is lut[0] for every d <= -S and lut[-1] for every d >= S (lut is monotone)."""
    n_lo = int((lut == lut[0]).sum())
    n_hi = int((lut == lut[-1]).sum())
    return max(radius - n_lo + 1, radius - n_hi + 1, 1)


def _banded_terms(qb, pos_key, p2c, lut, radius, band, r0):
    """c2p + p2c of query rows [r0, r0 + m) against all L keys when the distance of (i, j) is i - j. Only the
    band |i - j| < band varies in the relative index; the columns left / right of it read the saturated ends
    lut[-1] / lut[0], so they are a broadcast sum of one c2p column and one p2c row. The band is gathered per
    (batch, head) with one (m, band width) index: contiguous and shared, about twice as fast as an expanded
    (batch, heads, m, L) index. Same additions as the general path, so the same values."""
    batch, heads, m, _ = qb.shape
    L = p2c.shape[-1]
    c2p = torch.matmul(qb, pos_key.permute(1, 2, 0))                   # (batch, heads, m, K)
    # the products' dtype, as on the general path (under CPU autocast: bf16 / fp16, not qb's fp32)
    dtype = c2p.dtype
    p2c = p2c.to(dtype)
    add = torch.empty((batch, heads, m, L), dtype=dtype, device=qb.device)
    c0, c1 = max(r0 - band + 1, 0), min(r0 + m + band - 1, L)
    hi, lo = int(lut[-1]), int(lut[0])
    if c0 > 0:                                                         # i - j >= band: index lut[-1]
        torch.add(c2p[..., hi:hi + 1], p2c[:, :, hi, None, :c0], out=add[..., :c0])
    if c1 < L:                                                         # j - i >= band: index lut[0]
        torch.add(c2p[..., lo:lo + 1], p2c[:, :, lo, None, c1:], out=add[..., c1:])
    if c1 > c0:
        rows = torch.arange(r0, r0 + m, device=qb.device)
        cols = torch.arange(c0, c1, device=qb.device)
        index = lut[torch.clamp(rows[:, None] - cols[None, :], -radius, radius) + radius]   # (m, width)
        tmp = torch.empty(index.shape, dtype=dtype, device=qb.device)
        for b in range(batch):
            for h in range(heads):
                out = add[b, h, :, c0:c1]
                torch.gather(c2p[b, h], -1, index, out=out)
                out.add_(torch.gather(p2c[b, h, :, c0:c1], 0, index, out=tmp))
    return add


def _blocked(q, k, v, cu_seqlens, max_seqlen, positions, *, scale, dropout_p, pos_key=None, pos_query=None,
             lut=None, bias=None, radius=0):
    """Attention with the position terms of `_scores` in the kernel, on the padded layout, in blocks of
    query rows so that no (batch, heads, L, L) tensor exists: each block builds its (batch, heads, rows, L)
    additive term (c2p / p2c gathers, bias, key mask) and runs SDPA on it. Autograd flows through."""
    if q.shape[0] == 0:
        return q * 0 + k * 0 + v * 0
    batch, L = cu_seqlens.numel() - 1, max_seqlen
    src, mask = repad_index(cu_seqlens, L)
    c = _compute(q)

    def pad(t):
        return t.index_select(0, src).view(batch, L, *t.shape[1:])

    qh, kh, vh = (pad(t).to(c).transpose(1, 2) for t in (q, k, v))      # (batch, heads, L, d)
    pos = pad(positions).long()                                          # (batch, L)
    # -inf on padding keys; a sequence without keys (empty) gets 0s: finite rows that are dropped. Skipped
    # when nothing is padded (read on CPU only: no device sync, no data-dependent branch under compile)
    key_add = None
    if q.device.type != "cpu" or torch.compiler.is_compiling() or not bool(mask.all()):
        key_add = torch.zeros(mask.shape, dtype=c, device=q.device).masked_fill(~mask, float("-inf"))
        key_add = key_add.masked_fill(~mask.any(-1, keepdim=True), 0.0)[:, None, None, :]
    # p2c as (batch, heads, 2 span, L): gathered along dim 2, its block comes out (rows, L)-contiguous
    p2c = torch.matmul(pos_query.to(c).permute(1, 0, 2), kh.transpose(-1, -2)) if pos_query is not None else None
    lut = lut.long() if lut is not None else None                          # gather's index dtype, expanded
    band = _saturation(lut, radius) if _banded_ok(pos, mask, lut, pos_key, pos_query, bias, q, k, v) else None
    heads = qh.shape[1]
    # Traced: one block of all L rows. A Python loop over the symbolic L (or a test of its size) would make
    # it a constant, and the compiled model would be compiled again for each new length.
    compiling = torch.compiler.is_compiling()
    rows = L if compiling or batch * heads * L * L <= BLOCK_BUDGET else max(16, BLOCK_BUDGET // (batch * heads * L))
    outs = []
    for r0 in ((0,) if compiling else range(0, L, rows)):
        qb = qh[:, :, r0:r0 + rows]                                      # (batch, heads, m, d)
        m = qb.shape[2]
        d = torch.clamp(pos[:, r0:r0 + rows, None] - pos[:, None, :], -radius, radius) + radius   # (b, m, L)
        add = None
        if band is not None:
            add = _banded_terms(qb, pos_key.to(c), p2c, lut, radius, band, r0)
            add.mul_(scale)
        elif pos_key is not None or pos_query is not None:
            index = lut[d][:, None].expand(batch, heads, m, L)          # relative index of each (i, j)
            if pos_key is not None:
                c2p = torch.matmul(qb, pos_key.to(c).permute(1, 2, 0))  # (batch, heads, m, K)
                add = torch.gather(c2p, -1, index)
            if pos_query is not None:
                p2c_b = torch.gather(p2c, 2, index)                     # [.., i, j] = k_j . pos_query[index]
                add = p2c_b if add is None else add.add_(p2c_b)
            add.mul_(scale)
        if bias is not None:
            b_term = bias.to(c)[d].permute(0, 3, 1, 2)                  # (batch, heads, m, L)
            add = b_term if add is None else add.add_(b_term)
        if key_add is not None:
            add = key_add if add is None else add.add_(key_add)
        outs.append(F.scaled_dot_product_attention(qb, kh, vh, attn_mask=add, dropout_p=dropout_p, scale=scale))
    out = torch.cat(outs, 2).transpose(1, 2).reshape(batch * L, *q.shape[1:])
    return out.index_select(0, unpad_index(cu_seqlens, L, q.shape[0])).to(q.dtype)


# ---- The custom ops (kernel only: CPU tensors run it under the interpreter, interpret=True) ----------
def _need_kernel(q, interpret):
    if not run_kernel(q, interpret):
        raise ValueError("fastbert::relative_attention runs the Triton kernel (CUDA tensors, or CPU tensors with "
                         "interpret=True under TRITON_INTERPRET=1); CPU callers use relative_bias_attention / "
                         "disentangled_attention, whose torch path needs no op")


def _none_if_empty(t):
    return None if t is None or t.numel() == 0 else t


@triton_op("fastbert::relative_attention", mutates_args=())
def _relative_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                 positions: torch.Tensor, c2p: Optional[torch.Tensor], p2c: Optional[torch.Tensor],
                 lut: Optional[torch.Tensor], bias: Optional[torch.Tensor], radius: int, scale: float,
                 dropout_p: float, seed: Optional[torch.Tensor], interpret: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse (batch, heads, max_seqlen) fp32) of packed attention with the relative terms of
    fastbert.kernels.relative_attention (c2p / p2c (tokens, heads, K) fp32, lut int32, bias fp32);
    seed (1,) int64 when dropout_p > 0."""
    _need_kernel(q, interpret)
    from fastbert.kernels import relative_attention as kernel
    return kernel.relative_attention_fwd(q, k, v, cu_seqlens, max_seqlen, positions, c2p=c2p, p2c=p2c, lut=lut,
                                         bias=bias, radius=radius, scale=scale, dropout_p=dropout_p, seed=seed)


@triton_op("fastbert::relative_attention_backward", mutates_args=())
def _relative_backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          out: torch.Tensor, lse: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                          positions: torch.Tensor, c2p: Optional[torch.Tensor], p2c: Optional[torch.Tensor],
                          lut: Optional[torch.Tensor], bias: Optional[torch.Tensor], radius: int, scale: float,
                          dropout_p: float, seed: Optional[torch.Tensor],
                          interpret: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                    torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dc2p, dp2c, dbias); an absent c2p / p2c / bias gets an empty gradient."""
    _need_kernel(q, interpret)
    from fastbert.kernels import relative_attention as kernel
    grads = kernel.relative_attention_bwd(dout, q, k, v, out, lse, cu_seqlens, max_seqlen, positions, c2p=c2p,
                                          p2c=p2c, lut=lut, bias=bias, radius=radius, scale=scale,
                                          dropout_p=dropout_p, seed=seed)
    return tuple(g if g is not None else _empty(q) for g in grads)


def _empty(q):
    return torch.empty(0, dtype=torch.float32, device=q.device)


@_relative_op.register_fake
def _(q, k, v, cu_seqlens, max_seqlen, positions, c2p, p2c, lut, bias, radius, scale, dropout_p, seed, interpret):
    lse = torch.empty((cu_seqlens.shape[0] - 1, q.shape[1], max_seqlen), dtype=torch.float32, device=q.device)
    return torch.empty(q.shape, dtype=q.dtype, device=q.device), lse


@_relative_backward_op.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens, max_seqlen, positions, c2p, p2c, lut, bias, radius, scale, dropout_p,
      seed, interpret):
    like = (torch.empty_like(t) if t is not None else _empty(q)
            for t in (c2p, p2c, bias))
    return (*(torch.empty(q.shape, dtype=q.dtype, device=q.device) for _ in range(3)), *like)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens, max_seqlen, positions, c2p, p2c, lut, bias, radius, scale, dropout_p, seed, interpret = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(q, k, v, output[0], output[1], cu_seqlens, positions, c2p, p2c, lut, bias, seed)
    ctx.args = (max_seqlen, radius, scale, dropout_p, interpret)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, cu_seqlens, positions, c2p, p2c, lut, bias, seed = ctx.saved_tensors
    max_seqlen, radius, scale, dropout_p, interpret = ctx.args
    dq, dk, dv, dc2p, dp2c, dbias = torch.ops.fastbert.relative_attention_backward(
        dout.contiguous(), q, k, v, out, lse, cu_seqlens, max_seqlen, positions, c2p, p2c, lut, bias, radius,
        scale, dropout_p, seed, interpret)   # the forward's seed: the same dropout mask
    return (dq, dk, dv, None, None, None, _none_if_empty(dc2p), _none_if_empty(dp2c), None,
            _none_if_empty(dbias), None, None, None, None, None)


_relative_op.register_autograd(_backward, setup_context=_setup_context)


# ---- Public entry points --------------------------------------------------------------------------------
def _validate(q, k, v, cu_seqlens, max_seqlen, positions, dropout_p):
    _check_packed(q, k, v, cu_seqlens, positions)
    seqlen_int(max_seqlen)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")


def _held(distances: Optional[DistanceTable], q) -> Optional[DistanceTable]:
    """A caller's (model's) DistanceTable, checked against q; None when the call builds its own."""
    if distances is None:
        return None
    index, radius = distances
    if index.device != q.device or index.shape != (2 * radius + 1,) or index.is_floating_point():
        raise ValueError(f"distances must be an integer (2 radius + 1,) = ({2 * radius + 1},) index on {q.device}, "
                         f"got {index.dtype} shape {tuple(index.shape)} on {index.device}")
    return distances


def relative_bias_attention(q, k, v, cu_seqlens, max_seqlen: int, positions, table, *, num_buckets: int = 32,
                            max_distance: int = 128, scale: Optional[float] = None, dropout_p: float = 0.0,
                            backend: str = "auto", distances: Optional[DistanceTable] = None):
    """MPNet attention on packed tokens, bias table[bucket(p_j - p_i), head] added per (i, j).

    Kernel on CUDA (or backend="triton" under the interpreter), else the blocked torch path; dropout_p > 0
    drops attention probabilities (nn.Dropout on the probabilities, as transformers' MPNet). Gradients
    reach the table. distances: mpnet_distances(num_buckets, max_distance) on q's device, held by the
    caller (a model builds it once); None builds it for this call."""
    _validate(q, k, v, cu_seqlens, max_seqlen, positions, dropout_p)
    if table.dim() != 2 or table.shape[1] != q.shape[1] or table.shape[0] < num_buckets:
        raise ValueError(f"table must be (buckets >= {num_buckets}, heads={q.shape[1]}), got {tuple(table.shape)}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    index, radius = _held(distances, q) or mpnet_distances(num_buckets, max_distance, q.device)
    bias = F.embedding(index, table)                                     # (2R + 1, heads)
    if _use_kernel(backend, q, k, v):
        return torch.ops.fastbert.relative_attention(
            q, k, v, cu_seqlens, seqlen_int(max_seqlen), positions.to(torch.int32), None, None, None,
            bias.float().contiguous(), radius, scale, float(dropout_p), dropout_seed(dropout_p, q.device),
            not q.is_cuda)[0]
    return _blocked(q, k, v, cu_seqlens, int(max_seqlen), positions, scale=scale, dropout_p=dropout_p, bias=bias,
                    radius=radius)


def disentangled_attention(q, k, v, cu_seqlens, max_seqlen: int, positions, pos_key=None, pos_query=None, *,
                           span: int, position_buckets: int = -1, max_relative_positions: int = -1,
                           scale_factor: int = 1, dropout_p: float = 0.0, backend: str = "auto",
                           distances: Optional[DistanceTable] = None):
    """DeBERTa(-v2) attention on packed tokens: c2p / p2c gathered per (i, j) from `positions`.

    Kernel on CUDA (or backend="triton" under the interpreter): c2p = q . pos_key^T and p2c = k . pos_query^T
    ((tokens, heads, 2 span) fp32, torch GEMMs) are gathered tile by tile; else the blocked torch path.
    dropout_p > 0 drops attention probabilities after the softmax (transformers' XSoftmax + dropout: kept
    ones scaled by 1/(1-p)). distances: deberta_lut(span, position_buckets, max_relative_positions) on q's
    device, held by the caller (a model builds it once); None builds it for this call."""
    _validate(q, k, v, cu_seqlens, max_seqlen, positions, dropout_p)
    for name, t in (("pos_key", pos_key), ("pos_query", pos_query)):
        if t is not None and tuple(t.shape) != (2 * span, *q.shape[1:]):
            raise ValueError(f"{name} must be (2 span, heads, head_dim) = {(2 * span, *q.shape[1:])}, "
                             f"got {tuple(t.shape)}")
    scale = 1.0 / math.sqrt(q.shape[-1] * scale_factor)
    lut, radius = _held(distances, q) or deberta_lut(span, position_buckets, max_relative_positions, q.device)
    if _use_kernel(backend, q, k, v):
        def product(x, pos):                                             # (tokens, heads, 2 span) fp32
            return torch.matmul(x.transpose(0, 1).float(), pos.float().permute(1, 2, 0)).transpose(0, 1)
        c2p = product(q, pos_key) if pos_key is not None else None
        p2c = product(k, pos_query) if pos_query is not None else None
        return torch.ops.fastbert.relative_attention(
            q, k, v, cu_seqlens, seqlen_int(max_seqlen), positions.to(torch.int32), c2p, p2c, lut, None, radius,
            scale, float(dropout_p), dropout_seed(dropout_p, q.device), not q.is_cuda)[0]
    return _blocked(q, k, v, cu_seqlens, int(max_seqlen), positions, scale=scale, dropout_p=dropout_p,
                    pos_key=pos_key, pos_query=pos_query, lut=lut, radius=radius)
