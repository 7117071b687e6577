"""Bidirectional multi-head attention, padded (key-padding mask) or packed varlen."""
import math
from typing import Optional

import torch
import torch.nn.functional as F

from fastbert.ops._dispatch import use_triton

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


def _check_mask(q, attention_mask) -> None:
    if attention_mask is None:
        return
    if attention_mask.shape != q.shape[:2]:
        raise ValueError(f"attention_mask must have shape (batch, seq) = {tuple(q.shape[:2])}, "
                         f"got {tuple(attention_mask.shape)}")
    if attention_mask.device != q.device:
        raise ValueError(f"attention_mask is on {attention_mask.device} but q is on {q.device}")


def _check_cu_seqlens(q, cu_seqlens, max_seqlen) -> None:
    if cu_seqlens.dtype != torch.int32:
        raise ValueError(f"cu_seqlens must be int32, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D of length batch+1 >= 2, got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != q.device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but q is on {q.device}")
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


def attention_ref(q, k, v, attention_mask=None, scale: Optional[float] = None) -> torch.Tensor:
    """Pure-torch reference. (batch, seq, heads, head_dim) -> same; fully padded rows give zeros."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    qh, kh, vh = (t.transpose(1, 2).to(compute) for t in (q, k, v))  # (batch, heads, seq, head_dim)
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * scale       # (batch, heads, seq, seq)
    if attention_mask is not None:
        keep = attention_mask.bool()[:, None, None, :]
        scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)           # all-masked rows -> zeros
    out = torch.matmul(probs, vh)                                    # (batch, heads, seq, head_dim)
    return out.transpose(1, 2).to(q.dtype)


def attention(q, k, v, attention_mask=None, *, scale: Optional[float] = None,
              backend: str = "auto") -> torch.Tensor:
    """softmax(q k^T * scale + mask) v with HF's key-padding mask convention (1 = real token)."""
    _check_qkv(q, k, v, 4, "(batch, seq, heads, head_dim)")
    _check_mask(q, attention_mask)
    if use_triton(backend, q, k, v):
        from fastbert.ops._attention_triton import attention_triton
        return attention_triton(q, k, v, attention_mask, scale)
    return attention_ref(q, k, v, attention_mask, scale)


def varlen_attention_ref(q, k, v, cu_seqlens, max_seqlen: int, scale: Optional[float] = None):
    """Pure-torch reference over packed (total_tokens, heads, head_dim) sequences.

    Repads to (batch, max_seqlen) and runs one batched attention, so the CPU path stays fast."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    batch = cu_seqlens.numel() - 1
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    pos = torch.arange(max_seqlen, device=q.device)
    mask = pos[None, :] < lengths[:, None]                           # (batch, max_seqlen)
    idx = mask.flatten().nonzero().squeeze(1)                        # padded slots of the real tokens

    def pad(t):
        out = t.new_zeros((batch * max_seqlen,) + tuple(t.shape[1:]))
        out[idx] = t
        return out.view(batch, max_seqlen, *t.shape[1:]).transpose(1, 2)  # (batch, heads, seq, dim)

    qp, kp, vp = pad(q), pad(k), pad(v)
    if q.dtype in (torch.float16, torch.bfloat16):
        qp, kp, vp = qp.float(), kp.float(), vp.float()
    bias = torch.zeros(mask.shape, dtype=qp.dtype, device=q.device).masked_fill(~mask, float("-inf"))
    out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=bias[:, None, None, :], scale=scale)
    out = out.transpose(1, 2).reshape(batch * max_seqlen, *q.shape[1:])
    return out[idx].to(q.dtype)


def varlen_attention(q, k, v, cu_seqlens, max_seqlen: int, *, scale: Optional[float] = None,
                     backend: str = "auto") -> torch.Tensor:
    """Attention over packed sequences, as flash-attention's flash_attn_varlen_func (non-causal)."""
    _check_qkv(q, k, v, 3, "(total_tokens, heads, head_dim)")
    _check_cu_seqlens(q, cu_seqlens, max_seqlen)
    if use_triton(backend, q, k, v):
        from fastbert.ops._attention_triton import varlen_attention_triton
        return varlen_attention_triton(q, k, v, cu_seqlens, max_seqlen, scale)
    return varlen_attention_ref(q, k, v, cu_seqlens, max_seqlen, scale)
