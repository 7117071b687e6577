# Rotary position embedding (RoPE) of q and k in place in the fused QKV buffer, one launch.
#
#   x = [x1, x2] (halves of head_dim):   x1' = x1 cos - x2 sin,   x2' = x2 cos + x1 sin
#
# with per-token cos/sin (tokens, head_dim / 2) gathered from the model's tables (fastbert.ops.rotary).
# Run right after the QKV GEMM: q and k are read once and written once, v is not touched; no extra
# pass and no extra buffer. CONJUGATE rotates by -angle (sin negated): the backward of the rotation
# (its transpose), applied in place to a (tokens, 3, heads, head_dim) gradient buffer.
# Limits: qkv (tokens, 3, heads, head_dim) with any strides, head_dim even and <= 256;
# fp32 / fp16 / bf16; math in fp32, cast on store. Reference: Su et al., RoFormer (arXiv:2104.09864),
# in transformers' "rotate_half" layout (Llama, ModernBERT, NomicBERT).
import collections

import torch
import triton
import triton.language as tl

# kernel launches by name, so tests can prove the Triton path really ran
launch_count = collections.Counter()


@triton.jit
def _rotary_fwd_kernel(
    qkv_ptr,      # (tokens, 3, heads, head_dim) in/out: q (index 0) and k (index 1) rotated in place
    cos_ptr,      # (tokens, head_dim // 2) row stride stride_c
    sin_ptr,      # (tokens, head_dim // 2) row stride stride_sn
    heads, half,
    stride_t, stride_s, stride_h, stride_d,   # qkv strides: token, q/k/v, head, dim
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
    offs = h[:, None] * stride_h + d[None, :] * stride_d
    for which in tl.static_range(2):            # q, then k
        p1 = qkv_ptr + t * stride_t + which * stride_s + offs
        p2 = p1 + half * stride_d
        x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(p2, mask=mask, other=0.0).to(tl.float32)
        tl.store(p1, (x1 * c - x2 * s).to(qkv_ptr.dtype.element_ty), mask=mask)
        tl.store(p2, (x2 * c + x1 * s).to(qkv_ptr.dtype.element_ty), mask=mask)


def rotary_fwd(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, conjugate: bool = False) -> torch.Tensor:
    """Rotate qkv[:, 0] and qkv[:, 1] in place; returns qkv."""
    if qkv.dim() != 4 or qkv.shape[1] != 3:
        raise ValueError(f"qkv must be (tokens, 3, heads, head_dim), got shape {tuple(qkv.shape)}")
    tokens, _, heads, dim = qkv.shape
    if dim % 2 or dim > 256:
        raise ValueError(f"head_dim must be even and <= 256, got {dim}")
    half = dim // 2
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) != (tokens, half) or t.stride(1) != 1:
            raise ValueError(f"{name} must be (tokens, head_dim // 2) = {(tokens, half)} with unit column "
                             f"stride, got shape {tuple(t.shape)} strides {t.stride()}")
    if qkv.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"qkv dtype {qkv.dtype} is not fp32/fp16/bf16")
    if tokens == 0:
        return qkv
    block_d = triton.next_power_of_2(half)
    block_h = max(1, min(triton.next_power_of_2(heads), 4096 // block_d))
    grid = (tokens, triton.cdiv(heads, block_h))
    _rotary_fwd_kernel[grid](qkv, cos, sin, heads, half, *qkv.stride(), cos.stride(0), sin.stride(0),
                             CONJUGATE=conjugate, BLOCK_H=block_h, BLOCK_D=block_d)
    launch_count["rotary_fwd"] += 1
    return qkv
