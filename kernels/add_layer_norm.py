# Fused residual add + LayerNorm over the last dim, forward and backward (BERT's post-LN block).
#
#   forward:  s = dropout(x) + r              (r optional; dropout only when DROPOUT)
#             mean = sum(s) / N,  rstd = 1 / sqrt(sum((s - mean)^2) / N + eps)
#             y = (s - mean) * rstd * w + b    (mean and rstd saved in fp32 for the backward)
#   backward: xhat = (s - mean) * rstd,  g = dy * w
#             ds = rstd * (g - mean(g) - xhat * mean(g * xhat)) (+ the grad of s when s was returned)
#             dr = ds,  dx = ds * keep / (1 - p),  dw = sum_rows(dy * xhat),  db = sum_rows(dy)
# Limits: rows of N <= 8192 elements (one row lives in registers; any N, not only powers of two),
# unit column stride; fp32 / fp16 / bf16 in; y and s in torch's promoted dtype of x and r (as x + r
# would be, e.g. fp32 for an fp16 x and an fp32 residual stream under autocast); math in fp32.
# dw and db are deterministic: each backward program sums its rows into its own row of an
# (n_programs, N) fp32 buffer and the launcher adds those rows in a fixed order (no atomics).
# Dropout draws keep = u >= p, u the (col % 4)-th output of Philox4x32-10(seed, counter (col // 4, row))
# (one call per four elements, no row * N product to overflow), so the backward regenerates the same
# mask from the seed instead of storing it. The seed is read
# from a one-element int64 device tensor, so a call needs no host value (CUDA graphs capture it).
# Inference skips the stores the backward alone reads (mean, rstd: STORE_STATS=False).
# Reference: Ba, Kiros & Hinton, "Layer Normalization" (arXiv:1607.06450); Triton tutorial 05.
import torch
import triton
import triton.language as tl

from fastbert.kernels._autotune import TunedKernel
from fastbert.kernels._common import as_2d, dropout_keep, split_rows

MAX_N = 8192


@triton.jit
def _keep(seed_ptr, rows, p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    groups = tl.arange(0, BLOCK_N // 4)
    return dropout_keep(tl.load(seed_ptr), groups[None, :] + rows[:, None] * 0, rows[:, None], p, BLOCK_M, BLOCK_N)


@triton.jit
def _add_layer_norm_fwd_kernel(
    y_ptr,        # (n_rows, N) output, row stride stride_y
    s_ptr,        # (n_rows, N) output dropout(x) + r, written when STORE_SUM, row stride stride_s
    mean_ptr,     # (n_rows,) fp32 output mean of s, written when STORE_STATS
    rstd_ptr,     # (n_rows,) fp32 output 1 / std of s, written when STORE_STATS
    x_ptr,        # (n_rows, N) input, row stride stride_x
    r_ptr,        # (n_rows, N) residual, read when HAS_RESIDUAL, row stride stride_r
    w_ptr,        # (N,) weight
    b_ptr,        # (N,) bias
    n_rows, N, stride_y, stride_s, stride_x, stride_r,
    eps,          # added to the variance
    p,            # dropout probability, used when DROPOUT
    seed_ptr,     # (1,) int64 Philox seed, read when DROPOUT
    HAS_RESIDUAL: tl.constexpr, STORE_SUM: tl.constexpr, DROPOUT: tl.constexpr,
    STORE_STATS: tl.constexpr,  # write mean and rstd (the backward needs them)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    mask = (rows[:, None] < n_rows) & col_ok[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    s = tl.load(x_ptr + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if DROPOUT:
        s = tl.where(_keep(seed_ptr, rows, p, BLOCK_M, BLOCK_N), s / (1.0 - p), 0.0)
    if HAS_RESIDUAL:
        s += tl.load(r_ptr + rows64 * stride_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if STORE_SUM:
        tl.store(s_ptr + rows64 * stride_s + cols[None, :], s.to(s_ptr.dtype.element_ty), mask=mask)
    mean = tl.sum(s, axis=1) / N
    diff = tl.where(mask, s - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=1) / N + eps)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = diff * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + rows64 * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    if STORE_STATS:
        tl.store(mean_ptr + rows, mean, mask=rows < n_rows)
        tl.store(rstd_ptr + rows, rstd, mask=rows < n_rows)


@triton.jit
def _add_layer_norm_bwd_kernel(
    dx_ptr,       # (n_rows, N) output grad of x (of s when not DROPOUT), row stride stride_dx
    dr_ptr,       # (n_rows, N) output grad of r = grad of s, written when STORE_DR, row stride stride_dr
    dwp_ptr,      # (n_programs, N) fp32 output: this program's partial sum of dy * xhat
    dbp_ptr,      # (n_programs, N) fp32 output: this program's partial sum of dy
    dy_ptr,       # (n_rows, N) grad of y, row stride stride_dy
    dsum_ptr,     # (n_rows, N) grad of the returned s, read when HAS_DSUM, row stride stride_dsum
    s_ptr,        # (n_rows, N) forward's s = dropout(x) + r, row stride stride_s
    w_ptr,        # (N,) weight
    mean_ptr,     # (n_rows,) fp32 mean saved by the forward
    rstd_ptr,     # (n_rows,) fp32 rstd saved by the forward
    n_rows, N, stride_dx, stride_dr, stride_dy, stride_dsum, stride_s,
    rows_per_program,  # rows of this program: [pid * rows_per_program, (pid + 1) * rows_per_program)
    p,            # dropout probability of the forward, used when DROPOUT
    seed_ptr,     # (1,) int64 Philox seed of the forward, read when DROPOUT
    HAS_DSUM: tl.constexpr, DROPOUT: tl.constexpr,
    STORE_DR: tl.constexpr,  # dr differs from dx: dropout, or r has another dtype than x
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    for r in range(row_start, row_end, BLOCK_M):
        rows = r + tl.arange(0, BLOCK_M)
        row_ok = rows < row_end
        mask = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)[:, None]
        s = tl.load(s_ptr + rows64 * stride_s + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows64 * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        xhat = tl.where(mask, (s - mean[:, None]) * rstd[:, None], 0.0)
        g = dy * w[None, :]
        c1 = tl.sum(g * xhat, axis=1) / N
        c2 = tl.sum(g, axis=1) / N
        ds = tl.where(mask, (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None], 0.0)
        if HAS_DSUM:
            ds += tl.load(dsum_ptr + rows64 * stride_dsum + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dw += tl.sum(dy * xhat, axis=0)
        db += tl.sum(dy, axis=0)
        if STORE_DR:
            tl.store(dr_ptr + rows64 * stride_dr + cols[None, :], ds.to(dr_ptr.dtype.element_ty), mask=mask)
        if DROPOUT:
            ds = tl.where(_keep(seed_ptr, rows, p, BLOCK_M, BLOCK_N), ds / (1.0 - p), 0.0)
        tl.store(dx_ptr + rows64 * stride_dx + cols[None, :], ds.to(dx_ptr.dtype.element_ty), mask=mask)
    part = pid.to(tl.int64) * N
    tl.store(dwp_ptr + part + cols, dw, mask=col_ok)
    tl.store(dbp_ptr + part + cols, db, mask=col_ok)


def _configs():
    return [triton.Config({"BLOCK_M": m}, num_warps=w)
            for m in (64, 16, 4, 1) for w in (4, 8, 16)]  # few configs: each one compiles on the first call


def _bwd_words(config, block_n):
    """The backward's register words per thread: five fp32 (BLOCK_M, BLOCK_N) row tiles live at once (s,
    dy, xhat, g, ds) and three (BLOCK_N,) column vectors (w, dw, db)."""
    return (5 * config.kwargs["BLOCK_M"] * block_n + 3 * block_n) / (32 * config.num_warps)


# Over 192 words per thread the backward spilled (N = 8192 on 4 and 8 warps: 256 and 512 words, 8-1024 B of
# stack on sm_89 / sm_90) where 184 (4 x 1024 on 4 warps) did not. Under 16 elements per thread its
# row sums are most of the work, and 16 warps on 4 x 1024 (8 each) put 8 B on the stack on sm_89.
_BWD_BUDGET = 192


def _prune(max_elems, min_per_warp=256, words=None, budget=None, fp32_warps=16):
    """fp32_warps: the most warps for an fp32 x (the forward's x_ptr)."""
    def prune(configs, nargs, **kwargs):
        # a tile of BLOCK_M rows x BLOCK_N cols in registers: cap its size (and its words per thread
        # with `words`), scale warps with it
        block_n = kwargs["BLOCK_N"] if "BLOCK_N" in kwargs else nargs["BLOCK_N"]
        x = nargs.get("x_ptr")
        warps = fp32_warps if x is not None and x.element_size() == 4 else 16
        fits = [c for c in configs if c.kwargs["BLOCK_M"] * block_n <= max_elems and c.num_warps <= warps
                and (words is None or words(c, block_n) <= budget)]
        keep = [c for c in fits if min_per_warp <= c.kwargs["BLOCK_M"] * block_n // c.num_warps <= 2048]
        if not keep:  # tiny rows: fall back to the biggest allowed tile
            keep = fits
        # the default (first) config: 512 elements per warp (16 per thread) or the nearest, fewer warps
        # first; the largest tile per warp first spilled at N = 8192. A GPU times the rest.
        return sorted(keep, key=lambda c: (abs(c.kwargs["BLOCK_M"] * block_n // c.num_warps - 512), c.num_warps))
    return prune


# The forward at fp32 takes at most 8 warps: one row of 8192 on 16 warps (its default then, 16 elements a
# thread) put 8 B on the stack at 40 registers on sm_89, as 16 warps did in the backward (see above).
_fwd = TunedKernel(_add_layer_norm_fwd_kernel, _configs(), prune=_prune(16384, fp32_warps=8),
                   key=["N", "HAS_RESIDUAL", "STORE_SUM", "DROPOUT", "STORE_STATS"])
_bwd = TunedKernel(_add_layer_norm_bwd_kernel, _configs(), prune=_prune(8192, 512, _bwd_words, _BWD_BUDGET),
                   key=["N", "HAS_DSUM", "DROPOUT", "STORE_DR"])


def _check(x, residual, weight, bias) -> None:
    n = x.shape[-1]
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"add_layer_norm kernel takes float16/bfloat16/float32, got {x.dtype}")
    if n > MAX_N:
        raise ValueError(f"hidden size {n} exceeds {MAX_N}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
    for name, t in (("residual", residual), ("weight", weight), ("bias", bias)):
        if t is not None and t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"{name} must be float16/bfloat16/float32, got {t.dtype}")
        if t is not None and name != "residual" and t.shape != (n,):
            raise ValueError(f"{name} must have shape ({n},), got {tuple(t.shape)}")


def _check_seed(dropout_p, seed) -> None:
    if dropout_p > 0 and (seed is None or seed.dtype != torch.int64 or seed.numel() != 1):
        got = None if seed is None else f"{seed.dtype} {tuple(seed.shape)}"
        raise ValueError(f"dropout needs a one-element int64 seed tensor, got {got}")


def add_layer_norm_fwd(x, residual, weight, bias, eps: float, store_sum: bool = False,
                       dropout_p: float = 0.0, seed=None, store_stats: bool = True):
    """Returns (y, s, mean, rstd): y and s = dropout(x) + residual in x's shape and the promoted dtype
    of x and residual (s is None unless store_sum), mean and rstd fp32 of shape (n_rows,) (None unless
    store_stats). weight/bias None mean ones/zeros; seed is a (1,) int64 tensor on x's device."""
    _check(x, residual, weight, bias)
    _check_seed(dropout_p, seed)
    n = x.shape[-1]
    x2 = as_2d(x, n)
    n_rows = x2.shape[0]
    r2 = as_2d(residual, n) if residual is not None else x2
    w = weight.contiguous() if weight is not None else x.new_ones(n)
    b = bias.contiguous() if bias is not None else x.new_zeros(n)
    out_dtype = x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)
    y = torch.empty((n_rows, n), dtype=out_dtype, device=x.device)
    s = torch.empty_like(y) if store_sum else y
    mean = torch.empty(n_rows if store_stats else 0, dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    if n_rows > 0:
        has_res, dropout = residual is not None, dropout_p > 0
        block_n = max(4, triton.next_power_of_2(n))   # dropout draws four columns at a time
        key = (n, has_res, store_sum, dropout, store_stats, x.dtype, r2.dtype, w.dtype, b.dtype)
        grid = lambda meta: (triton.cdiv(n_rows, meta["BLOCK_M"]),)  # noqa: E731
        _fwd.launch(key, grid, y, s, mean if store_stats else y, rstd if store_stats else y, x2, r2, w, b,
                    n_rows, n, y.stride(0), s.stride(0), x2.stride(0), r2.stride(0), eps, dropout_p,
                    seed if dropout else y, HAS_RESIDUAL=has_res, STORE_SUM=store_sum, DROPOUT=dropout,
                    STORE_STATS=store_stats, BLOCK_N=block_n)
    return (y.view(x.shape), (s.view(x.shape) if store_sum else None),
            mean if store_stats else None, rstd if store_stats else None)


def add_layer_norm_bwd(dy, s, weight, mean, rstd, dsum=None, dropout_p: float = 0.0, seed=None,
                       x_dtype=None, residual_dtype=None):
    """Backward of add_layer_norm_fwd. s is the forward's dropout(x) + residual (x itself when there
    was neither). Returns (dx, dresidual, dweight, dbias): dx in x_dtype, dresidual in residual_dtype
    (both default to s's dtype; dresidual is dx itself when they agree and there is no dropout);
    dweight/dbias are fp32 sums, cast by the caller."""
    n = s.shape[-1]
    if dy.shape != s.shape or dy.dtype != s.dtype:
        raise ValueError(f"dy must be {tuple(s.shape)} {s.dtype}, got {tuple(dy.shape)} {dy.dtype}")
    if dsum is not None and (dsum.shape != s.shape or dsum.dtype != s.dtype):
        raise ValueError(f"dsum must be {tuple(s.shape)} {s.dtype}, got {tuple(dsum.shape)} {dsum.dtype}")
    _check_seed(dropout_p, seed)
    s2, dy2 = as_2d(s, n), as_2d(dy, n)
    ds2 = as_2d(dsum, n) if dsum is not None else dy2
    n_rows = s2.shape[0]
    w = weight.contiguous() if weight is not None else s.new_ones(n)
    x_dtype, residual_dtype = x_dtype or s.dtype, residual_dtype or s.dtype
    dx = torch.empty((n_rows, n), dtype=x_dtype, device=s.device)
    store_dr = dropout_p > 0 or residual_dtype != x_dtype
    dr = torch.empty((n_rows, n), dtype=residual_dtype, device=s.device) if store_dr else dx
    if n_rows == 0:
        zeros = torch.zeros(n, dtype=torch.float32, device=s.device)
        return dx.view(s.shape), dr.view(s.shape), zeros, zeros.clone()
    n_prog, rows_per_program = split_rows(n_rows, s.device)
    dw_partial = torch.empty((n_prog, n), dtype=torch.float32, device=s.device)
    db_partial = torch.empty_like(dw_partial)
    dropout = dropout_p > 0
    key = (n, dsum is not None, dropout, store_dr, s.dtype, w.dtype, x_dtype, residual_dtype)
    _bwd.launch(key, lambda meta: (n_prog,), dx, dr, dw_partial, db_partial, dy2, ds2, s2, w, mean, rstd,
                n_rows, n, dx.stride(0), dr.stride(0), dy2.stride(0), ds2.stride(0), s2.stride(0),
                rows_per_program, dropout_p, seed if dropout else s2, HAS_DSUM=dsum is not None,
                DROPOUT=dropout, STORE_DR=store_dr, BLOCK_N=max(4, triton.next_power_of_2(n)))
    return dx.view(s.shape), dr.view(s.shape), dw_partial.sum(0), db_partial.sum(0)
