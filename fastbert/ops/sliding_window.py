"""Bidirectional sliding-window (local) attention over packed varlen sequences: the blockwise torch
path of `fastbert.ops.attention.varlen_attention(..., window=)` and `sliding_window_attention`.

Query i of a sequence attends to key j of the same sequence when |pos_i - pos_j| <= window
(transformers' `sliding_window_bidirectional_overlay`; ModernBERT's window = local_attention // 2).

The torch path never builds a (tokens, tokens) score matrix: packed tokens are cut into query
blocks of `block` rows, and each block attends to the `block + 2 * window` packed keys around it,
masked to its own sequence and the window. Memory and time are O(tokens * (block + 2 * window)),
linear in length. Blocks inside one sequence with consecutive positions (all but a few for long
inputs) share one (block, span) mask and run on `unfold` views of k and v (no copy, no per-block
mask); the rest (sequence edges, holes, the ends) gather their keys and build their own mask. Blocks
go to SDPA in chunks so the scores of its math fallback stay bounded too. One host sync (the list of
the rest; under torch.compile every block takes the gathered path instead); sequence ids and offsets
are cumsums over cu_seqlens (fastbert.ops.varlen).

`positions` (tokens,) are the indices the window is measured in (default: the offset inside each
packed sequence). They may have holes (a left-padded or holey mask keeps array indices): packed
distance <= position distance, so the +-window packed keys still hold every key in the window.
"""
import math
from typing import Optional

import torch
import torch.nn.functional as F

from fastbert.ops.varlen import check_cu_seqlens_shape, check_packed_qkv, packed_positions, sequence_ids

_MAX_SCORES = 1 << 24   # score elements per chunk of query blocks (64 MiB in fp32)


def check_window_inputs(q, k, v, cu_seqlens, window, positions) -> None:
    """Shapes, the window and cu_seqlens' layout (no values read)."""
    check_packed_qkv(q, k, v)
    if not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be a non-negative int, got {window!r}")
    check_cu_seqlens_shape(cu_seqlens)
    if positions is not None and tuple(positions.shape) != (q.shape[0],):
        raise ValueError(f"positions must be (tokens,) = ({q.shape[0]},), got {tuple(positions.shape)}")


def sliding_window_attention_ref(q, k, v, cu_seqlens, window: int, positions: Optional[torch.Tensor] = None,
                                 scale: Optional[float] = None, *, dropout_p: float = 0.0,
                                 block: Optional[int] = None) -> torch.Tensor:
    """Blockwise torch reference: (tokens, heads, head_dim) -> same, linear memory in tokens."""
    check_window_inputs(q, k, v, cu_seqlens, window, positions)
    tokens, heads, dim = q.shape
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    if tokens == 0:
        return q * 0 + k * 0 + v * 0
    block = block or max(16, min(128, window))
    nb = -(-tokens // block)                                      # query blocks
    span = block + 2 * window                                      # keys seen by one block
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    qc, kc, vc = (t.to(compute) for t in (q, k, v))                # no copy when already `compute`
    seq = sequence_ids(cu_seqlens, tokens)
    pack = torch.arange(tokens, device=q.device)
    pos = packed_positions(cu_seqlens, tokens) if positions is None else positions.long()
    right = nb * block - tokens                                    # query padding of the last block

    def keys(t, fill):                  # (tokens,) -> (nb, span) view: block b sees b * block - window + [0, span)
        return F.pad(t, (window, right + window), value=fill).unfold(0, span, block)

    seq_k, pos_k = keys(seq, -2), keys(pos, 0)                     # -2: no key (padding)
    # A block whose keys are real, of one sequence, at consecutive positions has the mask `band` (the
    # same for all such blocks): those run on views of q, k, v under one broadcast mask; the others
    # (sequence edges, holes, the ends) gather their keys and build their own mask.
    step = keys(pos - pack, 0)
    plain = (seq_k == seq_k[:, :1]).all(1) & (step == step[:, :1]).all(1)
    i, s = torch.arange(block, device=q.device)[:, None], torch.arange(span, device=q.device)
    band = (i + window - s).abs() <= window                        # (block, span)
    out = qc.new_empty(nb, block, heads, dim)
    chunk = max(1, _MAX_SCORES // (heads * block * span))          # bounds the scores of a math fallback

    def attend(idx, qb, kb, vb, mask):                             # (n, block|span, heads, dim) -> out[idx]
        o = F.scaled_dot_product_attention(qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2),
                                           attn_mask=mask, dropout_p=dropout_p, scale=scale)
        out[idx] = o.transpose(1, 2)

    lo, hi = -(-window // block), (tokens - block - window) // block + 1     # blocks with all keys real
    compiling = torch.compiler.is_compiling()
    if compiling:          # no data-dependent shapes in a traced graph: all blocks gather
        lo, hi, rest = 0, 0, torch.arange(nb, device=q.device)
    else:
        rest = (~plain).nonzero().squeeze(1)                       # host sync (free on CPU)
    for a in range(lo, hi, chunk):
        b = min(hi, a + chunk)
        kv = [t[a * block - window:b * block + window].unfold(0, span, block).movedim(-1, 1) for t in (kc, vc)]
        attend(slice(a, b), qc[a * block:b * block].view(b - a, block, heads, dim), *kv, band)
    # Traced: every block in one chunk. A Python loop over the symbolic block count would make it a
    # constant, and the compiled model would be compiled again for each new length.
    for a in ((0,) if compiling else range(0, rest.numel(), chunk)):
        idx = rest if compiling else rest[a:a + chunk]
        kidx = (idx[:, None] * block - window + s).clamp(0, tokens - 1)      # (n, span), padding clamped
        qidx = kidx[:, window:window + block]
        # padding query rows (seq -2, pos 0) see the padding keys: finite, and dropped below
        sq, pq = seq_k[idx, window:window + block], pos_k[idx, window:window + block]
        allowed = ((sq[:, :, None] == seq_k[idx, None, :])
                   & ((pq[:, :, None] - pos_k[idx, None, :]).abs() <= window))
        attend(idx, qc[qidx], kc[kidx], vc[kidx], allowed[:, None])
    return out.view(nb * block, heads, dim)[:tokens].to(q.dtype)
