"""Rotary position embeddings (RoPE) for packed tokens, applied to q and k together.

    x = [x1, x2] (halves of head_dim)   ->   [x1 cos - x2 sin,  x2 cos + x1 sin]
    angle[p, i] = p * theta ** (-2i / dim)   (the "rotate_half" layout of transformers' Llama, ModernBERT,
                                              NomicBERT; cos/sin repeat over both halves)

`Rotary` is a small module that owns its cos/sin tables, one per (device, dtype, theta, dim), built on
first use up to `max_positions` (the model's limit, so building one never needs the positions' values
on the host: no sync). `rotary(qkv, cos, sin)` takes the fused QKV projection (tokens, 3, heads, dim)
and returns q and k rotated; v is untouched. q and k go through one elementwise expression together
(one read, one write of the q/k part). The math is in fp32 (fp64 stays fp64; transformers' ModernBERT
upcasts the same way) and cast back on store.

Custom ops (Triton on CUDA, or in Triton's interpreter with interpret=True; the torch reference on CPU):
  torch.ops.fastbert.rotary(qk, cos, sin, conjugate, interpret) -> (tokens, 2, heads, dim), a new buffer;
      autograd: its backward is the same op with conjugate flipped (the inverse rotation).
  torch.ops.fastbert.rotary_(qk, cos, sin, conjugate, interpret) rotates qk in place (inference).
qk is the (tokens, 2, heads, dim) view qkv[:, :2] of the fused projection: no copy of it is made.
"""
from typing import Dict, Tuple

import torch
from torch import nn

from fastbert.ops._dispatch import records_grad, run_kernel, triton_op, use_triton


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


def _rotate_ref(qk, cos, sin, conjugate: bool) -> torch.Tensor:
    """(tokens, 2, heads, dim) -> the rotation of both, in qk's dtype (math in fp32, fp64 stays fp64)."""
    compute = torch.float64 if qk.dtype == torch.float64 else torch.float32
    x1, x2 = qk.to(compute).chunk(2, dim=-1)
    c, s = cos.to(compute)[:, None, None, :], sin.to(compute)[:, None, None, :]
    s = -s if conjugate else s
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(qk.dtype)


@triton_op("fastbert::rotary", mutates_args=())
def _rotary_op(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, conjugate: bool,
               interpret: bool) -> torch.Tensor:
    """q and k (qk (tokens, 2, heads, dim), any strides) rotated into a new contiguous buffer."""
    if run_kernel(qk, interpret) and qk.dtype != torch.float64:
        from fastbert.kernels import rotary as kernel
        out = torch.empty(qk.shape, dtype=qk.dtype, device=qk.device)
        return kernel.rotary_fwd(qk, cos, sin, out=out, conjugate=conjugate)
    return _rotate_ref(qk, cos, sin, conjugate).contiguous()


@triton_op("fastbert::rotary_", mutates_args=("qk",))
def _rotary_inplace_op(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, conjugate: bool,
                       interpret: bool) -> None:
    """q and k rotated in place (inference: nothing may need the unrotated values)."""
    if run_kernel(qk, interpret) and qk.dtype != torch.float64:
        from fastbert.kernels import rotary as kernel
        kernel.rotary_fwd(qk, cos, sin, conjugate=conjugate)
    else:
        qk.copy_(_rotate_ref(qk, cos, sin, conjugate))


@_rotary_op.register_fake
def _(qk, cos, sin, conjugate, interpret):
    return torch.empty(qk.shape, dtype=qk.dtype, device=qk.device)


@_rotary_inplace_op.register_fake
def _(qk, cos, sin, conjugate, interpret):
    return None


def _setup_context(ctx, inputs, output):
    _, cos, sin, conjugate, interpret = inputs
    ctx.save_for_backward(cos, sin)
    ctx.conjugate, ctx.interpret = conjugate, interpret


def _backward(ctx, grad):
    cos, sin = ctx.saved_tensors      # the rotation is orthogonal: its transpose rotates the other way
    return torch.ops.fastbert.rotary(grad, cos, sin, not ctx.conjugate, ctx.interpret), None, None, None, None


_rotary_op.register_autograd(_backward, setup_context=_setup_context)


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

    On the kernel path this is one launch for q and k. inplace=True (inference: qkv must not need a
    gradient) writes into qkv's q/k part and returns views of qkv; otherwise q, k are views of one new
    (tokens, 2, heads, dim) buffer and autograd runs the inverse rotation."""
    _check(qkv, cos, sin)
    if use_triton(backend, qkv, cos, sin) and not (backend == "auto" and qkv.dtype == torch.float64):
        if qkv.dtype == torch.float64:
            raise ValueError("backend='triton' rotary supports float16, bfloat16 and float32, got torch.float64")
        interpret = not qkv.is_cuda
        if inplace and not records_grad(qkv):
            torch.ops.fastbert.rotary_(qkv[:, :2], cos, sin, False, interpret)
            return qkv[:, 0], qkv[:, 1]
        qk = torch.ops.fastbert.rotary(qkv[:, :2], cos, sin, False, interpret)
        return qk[:, 0], qk[:, 1]
    return rotary_ref(qkv, cos, sin)
