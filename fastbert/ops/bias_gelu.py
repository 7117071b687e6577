"""gelu(x + bias): the FFN's first activation, fused so x is read and written once."""
import torch
import torch.nn.functional as F

from fastbert.ops._dispatch import records_grad, use_triton

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


def bias_gelu_ref(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """Pure-torch reference: computes in fp32 (fp64 stays fp64), returns x's dtype."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = F.gelu(x.to(compute) + bias.to(compute), approximate=approximate)
    return y.to(x.dtype)


class _BiasGelu(torch.autograd.Function):
    """Triton forward and backward; saves x and bias and recomputes x + bias in the backward."""

    @staticmethod
    def forward(ctx, x, bias, approx_tanh):
        from fastbert.kernels.bias_gelu import bias_gelu_fwd
        ctx.save_for_backward(x, bias)
        ctx.approx_tanh = approx_tanh
        return bias_gelu_fwd(x, bias, approx_tanh)

    @staticmethod
    def backward(ctx, dy):
        from fastbert.kernels.bias_gelu import bias_gelu_bwd
        x, bias = ctx.saved_tensors
        dx, dbias = bias_gelu_bwd(dy, x, bias, ctx.approx_tanh)
        return dx, dbias, None


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
        if not records_grad(x, bias):
            from fastbert.kernels.bias_gelu import bias_gelu_fwd
            return bias_gelu_fwd(x, bias, approximate == "tanh")
        return _BiasGelu.apply(x, bias, approximate == "tanh")
    return bias_gelu_ref(x, bias, approximate)
