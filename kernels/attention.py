# Flash attention (bidirectional), forward and backward, padded or packed varlen.
#
# What is fused: S = Q K^T * scale, the key-padding mask, softmax, attention-probability dropout and
# O = P V in one pass over key blocks with an online softmax (running max m, running sum l, fp32
# accumulator), so the (seq x seq) matrix never reaches memory. The backward recomputes P from the
# saved logsumexp instead of storing it.
#
# Layouts (any strides; q, k, v may be views into one fused QKV tensor):
#   padded: q, k, v, out (batch, seq, heads, head_dim), key mask (batch, seq), nonzero = real token.
#           Padded query rows still attend to the real keys, as the torch reference does.
#   varlen: q, k, v, out (total_tokens, heads, head_dim), cu_seqlens (batch + 1,) int32 starts.
#   lse, delta: (batch, heads, max_seqlen) fp32, natural-log logsumexp of each query row's scaled
#           scores; a row with no real key (fully padded sequence) stores +inf, so that the backward's
#           P = exp(S - lse) is 0 there and the row's output and gradients are exactly 0.
# Limits: head_dim 1..128 (padded to the next power of two >= 16 with masked loads), any sequence
# length, fp16 / bf16 / fp32 in, fp32 accumulation and statistics, output in the input dtype.
# Dropout: keep(b, h, i, j) = philox_uniform(seed, ((b*H + h)*L + i)*L + j) >= p with L = max_seqlen;
# kept probabilities are scaled by 1/(1-p). The backward regenerates the same mask from (seed, offset).
# Backward (deterministic, no atomics): delta = rowsum(dO * O); a dk/dv pass over key blocks and a
# dq pass over query blocks, with dS = P * (dP - delta) (dP taken through the dropout mask).
# Math: Dao et al., "FlashAttention" (2022) and "FlashAttention-2" (2023).
import os

import torch
import triton
import triton.language as tl

from fastbert.kernels._autotune import launch_tuned

LOG2E = 1.4426950408889634
MAX_HEAD_DIM = 128
SEQ_BUCKET_CAP = 4096


def _gpu_compiles() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") != "1" and torch.cuda.is_available()


def seq_bucket(n: int) -> int:
    """Autotune key for a sequence length: next power of two in [16, SEQ_BUCKET_CAP]."""
    return min(max(16, triton.next_power_of_2(max(int(n), 1))), SEQ_BUCKET_CAP)


def _configs(pairs):
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
               for m, n, w, s in pairs]
    # Multi-config autotune needs a GPU driver to time configs; the interpreter gets the first one.
    return configs if _gpu_compiles() else configs[:1]


_FWD_CONFIGS = _configs([(64, 64, 4, 2), (128, 64, 8, 3), (128, 64, 4, 3), (64, 32, 4, 3),
                         (128, 128, 8, 2), (64, 64, 4, 4)])
_BWD_CONFIGS = _configs([(64, 64, 4, 2), (32, 64, 4, 2), (64, 32, 4, 2), (128, 64, 8, 2),
                         (64, 128, 8, 2), (32, 32, 4, 3)])
_KEY = ["SEQ_BUCKET", "HEAD_DIM", "IS_VARLEN", "HAS_MASK", "HAS_DROPOUT"]  # + argument dtypes


@triton.jit
def _sequence(cu_ptr, max_seqlen, b, IS_VARLEN: tl.constexpr):
    """(first token, length) of sequence b."""
    if IS_VARLEN:
        start = tl.load(cu_ptr + b)
        n = tl.load(cu_ptr + b + 1) - start
    else:
        start = tl.full([], 0, tl.int32)  # a tensor, not a constexpr, in both branches
        n = start + max_seqlen
    return start, n


@triton.jit
def _key_valid(mask_ptr, stride_mb, stride_ms, b, cols, n, HAS_MASK: tl.constexpr):
    valid = cols < n
    if HAS_MASK:
        real = tl.load(mask_ptr + b.to(tl.int64) * stride_mb + cols * stride_ms, mask=valid, other=0)
        valid = valid & (real != 0)
    return valid


@triton.jit
def _keep(seed, rng_base, rows, cols, max_seqlen, dropout_p):
    offsets = rng_base + rows[:, None].to(tl.int64) * max_seqlen + cols[None, :]
    return tl.rand(seed, offsets) >= dropout_p


@triton.autotune(configs=_FWD_CONFIGS, key=_KEY)
@triton.jit
def _attention_fwd_kernel(
    out_ptr,    # (batch, seq, heads, head_dim) or (total_tokens, heads, head_dim) output
    lse_ptr,    # (batch, heads, max_seqlen) fp32 logsumexp, +inf for rows without a real key
    q_ptr,      # like out
    k_ptr,      # like out
    v_ptr,      # like out
    mask_ptr,   # (batch, seq) int8 key mask, nonzero = real token (HAS_MASK)
    cu_ptr,     # (batch + 1,) int32 sequence starts (IS_VARLEN)
    stride_qb, stride_qs, stride_qh, stride_qd,  # batch stride is 0 for varlen
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ob, stride_os, stride_oh, stride_od,
    stride_mb, stride_ms,
    n_heads, max_seqlen, sm_scale, dropout_p, seed,
    SEQ_BUCKET,  # autotune key only: seq_bucket(max_seqlen)
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_MASK: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_bh = tl.program_id(0)  # batch * heads on axis 0: axis 1 is limited to 65535
    pid_m = tl.program_id(1)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    start, n = _sequence(cu_ptr, max_seqlen, b, IS_VARLEN)
    if pid_m * BLOCK_M >= n:
        return
    b64 = b.to(tl.int64)
    start64 = start.to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = rows < n
    d_ok = offs_d < HEAD_DIM
    q_base = q_ptr + b64 * stride_qb + start64 * stride_qs + h * stride_qh
    k_base = k_ptr + b64 * stride_kb + start64 * stride_ks + h * stride_kh
    v_base = v_ptr + b64 * stride_vb + start64 * stride_vs + h * stride_vh
    q = tl.load(q_base + rows[:, None] * stride_qs + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    qk_scale = sm_scale * 1.4426950408889634  # exp2 instead of exp
    rng_base = pid_bh.to(tl.int64) * max_seqlen * max_seqlen
    # A finite start for the running max: rows whose keys are all masked keep m finite, p = 0, l = 0.
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, n, BLOCK_N):
        cols = start_n + offs_n
        col_ok = _key_valid(mask_ptr, stride_mb, stride_ms, b, cols, n, HAS_MASK)
        kt = tl.load(k_base + cols[None, :] * stride_ks + offs_d[:, None] * stride_kd,
                     mask=(cols[None, :] < n) & d_ok[:, None], other=0.0)       # (BLOCK_D, BLOCK_N)
        v = tl.load(v_base + cols[:, None] * stride_vs + offs_d[None, :] * stride_vd,
                    mask=(cols[:, None] < n) & d_ok[None, :], other=0.0)        # (BLOCK_N, BLOCK_D)
        s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale
        s = tl.where(col_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if HAS_DROPOUT:
            keep = _keep(seed, rng_base, rows, cols, max_seqlen, dropout_p)
            p = tl.where(keep, p * (1.0 / (1.0 - dropout_p)), 0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    has_key = l_i > 0.0
    l_safe = tl.where(has_key, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(has_key, (m_i + tl.log2(l_safe)) / 1.4426950408889634, float("inf"))
    o_base = out_ptr + b64 * stride_ob + start64 * stride_os + h * stride_oh
    tl.store(o_base + rows[:, None] * stride_os + offs_d[None, :] * stride_od,
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + pid_bh.to(tl.int64) * max_seqlen + rows, lse, mask=row_ok)


@triton.jit
def _attention_bwd_preprocess_kernel(
    delta_ptr,  # (batch, heads, max_seqlen) fp32 rowsum(dO * O)
    out_ptr,    # like q in the forward
    do_ptr,     # like out
    cu_ptr,     # (batch + 1,) int32 (IS_VARLEN)
    stride_ob, stride_os, stride_oh, stride_od,
    stride_db, stride_ds, stride_dh, stride_dd,
    n_heads, max_seqlen,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_VARLEN: tl.constexpr, BLOCK_M: tl.constexpr,
):
    pid_bh = tl.program_id(0)  # batch * heads on axis 0: axis 1 is limited to 65535
    pid_m = tl.program_id(1)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    start, n = _sequence(cu_ptr, max_seqlen, b, IS_VARLEN)
    if pid_m * BLOCK_M >= n:
        return
    b64 = b.to(tl.int64)
    start64 = start.to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (rows[:, None] < n) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(out_ptr + b64 * stride_ob + (start64 + rows[:, None]) * stride_os + h * stride_oh
                + offs_d[None, :] * stride_od, mask=ok, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + b64 * stride_db + (start64 + rows[:, None]) * stride_ds + h * stride_dh
                 + offs_d[None, :] * stride_dd, mask=ok, other=0.0).to(tl.float32)
    tl.store(delta_ptr + pid_bh.to(tl.int64) * max_seqlen + rows, tl.sum(o * do, 1), mask=rows < n)


@triton.autotune(configs=_BWD_CONFIGS, key=_KEY)
@triton.jit
def _attention_bwd_dkdv_kernel(
    dk_ptr,     # like k, contiguous
    dv_ptr,     # like v, contiguous (same strides as dk)
    q_ptr, k_ptr, v_ptr,
    do_ptr,     # like q
    lse_ptr,    # (batch, heads, max_seqlen) fp32 from the forward
    delta_ptr,  # (batch, heads, max_seqlen) fp32 from the preprocess kernel
    mask_ptr, cu_ptr,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_db, stride_ds, stride_dh, stride_dd,   # dO
    stride_gb, stride_gs, stride_gh, stride_gd,   # dk and dv
    stride_mb, stride_ms,
    n_heads, max_seqlen, sm_scale, dropout_p, seed,
    SEQ_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_MASK: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    start, n = _sequence(cu_ptr, max_seqlen, b, IS_VARLEN)
    if pid_n * BLOCK_N >= n:
        return
    b64 = b.to(tl.int64)
    start64 = start.to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    col_in = cols < n
    col_ok = _key_valid(mask_ptr, stride_mb, stride_ms, b, cols, n, HAS_MASK)
    q_base = q_ptr + b64 * stride_qb + start64 * stride_qs + h * stride_qh
    do_base = do_ptr + b64 * stride_db + start64 * stride_ds + h * stride_dh
    k = tl.load(k_ptr + b64 * stride_kb + start64 * stride_ks + h * stride_kh
                + cols[:, None] * stride_ks + offs_d[None, :] * stride_kd,
                mask=col_in[:, None] & d_ok[None, :], other=0.0)                 # (BLOCK_N, BLOCK_D)
    v = tl.load(v_ptr + b64 * stride_vb + start64 * stride_vs + h * stride_vh
                + cols[:, None] * stride_vs + offs_d[None, :] * stride_vd,
                mask=col_in[:, None] & d_ok[None, :], other=0.0)
    qk_scale = sm_scale * 1.4426950408889634
    stat_base = pid_bh.to(tl.int64) * max_seqlen
    rng_base = stat_base * max_seqlen
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for start_m in range(0, n, BLOCK_M):
        rows = start_m + offs_m
        row_ok = rows < n
        q = tl.load(q_base + rows[:, None] * stride_qs + offs_d[None, :] * stride_qd,
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        do = tl.load(do_base + rows[:, None] * stride_ds + offs_d[None, :] * stride_dd,
                     mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        lse = tl.load(lse_ptr + stat_base + rows, mask=row_ok, other=float("inf"))
        delta = tl.load(delta_ptr + stat_base + rows, mask=row_ok, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale   # (BLOCK_M, BLOCK_N)
        p = tl.exp2(s - lse[:, None] * 1.4426950408889634)
        p = tl.where(col_ok[None, :], p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        if HAS_DROPOUT:
            keep = _keep(seed, rng_base, rows, cols, max_seqlen, dropout_p)
            scale_keep = 1.0 / (1.0 - dropout_p)
            p_drop = tl.where(keep, p * scale_keep, 0.0)
            dp = tl.where(keep, dp * scale_keep, 0.0)
        else:
            p_drop = p
        dv += tl.dot(tl.trans(p_drop.to(do.dtype)), do, input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=DOT_PRECISION)
    dk = dk * sm_scale
    g_off = b64 * stride_gb + (start64 + cols[:, None]) * stride_gs + h * stride_gh + offs_d[None, :] * stride_gd
    g_ok = col_in[:, None] & d_ok[None, :]
    tl.store(dk_ptr + g_off, dk.to(dk_ptr.dtype.element_ty), mask=g_ok)
    tl.store(dv_ptr + g_off, dv.to(dv_ptr.dtype.element_ty), mask=g_ok)


@triton.autotune(configs=_BWD_CONFIGS, key=_KEY)
@triton.jit
def _attention_bwd_dq_kernel(
    dq_ptr,     # like q, contiguous
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, mask_ptr, cu_ptr,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_db, stride_ds, stride_dh, stride_dd,   # dO
    stride_gb, stride_gs, stride_gh, stride_gd,   # dq
    stride_mb, stride_ms,
    n_heads, max_seqlen, sm_scale, dropout_p, seed,
    SEQ_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_MASK: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_bh = tl.program_id(0)  # batch * heads on axis 0: axis 1 is limited to 65535
    pid_m = tl.program_id(1)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    start, n = _sequence(cu_ptr, max_seqlen, b, IS_VARLEN)
    if pid_m * BLOCK_M >= n:
        return
    b64 = b.to(tl.int64)
    start64 = start.to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    row_ok = rows < n
    q = tl.load(q_ptr + b64 * stride_qb + start64 * stride_qs + h * stride_qh
                + rows[:, None] * stride_qs + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    do = tl.load(do_ptr + b64 * stride_db + start64 * stride_ds + h * stride_dh
                 + rows[:, None] * stride_ds + offs_d[None, :] * stride_dd,
                 mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    stat_base = pid_bh.to(tl.int64) * max_seqlen
    rng_base = stat_base * max_seqlen
    lse = tl.load(lse_ptr + stat_base + rows, mask=row_ok, other=float("inf"))
    delta = tl.load(delta_ptr + stat_base + rows, mask=row_ok, other=0.0)
    k_base = k_ptr + b64 * stride_kb + start64 * stride_ks + h * stride_kh
    v_base = v_ptr + b64 * stride_vb + start64 * stride_vs + h * stride_vh
    qk_scale = sm_scale * 1.4426950408889634
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, n, BLOCK_N):
        cols = start_n + offs_n
        col_ok = _key_valid(mask_ptr, stride_mb, stride_ms, b, cols, n, HAS_MASK)
        kv_ok = (cols[:, None] < n) & d_ok[None, :]
        k = tl.load(k_base + cols[:, None] * stride_ks + offs_d[None, :] * stride_kd, mask=kv_ok, other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vs + offs_d[None, :] * stride_vd, mask=kv_ok, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        p = tl.exp2(s - lse[:, None] * 1.4426950408889634)
        p = tl.where(col_ok[None, :], p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        if HAS_DROPOUT:
            keep = _keep(seed, rng_base, rows, cols, max_seqlen, dropout_p)
            dp = tl.where(keep, dp * (1.0 / (1.0 - dropout_p)), 0.0)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)
    dq = dq * sm_scale
    tl.store(dq_ptr + b64 * stride_gb + (start64 + rows[:, None]) * stride_gs + h * stride_gh
             + offs_d[None, :] * stride_gd, dq.to(dq_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])


# ----------------------------------------------------------------------------------------------
# Launchers: plain functions over torch tensors (validation of user input lives in fastbert.ops).

def _strides4(t: torch.Tensor):
    """(batch, seq, head, dim) strides; varlen (total, heads, dim) tensors get batch stride 0."""
    return (0,) + tuple(t.stride()) if t.dim() == 3 else tuple(t.stride())


def _layout(q, key_mask, cu_seqlens, max_seqlen):
    """(batch, heads, max_seqlen, is_varlen, mask, mask strides, cu) for one call."""
    heads = q.shape[-2]
    if cu_seqlens is not None:
        if max_seqlen is None:
            raise ValueError("varlen attention needs max_seqlen")
        return (cu_seqlens.numel() - 1, heads, int(max_seqlen), True, q, (0, 0), cu_seqlens)
    batch, seq = q.shape[0], q.shape[1]
    if key_mask is None:
        return batch, heads, seq, False, q, (0, 0), q
    if key_mask.dtype != torch.int8:
        key_mask = (key_mask != 0).to(torch.int8)
    return batch, heads, seq, False, key_mask, tuple(key_mask.stride()), q


def _common(q, scale, dropout_p, seed, max_seqlen, has_mask, is_varlen):
    head_dim = q.shape[-1]
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {head_dim} exceeds {MAX_HEAD_DIM}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"the Triton attention kernel takes float16, bfloat16 or float32, got {q.dtype}")
    return dict(sm_scale=float(scale), dropout_p=float(dropout_p), seed=int(seed),
                SEQ_BUCKET=seq_bucket(max_seqlen), HEAD_DIM=head_dim,
                BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
                DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                IS_VARLEN=is_varlen, HAS_MASK=has_mask, HAS_DROPOUT=dropout_p > 0)


def attention_fwd(q, k, v, *, scale, key_mask=None, cu_seqlens=None, max_seqlen=None,
                  dropout_p=0.0, seed=0):
    """out (like q, contiguous) and lse (batch, heads, max_seqlen) fp32."""
    batch, heads, max_seqlen, is_varlen, mask, mstride, cu = _layout(q, key_mask, cu_seqlens, max_seqlen)
    meta = _common(q, scale, dropout_p, seed, max_seqlen, key_mask is not None and not is_varlen, is_varlen)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, max_seqlen), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse.fill_(float("inf"))
    grid = lambda m: (batch * heads, triton.cdiv(max_seqlen, m["BLOCK_M"]))  # noqa: E731
    launch_tuned(
        _attention_fwd_kernel, grid, out, lse, q, k, v, mask, cu,
        *_strides4(q), *_strides4(k), *_strides4(v), *_strides4(out), *mstride,
        heads, max_seqlen, meta.pop("sm_scale"), meta.pop("dropout_p"), meta.pop("seed"), **meta)
    return out, lse


def attention_bwd(do, q, k, v, out, lse, *, scale, key_mask=None, cu_seqlens=None, max_seqlen=None,
                  dropout_p=0.0, seed=0):
    """(dq, dk, dv), each contiguous in q's shape and dtype; same seed as the forward."""
    batch, heads, max_seqlen, is_varlen, mask, mstride, cu = _layout(q, key_mask, cu_seqlens, max_seqlen)
    meta = _common(q, scale, dropout_p, seed, max_seqlen, key_mask is not None and not is_varlen, is_varlen)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dv = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.numel() == 0:
        return dq, dk, dv
    delta = torch.empty_like(lse)
    block_m = 64
    _attention_bwd_preprocess_kernel[(batch * heads, triton.cdiv(max_seqlen, block_m))](
        delta, out, do, cu, *_strides4(out), *_strides4(do), heads, max_seqlen,
        HEAD_DIM=meta["HEAD_DIM"], BLOCK_D=meta["BLOCK_D"], IS_VARLEN=is_varlen, BLOCK_M=block_m)
    args = (q, k, v, do, lse, delta, mask, cu,
            *_strides4(q), *_strides4(k), *_strides4(v), *_strides4(do))
    scalars = (*mstride, heads, max_seqlen, meta.pop("sm_scale"), meta.pop("dropout_p"), meta.pop("seed"))
    grid_n = lambda m: (batch * heads, triton.cdiv(max_seqlen, m["BLOCK_N"]))  # noqa: E731
    grid_m = lambda m: (batch * heads, triton.cdiv(max_seqlen, m["BLOCK_M"]))  # noqa: E731
    launch_tuned(_attention_bwd_dkdv_kernel, grid_n, dk, dv, *args, *_strides4(dk), *scalars, **meta)
    launch_tuned(_attention_bwd_dq_kernel, grid_m, dq, *args, *_strides4(dq), *scalars, **meta)
    return dq, dk, dv
