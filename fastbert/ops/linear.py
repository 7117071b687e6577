"""x W^T + b with an optional epilogue: GELU (erf or tanh), ReLU, or a residual add.

- `linear_ref`: F.linear, then the activation or the add. Pure torch; the test oracle.
- oneDNN (`torch.ops.mkldnn._linear_pointwise`, the op torch.compile's CPU backend emits) for CPU
  fp32 inference (no tensor needs a gradient), backend="auto" only, eager only: the epilogue runs inside the
  GEMM, so FFN1's 4x-wide activation is written once instead of read and written again, and the
  residual add after an output projection costs no extra pass. On a 2-core x86 box this is
  1.2-1.7x faster than F.linear for BERT's shapes.
- `pack_weight`: oneDNN's blocked copy of a weight, which `linear(..., packed=)` then reads instead
  of reordering the plain weight on every call (at batch 1 that reorder is most of a GEMM: 548 vs
  860 us for a MiniLM layer's four GEMMs at 15 tokens, 1 thread). The copy does not follow later
  writes to the weight: its owner remakes it (fastbert.models.layers.PackedWeights).
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


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's blocked copy of a CPU fp32 (out, in) weight (an opaque mkldnn tensor), for
    `linear(..., packed=)`. A copy: later writes to `weight` do not reach it."""
    if _ONEDNN is None or weight.device.type != "cpu" or weight.dtype != torch.float32 or weight.dim() != 2:
        raise ValueError(f"pack_weight takes a 2-D float32 CPU weight with oneDNN available, got "
                         f"{tuple(weight.shape)} {weight.dtype} on {weight.device}")
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
           activation: Optional[str] = None, residual: Optional[torch.Tensor] = None,
           backend: str = "auto", packed: Optional[torch.Tensor] = None) -> torch.Tensor:
    """act(x W^T + b) (activation "gelu" = exact erf GELU, "gelu_tanh", "relu"), or with
    residual: x W^T + b + residual. Same result on every path, within float rounding.
    packed: pack_weight(weight), read instead of weight when oneDNN runs the call; the caller
    vouches that it is current."""
    _check(x, weight, bias, activation, residual, backend)
    if packed is not None and not (packed.is_mkldnn and packed.shape == weight.shape):
        raise ValueError(f"packed must be pack_weight(weight) for weight {tuple(weight.shape)}, got "
                         f"{'a ' if packed.is_mkldnn else 'a non-packed '}{tuple(packed.shape)} tensor")
    if uses_onednn(x, weight, backend, bias, residual) and (residual is None or residual.dtype == x.dtype):
        x = x.contiguous()
        w = weight if packed is None else packed
        if residual is not None:
            return _ONEDNN.binary(x, residual.contiguous(), w, bias, "add")
        attr, algorithm = _EPILOGUE[activation]
        return _ONEDNN(x, w, bias, attr, [None] if attr in ("none", "gelu") else [], algorithm)
    if activation in ("gelu", "gelu_tanh") and bias is not None:
        h = F.linear(x, weight)                                  # bias is fused into the GELU below
        approximate = "tanh" if activation == "gelu_tanh" else "none"
        return bias_gelu(h, bias.to(h.dtype), approximate=approximate, backend=backend)  # autocast: h may be bf16
    return linear_ref(x, weight, bias, activation, residual)
