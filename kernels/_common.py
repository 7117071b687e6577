"""Small helpers shared by the kernel files: 2-D views, grid sizing, and the dropout mask."""
import torch
import triton
import triton.language as tl


def as_2d(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """t as (rows, n_cols) with unit column stride: a view when strides allow, else a copy."""
    t2 = t.reshape(-1, n_cols)
    return t2 if n_cols <= 1 or t2.stride(1) == 1 else t2.contiguous()


def row_programs(n_rows: int, device: torch.device) -> int:
    """Programs for a kernel whose programs each walk a run of rows and write one partial sum each:
    a few per SM on a GPU, few under the interpreter (each program is slow there)."""
    target = 4 * torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return max(1, min(target, triton.cdiv(n_rows, 16)))


def split_rows(n_rows: int, device: torch.device):
    """(n_programs, rows_per_program) covering n_rows with no empty program."""
    n_prog = row_programs(n_rows, device)
    rows_per_program = triton.cdiv(n_rows, n_prog)
    return triton.cdiv(n_rows, rows_per_program), rows_per_program


@triton.jit
def dropout_keep(seed, c0, c1, p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(BLOCK_M, BLOCK_N) dropout keep mask (uniform >= p) from one Philox4x32-10 call per four columns:
    c0 (BLOCK_M, BLOCK_N // 4) and c1 (broadcastable) int32 counters name each group of four columns,
    whose uniforms are the call's four outputs. Counters, not a flat element index: no int32 product
    that a large tensor would overflow, and no 64-bit Philox."""
    zero = tl.zeros_like(c0)
    r0, r1, r2, r3 = tl.philox(seed, c0, zero + c1, zero, zero)
    u = tl.join(tl.join(tl.uint_to_uniform_float(r0), tl.uint_to_uniform_float(r1)),
                tl.join(tl.uint_to_uniform_float(r2), tl.uint_to_uniform_float(r3)))
    return tl.reshape(u, (BLOCK_M, BLOCK_N)) >= p


@triton.jit
def dropout_keep4(seed, c0, c1, p):
    """dropout_keep's draws before they are interleaved: the four (c0's shape) keep masks of one Philox
    call per counter, for kernels that also pack the mask (dropout_keep puts the first, third, second and
    fourth at the columns 4g .. 4g + 3 of group g)."""
    zero = tl.zeros_like(c0)
    r0, r1, r2, r3 = tl.philox(seed, c0, zero + c1, zero, zero)
    return (tl.uint_to_uniform_float(r0) >= p, tl.uint_to_uniform_float(r1) >= p,
            tl.uint_to_uniform_float(r2) >= p, tl.uint_to_uniform_float(r3) >= p)
