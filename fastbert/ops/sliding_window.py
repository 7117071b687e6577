"""Bidirectional sliding-window (local) attention over packed varlen sequences.

Query i of a sequence attends to key j of the same sequence when |pos_i - pos_j| <= window
(transformers' `sliding_window_bidirectional_overlay`; ModernBERT's window = local_attention // 2).

The torch path never builds a (tokens, tokens) score matrix: packed tokens are cut into query
blocks of `block` rows, and each block attends to the `block + 2 * window` packed keys around it
(an `unfold` view of the padded keys, no copy), masked to its own sequence and the window. Memory
and time are O(tokens * (block + 2 * window)), linear in length; blocks are processed in chunks so
the score tensors stay bounded too. No host sync: the block count comes from shapes, sequence ids
from `searchsorted` on cu_seqlens.

`positions` (tokens,) are the indices the window is measured in (default: the offset inside each
packed sequence). They may have holes (a left-padded or holey mask keeps array indices): packed
distance <= position distance, so the +-window packed keys still hold every key in the window.
"""
import math
from typing import Optional

import torch
import torch.nn.functional as F

from fastbert.ops.attention import varlen_attention

_MAX_SCORES = 1 << 24   # score elements per chunk of query blocks (64 MiB in fp32)


def sequence_ids(cu_seqlens: torch.Tensor, tokens: int) -> torch.Tensor:
    """(tokens,) index of the packed sequence each token belongs to."""
    idx = torch.arange(tokens, device=cu_seqlens.device, dtype=torch.int32)
    return torch.searchsorted(cu_seqlens[1:].contiguous(), idx, right=True)


def packed_offsets(cu_seqlens: torch.Tensor, tokens: int) -> torch.Tensor:
    """(tokens,) int64 position of each token inside its sequence (0, 1, ... per sequence)."""
    seq = sequence_ids(cu_seqlens, tokens)
    return torch.arange(tokens, device=cu_seqlens.device) - cu_seqlens.long().index_select(0, seq)


def _check(q, k, v, cu_seqlens, window, positions):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D (tokens, heads, head_dim), got shape {tuple(t.shape)}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be a non-negative int, got {window!r}")
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D int32 of length batch+1 >= 2, got {cu_seqlens.dtype} "
                         f"shape {tuple(cu_seqlens.shape)}")
    if positions is not None and tuple(positions.shape) != (q.shape[0],):
        raise ValueError(f"positions must be (tokens,) = ({q.shape[0]},), got {tuple(positions.shape)}")


def sliding_window_attention_ref(q, k, v, cu_seqlens, window: int, positions: Optional[torch.Tensor] = None,
                                 scale: Optional[float] = None, *, dropout_p: float = 0.0,
                                 block: Optional[int] = None) -> torch.Tensor:
    """Blockwise torch reference: (tokens, heads, head_dim) -> same, linear memory in tokens."""
    _check(q, k, v, cu_seqlens, window, positions)
    tokens, heads, dim = q.shape
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    if tokens == 0:
        return q * 0 + k * 0 + v * 0
    block = block or max(16, min(128, window))
    nb = -(-tokens // block)                                      # query blocks
    span = block + 2 * window                                      # keys seen by one block
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    seq = sequence_ids(cu_seqlens, tokens)
    pos = packed_offsets(cu_seqlens, tokens) if positions is None else positions.long()
    right = nb * block - tokens                                    # query padding of the last block

    def keys(t, fill):                                             # (tokens, ...) -> (nb, span, ...) view
        t = F.pad(t, (0, 0) * (t.dim() - 1) + (window, right + window), value=fill)
        return t.unfold(0, span, block).movedim(-1, 1)

    qb = F.pad(q.to(compute), (0, 0, 0, 0, 0, right)).view(nb, block, heads, dim)
    kb, vb = keys(k.to(compute), 0), keys(v.to(compute), 0)        # (nb, span, heads, dim)
    seq_q = F.pad(seq, (0, right), value=-1).view(nb, block)
    pos_q = F.pad(pos, (0, right)).view(nb, block)
    seq_k, pos_k = keys(seq, -2), keys(pos, 0)                     # (nb, span); -2: no key
    chunk = max(1, _MAX_SCORES // (heads * block * span))
    outs = []
    for lo in range(0, nb, chunk):
        hi = min(nb, lo + chunk)
        allowed = ((seq_q[lo:hi, :, None] == seq_k[lo:hi, None, :])
                   & ((pos_q[lo:hi, :, None] - pos_k[lo:hi, None, :]).abs() <= window))
        # padding query rows of the last block have no key: let them see all (finite), then drop them
        allowed = allowed | ~allowed.any(-1, keepdim=True)
        out = F.scaled_dot_product_attention(
            qb[lo:hi].transpose(1, 2), kb[lo:hi].transpose(1, 2), vb[lo:hi].transpose(1, 2),
            attn_mask=allowed[:, None], dropout_p=dropout_p, scale=scale)   # (n, heads, block, dim)
        outs.append(out.transpose(1, 2))
    return torch.cat(outs).reshape(nb * block, heads, dim)[:tokens].to(q.dtype)


def sliding_window_attention(q, k, v, cu_seqlens, max_seqlen: int, window: int,
                             positions: Optional[torch.Tensor] = None, *, scale: Optional[float] = None,
                             dropout_p: float = 0.0, backend: str = "auto") -> torch.Tensor:
    """Local attention over packed sequences: the varlen flash kernel with its window (backend
    "triton", or "auto" on CUDA; it skips key blocks outside the window), else the blockwise torch
    path above. When no sequence is longer than the window reaches (max_seqlen - 1 <= window, with
    default positions) it is plain varlen attention."""
    _check(q, k, v, cu_seqlens, window, positions)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if positions is None and max_seqlen - 1 <= window:
        return varlen_attention(q, k, v, cu_seqlens, max_seqlen, scale=scale, dropout_p=dropout_p,
                                backend=backend)
    # varlen_attention runs the kernel where the backend picks it, else sliding_window_attention_ref
    return varlen_attention(q, k, v, cu_seqlens, max_seqlen, scale=scale, dropout_p=dropout_p, backend=backend,
                            window=window, positions=positions)
