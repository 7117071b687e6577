"""The packed (varlen) layout, in one place: unpad / repad, per-sequence positions, and its checks.

Packed tokens sit back to back, (tokens, ...), so no FLOP is spent on padding; sequence b is rows
cu_seqlens[b]:cu_seqlens[b + 1] (cumulative lengths, int32, (batch + 1,): flash-attention's varlen
layout) and none is longer than max_seqlen. The models remove padding once before the first layer
and restore it once after the last (`unpad`, `pack`, `repad` over a `Packing`); the torch references
of the attention ops lay packed tokens out as (batch, max_seqlen) and back (`repad_index`,
`unpad_index`). Nothing here reads a device tensor's values, except `check_cu_seqlens` (host side)
and `unpad` without its host stats.
"""
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

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


# ---- a padded batch <-> packed tokens ----------------------------------------------------------------
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


# ---- where each packed token is, from cu_seqlens alone (on the device, no sync) ---------------------
def sequence_ids(cu_seqlens: torch.Tensor, tokens: int) -> torch.Tensor:
    """(tokens,) int64 index of the packed sequence each token belongs to."""
    # count the sequence ends at or before each token: a histogram and a cumsum (searchsorted is far slower)
    ends = cu_seqlens[1:].long().clamp(max=tokens)
    return torch.zeros(tokens + 1, dtype=torch.long, device=ends.device).index_add_(
        0, ends, torch.ones_like(ends)).cumsum(0)[:tokens]


def packed_positions(cu_seqlens: torch.Tensor, tokens: int, offset: int = 0) -> torch.Tensor:
    """(tokens,) int64 position of each token inside its sequence: 0..len-1 each, plus `offset`."""
    # each sequence's start: cu[0], plus from each later start on the length of the one before (a cumsum)
    cu = cu_seqlens.long()
    at = torch.cat([cu.new_zeros(1), cu[1:].clamp(max=tokens)])
    starts = cu.new_zeros(tokens + 1).index_add_(0, at, cu.diff(prepend=cu.new_zeros(1)))
    return torch.arange(tokens, device=cu.device) - starts.cumsum(0)[:tokens] + offset


def token_positions(packing: Packing, tokens: int) -> torch.Tensor:
    """(tokens,) int64 position of each real token: its column in its padded row (transformers'
    numbering; a mask with holes keeps them), or without padding (the packed entry) its offset in its
    sequence."""
    if packing.indices is None:
        return packed_positions(packing.cu_seqlens, tokens)
    return packing.indices % packing.seqlen


def repad_index(cu_seqlens: torch.Tensor, max_seqlen: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(src, mask) for laying packed tokens out as (batch, max_seqlen): src (batch * max_seqlen,) the
    packed token each padded slot reads (token 0 for padding slots), mask (batch, max_seqlen) True at
    real slots. `t.index_select(0, src).view(batch, max_seqlen, ...)` gathers (no scatter into zeros)."""
    starts, lengths = cu_seqlens[:-1].long(), (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    pos = torch.arange(max_seqlen, device=cu_seqlens.device)
    mask = pos[None, :] < lengths[:, None]                           # (batch, max_seqlen)
    return torch.where(mask, starts[:, None] + pos[None, :], 0).flatten(), mask


def unpad_index(cu_seqlens: torch.Tensor, max_seqlen: int, tokens: int) -> torch.Tensor:
    """(tokens,) int64: where each packed token sits in the (batch * max_seqlen) padded layout, the
    inverse of `repad_index`. Built from cu_seqlens alone (no nonzero(): its size would depend on
    the values, a torch.compile break)."""
    return sequence_ids(cu_seqlens, tokens) * max_seqlen + packed_positions(cu_seqlens, tokens)


# ---- checks ----------------------------------------------------------------------------------------
def check_packed_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ValueError unless q, k, v are packed (tokens, heads, head_dim) tensors of one shape."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D (tokens, heads, head_dim), got shape {tuple(t.shape)}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")


def check_cu_seqlens_shape(cu_seqlens: torch.Tensor, min_length: int = 2) -> None:
    """Raise ValueError unless cu_seqlens is 1-D int32 of length batch + 1 >= min_length (1 admits an
    empty batch). Reads no values: safe on a device tensor and under torch.compile."""
    if cu_seqlens.dtype != torch.int32:
        raise ValueError(f"cu_seqlens must be 1-D int32, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < min_length:
        raise ValueError(f"cu_seqlens must be 1-D int32 of length batch + 1 >= {min_length}, "
                         f"got shape {tuple(cu_seqlens.shape)}")


def check_cu_seqlens(cu_seqlens: torch.Tensor, total_tokens: int, max_seqlen: int, min_length: int = 2) -> None:
    """Raise ValueError unless cu_seqlens (int32, (batch + 1,)) starts at 0, never decreases, ends at
    total_tokens and has no sequence longer than max_seqlen. Reads the values: call it on the host
    copy (a CUDA tensor would sync)."""
    check_cu_seqlens_shape(cu_seqlens, min_length)
    c = cu_seqlens.tolist()
    if c[0] != 0 or c[-1] != total_tokens:
        raise ValueError(f"cu_seqlens must start at 0 and end at total_tokens={total_tokens}, "
                         f"got {c[0]} ... {c[-1]}")
    lengths = [b - a for a, b in zip(c[:-1], c[1:])]
    bad = [i for i, n in enumerate(lengths) if n < 0]
    if bad:
        raise ValueError(f"cu_seqlens must be non-decreasing; it decreases at index {bad[0] + 1}: {c}")
    if max(lengths, default=0) > max_seqlen:
        raise ValueError(f"max_seqlen={max_seqlen} is smaller than the longest sequence ({max(lengths)})")
