"""layer_norm(x + residual): the post-LN residual block of BERT, fused into one pass."""
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F

from fastbert.ops._dispatch import records_grad, use_triton

MAX_HIDDEN = 8192
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check(x, residual, weight, bias, eps, dropout_p=0.0) -> None:
    n = x.shape[-1] if x.dim() else 0
    if x.dtype not in DTYPES:
        raise ValueError(f"x has dtype {x.dtype}; expected one of {DTYPES}")
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
    for name, p in (("residual", residual), ("weight", weight), ("bias", bias)):
        if p is not None and p.dtype not in DTYPES:
            raise ValueError(f"{name} has dtype {p.dtype}; expected one of {DTYPES}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")


def add_layer_norm_ref(x, residual, weight, bias, eps: float = 1e-12, return_sum: bool = False):
    """Pure-torch reference: statistics in fp32 (fp64 stays fp64); output in the dtype of x + residual."""
    out = x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)
    compute = torch.float64 if out == torch.float64 else torch.float32
    s = x.to(compute) if residual is None else x.to(compute) + residual.to(compute)
    w = None if weight is None else weight.to(compute)
    b = None if bias is None else bias.to(compute)
    y = F.layer_norm(s, (x.shape[-1],), w, b, eps).to(out)
    return (y, s.to(out)) if return_sum else y


class _AddLayerNorm(torch.autograd.Function):
    """Triton forward/backward. Saves s = dropout(x) + residual (x itself when there is neither), the
    fp32 mean and rstd; the dropout mask is regenerated from the seed, never stored."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps, return_sum, dropout_p, seed):
        from fastbert.kernels.add_layer_norm import add_layer_norm_fwd
        training = any(ctx.needs_input_grad[:4])
        store = return_sum or (training and (residual is not None or dropout_p > 0))
        y, s, mean, rstd = add_layer_norm_fwd(x, residual, weight, bias, eps, store, dropout_p, seed)
        ctx.save_for_backward(x if s is None else s, weight, mean, rstd)
        ctx.args = (x.dtype, None if residual is None else residual.dtype, None if bias is None else bias.dtype,
                    dropout_p, seed, return_sum)
        return (y, s) if return_sum else y

    @staticmethod
    def backward(ctx, dy, dsum=None):
        from fastbert.kernels.add_layer_norm import add_layer_norm_bwd
        s, weight, mean, rstd = ctx.saved_tensors
        x_dtype, residual_dtype, bias_dtype, dropout_p, seed, return_sum = ctx.args
        dx, dres, dw, db = add_layer_norm_bwd(dy, s, weight, mean, rstd, dsum if return_sum else None,
                                              dropout_p, seed, x_dtype, residual_dtype)
        dw = dw.to(weight.dtype) if weight is not None else None
        db = db.to(bias_dtype) if bias_dtype is not None else None
        return dx, (dres if residual_dtype is not None else None), dw, db, None, None, None, None


def add_layer_norm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                   bias: Optional[torch.Tensor], eps: float = 1e-12, *, return_sum: bool = False,
                   dropout_p: float = 0.0, seed: Optional[int] = None,
                   backend: str = "auto") -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """layer_norm(dropout(x) + residual) over the last dim; with return_sum=True also returns the sum.

    The output has the dtype of x + residual (torch's promotion: an fp16 x on an fp32 residual stream,
    as under autocast, gives fp32); weight and bias may be any float dtype; math is fp32.

    dropout_p > 0 is HF's hidden dropout (training mode); the Triton path draws its mask from a
    counter-based generator keyed by `seed` (default: drawn from torch's CPU generator, so
    torch.manual_seed makes it reproducible). dropout_p = 0 is exact."""
    _check(x, residual, weight, bias, eps, dropout_p)
    if seed is not None and not 0 <= seed < 2**31:
        raise ValueError(f"seed must be in [0, 2**31), got {seed}")
    tensors = [t for t in (x, residual, weight, bias) if t is not None]
    if any(t.dtype == torch.float64 for t in tensors):
        if backend == "triton":
            raise ValueError("backend='triton' computes in fp32 and takes float16/bfloat16/float32, "
                             "got float64; use backend='torch'")
        backend = "torch"
    if use_triton(backend, *tensors):
        if seed is None:
            seed = int(torch.randint(0, 2**31 - 1, (1,)).item()) if dropout_p > 0 else 0
        if not records_grad(*tensors):
            from fastbert.kernels.add_layer_norm import add_layer_norm_fwd
            y, s, _, _ = add_layer_norm_fwd(x, residual, weight, bias, eps, return_sum, float(dropout_p), seed)
            return (y, s) if return_sum else y
        return _AddLayerNorm.apply(x, residual, weight, bias, eps, return_sum, float(dropout_p), seed)
    if dropout_p > 0:
        gen = None if seed is None else torch.Generator(device=x.device).manual_seed(seed)
        keep = torch.empty_like(x).bernoulli_(1.0 - dropout_p, generator=gen)
        x = x * keep / (1.0 - dropout_p)
    return add_layer_norm_ref(x, residual, weight, bias, eps, return_sum)
