"""Bidirectional multi-head attention, padded (key-padding mask) or packed varlen.

CUDA tensors run the flash-attention Triton kernel (fastbert.kernels.attention) through the custom
ops torch.ops.fastbert.attention / varlen_attention (and their _backward ops); CPU tensors run the
torch reference, which is also the test oracle. Attention dropout (training) comes from a seed
tensor drawn on the device from `generator` (or torch's default generator for that device), so
`torch.manual_seed` makes a call reproducible; the kernel and the reference draw different masks.

Packing metadata: cu_seqlens' values are the caller's contract. CPU tensors are checked on every
call; CUDA tensors are not read (that would be a device-to-host sync per layer, and no CUDA graph or
torch.compile graph could hold it): check them on the host copy before the upload, with
fastbert.ops.varlen.check_cu_seqlens(), as the tokenizer's packed output and the padding helpers do.

Sliding window (ModernBERT's local layers): varlen_attention(..., window=w) lets query i see key j of
its own sequence only when |pos_i - pos_j| <= w, pos being the offset inside the sequence or the given
`positions`; the kernel skips the key blocks outside the window (O(tokens * w) work)."""
import math
import operator
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from fastbert.ops._dispatch import dropout_seed, records_grad, run_kernel, triton_op, use_triton
from fastbert.ops.sliding_window import check_window_inputs, sliding_window_attention_ref
from fastbert.ops.varlen import check_cu_seqlens, check_cu_seqlens_shape, repad_index, unpad_index

MAX_HEAD_DIM = 128
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_qkv(q, k, v, rank: int, layout: str) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != rank:
            raise ValueError(f"{name} must be {rank}-D {layout}, got {t.dim()}-D shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise ValueError(f"{name} has dtype {t.dtype}; expected one of {DTYPES}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v devices differ: {q.device}, {k.device}, {v.device}")
    if q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {q.shape[-1]} exceeds {MAX_HEAD_DIM}")
    if q.shape[-1] < 1:
        raise ValueError(f"head_dim must be >= 1, got shape {tuple(q.shape)}")


def _check_dropout(dropout_p, generator) -> None:
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")


# attention()'s q / k / v layouts: a (2, 8, 8, 64) tensor is either, so the caller says which
LAYOUTS = {"bshd": "(batch, seq, heads, head_dim)", "bhsd": "(batch, heads, seq, head_dim) (torch SDPA's)"}


def _check_mask(q, attention_mask, layout: str = "bshd") -> None:
    """q in (batch, seq, heads, head_dim) order whatever the caller's layout (named in errors)."""
    if attention_mask is None:
        return
    if attention_mask.shape != q.shape[:2]:
        other = "bhsd" if layout == "bshd" else "bshd"
        hint = (f"; q looks like layout={other!r} {LAYOUTS[other]}: pass layout={other!r} to "
                "fastbert.ops.attention, or transpose q, k, v"
                if attention_mask.shape == (q.shape[0], q.shape[2]) else "")
        raise ValueError(f"attention_mask must have shape (batch, seq) = {tuple(q.shape[:2])} for q of layout "
                         f"{layout!r} {LAYOUTS[layout]}, got {tuple(attention_mask.shape)}{hint}")
    if attention_mask.device != q.device:
        raise ValueError(f"attention_mask is on {attention_mask.device} but q is on {q.device}")
    if attention_mask.is_complex():
        raise ValueError(f"attention_mask must be bool, integer or float, got {attention_mask.dtype}")


def seqlen_int(max_seqlen) -> int:
    """max_seqlen as a Python int >= 0: an int, a numpy integer or a SymInt; a tensor (reading it
    would sync the device), a float, a str or a bool is refused, not converted."""
    if isinstance(max_seqlen, torch.Tensor):
        raise ValueError("max_seqlen must be a Python int, not a tensor (reading one would sync the device)")
    if isinstance(max_seqlen, bool):
        n = None
    elif isinstance(max_seqlen, int):
        # as it is: under torch.compile an int input becomes symbolic after its first change, and
        # operator.index would make it a constant again (one compilation per value)
        n = max_seqlen
    else:
        try:
            n = operator.index(max_seqlen)
        except TypeError:
            n = None
    if n is None or n < 0:
        raise ValueError(f"max_seqlen must be a Python int >= 0, got {max_seqlen!r}")
    return n


def _check_packing(q, cu_seqlens, max_seqlen) -> None:
    check_cu_seqlens_shape(cu_seqlens)
    if cu_seqlens.device != q.device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but q is on {q.device}")
    if not isinstance(max_seqlen, int) or max_seqlen < 0:
        raise ValueError(f"max_seqlen must be a Python int >= 0, got {max_seqlen!r}")
    # values: on the host only, and not while torch.compile traces (they are the caller's contract)
    if cu_seqlens.device.type == "cpu" and not torch.compiler.is_compiling():
        check_cu_seqlens(cu_seqlens, q.shape[0], max_seqlen)


def _draw_keep(shape, dropout_p, generator, device) -> torch.Tensor:
    """Bernoulli(1 - dropout_p) keep mask for the torch path."""
    gen_device = generator.device if generator is not None else device
    u = torch.rand(shape, generator=generator, device=gen_device)
    return (u >= dropout_p).to(device)


def _attend(qh, kh, vh, key_keep, scale, dropout_p=0.0, generator=None, drop_keep=None):
    """(batch, heads, seq, dim) attention over keys where key_keep (batch, seq) is True (or a
    (batch, 1, seq, seq) mask, True where query i may see key j).

    Without dropout this is one SDPA call (it returns zeros, not NaN, for rows with no key, forward
    and backward). With dropout the probabilities are materialised once to apply the mask."""
    if dropout_p == 0.0 and drop_keep is None:
        attn_mask = None if key_keep is None else _keep4(key_keep)
        return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=attn_mask, scale=scale)
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * scale          # (batch, heads, seq, seq)
    if key_keep is not None:
        keep = _keep4(key_keep)
        any_key = keep.any(-1, keepdim=True)
        # rows with no key get finite scores and are zeroed after softmax: no NaN in either pass
        scores = scores.masked_fill(~keep, float("-inf")).masked_fill(~any_key, 0.0)
    probs = torch.softmax(scores, dim=-1)
    if key_keep is not None:
        probs = probs * any_key
    if drop_keep is None:
        drop_keep = _draw_keep(probs.shape, dropout_p, generator, probs.device)
    probs = probs * drop_keep / (1.0 - dropout_p)
    return torch.matmul(probs, vh)


def _keep4(key_keep):
    return key_keep if key_keep.dim() == 4 else key_keep[:, None, None, :]


def _window_keep(mask, window: int, positions=None):
    """(batch, 1, seq, seq) bool: real keys (mask (batch, seq)) within +-window of the query, the
    distance in positions (batch, seq) or, without them, in offsets inside the row."""
    pos = torch.arange(mask.shape[1], device=mask.device)[None, :] if positions is None else positions.long()
    near = (pos[:, :, None] - pos[:, None, :]).abs() <= window        # (batch or 1, seq, seq)
    return (mask[:, None, :] & near)[:, None]


def _compute_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def attention_ref(q, k, v, attention_mask=None, scale: Optional[float] = None, *,
                  dropout_p: float = 0.0, generator: Optional[torch.Generator] = None,
                  _drop_keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Pure-torch reference. (batch, seq, heads, head_dim) -> same; fully padded rows give zeros.

    Computes in fp32 (fp64 stays fp64). `_drop_keep` (batch, heads, seq, seq) fixes the dropout mask
    (tests use it to replay a mask recovered from the kernel)."""
    _check_mask(q, attention_mask)   # the one check its layout allows (see attention's layout=)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    compute = _compute_dtype(q.dtype)
    qh, kh, vh = (t.transpose(1, 2).to(compute) for t in (q, k, v))  # (batch, heads, seq, head_dim)
    key_keep = None if attention_mask is None else attention_mask != 0
    out = _attend(qh, kh, vh, key_keep, scale, dropout_p, generator, _drop_keep)
    return out.transpose(1, 2).to(q.dtype)


def varlen_attention_ref(q, k, v, cu_seqlens, max_seqlen: int, scale: Optional[float] = None, *,
                         dropout_p: float = 0.0, generator: Optional[torch.Generator] = None,
                         window: Optional[int] = None, positions: Optional[torch.Tensor] = None,
                         _drop_keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Pure-torch reference over packed (total_tokens, heads, head_dim) sequences.

    Repads to (batch, max_seqlen) and runs one batched attention, so the CPU path stays fast. With a
    window the mask is (batch, seq, seq): an oracle (fastbert.ops.sliding_window has the linear one)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    batch = cu_seqlens.numel() - 1
    # Gather (not scatter into zeros): padding slots read token 0 (or nothing when there are no
    # tokens); they are masked as keys and dropped as queries, so they add nothing to the gradients.
    src, mask = repad_index(cu_seqlens, max_seqlen)
    compute = _compute_dtype(q.dtype)
    if q.shape[0] == 0:
        return q * 0 + k * 0 + v * 0                                 # empty, but still in the graph

    def pad(t):
        # index_select, not t[src]: advanced indexing is many times slower on CPU
        return t.index_select(0, src).to(compute).view(batch, max_seqlen, *t.shape[1:]).transpose(1, 2)

    if window is not None:
        pos = None if positions is None else positions.index_select(0, src).view(batch, max_seqlen)
        mask = _window_keep(mask, window, pos)
    out = _attend(pad(q), pad(k), pad(v), mask, scale, dropout_p, generator, _drop_keep)
    out = out.transpose(1, 2).reshape(batch * max_seqlen, *q.shape[1:])
    return out.index_select(0, unpad_index(cu_seqlens, max_seqlen, q.shape[0])).to(q.dtype)


# ----------------------------------------------------------------------------------------------
# The custom ops: (out, lse) forward and (dq, dk, dv) backward, the kernel's quantities. On CPU
# their torch reference computes the same lse and the flash backward's formulas, without dropout.

def _no_ref_dropout(dropout_p) -> None:
    if dropout_p > 0:
        raise ValueError("fastbert's attention ops on CPU tensors run the torch reference, which has no "
                         "Philox dropout; use interpret=True, or attention(..., backend='torch')")


def _no_stats(q) -> torch.Tensor:
    return torch.empty(0, dtype=torch.float32, device=q.device)


def _flash_ref(q, k, v, key_keep, scale):
    """(out, lse) for (batch, seq, heads, dim): lse (batch, heads, seq) fp32, +inf for a row with no key.
    key_keep: (batch, seq) real keys, or a (batch, 1, seq, seq) visibility mask."""
    compute = _compute_dtype(q.dtype)
    qh, kh, vh = (t.transpose(1, 2).to(compute) for t in (q, k, v))
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * scale           # (batch, heads, seq, seq)
    if key_keep is not None:
        scores = scores.masked_fill(~_keep4(key_keep), float("-inf"))
    lse = torch.logsumexp(scores, -1)
    has_key = lse > float("-inf")
    p = torch.exp(scores - torch.where(has_key, lse, 0.0)[..., None])  # rows with no key: all 0
    out = torch.matmul(p, vh).transpose(1, 2).to(q.dtype).contiguous()
    return out, torch.where(has_key, lse, float("inf")).float()


def _flash_backward_ref(dout, q, k, v, out, lse, key_keep, scale):
    """(dq, dk, dv) from the forward's out and lse: P = exp(S - lse), dS = P * (dP - rowsum(dO * O))."""
    compute = _compute_dtype(q.dtype)
    qh, kh, vh, oh, doh = (t.transpose(1, 2).to(compute) for t in (q, k, v, out, dout))
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    p = torch.exp(scores - lse.to(compute)[..., None])
    if key_keep is not None:
        p = p.masked_fill(~_keep4(key_keep), 0.0)
    dv = torch.matmul(p.transpose(-1, -2), doh)
    ds = p * (torch.matmul(doh, vh.transpose(-1, -2)) - (doh * oh).sum(-1, keepdim=True))
    dq = torch.matmul(ds, kh) * scale
    dk = torch.matmul(ds.transpose(-1, -2), qh) * scale
    return tuple(t.transpose(1, 2).to(q.dtype).contiguous() for t in (dq, dk, dv))


def _repad(t, cu_seqlens, max_seqlen):
    """Packed (total, heads, dim) -> (batch, max_seqlen, heads, dim), zeros in the padding."""
    src, mask = repad_index(cu_seqlens, max_seqlen)
    padded = t.index_select(0, src).view(mask.shape[0], max_seqlen, *t.shape[1:])
    return padded * mask[:, :, None, None].to(t.dtype), mask


def _varlen_keep(cu_seqlens, max_seqlen, window, positions):
    """The reference's (batch, max_seqlen) real-token mask, or with a window its (batch, 1, seq, seq) mask."""
    src, mask = repad_index(cu_seqlens, max_seqlen)
    if window is None:
        return mask
    pos = None if positions is None else positions.index_select(0, src).view(mask.shape)
    return _window_keep(mask, window, pos)


def _unpad(t, cu_seqlens, max_seqlen, total):
    return t.reshape(-1, *t.shape[2:]).index_select(0, unpad_index(cu_seqlens, max_seqlen, total)).contiguous()


@triton_op("fastbert::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: Optional[torch.Tensor],
                  scale: float, dropout_p: float, seed: Optional[torch.Tensor], save_stats: bool,
                  interpret: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of padded attention; key_mask (batch, seq) int8, seed (1,) int64 when dropout_p > 0;
    lse is empty unless save_stats."""
    if run_kernel(q, interpret):
        from fastbert.kernels import attention as kernel
        out, lse = kernel.attention_fwd(q, k, v, scale=scale, key_mask=key_mask, dropout_p=dropout_p,
                                        seed=seed, store_lse=save_stats)
    else:
        _no_ref_dropout(dropout_p)
        out, lse = _flash_ref(q, k, v, None if key_mask is None else key_mask != 0, scale)
    return out, (lse if save_stats else _no_stats(q))


@triton_op("fastbert::varlen_attention", mutates_args=())
def _varlen_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                         max_seqlen: int, scale: float, dropout_p: float, seed: Optional[torch.Tensor],
                         save_stats: bool, interpret: bool, window: Optional[int] = None,
                         positions: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of packed attention; lse is (batch, heads, max_seqlen), empty unless save_stats.
    window: sliding-window half-width (None: global); positions (total,) the window's positions."""
    if run_kernel(q, interpret):
        from fastbert.kernels import attention as kernel
        out, lse = kernel.attention_fwd(q, k, v, scale=scale, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                                        dropout_p=dropout_p, seed=seed, store_lse=save_stats, window=window,
                                        positions=positions)
        return out, (lse if save_stats else _no_stats(q))
    _no_ref_dropout(dropout_p)
    batch, total = cu_seqlens.numel() - 1, q.shape[0]
    if total == 0:
        lse = torch.full((batch, q.shape[1], max_seqlen), float("inf"), device=q.device)
        return torch.empty(q.shape, dtype=q.dtype, device=q.device), (lse if save_stats else _no_stats(q))
    qp, kp, vp = (_repad(t, cu_seqlens, max_seqlen)[0] for t in (q, k, v))
    out, lse = _flash_ref(qp, kp, vp, _varlen_keep(cu_seqlens, max_seqlen, window, positions), scale)
    return _unpad(out, cu_seqlens, max_seqlen, total), (lse if save_stats else _no_stats(q))


@triton_op("fastbert::attention_backward", mutates_args=())
def _attention_backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           out: torch.Tensor, lse: torch.Tensor, key_mask: Optional[torch.Tensor],
                           scale: float, dropout_p: float, seed: Optional[torch.Tensor],
                           interpret: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if run_kernel(q, interpret):
        from fastbert.kernels import attention as kernel
        return kernel.attention_bwd(dout, q, k, v, out, lse, scale=scale, key_mask=key_mask,
                                    dropout_p=dropout_p, seed=seed)
    _no_ref_dropout(dropout_p)
    return _flash_backward_ref(dout, q, k, v, out, lse, None if key_mask is None else key_mask != 0, scale)


@triton_op("fastbert::varlen_attention_backward", mutates_args=())
def _varlen_attention_backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                  out: torch.Tensor, lse: torch.Tensor, cu_seqlens: torch.Tensor,
                                  max_seqlen: int, scale: float, dropout_p: float,
                                  seed: Optional[torch.Tensor], interpret: bool, window: Optional[int] = None,
                                  positions: Optional[torch.Tensor] = None
                                  ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if run_kernel(q, interpret):
        from fastbert.kernels import attention as kernel
        return kernel.attention_bwd(dout, q, k, v, out, lse, scale=scale, cu_seqlens=cu_seqlens,
                                    max_seqlen=max_seqlen, dropout_p=dropout_p, seed=seed, window=window,
                                    positions=positions)
    _no_ref_dropout(dropout_p)
    total = q.shape[0]
    if total == 0:
        return tuple(torch.empty(q.shape, dtype=q.dtype, device=q.device) for _ in range(3))
    padded = [_repad(t, cu_seqlens, max_seqlen)[0] for t in (dout, q, k, v, out)]
    mask = repad_index(cu_seqlens, max_seqlen)[1]
    lse = torch.where(mask[:, None, :], lse, float("inf"))            # padding rows: P = 0
    grads = _flash_backward_ref(*padded, lse, _varlen_keep(cu_seqlens, max_seqlen, window, positions), scale)
    return tuple(_unpad(g, cu_seqlens, max_seqlen, total) for g in grads)


def _lse_like(q, batch, seq, save_stats):
    heads = q.shape[-2]
    return torch.empty((batch, heads, seq) if save_stats else (0,), dtype=torch.float32, device=q.device)


@_attention_op.register_fake
def _(q, k, v, key_mask, scale, dropout_p, seed, save_stats, interpret):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device), _lse_like(q, q.shape[0], q.shape[1], save_stats)


@_varlen_attention_op.register_fake
def _(q, k, v, cu_seqlens, max_seqlen, scale, dropout_p, seed, save_stats, interpret, window=None, positions=None):
    lse = _lse_like(q, cu_seqlens.shape[0] - 1, max_seqlen, save_stats)
    return torch.empty(q.shape, dtype=q.dtype, device=q.device), lse


def _grads_like(q):
    return tuple(torch.empty(q.shape, dtype=q.dtype, device=q.device) for _ in range(3))


_attention_backward_op.register_fake(lambda dout, q, *args: _grads_like(q))
_varlen_attention_backward_op.register_fake(lambda dout, q, *args: _grads_like(q))


def _setup_context(n_window_args: int):
    """setup_context for an op whose inputs are (q, k, v, layout, *options, scale, dropout_p, seed,
    save_stats, interpret) followed by n_window_args window arguments (window, positions)."""
    def setup_context(ctx, inputs, output):
        ctx.n_inputs = len(inputs)
        inputs = tuple(inputs) + (None,) * (10 + n_window_args - len(inputs) if n_window_args else 0)
        head = inputs[:len(inputs) - n_window_args]
        q, k, v, layout = head[:4]
        *options, scale, dropout_p, seed, save_stats, interpret = head[4:]
        out, lse = output
        if not save_stats:
            ctx.mark_non_differentiable(out)  # no lse saved: a backward would be wrong, so there is none
        ctx.mark_non_differentiable(lse)
        window, positions = inputs[len(head):] if n_window_args else (None, None)
        ctx.save_for_backward(q, k, v, out, lse, layout, seed, positions)
        ctx.args = (*options, scale, dropout_p)
        ctx.window = window
        ctx.interpret = interpret
        ctx.n_window_args = n_window_args
    return setup_context


def _backward(op):
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, layout, seed, positions = ctx.saved_tensors
        *options, scale, dropout_p = ctx.args
        window_args = (ctx.window, positions) if ctx.n_window_args else ()
        dq, dk, dv = op(dout, q, k, v, out, lse, layout, *options, scale, dropout_p, seed, ctx.interpret,
                        *window_args)
        return (dq, dk, dv) + (None,) * (ctx.n_inputs - 3)
    return backward


_attention_op.register_autograd(_backward(torch.ops.fastbert.attention_backward), setup_context=_setup_context(0))
_varlen_attention_op.register_autograd(_backward(torch.ops.fastbert.varlen_attention_backward),
                                       setup_context=_setup_context(2))


def _use_kernel(backend, q, k, v) -> bool:
    triton_path = use_triton(backend, q, k, v)
    if triton_path and q.dtype == torch.float64:
        if backend == "triton":
            raise ValueError("backend='triton' supports float16, bfloat16 and float32, got torch.float64")
        return False                                                 # auto: fp64 stays on torch
    return triton_path


def attention(q, k, v, attention_mask=None, *, scale: Optional[float] = None, backend: str = "auto",
              dropout_p: float = 0.0, generator: Optional[torch.Generator] = None,
              layout: str = "bshd") -> torch.Tensor:
    """softmax(q k^T * scale + mask) v with HF's key-padding mask convention (1 = real token).

    layout: "bshd" (default) for q, k, v of shape (batch, seq, heads, head_dim), "bhsd" for torch
    SDPA's (batch, heads, seq, head_dim); the output has the inputs' layout. Shapes alone cannot tell
    the two apart, so a tensor in the other layout gives wrong numbers unless it is said here; an
    attention_mask (batch, seq) is checked against the layout's seq dimension.
    dropout_p > 0 drops attention probabilities (training); pass it as 0.0 in eval mode."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS} (key: q, k, v shape), got {layout!r}")
    _check_qkv(q, k, v, 4, LAYOUTS[layout])
    if layout == "bhsd":   # the op runs on (batch, seq, heads, head_dim) views; head_dim stays contiguous
        _check_mask(q.transpose(1, 2), attention_mask, layout)
        return attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attention_mask, scale=scale,
                         backend=backend, dropout_p=dropout_p, generator=generator).transpose(1, 2)
    _check_mask(q, attention_mask, layout)
    _check_dropout(dropout_p, generator)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if _use_kernel(backend, q, k, v):
        key_mask = None if attention_mask is None else (attention_mask != 0).to(torch.int8)
        return torch.ops.fastbert.attention(q, k, v, key_mask, scale, float(dropout_p),
                                            dropout_seed(dropout_p, q.device, generator), records_grad(q, k, v),
                                            not q.is_cuda)[0]
    return attention_ref(q, k, v, attention_mask, scale, dropout_p=dropout_p, generator=generator)


def _check_window(q, window, positions) -> None:
    if window is None:
        if positions is not None:
            raise ValueError("positions are the sliding window's; pass them with window=")
        return
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be an int >= 0 (the half-width: ModernBERT's local_attention // 2), "
                         f"got {window!r}")
    if positions is None:
        return
    if not isinstance(positions, torch.Tensor) or positions.dtype.is_floating_point or positions.is_complex() \
            or positions.dtype == torch.bool:
        raise ValueError(f"positions must be an integer tensor, got {getattr(positions, 'dtype', type(positions))}")
    if tuple(positions.shape) != (q.shape[0],):
        raise ValueError(f"positions must have shape (total_tokens,) = ({q.shape[0]},), got {tuple(positions.shape)}")
    if positions.device != q.device:
        raise ValueError(f"positions is on {positions.device} but q is on {q.device}")


def varlen_attention(q, k, v, cu_seqlens, max_seqlen: int, *, scale: Optional[float] = None,
                     backend: str = "auto", dropout_p: float = 0.0,
                     generator: Optional[torch.Generator] = None, window: Optional[int] = None,
                     positions: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Attention over packed sequences, as flash-attention's flash_attn_varlen_func (non-causal).

    window: a sliding window's half-width: query i sees key j of its sequence iff |pos_i - pos_j| <=
    window, pos the offset inside the sequence or `positions` (total_tokens,) (increasing inside each
    sequence; holes allowed). The kernel skips key blocks outside it; on the torch path it runs
    fastbert.ops.sliding_window's blockwise reference (linear memory).
    cu_seqlens' values are checked here for CPU tensors only; see check_cu_seqlens()."""
    _check_qkv(q, k, v, 3, "(total_tokens, heads, head_dim)")
    max_seqlen = seqlen_int(max_seqlen)
    _check_packing(q, cu_seqlens, max_seqlen)
    _check_dropout(dropout_p, generator)
    _check_window(q, window, positions)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if _use_kernel(backend, q, k, v):
        window_args = () if window is None else (window, None if positions is None else positions.contiguous())
        return torch.ops.fastbert.varlen_attention(q, k, v, cu_seqlens, max_seqlen, scale, float(dropout_p),
                                                   dropout_seed(dropout_p, q.device, generator),
                                                   records_grad(q, k, v), not q.is_cuda, *window_args)[0]
    if window is not None:
        if generator is not None:
            raise ValueError("the sliding-window torch path draws dropout from torch's default generator; "
                             "pass generator=None")
        return sliding_window_attention_ref(q, k, v, cu_seqlens, window, positions, scale, dropout_p=dropout_p)
    from fastbert.ops.length_runs import varlen_attention_cpu   # CPU inference: no padding
    out = varlen_attention_cpu(q, k, v, cu_seqlens, dropout_p, scale)
    if out is not None:
        return out
    return varlen_attention_ref(q, k, v, cu_seqlens, int(max_seqlen), scale, dropout_p=dropout_p,
                                generator=generator)


def sliding_window_attention(q, k, v, cu_seqlens, max_seqlen: int, window: int,
                             positions: Optional[torch.Tensor] = None, *, scale: Optional[float] = None,
                             dropout_p: float = 0.0, backend: str = "auto") -> torch.Tensor:
    """Local attention over packed sequences: the varlen flash kernel with its window (backend
    "triton", or "auto" on CUDA; it skips key blocks outside the window), else the blockwise torch
    path of fastbert.ops.sliding_window. When no sequence is longer than the window reaches
    (max_seqlen - 1 <= window, with default positions) it is plain varlen attention."""
    check_window_inputs(q, k, v, cu_seqlens, window, positions)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if positions is None and max_seqlen - 1 <= window:
        return varlen_attention(q, k, v, cu_seqlens, max_seqlen, scale=scale, dropout_p=dropout_p,
                                backend=backend)
    return varlen_attention(q, k, v, cu_seqlens, max_seqlen, scale=scale, dropout_p=dropout_p, backend=backend,
                            window=window, positions=positions)


def attention_probs_ref(q, k, attention_mask=None, scale: Optional[float] = None) -> torch.Tensor:
    """softmax(q k^T * scale) over real keys, for output_attentions: (batch, seq, heads, head_dim)
    -> (batch, heads, seq, seq) probabilities in q's dtype (computed in fp32; fp64 stays fp64).

    Masking as attention_ref's: keys where attention_mask == 0 get no weight and a query row with
    no real key is all zeros, so `probs @ v` equals attention_ref(q, k, v, attention_mask)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    compute = _compute_dtype(q.dtype)
    qh, kh = (t.transpose(1, 2).to(compute) for t in (q, k))     # (batch, heads, seq, head_dim)
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * scale      # (batch, heads, seq, seq)
    if attention_mask is None:
        return torch.softmax(scores, dim=-1).to(q.dtype)
    keep = (attention_mask != 0)[:, None, None, :]
    any_key = keep.any(-1, keepdim=True)
    scores = scores.masked_fill(~keep, float("-inf")).masked_fill(~any_key, 0.0)
    return (torch.softmax(scores, dim=-1) * any_key).to(q.dtype)
