"""Unpad / repad: pack the real tokens of a padded batch, and put them back.

The encoder works on packed (tokens, hidden) rows so no FLOP is spent on padding; attention sees
each sequence through `cu_seqlens` (cumulative lengths, int32, flash-attention's varlen layout).
Padding is removed once before the first layer and restored once after the last.
"""
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F


@dataclass
class Packing:
    indices: Optional[torch.Tensor]  # (tokens,) int64 flat positions of real tokens in (batch*seq); None: no padding
    cu_seqlens: torch.Tensor         # (batch + 1,) int32
    max_seqlen: int
    batch: int
    seqlen: int                      # padded length (the packed entry: max_seqlen)

    @property
    def total(self) -> int:
        return self.batch * self.seqlen if self.indices is None else self.indices.numel()

    def mask(self) -> torch.Tensor:
        """(batch, seq) bool, True at real tokens."""
        device = self.cu_seqlens.device
        if self.indices is None:
            return torch.ones(self.batch, self.seqlen, dtype=torch.bool, device=device)
        keep = torch.zeros(self.batch * self.seqlen, dtype=torch.bool, device=device)
        return keep.index_fill(0, self.indices, True).view(self.batch, self.seqlen)


def mask_stats(attention_mask: torch.Tensor) -> torch.Tensor:
    """(2,) int64 on the mask's device: the longest row and the number of real tokens. Read it on
    the host together with other values (one sync) and hand it to `unpad`."""
    keep = attention_mask.bool()
    if keep.numel() == 0:
        return torch.zeros(2, dtype=torch.int64, device=keep.device)
    lengths = keep.sum(1)
    return torch.stack([lengths.max(), lengths.sum()])


def unpad(attention_mask: Optional[torch.Tensor], batch: int, seqlen: int, device,
          host_stats: Optional[Sequence[int]] = None) -> Packing:
    """Packing for a (batch, seq) mask with 1 for real tokens (None: all real).

    `host_stats` is mask_stats(attention_mask) already read on the host; without it unpad reads
    it (one device-to-host sync). Nothing else here waits for the device.
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
    if host_stats is None:
        host_stats = mask_stats(keep).tolist()
    max_seqlen, total = (int(v) for v in host_stats)
    if total == batch * seqlen:
        return Packing(None, cu, seqlen, batch, seqlen)
    indices = torch.nonzero_static(keep.flatten(), size=total).squeeze(1)   # size known: no sync
    return Packing(indices, cu, max_seqlen, batch, seqlen)


def packed_positions(cu_seqlens: torch.Tensor, tokens: int, offset: int = 0) -> torch.Tensor:
    """(tokens,) int64 position of each packed token in its sequence (0..len-1, plus `offset`),
    computed on the device from cu_seqlens (no sync)."""
    index = torch.arange(tokens, device=cu_seqlens.device, dtype=torch.int32)
    sequence = torch.searchsorted(cu_seqlens[1:].contiguous(), index, right=True)   # (tokens,) which sequence
    return (index - cu_seqlens[sequence]).long() + offset


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
