"""layer_norm(x + residual): the post-LN residual block of BERT, fused into one pass.

Registered as the custom ops torch.ops.fastbert.add_layer_norm and add_layer_norm_backward: the
Triton kernel on CUDA (on CPU with interpret=True, in Triton's interpreter), the torch reference on
CPU (without dropout: the kernel's Philox mask has no torch equivalent; add_layer_norm(backend="torch")
draws its own). CPU float32 inference takes fastbert._C's LayerNorm instead (csrc/py_layers.cpp, the
one of the C++ layer stack): each row alone, on the calling thread up to 2**16 values, so that a
short text's embeddings wake none of torch's OpenMP threads, which split even 26 rows and then spin
on the cores that the C++ layer stack (fastbert.models.layers.run_lean) starts on next (one 26-token
text on 2 threads: 2.7-2.8 ms with it, 4.2-4.7 with torch's); at every size, so that a row's bits
never depend on how many rows share the call (the int8 path's batch independence rests on that)."""
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F

from fastbert import _C
from fastbert.ops._dispatch import draw_seed, records_grad, run_kernel, triton_op, use_triton

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


def _stores_sum(residual, return_sum, dropout_p, save_stats) -> bool:
    # s = dropout(x) + residual is an output when asked for, and saved for the backward when it is
    # not x itself
    return return_sum or (save_stats and (residual is not None or dropout_p > 0))


def _no_ref_dropout(dropout_p) -> None:
    if dropout_p > 0:
        raise ValueError("fastbert::add_layer_norm on CPU tensors runs the torch reference, which has no "
                         "Philox dropout; use interpret=True, or add_layer_norm(..., backend='torch')")


def _stats_ref(x, residual, weight, bias, eps):
    """(y, s, mean, rstd) in the kernel's dtypes, computed in fp32 (fp64 stays fp64)."""
    out = x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)
    compute = torch.float64 if out == torch.float64 else torch.float32
    s = x.to(compute) if residual is None else x.to(compute) + residual.to(compute)
    mean = s.mean(-1, keepdim=True)
    rstd = torch.rsqrt((s - mean).pow(2).mean(-1, keepdim=True) + eps)
    y = (s - mean) * rstd
    y = y if weight is None else y * weight.to(compute)
    y = y if bias is None else y + bias.to(compute)
    return (y.to(out).contiguous(), s.to(out).contiguous(), mean.reshape(-1).float(), rstd.reshape(-1).float())


@triton_op("fastbert::add_layer_norm", mutates_args=())
def _add_layer_norm_op(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                       bias: Optional[torch.Tensor], eps: float, return_sum: bool, dropout_p: float,
                       seed: Optional[torch.Tensor], save_stats: bool, interpret: bool
                       ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, s, mean, rstd); s is empty unless _stores_sum(), mean and rstd are empty unless save_stats."""
    store = _stores_sum(residual, return_sum, dropout_p, save_stats)
    if run_kernel(x, interpret):
        from fastbert.kernels.add_layer_norm import add_layer_norm_fwd
        y, s, mean, rstd = add_layer_norm_fwd(x, residual, weight, bias, eps, store, dropout_p, seed, save_stats)
    else:
        _no_ref_dropout(dropout_p)
        y, s, mean, rstd = _stats_ref(x, residual, weight, bias, eps)
    empty = mean if save_stats else torch.empty(0, dtype=torch.float32, device=x.device)
    return y, (s if store else y.new_empty(0)), empty, (rstd if save_stats else empty.clone())


@_add_layer_norm_op.register_fake
def _(x, residual, weight, bias, eps, return_sum, dropout_p, seed, save_stats, interpret):
    out = x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)
    y = torch.empty(x.shape, dtype=out, device=x.device)
    s = torch.empty_like(y) if _stores_sum(residual, return_sum, dropout_p, save_stats) else y.new_empty(0)
    rows = x.numel() // x.shape[-1] if save_stats else 0
    stats = torch.empty(rows, dtype=torch.float32, device=x.device)
    return y, s, stats, torch.empty_like(stats)


def _separate_dresidual(dropout_p, x_dtype, residual_dtype) -> bool:
    # the residual's gradient is dx itself unless dropout or a dtype stands between them
    return residual_dtype is not None and (dropout_p > 0 or residual_dtype != x_dtype)


@triton_op("fastbert::add_layer_norm_backward", mutates_args=())
def _add_layer_norm_backward_op(dy: torch.Tensor, dsum: Optional[torch.Tensor], s: torch.Tensor,
                                weight: Optional[torch.Tensor], mean: torch.Tensor, rstd: torch.Tensor,
                                dropout_p: float, seed: Optional[torch.Tensor], x_dtype: torch.dtype,
                                residual_dtype: Optional[torch.dtype], interpret: bool
                                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dresidual, dweight, dbias); dresidual is empty unless _separate_dresidual() (it is dx then),
    dweight and dbias are fp32 sums."""
    separate = _separate_dresidual(dropout_p, x_dtype, residual_dtype)
    if run_kernel(s, interpret):
        from fastbert.kernels.add_layer_norm import add_layer_norm_bwd
        dx, dres, dw, db = add_layer_norm_bwd(dy, s, weight, mean, rstd, dsum, dropout_p, seed, x_dtype,
                                              residual_dtype if separate else x_dtype)
        return dx, (dres if separate else dx.new_empty(0)), dw, db
    _no_ref_dropout(dropout_p)
    n = s.shape[-1]
    compute = torch.float64 if s.dtype == torch.float64 else torch.float32
    s2, dy2 = s.reshape(-1, n).to(compute), dy.reshape(-1, n).to(compute)
    xhat = (s2 - mean.to(compute)[:, None]) * rstd.to(compute)[:, None]
    g = dy2 if weight is None else dy2 * weight.to(compute)
    ds = (g - xhat * (g * xhat).mean(-1, keepdim=True) - g.mean(-1, keepdim=True)) * rstd.to(compute)[:, None]
    if dsum is not None:
        ds = ds + dsum.reshape(-1, n).to(compute)
    ds = ds.view(s.shape)
    dres = ds.to(residual_dtype) if separate else s.new_empty(0, dtype=x_dtype)
    return ds.to(x_dtype), dres, (dy2 * xhat).sum(0).float(), dy2.sum(0).float()


@_add_layer_norm_backward_op.register_fake
def _(dy, dsum, s, weight, mean, rstd, dropout_p, seed, x_dtype, residual_dtype, interpret):
    separate = _separate_dresidual(dropout_p, x_dtype, residual_dtype)
    dx = torch.empty(s.shape, dtype=x_dtype, device=s.device)
    dres = torch.empty(s.shape, dtype=residual_dtype, device=s.device) if separate else dx.new_empty(0)
    stat = torch.empty(s.shape[-1], dtype=torch.float32, device=s.device)
    return dx, dres, stat, torch.empty_like(stat)


def _setup_context(ctx, inputs, output):
    x, residual, weight, bias, _, return_sum, dropout_p, seed, save_stats, interpret = inputs
    y, s, mean, rstd = output
    if not save_stats:
        ctx.mark_non_differentiable(y)  # nothing saved: a backward would be wrong, so there is none
    ctx.mark_non_differentiable(mean, rstd)
    stored = _stores_sum(residual, return_sum, dropout_p, save_stats)
    ctx.save_for_backward(s if stored else x, weight, mean, rstd, seed)
    ctx.args = (x.dtype, None if residual is None else residual.dtype, None if bias is None else bias.dtype,
                dropout_p, return_sum, interpret)


def _backward(ctx, dy, dsum, _dmean, _drstd):
    s, weight, mean, rstd, seed = ctx.saved_tensors
    x_dtype, residual_dtype, bias_dtype, dropout_p, return_sum, interpret = ctx.args
    dy = torch.zeros_like(s) if dy is None else dy
    dsum = dsum if return_sum else None
    dx, dres, dw, db = torch.ops.fastbert.add_layer_norm_backward(
        dy, dsum, s, weight, mean, rstd, dropout_p, seed, x_dtype, residual_dtype, interpret)
    if residual_dtype is not None and not _separate_dresidual(dropout_p, x_dtype, residual_dtype):
        dres = dx
    return (dx, dres if residual_dtype is not None else None,
            dw.to(weight.dtype) if weight is not None else None,
            db.to(bias_dtype) if bias_dtype is not None else None, None, None, None, None, None, None)


_add_layer_norm_op.register_autograd(_backward, setup_context=_setup_context)


def add_layer_norm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                   bias: Optional[torch.Tensor], eps: float = 1e-12, *, return_sum: bool = False,
                   dropout_p: float = 0.0, seed: Optional[int] = None,
                   backend: str = "auto") -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """layer_norm(dropout(x) + residual) over the last dim; with return_sum=True also returns the sum.

    The output has the dtype of x + residual (torch's promotion: an fp16 x on an fp32 residual stream,
    as under autocast, gives fp32); weight and bias may be any float dtype; math is fp32.

    dropout_p > 0 is HF's hidden dropout (training mode); the Triton path draws its mask from a
    counter-based generator keyed by `seed` (default: a seed drawn on x's device by torch's generator,
    so torch.manual_seed makes it reproducible and a CUDA graph can capture it). dropout_p = 0 is exact."""
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
        seed_t = None
        if dropout_p > 0:
            seed_t = (draw_seed(x.device) if seed is None
                      else torch.tensor([seed], dtype=torch.int64).to(x.device, non_blocking=True))
        y, s, _, _ = torch.ops.fastbert.add_layer_norm(x, residual, weight, bias, float(eps), return_sum,
                                                       float(dropout_p), seed_t, records_grad(*tensors),
                                                       not x.is_cuda)
        return (y, s) if return_sum else y
    if (backend == "auto" and dropout_p == 0 and not return_sum and _cpu_inference(x, residual, weight, bias)
            and (out := _layer_norm_f32(x, residual, weight, bias, eps)) is not None):
        return out
    if dropout_p > 0:
        gen = None if seed is None else torch.Generator(device=x.device).manual_seed(seed)
        keep = torch.empty_like(x).bernoulli_(1.0 - dropout_p, generator=gen)
        x = x * keep / (1.0 - dropout_p)
    return add_layer_norm_ref(x, residual, weight, bias, eps, return_sum)


def _cpu_inference(x, residual, weight, bias) -> bool:
    """CPU float32 (rows, n) inference with both LayerNorm parameters: nothing needs a gradient, not traced."""
    operands = (x, residual, weight, bias)
    return (x.device.type == "cpu" and x.dim() == 2 and weight is not None and bias is not None
            and all(t is None or (t.dtype == torch.float32 and t.device.type == "cpu") for t in operands)
            and (residual is None or residual.shape == x.shape) and not torch.compiler.is_compiling()
            and not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in operands)))


def _layer_norm_f32(x, residual, weight, bias, eps) -> Optional[torch.Tensor]:
    out = torch.empty(x.shape, dtype=torch.float32)
    done = _C.layer_norm_f32(x.contiguous().numpy(), None if residual is None else residual.contiguous().numpy(),
                             weight.detach().contiguous().numpy(), bias.detach().contiguous().numpy(), float(eps),
                             out.numpy(), torch.get_num_threads())
    return out if done else None


def embed_layer_norm_cpu(input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: Optional[torch.Tensor],
                         word: torch.Tensor, position: torch.Tensor, token_type: Optional[torch.Tensor],
                         weight: torch.Tensor, bias: torch.Tensor, eps: float) -> Optional[torch.Tensor]:
    """The embeddings' lookups and LayerNorm in one C++ pass for CPU float32 inference:
    layer_norm(word[input_ids] + (position[position_ids] + token_type[token_type_ids])) on packed
    (tokens,) ids, token_type_ids None meaning type 0 and token_type None no type table; the sums in
    the order the embeddings module's torch ops add them, so the result is theirs bit for bit. None
    where this path does not apply (another device or dtype, a gradient to record, under
    torch.compile, no AVX-512): the caller runs its torch ops. A short text's lookups, adds and
    LayerNorm were a dozen torch calls, slowest right after a forward has streamed the weights
    through the caches; here one. An id outside its table is an IndexError."""
    tables = (word, position, weight, bias) if token_type is None else (word, position, token_type, weight, bias)
    if (torch.is_grad_enabled() and any(t.requires_grad for t in tables)) or torch.compiler.is_compiling():
        return None
    for t in tables:
        if t.dtype != torch.float32 or t.device.type != "cpu":
            return None
    for i in (input_ids, position_ids) if token_type_ids is None else (input_ids, position_ids, token_type_ids):
        if i.device.type != "cpu" or i.dim() != 1 or i.is_floating_point():
            return None
    out = torch.empty((input_ids.shape[0], word.shape[1]))
    done = _C.embed_layer_norm_f32(_host_ids(input_ids), _host_ids(position_ids), _host_ids(token_type_ids),
                                   _host_table(word), _host_table(position), _host_table(token_type),
                                   _host_table(weight), _host_table(bias), float(eps), out.numpy(),
                                   torch.get_num_threads())
    return out if done else None


def _host_ids(ids: Optional[torch.Tensor]):
    return None if ids is None else (ids if ids.dtype == torch.int64 else ids.long()).contiguous().numpy()


def _host_table(t: Optional[torch.Tensor]):
    return None if t is None else t.detach().contiguous().numpy()
