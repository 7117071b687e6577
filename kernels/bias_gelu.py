# Fused bias + GELU, forward and backward (the activation after BERT's first FFN GEMM).
#
#   forward:  h = x + b            y = gelu(h)
#   backward: dx = dy * gelu'(h)   db = sum over rows of dx
#
# GELU is the exact erf form by default, gelu(h) = h/2 * (1 + erf(h / sqrt 2)), with
#   gelu'(h) = (1 + erf(h / sqrt 2)) / 2 + h * exp(-h^2 / 2) / sqrt(2 pi);
# APPROX_TANH selects the tanh form of Hendrycks & Gimpel (arXiv:1606.08415, eq. 2),
#   gelu(h) = h/2 * (1 + tanh(u)),  u = sqrt(2/pi) * (h + 0.044715 h^3),
#   gelu'(h) = (1 + t)/2 + h/2 * (1 - t^2) * sqrt(2/pi) * (1 + 3 * 0.044715 h^2),  t = tanh(u).
# Limits: x is (n_rows, n_cols) with unit column stride (any row stride), b is (n_cols,);
# fp32 / fp16 / bf16 in (b may differ from x), y and dx in x's dtype; all math in fp32, cast on store.
# db is deterministic: each program sums its rows into its own row of an (n_programs, n_cols) fp32
# buffer, and the launcher adds those rows up in a fixed order (no atomics).
import torch
import triton
import triton.language as tl

from fastbert.kernels._autotune import TunedKernel
from fastbert.kernels._common import as_2d, split_rows

# compiled kernels read globals only when they are tl.constexpr; keep a tensor on the left of
# `*` with them (in the interpreter, constexpr * tensor stays a constexpr)
_SQRT1_2 = tl.constexpr(0.7071067811865476)       # 1 / sqrt(2)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1 / sqrt(2 pi)
_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)  # sqrt(2 / pi)


@triton.jit
def _tanh_parts(u):
    # (tanh(u), 1 - tanh(u)^2) from e = exp(-2|u|) in (0, 1]: no overflow, and 1 - t^2 = 4e / (1 + e)^2
    # keeps full precision where t is close to +-1
    e = tl.exp(-2.0 * tl.abs(u))
    t = (1.0 - e) / (1.0 + e)
    t = tl.where(u < 0, -t, t)
    return t, 4.0 * e / ((1.0 + e) * (1.0 + e))


@triton.jit
def _bias_gelu_fwd_kernel(
    y_ptr,        # (n_rows, n_cols) output, row stride stride_y
    x_ptr,        # (n_rows, n_cols) input, row stride stride_x
    b_ptr,        # (n_cols,) bias
    n_rows, n_cols, stride_x, stride_y,
    APPROX_TANH: tl.constexpr,  # tanh GELU instead of erf
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    rows64 = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    h = x + b[None, :]
    if APPROX_TANH:
        t, _ = _tanh_parts((h + 0.044715 * h * h * h) * _SQRT_2_OVER_PI)
        y = 0.5 * h * (1.0 + t)
    else:
        y = 0.5 * h * (1.0 + tl.math.erf(h * _SQRT1_2))
    tl.store(y_ptr + rows64 * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bias_gelu_bwd_kernel(
    dx_ptr,       # (n_rows, n_cols) output grad of x, row stride stride_dx
    dbp_ptr,      # (n_programs_m, n_cols) fp32 output: this program row's partial sum of dx
    dy_ptr,       # (n_rows, n_cols) grad of y, row stride stride_dy
    x_ptr,        # (n_rows, n_cols) forward input, row stride stride_x
    b_ptr,        # (n_cols,) bias
    n_rows, n_cols, stride_dx, stride_dy, stride_x,
    rows_per_program,           # each program walks this many rows, BLOCK_M at a time
    APPROX_TANH: tl.constexpr,  # tanh GELU instead of erf
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    row_start = pid_m * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    for r in range(row_start, row_end, BLOCK_M):
        rows = r + tl.arange(0, BLOCK_M)
        mask = (rows[:, None] < row_end) & col_ok[None, :]
        rows64 = rows.to(tl.int64)[:, None]
        x = tl.load(x_ptr + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows64 * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        h = x + b[None, :]
        if APPROX_TANH:
            t, sech2 = _tanh_parts((h + 0.044715 * h * h * h) * _SQRT_2_OVER_PI)
            grad = 0.5 * (1.0 + t) + 0.5 * h * sech2 * _SQRT_2_OVER_PI * (1.0 + 0.134145 * h * h)
        else:
            grad = 0.5 * (1.0 + tl.math.erf(h * _SQRT1_2)) + h * tl.exp(-0.5 * h * h) * _INV_SQRT_2PI
        dx = tl.where(mask, dy * grad, 0.0)
        db += tl.sum(dx, axis=0)
        tl.store(dx_ptr + rows64 * stride_dx + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(dbp_ptr + pid_m * n_cols + cols, db, mask=col_ok)


def _fwd_configs():
    # first config is the one the interpreter (and a GPU before tuning) uses
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w)
            for m, n, w in ((16, 256, 8), (8, 256, 4), (4, 512, 4), (8, 1024, 8))]


def _bwd_configs():
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w)
            for m, n, w in ((32, 128, 8), (16, 128, 4), (8, 256, 4), (16, 256, 8))]


_fwd = TunedKernel(_bias_gelu_fwd_kernel, _fwd_configs(), key=["n_cols", "APPROX_TANH"])
# BLOCK_N changes the number of column programs, not the partial-sum layout, so tuning it is safe
_bwd = TunedKernel(_bias_gelu_bwd_kernel, _bwd_configs(), key=["n_cols", "APPROX_TANH"])


def _check(x: torch.Tensor, b: torch.Tensor) -> None:
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"bias_gelu kernel takes float16/bfloat16/float32, got {x.dtype}")
    if b.shape != (x.shape[-1],) or b.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"bias must be ({x.shape[-1]},) float16/bfloat16/float32, got {tuple(b.shape)} {b.dtype}")


def bias_gelu_fwd(x: torch.Tensor, b: torch.Tensor, approx_tanh: bool = False) -> torch.Tensor:
    """gelu(x + b) over the last dim; returns a new contiguous tensor of x's shape and dtype."""
    _check(x, b)
    n_cols = x.shape[-1]
    x2 = as_2d(x, n_cols)
    n_rows = x2.shape[0]
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows > 0:
        grid = lambda meta: (triton.cdiv(n_rows, meta["BLOCK_M"]), triton.cdiv(n_cols, meta["BLOCK_N"]))  # noqa: E731
        _fwd.launch((n_cols, approx_tanh, x.dtype, b.dtype), grid, y, x2, b.contiguous(), n_rows, n_cols,
                    x2.stride(0), y.stride(0), APPROX_TANH=approx_tanh)
    return y.view(x.shape)


def bias_gelu_bwd(dy: torch.Tensor, x: torch.Tensor, b: torch.Tensor, approx_tanh: bool = False):
    """Returns (dx, db) for y = gelu(x + b): dx in x's shape/dtype, db (n_cols,) in b's dtype."""
    _check(x, b)
    if dy.shape != x.shape or dy.dtype != x.dtype:
        raise ValueError(f"dy must be {tuple(x.shape)} {x.dtype}, got {tuple(dy.shape)} {dy.dtype}")
    n_cols = x.shape[-1]
    x2, dy2 = as_2d(x, n_cols), as_2d(dy, n_cols)
    n_rows = x2.shape[0]
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return dx.view(x.shape), torch.zeros_like(b)
    n_prog, rows_per_program = split_rows(n_rows, x.device)
    db_partial = torch.empty((n_prog, n_cols), dtype=torch.float32, device=x.device)
    grid = lambda meta: (n_prog, triton.cdiv(n_cols, meta["BLOCK_N"]))  # noqa: E731
    _bwd.launch((n_cols, approx_tanh, x.dtype, b.dtype), grid, dx, db_partial, dy2, x2, b.contiguous(),
                n_rows, n_cols, dx.stride(0), dy2.stride(0), x2.stride(0), rows_per_program,
                APPROX_TANH=approx_tanh)
    return dx.view(x.shape), db_partial.sum(0).to(b.dtype)
