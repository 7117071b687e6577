"""gelu(x + bias): the FFN's first activation, fused so x is read and written once.

Registered as the custom ops torch.ops.fastbert.bias_gelu and bias_gelu_backward: the Triton kernel
on CUDA (on CPU with interpret=True, in Triton's interpreter), the torch reference on CPU."""
import math
from typing import Tuple

import torch
import torch.nn.functional as F

from fastbert.ops._dispatch import run_kernel, triton_op, use_triton

APPROXIMATE = ("none", "tanh")
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check(x: torch.Tensor, bias: torch.Tensor, approximate: str) -> None:
    if approximate not in APPROXIMATE:
        raise ValueError(f"approximate must be one of {APPROXIMATE}, got {approximate!r}")
    if bias.dim() != 1 or x.dim() < 1 or bias.shape[0] != x.shape[-1]:
        raise ValueError(f"bias must have shape ({x.shape[-1] if x.dim() else '?'},) to match x's last dim; "
                         f"got x {tuple(x.shape)} and bias {tuple(bias.shape)}")
    for name, t in (("x", x), ("bias", bias)):
        if t.dtype not in DTYPES:
            raise ValueError(f"{name} has dtype {t.dtype}; expected one of {DTYPES}")
    if x.device != bias.device:
        raise ValueError(f"x and bias must be on one device, got {x.device} and {bias.device}")


def _compute(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def bias_gelu_ref(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """Pure-torch reference: computes in fp32 (fp64 stays fp64), returns x's dtype."""
    compute = _compute(x.dtype)
    y = F.gelu(x.to(compute) + bias.to(compute), approximate=approximate)
    return y.to(x.dtype)


def _gelu_grad(h: torch.Tensor, approx_tanh: bool) -> torch.Tensor:
    """d gelu / dh, the same formulas as the kernel."""
    if approx_tanh:
        c = math.sqrt(2 / math.pi)
        t = torch.tanh(c * (h + 0.044715 * h ** 3))
        return 0.5 * (1 + t) + 0.5 * h * (1 - t * t) * c * (1 + 3 * 0.044715 * h * h)
    return 0.5 * (1 + torch.erf(h * math.sqrt(0.5))) + h * torch.exp(-0.5 * h * h) / math.sqrt(2 * math.pi)


@triton_op("fastbert::bias_gelu", mutates_args=())
def _bias_gelu_op(x: torch.Tensor, bias: torch.Tensor, approx_tanh: bool, interpret: bool) -> torch.Tensor:
    if run_kernel(x, interpret):
        from fastbert.kernels.bias_gelu import bias_gelu_fwd
        return bias_gelu_fwd(x, bias, approx_tanh)
    return bias_gelu_ref(x, bias, APPROXIMATE[approx_tanh]).contiguous()


@triton_op("fastbert::bias_gelu_backward", mutates_args=())
def _bias_gelu_backward_op(dy: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, approx_tanh: bool,
                           interpret: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    if run_kernel(x, interpret):
        from fastbert.kernels.bias_gelu import bias_gelu_bwd
        return bias_gelu_bwd(dy, x, bias, approx_tanh)
    compute = _compute(x.dtype)
    dx = dy.to(compute) * _gelu_grad(x.to(compute) + bias.to(compute), approx_tanh)
    return dx.to(x.dtype).contiguous(), dx.reshape(-1, x.shape[-1]).sum(0).to(bias.dtype)


@_bias_gelu_op.register_fake
def _(x, bias, approx_tanh, interpret):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@_bias_gelu_backward_op.register_fake
def _(dy, x, bias, approx_tanh, interpret):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), torch.empty_like(bias)


def _setup_context(ctx, inputs, output):
    x, bias, ctx.approx_tanh, ctx.interpret = inputs
    ctx.save_for_backward(x, bias)


def _backward(ctx, dy):
    x, bias = ctx.saved_tensors
    dx, dbias = torch.ops.fastbert.bias_gelu_backward(dy, x, bias, ctx.approx_tanh, ctx.interpret)
    return dx, dbias, None, None


_bias_gelu_op.register_autograd(_backward, setup_context=_setup_context)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, *, approximate: str = "none",
              backend: str = "auto") -> torch.Tensor:
    """gelu(x + bias) over x's last dim; exact erf GELU by default, "tanh" for gelu_new.

    The output has x's dtype; bias may be another float dtype (an fp32 bias on an fp16 GEMM output
    under autocast), its gradient comes back in its own dtype; the math is fp32."""
    _check(x, bias, approximate)
    if torch.float64 in (x.dtype, bias.dtype):
        if backend == "triton":
            raise ValueError("backend='triton' computes in fp32 and takes float16/bfloat16/float32, "
                             "got float64; use backend='torch'")
        backend = "torch"
    if use_triton(backend, x, bias):
        return torch.ops.fastbert.bias_gelu(x, bias, approximate == "tanh", not x.is_cuda)
    return bias_gelu_ref(x, bias, approximate)
