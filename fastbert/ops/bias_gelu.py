"""gelu(x + bias): the FFN's first activation, fused so x is read and written once."""
import torch
import torch.nn.functional as F

from fastbert.ops._dispatch import use_triton

APPROXIMATE = ("none", "tanh")


def _check(x: torch.Tensor, bias: torch.Tensor, approximate: str) -> None:
    if approximate not in APPROXIMATE:
        raise ValueError(f"approximate must be one of {APPROXIMATE}, got {approximate!r}")
    if bias.dim() != 1 or x.dim() < 1 or bias.shape[0] != x.shape[-1]:
        raise ValueError(f"bias must have shape ({x.shape[-1] if x.dim() else '?'},) to match x's last dim; "
                         f"got x {tuple(x.shape)} and bias {tuple(bias.shape)}")
    if x.dtype != bias.dtype:
        raise ValueError(f"x and bias must share a dtype, got {x.dtype} and {bias.dtype}")
    if x.device != bias.device:
        raise ValueError(f"x and bias must be on one device, got {x.device} and {bias.device}")


def bias_gelu_ref(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """Pure-torch reference: computes in fp32 (fp64 stays fp64), returns x's dtype."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = F.gelu(x.to(compute) + bias.to(compute), approximate=approximate)
    return y.to(x.dtype)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, *, approximate: str = "none",
              backend: str = "auto") -> torch.Tensor:
    """gelu(x + bias) over x's last dim; exact erf GELU by default, "tanh" for gelu_new."""
    _check(x, bias, approximate)
    if use_triton(backend, x, bias):
        from fastbert.ops._bias_gelu_triton import bias_gelu_triton
        return bias_gelu_triton(x, bias, approximate)
    return bias_gelu_ref(x, bias, approximate)
