# Rotary position embedding (RoPE) of q and k, one launch for both, in place or into a new buffer.
#
#   x = [x1, x2] (halves of head_dim):   x1' = x1 cos - x2 sin,   x2' = x2 cos + x1 sin
#
# with per-token cos/sin (tokens, head_dim / 2) gathered from the model's tables (fastbert.ops.rotary).
# Run right after the QKV GEMM on the q/k part of the fused buffer, x = qkv[:, :2]: q and k are read
# once and written once (in place for inference, into `out` when autograd keeps x), v is not touched;
# no extra pass. CONJUGATE rotates by -angle (sin negated): the backward of the rotation (its transpose).
# Limits: x (tokens, 2, heads, head_dim) with any strides (a view of (tokens, 3, ...) works), head_dim
# even and <= 256; fp32 / fp16 / bf16; math in fp32, cast on store. Reference: Su et al., RoFormer
# (arXiv:2104.09864), in transformers' "rotate_half" layout (Llama, ModernBERT, NomicBERT).
import torch
import triton
import triton.language as tl

from fastbert.kernels._autotune import launch


@triton.jit
def _rotary_fwd_kernel(
    out_ptr,      # (tokens, 2, heads, head_dim) rotated q (index 0) and k (index 1); may be x itself
    x_ptr,        # (tokens, 2, heads, head_dim) q and k
    cos_ptr,      # (tokens, head_dim // 2) row stride stride_c
    sin_ptr,      # (tokens, head_dim // 2) row stride stride_sn
    heads, half,
    stride_t, stride_s, stride_h, stride_d,   # x strides: token, q/k, head, dim
    stride_ot, stride_os, stride_oh, stride_od,
    stride_c, stride_sn,
    CONJUGATE: tl.constexpr,   # rotate by -angle (the backward)
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    dmask = d < half
    mask = (h[:, None] < heads) & dmask[None, :]
    c = tl.load(cos_ptr + t * stride_c + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + t * stride_sn + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    if CONJUGATE:
        s = -s
    for which in tl.static_range(2):            # q, then k
        p1 = x_ptr + t * stride_t + which * stride_s + h[:, None] * stride_h + d[None, :] * stride_d
        o1 = out_ptr + t * stride_ot + which * stride_os + h[:, None] * stride_oh + d[None, :] * stride_od
        x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(p1 + half * stride_d, mask=mask, other=0.0).to(tl.float32)
        tl.store(o1, (x1 * c - x2 * s).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(o1 + half * stride_od, (x2 * c + x1 * s).to(out_ptr.dtype.element_ty), mask=mask)


def rotary_fwd(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out=None, conjugate: bool = False):
    """Rotate x[:, 0] and x[:, 1] (x (tokens, 2 or 3, heads, head_dim)) into out[:, 0], out[:, 1]
    (default: x itself, in place); returns out."""
    if x.dim() != 4 or x.shape[1] not in (2, 3):
        raise ValueError(f"x must be (tokens, 2 or 3, heads, head_dim), got shape {tuple(x.shape)}")
    out = x if out is None else out
    if out.dim() != 4 or out.shape[0] != x.shape[0] or out.shape[1] < 2 or out.shape[2:] != x.shape[2:]:
        raise ValueError(f"out must be (tokens, 2, heads, head_dim) like x {tuple(x.shape)}, got {tuple(out.shape)}")
    tokens, _, heads, dim = x.shape
    if dim % 2 or dim > 256:
        raise ValueError(f"head_dim must be even and <= 256, got {dim}")
    half = dim // 2
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) != (tokens, half) or t.stride(1) != 1:
            raise ValueError(f"{name} must be (tokens, head_dim // 2) = {(tokens, half)} with unit column "
                             f"stride, got shape {tuple(t.shape)} strides {t.stride()}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"x dtype {x.dtype} is not fp32/fp16/bf16")
    if tokens == 0:
        return out
    block_d = triton.next_power_of_2(half)
    block_h = max(1, min(triton.next_power_of_2(heads), 4096 // block_d))
    grid = (tokens, triton.cdiv(heads, block_h))
    launch(_rotary_fwd_kernel, grid, out, x, cos, sin, heads, half, *x.stride(), *out.stride(),
           cos.stride(0), sin.stride(0), CONJUGATE=conjugate, BLOCK_H=block_h, BLOCK_D=block_d)
    return out
