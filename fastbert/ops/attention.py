"""Bidirectional multi-head attention, padded (key-padding mask) or packed varlen.

CUDA tensors run the flash-attention Triton kernel (fastbert.kernels.attention) through a small
autograd.Function; CPU tensors run the torch reference, which is also the test oracle. Attention
dropout (training) comes from a seed drawn from `generator` (or torch's default CPU generator), so
`torch.manual_seed` makes a call reproducible; the kernel and the reference draw different masks."""
import math
import weakref
from typing import Optional

import torch
import torch.nn.functional as F

from fastbert.ops._dispatch import records_grad, use_triton

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


def _check_mask(q, attention_mask) -> None:
    if attention_mask is None:
        return
    if attention_mask.shape != q.shape[:2]:
        raise ValueError(f"attention_mask must have shape (batch, seq) = {tuple(q.shape[:2])}, "
                         f"got {tuple(attention_mask.shape)}")
    if attention_mask.device != q.device:
        raise ValueError(f"attention_mask is on {attention_mask.device} but q is on {q.device}")
    if attention_mask.is_complex():
        raise ValueError(f"attention_mask must be bool, integer or float, got {attention_mask.dtype}")


def _check_cu_seqlens(q, cu_seqlens, max_seqlen) -> None:
    if cu_seqlens.dtype != torch.int32:
        raise ValueError(f"cu_seqlens must be int32, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D of length batch+1 >= 2, got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != q.device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but q is on {q.device}")
    # Reading the values syncs a GPU; the models pass one cu_seqlens to every layer, so the last
    # tensor checked (same object, unmodified: same version counter) is not read again.
    global _last_cu_seqlens
    key = (cu_seqlens._version, q.shape[0], int(max_seqlen))
    last, last_key = _last_cu_seqlens
    if last is not None and last() is cu_seqlens and last_key == key:
        return
    c = cu_seqlens.tolist()
    if c[0] != 0 or c[-1] != q.shape[0]:
        raise ValueError(f"cu_seqlens must start at 0 and end at total_tokens={q.shape[0]}, "
                         f"got {c[0]} ... {c[-1]}")
    lengths = [b - a for a, b in zip(c[:-1], c[1:])]
    bad = [i for i, n in enumerate(lengths) if n < 0]
    if bad:
        raise ValueError(f"cu_seqlens must be non-decreasing; it decreases at index {bad[0] + 1}: {c}")
    if max(lengths) > max_seqlen:
        raise ValueError(f"max_seqlen={max_seqlen} is smaller than the longest sequence ({max(lengths)})")
    _last_cu_seqlens = (weakref.ref(cu_seqlens), key)


_last_cu_seqlens = (None, None)  # (weakref to the last valid cu_seqlens, its check key)


def _draw_keep(shape, dropout_p, generator, device) -> torch.Tensor:
    """Bernoulli(1 - dropout_p) keep mask for the torch path."""
    gen_device = generator.device if generator is not None else device
    u = torch.rand(shape, generator=generator, device=gen_device)
    return (u >= dropout_p).to(device)


def _attend(qh, kh, vh, key_keep, scale, dropout_p=0.0, generator=None, drop_keep=None):
    """(batch, heads, seq, dim) attention over keys where key_keep (batch, seq) is True.

    Without dropout this is one SDPA call (it returns zeros, not NaN, for rows with no key, forward
    and backward). With dropout the probabilities are materialised once to apply the mask."""
    if dropout_p == 0.0 and drop_keep is None:
        attn_mask = None if key_keep is None else key_keep[:, None, None, :]
        return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=attn_mask, scale=scale)
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * scale          # (batch, heads, seq, seq)
    if key_keep is not None:
        keep = key_keep[:, None, None, :]
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


def _compute_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def attention_ref(q, k, v, attention_mask=None, scale: Optional[float] = None, *,
                  dropout_p: float = 0.0, generator: Optional[torch.Generator] = None,
                  _drop_keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Pure-torch reference. (batch, seq, heads, head_dim) -> same; fully padded rows give zeros.

    Computes in fp32 (fp64 stays fp64). `_drop_keep` (batch, heads, seq, seq) fixes the dropout mask
    (tests use it to replay a mask recovered from the kernel)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    compute = _compute_dtype(q.dtype)
    qh, kh, vh = (t.transpose(1, 2).to(compute) for t in (q, k, v))  # (batch, heads, seq, head_dim)
    key_keep = None if attention_mask is None else attention_mask != 0
    out = _attend(qh, kh, vh, key_keep, scale, dropout_p, generator, _drop_keep)
    return out.transpose(1, 2).to(q.dtype)


def varlen_attention_ref(q, k, v, cu_seqlens, max_seqlen: int, scale: Optional[float] = None, *,
                         dropout_p: float = 0.0, generator: Optional[torch.Generator] = None,
                         _drop_keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Pure-torch reference over packed (total_tokens, heads, head_dim) sequences.

    Repads to (batch, max_seqlen) and runs one batched attention, so the CPU path stays fast."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    batch = cu_seqlens.numel() - 1
    starts, lengths = cu_seqlens[:-1].long(), (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    pos = torch.arange(max_seqlen, device=q.device)
    mask = pos[None, :] < lengths[:, None]                           # (batch, max_seqlen)
    # Gather (not scatter into zeros): padding slots read token 0 (or nothing when there are no
    # tokens); they are masked as keys and dropped as queries, so they add nothing to the gradients.
    src = torch.where(mask, starts[:, None] + pos[None, :], 0).flatten()
    compute = _compute_dtype(q.dtype)
    if q.shape[0] == 0:
        return q * 0 + k * 0 + v * 0                                 # empty, but still in the graph

    def pad(t):
        # index_select, not t[src]: advanced indexing is many times slower on CPU
        return t.index_select(0, src).to(compute).view(batch, max_seqlen, *t.shape[1:]).transpose(1, 2)

    out = _attend(pad(q), pad(k), pad(v), mask, scale, dropout_p, generator, _drop_keep)
    out = out.transpose(1, 2).reshape(batch * max_seqlen, *q.shape[1:])
    return out.index_select(0, mask.flatten().nonzero().squeeze(1)).to(q.dtype)


def _flash_forward(q, k, v, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed):
    """(out, lse, kernel options) of the Triton forward; the options replay the same call backward."""
    from fastbert.kernels import attention as kernel
    if key_mask is not None:
        key_mask = (key_mask != 0).to(torch.int8)                    # once, for both passes
    opts = dict(scale=scale, key_mask=key_mask, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                dropout_p=dropout_p, seed=seed)
    out, lse = kernel.attention_fwd(q, k, v, **opts)
    return out, lse, opts


def _flash(q, k, v, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed):
    if not records_grad(q, k, v):
        return _flash_forward(q, k, v, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed)[0]
    return _FlashAttention.apply(q, k, v, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed)


class _FlashAttention(torch.autograd.Function):
    """The Triton forward and backward; key_mask (padded) or cu_seqlens (varlen) selects the layout."""

    @staticmethod
    def forward(ctx, q, k, v, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed):
        out, lse, opts = _flash_forward(q, k, v, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.opts = opts
        return out

    @staticmethod
    def backward(ctx, dout):
        from fastbert.kernels import attention as kernel
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = kernel.attention_bwd(dout, q, k, v, out, lse, **ctx.opts)
        return dq, dk, dv, None, None, None, None, None, None


def _seed(dropout_p, generator) -> int:
    """A kernel seed drawn from generator (or torch's default generator); 0 without dropout."""
    if dropout_p == 0.0:
        return 0
    device = generator.device if generator is not None else "cpu"
    return int(torch.randint(0, 2**31 - 1, (), generator=generator, device=device))


def _use_kernel(backend, q, k, v) -> bool:
    triton_path = use_triton(backend, q, k, v)
    if triton_path and q.dtype == torch.float64:
        if backend == "triton":
            raise ValueError("backend='triton' supports float16, bfloat16 and float32, got torch.float64")
        return False                                                 # auto: fp64 stays on torch
    return triton_path


def attention(q, k, v, attention_mask=None, *, scale: Optional[float] = None, backend: str = "auto",
              dropout_p: float = 0.0, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v with HF's key-padding mask convention (1 = real token).

    dropout_p > 0 drops attention probabilities (training); pass it as 0.0 in eval mode."""
    _check_qkv(q, k, v, 4, "(batch, seq, heads, head_dim)")
    _check_mask(q, attention_mask)
    _check_dropout(dropout_p, generator)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if _use_kernel(backend, q, k, v):
        return _flash(q, k, v, attention_mask, None, None, scale, dropout_p,
                                     _seed(dropout_p, generator))
    return attention_ref(q, k, v, attention_mask, scale, dropout_p=dropout_p, generator=generator)


def varlen_attention(q, k, v, cu_seqlens, max_seqlen: int, *, scale: Optional[float] = None,
                     backend: str = "auto", dropout_p: float = 0.0,
                     generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Attention over packed sequences, as flash-attention's flash_attn_varlen_func (non-causal)."""
    _check_qkv(q, k, v, 3, "(total_tokens, heads, head_dim)")
    _check_cu_seqlens(q, cu_seqlens, max_seqlen)
    _check_dropout(dropout_p, generator)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if _use_kernel(backend, q, k, v):
        return _flash(q, k, v, None, cu_seqlens, int(max_seqlen), scale, dropout_p,
                                     _seed(dropout_p, generator))
    return varlen_attention_ref(q, k, v, cu_seqlens, max_seqlen, scale, dropout_p=dropout_p,
                                generator=generator)


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
