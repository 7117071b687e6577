"""layer_norm(x + residual): the post-LN residual block of BERT, fused into one pass."""
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F

from fastbert.ops._dispatch import use_triton

MAX_HIDDEN = 8192


def _check(x, residual, weight, bias, eps) -> None:
    n = x.shape[-1] if x.dim() else 0
    if x.dim() < 1 or n == 0:
        raise ValueError(f"x must have a non-empty last dim, got shape {tuple(x.shape)}")
    if n > MAX_HIDDEN:
        raise ValueError(f"hidden size {n} exceeds {MAX_HIDDEN}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != (n,):
            raise ValueError(f"{name} must have shape ({n},), got {tuple(p.shape)}")
    for name, t in (("residual", residual), ("weight", weight), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    if residual is not None and residual.dtype != x.dtype:
        raise ValueError(f"x and residual must share a dtype, got {x.dtype} and {residual.dtype}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")


def add_layer_norm_ref(x, residual, weight, bias, eps: float = 1e-12, return_sum: bool = False):
    """Pure-torch reference: statistics in fp32 (fp64 stays fp64); output in x's dtype."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    s = x.to(compute) if residual is None else x.to(compute) + residual.to(compute)
    w = None if weight is None else weight.to(compute)
    b = None if bias is None else bias.to(compute)
    y = F.layer_norm(s, (x.shape[-1],), w, b, eps).to(x.dtype)
    return (y, s.to(x.dtype)) if return_sum else y


def add_layer_norm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                   bias: Optional[torch.Tensor], eps: float = 1e-12, *, return_sum: bool = False,
                   backend: str = "auto") -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """layer_norm(x + residual) over the last dim; with return_sum=True also returns x + residual."""
    _check(x, residual, weight, bias, eps)
    tensors = [t for t in (x, residual, weight, bias) if t is not None]
    if use_triton(backend, *tensors):
        from fastbert.ops._add_layer_norm_triton import add_layer_norm_triton
        return add_layer_norm_triton(x, residual, weight, bias, eps, return_sum)
    return add_layer_norm_ref(x, residual, weight, bias, eps, return_sum)
