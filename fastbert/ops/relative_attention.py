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

These are torch references only: they repad each sequence to max_seqlen and materialise the
(batch, heads, L, L) scores and bias (plus (batch, heads, L, 2 span) c2p/p2c products), so memory
grows with L^2 as in transformers' eager attention. No Triton kernel holds these terms yet (the
DESIGN goal is to compute them tile by tile inside the flash kernel); backend="triton" raises.
Autograd flows through plain torch ops (into q, k, v, the bias table and the projections).
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from fastbert.ops._dispatch import BACKENDS


def _check_backend(backend: str, op: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "triton":
        raise NotImplementedError(f"{op} has no Triton kernel yet; use backend='auto' or 'torch' "
                                  "(the torch reference, on any device)")


def _check_packed(q, k, v, cu_seqlens, positions) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D (tokens, heads, head_dim), got shape {tuple(t.shape)}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D int32 of length batch + 1 >= 2, got {cu_seqlens.dtype} "
                         f"shape {tuple(cu_seqlens.shape)}")
    if positions.shape != q.shape[:1] or positions.is_floating_point():
        raise ValueError(f"positions must be integer (tokens,) = ({q.shape[0]},), got {positions.dtype} "
                         f"shape {tuple(positions.shape)}")


def repad_varlen(cu_seqlens: torch.Tensor, max_seqlen: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(src (batch * max_seqlen,) token index to gather, mask (batch, max_seqlen) True at real tokens)."""
    starts, lengths = cu_seqlens[:-1].long(), (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    pos = torch.arange(max_seqlen, device=cu_seqlens.device)
    mask = pos[None, :] < lengths[:, None]
    return torch.where(mask, starts[:, None] + pos[None, :], 0).flatten(), mask


def _compute(t: torch.Tensor) -> torch.dtype:
    """Scores are computed in fp32 (fp64 stays fp64)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _softmax_attend(scores, vh, key_mask, dropout_p: float):
    """softmax over real keys (rows without one are zeros), dropout, @ v. scores (b, h, L, L)."""
    keep = key_mask[:, None, None, :]
    any_key = keep.any(-1, keepdim=True)
    scores = scores.masked_fill(~keep, float("-inf")).masked_fill(~any_key, 0.0)
    probs = torch.softmax(scores, dim=-1) * any_key
    dropped = F.dropout(probs, dropout_p, training=True) if dropout_p > 0 else probs
    return torch.matmul(dropped, vh), probs


def _run_varlen(core, q, k, v, cu_seqlens, max_seqlen, positions, **kwargs):
    """Repad packed inputs per sequence, run the padded core, pack the output back."""
    if q.shape[0] == 0:
        return q * 0 + k * 0 + v * 0
    batch = cu_seqlens.numel() - 1
    src, mask = repad_varlen(cu_seqlens, max_seqlen)

    def pad(t):
        return t.index_select(0, src).view(batch, max_seqlen, *t.shape[1:])

    out, _ = core(pad(q), pad(k), pad(v), mask, pad(positions), **kwargs)
    out = out.reshape(batch * max_seqlen, *q.shape[1:])
    real = torch.nonzero_static(mask.flatten(), size=q.shape[0]).squeeze(1)   # size known: no device sync
    return out.index_select(0, real)


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
                                   dropout_p: float = 0.0):
    """(batch, L, heads, d) q, k, v; key_mask (batch, L) bool; positions (batch, L); table (buckets, heads)
    -> (out (batch, L, heads, d), probs (batch, heads, L, L)). Materialises the (batch, heads, L, L) bias."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    c = _compute(q)
    qh, kh, vh = (t.transpose(1, 2).to(c) for t in (q, k, v))       # (batch, heads, L, d)
    bucket = mpnet_bucket(positions[:, None, :] - positions[:, :, None], num_buckets, max_distance)
    bias = F.embedding(bucket, table).permute(0, 3, 1, 2)           # (batch, heads, L, L)
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * scale + bias.to(qh.dtype)
    out, probs = _softmax_attend(scores, vh, key_mask, dropout_p)
    return out.transpose(1, 2).to(q.dtype), probs.to(q.dtype)


def relative_bias_attention(q, k, v, cu_seqlens, max_seqlen: int, positions, table, *, num_buckets: int = 32,
                            max_distance: int = 128, scale: Optional[float] = None, dropout_p: float = 0.0,
                            backend: str = "auto"):
    """MPNet attention on packed tokens: the bias is built per sequence from `positions`."""
    _check_backend(backend, "relative_bias_attention")
    _check_packed(q, k, v, cu_seqlens, positions)
    if table.dim() != 2 or table.shape[1] != q.shape[1] or table.shape[0] < num_buckets:
        raise ValueError(f"table must be (buckets >= {num_buckets}, heads={q.shape[1]}), got {tuple(table.shape)}")
    return _run_varlen(relative_bias_attention_padded, q, k, v, cu_seqlens, max_seqlen, positions, table=table,
                       num_buckets=num_buckets, max_distance=max_distance, scale=scale, dropout_p=dropout_p)


# ---- DeBERTa: disentangled attention ------------------------------------------------------------------
def deberta_log_bucket(relative: torch.Tensor, bucket_size: int, max_position: int) -> torch.Tensor:
    """DeBERTa's log-bucketed relative position (transformers' make_log_bucket_position), as long."""
    sign = torch.sign(relative)
    mid = bucket_size // 2
    abs_pos = torch.where((relative < mid) & (relative > -mid), torch.tensor(mid - 1).type_as(relative),
                          torch.abs(relative))
    log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid))
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
                                  scale_factor: int = 1, dropout_p: float = 0.0):
    """(batch, L, heads, d) q, k, v; key_mask (batch, L) bool; positions (batch, L); pos_key / pos_query
    (2 span, heads, d) or None (no c2p / no p2c term) -> (out (batch, L, heads, d), probs (b, h, L, L))."""
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
    out, probs = _softmax_attend(scores, vh, key_mask, dropout_p)
    return out.transpose(1, 2).to(q.dtype), probs.to(q.dtype)


def disentangled_attention(q, k, v, cu_seqlens, max_seqlen: int, positions, pos_key=None, pos_query=None, *,
                           span: int, position_buckets: int = -1, max_relative_positions: int = -1,
                           scale_factor: int = 1, dropout_p: float = 0.0, backend: str = "auto"):
    """DeBERTa(-v2) attention on packed tokens: c2p/p2c gathered per sequence from `positions`."""
    _check_backend(backend, "disentangled_attention")
    _check_packed(q, k, v, cu_seqlens, positions)
    for name, t in (("pos_key", pos_key), ("pos_query", pos_query)):
        if t is not None and tuple(t.shape) != (2 * span, *q.shape[1:]):
            raise ValueError(f"{name} must be (2 span, heads, head_dim) = {(2 * span, *q.shape[1:])}, "
                             f"got {tuple(t.shape)}")
    return _run_varlen(disentangled_attention_padded, q, k, v, cu_seqlens, max_seqlen, positions,
                       pos_key=pos_key, pos_query=pos_query, span=span, position_buckets=position_buckets,
                       max_relative_positions=max_relative_positions, scale_factor=scale_factor,
                       dropout_p=dropout_p)
