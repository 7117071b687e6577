"""Rotary position embeddings (RoPE) for packed tokens, applied to q and k together.

    x = [x1, x2] (halves of head_dim)   ->   [x1 cos - x2 sin,  x2 cos + x1 sin]
    angle[p, i] = p * theta ** (-2i / dim)   (the "rotate_half" layout of transformers' Llama, ModernBERT,
                                              NomicBERT; cos/sin repeat over both halves)

`Rotary` is a small module that owns its cos/sin tables, one per (device, dtype, theta, dim), built on
first use up to `max_positions` (the model's limit, so building one never needs the positions' values
on the host: no sync). `rotary(qkv, cos, sin)` takes the fused QKV projection (tokens, 3, heads, dim)
and returns q and k rotated; v is untouched. q and k go through one elementwise expression together
(one read, one write of the q/k part); on CUDA a Triton kernel does it in place on the QKV buffer
when no gradient is needed. The math is in fp32 (fp64 stays fp64; transformers' ModernBERT upcasts the same way)
and cast back on store.
"""
from typing import Dict, Tuple

import torch
from torch import nn

from fastbert.ops._dispatch import records_grad, use_triton


def inv_freq(theta: float, dim: int) -> torch.Tensor:
    """theta ** (-2i / dim) for i < dim / 2, computed as transformers does (fp32, same expression)."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


class Rotary(nn.Module):
    """cos/sin tables per (device, dtype, theta, dim), held by the model (not a global).

    The tables are plain attributes, not buffers: they are derived from the config, so they are not
    part of the state_dict (transformers keeps its inv_freq non-persistent for the same reason)."""

    def __init__(self, dim: int, max_positions: int):
        super().__init__()
        if dim % 2:
            raise ValueError(f"rotary head_dim must be even, got {dim}")
        if max_positions < 1:
            raise ValueError(f"max_positions must be >= 1, got {max_positions}")
        self.dim, self.max_positions = dim, max_positions
        self._tables: Dict[tuple, Tuple[torch.Tensor, torch.Tensor]] = {}

    def tables(self, theta: float, device, dtype) -> Tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each (max_positions, dim // 2) in `dtype` on `device`."""
        key = (torch.device(device), dtype, float(theta), self.dim)
        if key not in self._tables:
            with torch.inference_mode(False), torch.no_grad():
                pos = torch.arange(self.max_positions, dtype=torch.int64).float()
                angles = pos[:, None] * inv_freq(float(theta), self.dim)[None, :]   # fp32, as transformers
                self._tables[key] = (angles.cos().to(device=device, dtype=dtype),
                                     angles.sin().to(device=device, dtype=dtype))
        return self._tables[key]

    def forward(self, positions: torch.Tensor, theta: float, dtype) -> Tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for each packed token: (tokens,) int positions -> two (tokens, dim // 2) tensors.

        Positions must lie in [0, max_positions) (the models check them with their other inputs)."""
        cos, sin = self.tables(theta, positions.device, dtype)
        return cos.index_select(0, positions), sin.index_select(0, positions)


def _check(qkv, cos, sin) -> None:
    if qkv.dim() != 4 or qkv.shape[1] != 3:
        raise ValueError(f"qkv must be (tokens, 3, heads, head_dim), got shape {tuple(qkv.shape)}")
    half = qkv.shape[-1] // 2
    if qkv.shape[-1] % 2:
        raise ValueError(f"rotary needs an even head_dim, got {qkv.shape[-1]}")
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) != (qkv.shape[0], half):
            raise ValueError(f"{name} must be (tokens, head_dim // 2) = {(qkv.shape[0], half)}, "
                             f"got {tuple(t.shape)}")
        if t.device != qkv.device:
            raise ValueError(f"{name} is on {t.device} but qkv is on {qkv.device}")


def rotary_ref(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Pure torch: (tokens, 3, heads, dim) -> rotated q, k, each (tokens, heads, dim) in qkv's dtype."""
    compute = torch.float64 if qkv.dtype == torch.float64 else torch.float32
    x = qkv[:, :2].to(compute)                                   # (tokens, 2, heads, dim): q and k
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos.to(compute)[:, None, None, :], sin.to(compute)[:, None, None, :]
    out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(qkv.dtype)
    return out[:, 0], out[:, 1]


def rotary(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, backend: str = "auto",
           inplace: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """q, k of a fused QKV projection rotated by per-token cos/sin (from `Rotary`).

    inplace=True lets the kernel write into qkv's q/k part (inference: qkv must not need a gradient);
    the returned q, k are then views of qkv."""
    _check(qkv, cos, sin)
    if use_triton(backend, qkv, cos, sin):
        from fastbert.kernels import rotary as kernel
        if records_grad(qkv):
            return _RotaryFunction.apply(qkv, cos, sin)
        out = qkv if inplace else qkv.clone()
        kernel.rotary_fwd(out, cos, sin)
        return out[:, 0], out[:, 1]
    return rotary_ref(qkv, cos, sin)


class _RotaryFunction(torch.autograd.Function):
    """The kernel both ways: the backward is the inverse rotation (sin negated) of dq, dk."""

    @staticmethod
    def forward(ctx, qkv, cos, sin):
        from fastbert.kernels import rotary as kernel
        out = qkv.clone()
        kernel.rotary_fwd(out, cos, sin)
        ctx.save_for_backward(cos, sin)
        ctx.qkv_shape, ctx.qkv_dtype = qkv.shape, qkv.dtype
        return out[:, 0], out[:, 1]

    @staticmethod
    def backward(ctx, dq, dk):
        from fastbert.kernels import rotary as kernel
        cos, sin = ctx.saved_tensors
        grad = cos.new_zeros(ctx.qkv_shape, dtype=ctx.qkv_dtype)      # v's gradient flows outside this op
        if dq is not None:
            grad[:, 0] = dq
        if dk is not None:
            grad[:, 1] = dk
        kernel.rotary_fwd(grad, cos, sin, conjugate=True)
        return grad, None, None
