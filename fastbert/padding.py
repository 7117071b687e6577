"""Unpad / repad: pack the real tokens of a padded batch, and put them back.

The encoder works on packed (tokens, hidden) rows so no FLOP is spent on padding; attention sees
each sequence through `cu_seqlens` (cumulative lengths, int32, flash-attention's varlen layout).
Padding is removed once before the first layer and restored once after the last.
"""
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F


@dataclass
class Packing:
    indices: Optional[torch.Tensor]  # (tokens,) int64 flat positions of real tokens in (batch*seq); None: no padding
    cu_seqlens: torch.Tensor         # (batch + 1,) int32
    max_seqlen: int
    batch: int
    seqlen: int

    @property
    def total(self) -> int:
        return self.batch * self.seqlen if self.indices is None else self.indices.numel()


def unpad(attention_mask: Optional[torch.Tensor], batch: int, seqlen: int, device) -> Packing:
    """Packing for a (batch, seq) mask with 1 for real tokens (None: all real).

    Tokens keep their order inside a row; a mask with holes packs the row's real tokens together,
    which is what a key-padding mask means for attention."""
    # cu_seqlens is built as a normal tensor even under torch.inference_mode: fastbert.ops reads its
    # version counter to validate it once per forward, and inference tensors have none.
    with torch.inference_mode(False):
        if attention_mask is None:
            lengths = torch.full((batch,), seqlen, dtype=torch.int32, device=device)
            cu = F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
            return Packing(None, cu, seqlen, batch, seqlen)
        keep = attention_mask.bool()
        lengths = keep.sum(1, dtype=torch.int32)
        cu = F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
    max_seqlen = int(lengths.max()) if batch else 0
    if max_seqlen == seqlen and bool(keep.all()):
        return Packing(None, cu, seqlen, batch, seqlen)
    indices = keep.flatten().nonzero().squeeze(1)
    return Packing(indices, cu, max_seqlen, batch, seqlen)


def pack(x: torch.Tensor, packing: Packing) -> torch.Tensor:
    """(batch, seq, ...) -> (tokens, ...)."""
    flat = x.reshape(packing.batch * packing.seqlen, *x.shape[2:])
    return flat if packing.indices is None else flat.index_select(0, packing.indices)


def repad(x: torch.Tensor, packing: Packing) -> torch.Tensor:
    """(tokens, ...) -> (batch, seq, ...), zeros at padding."""
    shape = (packing.batch, packing.seqlen, *x.shape[1:])
    if packing.indices is None:
        return x.reshape(shape)
    out = x.new_zeros((packing.batch * packing.seqlen, *x.shape[1:]))
    return out.index_copy(0, packing.indices, x).view(shape)
