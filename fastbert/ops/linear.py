"""x W^T + b with an optional epilogue: GELU (erf or tanh), ReLU, or a residual add.

- `linear_ref`: F.linear, then the activation or the add. Pure torch; the test oracle.
- oneDNN (`torch.ops.mkldnn._linear_pointwise`, the op torch.compile's CPU backend emits) for CPU
  fp32 inference (no tensor needs a gradient), backend="auto" only, eager only: the epilogue runs inside the
  GEMM, so FFN1's 4x-wide activation is written once instead of read and written again, and the
  residual add after an output projection costs no extra pass. On a 2-core x86 box this is
  1.2-1.7x faster than F.linear for BERT's shapes.
- Elsewhere (CUDA, autograd, other dtypes, backend="torch" or "triton"): F.linear, with the GELU
  epilogue as fastbert.ops.bias_gelu on the same backend (its Triton kernel on CUDA).
GEMMs themselves always stay with torch (cuBLAS / oneDNN); there is no Triton GEMM.
"""
from typing import Optional

import torch
import torch.nn.functional as F

from fastbert.ops._dispatch import BACKENDS
from fastbert.ops.bias_gelu import bias_gelu

ACTIVATIONS = (None, "gelu", "gelu_tanh", "relu")
_ONEDNN = getattr(torch.ops.mkldnn, "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None
# activation -> (oneDNN post-op, its algorithm)
_EPILOGUE = {None: ("none", ""), "gelu": ("gelu", "none"), "gelu_tanh": ("gelu", "tanh"), "relu": ("relu", "")}


def _check(x, weight, bias, activation, residual, backend) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if activation is not None and residual is not None:
        raise ValueError("linear takes one epilogue: an activation or a residual, not both")
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} does not fit weight {tuple(weight.shape)} (in_features last)")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    if residual is not None and tuple(residual.shape) != (*x.shape[:-1], weight.shape[0]):
        raise ValueError(f"residual must have shape {(*x.shape[:-1], weight.shape[0])}, got {tuple(residual.shape)}")


def uses_onednn(x: torch.Tensor, weight: torch.Tensor, backend: str = "auto", bias: Optional[torch.Tensor] = None,
                residual: Optional[torch.Tensor] = None) -> bool:
    """True when `linear` runs this call as one oneDNN GEMM with its epilogue fused. Never while
    torch.compile traces: the op has no fake kernel, and Inductor makes the same fusion itself
    from F.linear (with weights it packs). Never when any operand needs a gradient: the op has no
    backward, so a trainable bias beside a frozen weight (BitFit) would get none."""
    operands = (x, weight, bias, residual)
    return (backend == "auto" and _ONEDNN is not None and not torch.compiler.is_compiling()
            and x.device.type == "cpu" and x.dim() == 2
            and x.dtype == weight.dtype == torch.float32
            and not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in operands)))


def linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
               activation: Optional[str] = None, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Pure-torch reference: act(x W^T + b) or x W^T + b + residual."""
    y = F.linear(x, weight, bias)
    if activation == "gelu":
        y = F.gelu(y)
    elif activation == "gelu_tanh":
        y = F.gelu(y, approximate="tanh")
    elif activation == "relu":
        y = torch.relu(y)
    return y if residual is None else y + residual


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
           activation: Optional[str] = None, residual: Optional[torch.Tensor] = None,
           backend: str = "auto") -> torch.Tensor:
    """act(x W^T + b) (activation "gelu" = exact erf GELU, "gelu_tanh", "relu"), or with
    residual: x W^T + b + residual. Same result on every path, within float rounding."""
    _check(x, weight, bias, activation, residual, backend)
    if uses_onednn(x, weight, backend, bias, residual) and (residual is None or residual.dtype == x.dtype):
        x = x.contiguous()
        if residual is not None:
            return _ONEDNN.binary(x, residual.contiguous(), weight, bias, "add")
        attr, algorithm = _EPILOGUE[activation]
        return _ONEDNN(x, weight, bias, attr, [None] if attr in ("none", "gelu") else [], algorithm)
    if activation in ("gelu", "gelu_tanh") and bias is not None:
        h = F.linear(x, weight)                                  # bias is fused into the GELU below
        approximate = "tanh" if activation == "gelu_tanh" else "none"
        return bias_gelu(h, bias.to(h.dtype), approximate=approximate, backend=backend)  # autocast: h may be bf16
    return linear_ref(x, weight, bias, activation, residual)
