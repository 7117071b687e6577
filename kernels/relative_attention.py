# Flash attention with relative position terms (MPNet's bucketed bias, DeBERTa's c2p / p2c), packed
# varlen, forward and backward. The position terms are added tile by tile inside the online softmax;
# no (batch, heads, L, L) score, bias or gather tensor is ever written.
#
# Per query i and key j of one sequence, with d = clamp(p_i - p_j, -R, R) + R (p = `positions`):
#   s[i, j] = (q_i . k_j + c2p[i, h, lut[d]] + p2c[j, h, lut[d]]) * sm_scale + bias[d, h]
#   c2p (tokens, heads, K) = q . pos_key^T and p2c (tokens, heads, K) = k . pos_query^T are the
#   per-token products with the (K = 2 span) relative projections (DeBERTa); the caller computes them
#   (a GEMM, O(tokens * K) memory) and the kernel gathers them per (i, j). lut (2R + 1,) int32 maps a
#   clamped distance to a relative index (DeBERTa's clamp(r(d) + span), log buckets or not).
#   bias (2R + 1, heads) fp32 is a per-distance bias (MPNet: table[bucket(-d)] gathered by the caller).
#   R is where the index saturates, so clamping d changes nothing.
# Backward: P is recomputed from the saved lse; dS = P * (dP - rowsum(dO * O)). dq and dc2p (rows)
# in one pass over key blocks, dk, dv and dp2c (columns) in one pass over query blocks; the gathers'
# gradients are scatter-adds (fp32 atomics: several (i, j) of a tile share an index) into zeroed
# dc2p / dp2c (tokens, heads, K) and dbias (2R + 1, heads) buffers; the caller chains them into q, k,
# pos_key, pos_query and the table with torch GEMMs / index_add.
# Dropout (HAS_DROPOUT) on the probabilities, exactly as fastbert.kernels.attention (one Philox4x32
# call per four scores, counter (i * ceil(L / 4) + j // 4, b*H + h), i, j offsets in the sequence,
# L = max_seqlen), kept ones scaled by 1/(1-p); softmax statistics are those of the undropped P (transformers drops
# after the softmax). The seed is a one-element int64 device tensor. The backward draws the mask once:
# the query pass regenerates it from the seed and writes it as bits (fastbert.kernels.attention's
# transient (batch * heads, L, ceil(L / 8)) uint8 buffer), which the key pass reads; dS, dc2p, dp2c and
# dbias go through it like dP.
# Limits: head_dim <= 128, fp16 / bf16 / fp32 q, k, v (c2p, p2c, bias fp32), fp32 accumulators and
# statistics; fp32 products as in fastbert.kernels.attention (TF32 or 3xTF32, never unrolled FMAs).
# Offsets that scale with the token count are int64: c2p / p2c are transposed views whose head stride is
# tokens * K, so h * stride_ch passes 2^31 at a few hundred thousand tokens. Each sequence has at least
# one key for each of its rows, so lse is finite on real rows
# (an empty sequence has no rows: nothing is written for it).
# Reference: fastbert/ops/relative_attention.py (relative_bias_attention_padded,
# disentangled_attention_padded); math: Dao, "FlashAttention-2" (2023); He et al., "DeBERTa" (2021).
import torch
import triton
import triton.language as tl

from fastbert.kernels._autotune import TunedKernel, launch
from fastbert.kernels.attention import (
    MAX_HEAD_DIM,
    _attention_bwd_preprocess_kernel,
    _bits_ptrs,
    _bwd_tile,
    _configs,
    _head,
    _keep,
    _keep_bits,
    _program,
    _store_tile,
    _strides4,
    _tile,
    _unpack_bits,
    by_dtype,
    dot_precision,
    fwd_words,
    narrow_keys,
    preprocess_block,
    seq_bucket,
    shared_bytes,
)

# The forward's register budget by element size, in _fwd_words' estimate (attention.fwd_words' tiles, a
# score-sized tile per relative position term, and c2p / p2c's index tile), set as attention.FWD_BUDGET
# is: between the largest estimate that never spilled (168, 48) and the smallest that did (192, 52).
# The configs and the prune are defined below the kernels.
FWD_BUDGET = {2: 168, 4: 48}
# The backward is not timed (see _bwd): it runs the one config _bwd_prune keeps.
_BWD_CONFIGS = _configs([(64, 32, 4, 2), (32, 32, 4, 2), (64, 32, 8, 2), (32, 32, 8, 2), (16, 32, 4, 1),
                         (16, 16, 2, 1), (16, 32, 8, 1), (16, 16, 8, 1)])
_KEY = ["SEQ_BUCKET", "HEAD_DIM", "HAS_C2P", "HAS_P2C", "HAS_BIAS", "HAS_DROPOUT"]


@triton.jit
def _scores(qk, rows, cols, n, h, start64, pos_ptr, c2p_ptr, p2c_ptr, lut_ptr, bias_ptr, stride_cs, stride_ch,
            stride_bd, radius, sm_scale, HAS_C2P: tl.constexpr, HAS_P2C: tl.constexpr, HAS_BIAS: tl.constexpr):
    """(BLOCK_M, BLOCK_N) fp32 scores in natural-log units from the product qk = q . k^T, the clamped
    distance index d, its relative index lut[d] (HAS_C2P or HAS_P2C, else d), the tile mask."""
    row_ok = rows < n
    col_ok = cols < n
    ok = row_ok[:, None] & col_ok[None, :]
    p_i = tl.load(pos_ptr + start64 + rows, mask=row_ok, other=0)
    p_j = tl.load(pos_ptr + start64 + cols, mask=col_ok, other=0)
    d = tl.minimum(tl.maximum(p_i[:, None] - p_j[None, :], -radius), radius) + radius
    s = qk
    idx = d
    if HAS_C2P or HAS_P2C:
        idx = tl.load(lut_ptr + d, mask=ok, other=0)
    if HAS_C2P:
        s += tl.load(c2p_ptr + (start64 + rows[:, None]) * stride_cs + h * stride_ch + idx, mask=ok, other=0.0)
    if HAS_P2C:
        s += tl.load(p2c_ptr + (start64 + cols[None, :]) * stride_cs + h * stride_ch + idx, mask=ok, other=0.0)
    s = s * sm_scale
    if HAS_BIAS:
        s += tl.load(bias_ptr + d * stride_bd + h, mask=ok, other=0.0)
    return s, d, idx, ok


@triton.jit
def _tiles(base, rows, n, offs_d, stride_s, stride_d, HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr):
    """_tile of columns offs_d and, SPLIT (the head dimension in two halves), of the next len(offs_d)
    columns (else the first again)."""
    t = _tile(base, rows, n, offs_d, stride_s, stride_d, HEAD_DIM)
    t2 = t
    if SPLIT:
        t2 = _tile(base, rows, n, offs_d + offs_d.shape[0], stride_s, stride_d, HEAD_DIM)
    return t, t2


@triton.jit
def _dot_nt(a, a2, b, b2, DOT_PRECISION: tl.constexpr, SPLIT: tl.constexpr):
    """a . b^T over the head dimension (+ a2 . b2^T, its second half, when SPLIT)."""
    x = tl.dot(a, tl.trans(b), input_precision=DOT_PRECISION)
    if SPLIT:
        x = tl.dot(a2, tl.trans(b2), x, input_precision=DOT_PRECISION)
    return x


def _bwd_prune(configs, nargs, BLOCK_D, ROWS, **meta):
    """The backward's one config by dtype, head-dim block and pass (query rows or key columns): a large tile that
    neither spills nor overflows 99 KB of shared memory on sm_80/89/90 (AOT test); TF32 has its own past 64."""
    fp32 = nargs["q_ptr"].element_size() == 4
    rows = {(False, 16): (64, 32, 4, 2), (False, 32): (64, 32, 4, 2), (False, 64): (64, 32, 8, 2),
            (False, 128): (32, 32, 8, 2), (True, 16): (16, 32, 4, 1), (True, 32): (16, 32, 4, 1),
            (True, 64): (16, 32, 8, 1), (True, 128): (16, 16, 8, 1)}
    cols = {(False, 16): (64, 32, 4, 2), (False, 32): (64, 32, 4, 2), (False, 64): (32, 32, 4, 2),
            (False, 128): (32, 32, 8, 2), (True, 16): (16, 16, 2, 1), (True, 32): (16, 16, 2, 1),
            (True, 64): (16, 32, 8, 1), (True, 128): (16, 16, 8, 1)}
    tf32 = {(True, 64): (16, 16, 8, 1), (True, 128): (16, 32, 8, 1)} if meta["DOT_PRECISION"] == "tf32" else {}
    shape = tf32.get((fp32, BLOCK_D)) or (rows if ROWS else cols)[fp32, BLOCK_D]
    return [c for c in configs if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) == shape]


@triton.jit
def _relative_attention_fwd_kernel(
    out_ptr,    # (tokens, heads, head_dim) output
    lse_ptr,    # (batch, heads, max_seqlen) fp32 natural-log logsumexp of each row's scores
    q_ptr, k_ptr, v_ptr,  # (tokens, heads, head_dim), any strides
    cu_ptr,     # (batch + 1,) int32 sequence starts
    pos_ptr,    # (tokens,) int32 positions
    c2p_ptr,    # (tokens, heads, K) fp32 contiguous q . pos_key^T (HAS_C2P)
    p2c_ptr,    # (tokens, heads, K) fp32 contiguous k . pos_query^T (HAS_P2C)
    lut_ptr,    # (2 radius + 1,) int32 distance -> relative index (HAS_C2P or HAS_P2C)
    bias_ptr,   # (2 radius + 1, heads) fp32 contiguous per-distance bias (HAS_BIAS)
    seed_ptr,   # (1,) int64 Philox seed (HAS_DROPOUT)
    stride_qs, stride_qh, stride_qd, stride_ks, stride_kh, stride_kd, stride_vs, stride_vh, stride_vd,
    stride_os, stride_oh, stride_od,
    stride_cs, stride_ch,  # of c2p and p2c (same layout)
    stride_bd,             # of bias (row stride; heads contiguous)
    n_heads, max_seqlen, radius, sm_scale, dropout_p,
    SEQ_BUCKET,  # autotune key only
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    HAS_C2P: tl.constexpr, HAS_P2C: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_bh, pid_m, b, h, start64, n = _program(cu_ptr, n_heads, max_seqlen, True)
    if pid_m * BLOCK_M >= n:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = _tile(_head(q_ptr, b, start64, h, 0, stride_qs, stride_qh), rows, n, offs_d, stride_qs, stride_qd, HEAD_DIM)
    k_base = _head(k_ptr, b, start64, h, 0, stride_ks, stride_kh)
    v_base = _head(v_ptr, b, start64, h, 0, stride_vs, stride_vh)
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, n, BLOCK_N):
        cols = start_n + offs_n
        k = _tile(k_base, cols, n, offs_d, stride_ks, stride_kd, HEAD_DIM)
        v = _tile(v_base, cols, n, offs_d, stride_vs, stride_vd, HEAD_DIM)
        s, _, _, _ = _scores(tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION), rows, cols, n, h, start64,
                             pos_ptr, c2p_ptr, p2c_ptr, lut_ptr, bias_ptr, stride_cs, stride_ch, stride_bd, radius,
                             sm_scale, HAS_C2P, HAS_P2C, HAS_BIAS)
        s = tl.where((cols < n)[None, :], s * 1.4426950408889634, float("-inf"))   # exp2 units
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if HAS_DROPOUT:
            keep = _keep(seed_ptr, pid_bh, rows, start_n, max_seqlen, dropout_p, BLOCK_M, BLOCK_N)
            p = tl.where(keep, p * (1.0 / (1.0 - dropout_p)), 0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    _store_tile(_head(out_ptr, b, start64, h, 0, stride_os, stride_oh), acc / l_safe[:, None], rows, n, offs_d,
                stride_os, stride_od, HEAD_DIM)
    tl.store(lse_ptr + pid_bh.to(tl.int64) * max_seqlen + rows, (m_i + tl.log2(l_safe)) / 1.4426950408889634,
             mask=rows < n)


@triton.jit
def _relative_attention_bwd_kernel(
    dq_ptr,     # (tokens, heads, head_dim) contiguous, written when ROWS
    dk_ptr,     # like dq, written when not ROWS
    dv_ptr,     # like dq, written when not ROWS
    dc2p_ptr,   # (tokens, heads, K) fp32 zeroed, scatter-added when ROWS and HAS_C2P
    dp2c_ptr,   # like dc2p, scatter-added when not ROWS and HAS_P2C
    dbias_ptr,  # (2 radius + 1, heads) fp32 zeroed, scatter-added when ROWS and HAS_BIAS
    bits_ptr,   # (batch * heads, max_seqlen, ceil(max_seqlen / 8)) uint8 dropout keep bits, written when
                # ROWS, read when not (HAS_DROPOUT)
    q_ptr, k_ptr, v_ptr,
    do_ptr,     # (tokens, heads, head_dim) output gradient
    lse_ptr,    # (batch, heads, max_seqlen) fp32 from the forward
    delta_ptr,  # (batch, heads, max_seqlen) fp32 rowsum(dO * O)
    cu_ptr, pos_ptr, c2p_ptr, p2c_ptr, lut_ptr, bias_ptr, seed_ptr,
    stride_qs, stride_qh, stride_qd, stride_ks, stride_kh, stride_kd, stride_vs, stride_vh, stride_vd,
    stride_ds, stride_dh, stride_dd,   # dO
    stride_gs, stride_gh, stride_gd,   # dq, dk, dv
    stride_cs, stride_ch, stride_bd,
    n_heads, max_seqlen, radius, sm_scale, dropout_p,
    SEQ_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    HAS_C2P: tl.constexpr, HAS_P2C: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    ROWS: tl.constexpr,  # True: this program owns a query block (dq, dc2p, dbias); False: a key block
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Past 64 the head dimension is taken in two halves (SPLIT): q, k, v, dO tiles and dq / dk / dv
    # accumulators of 64 columns each, each product over it a sum of two. A warp holds a whole row block
    # of a product's first operand (3xTF32: twice, split in two): at 128 wide it spilled even at 16 x 16.
    SPLIT: tl.constexpr = BLOCK_D > 64
    D1: tl.constexpr = BLOCK_D // 2 if SPLIT else BLOCK_D
    pid_bh, pid, b, h, start64, n = _program(cu_ptr, n_heads, max_seqlen, True)
    own = BLOCK_M if ROWS else BLOCK_N
    if pid * own >= n:
        return
    offs_d = tl.arange(0, D1)
    q_base = _head(q_ptr, b, start64, h, 0, stride_qs, stride_qh)
    k_base = _head(k_ptr, b, start64, h, 0, stride_ks, stride_kh)
    v_base = _head(v_ptr, b, start64, h, 0, stride_vs, stride_vh)
    do_base = _head(do_ptr, b, start64, h, 0, stride_ds, stride_dh)
    stat_base = pid_bh.to(tl.int64) * max_seqlen
    if ROWS:
        rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        q, q2 = _tiles(q_base, rows, n, offs_d, stride_qs, stride_qd, HEAD_DIM, SPLIT)
        do, do2 = _tiles(do_base, rows, n, offs_d, stride_ds, stride_dd, HEAD_DIM, SPLIT)
        lse = tl.load(lse_ptr + stat_base + rows, mask=rows < n, other=float("inf"))
        delta = tl.load(delta_ptr + stat_base + rows, mask=rows < n, other=0.0)
        dq = tl.zeros([BLOCK_M, D1], tl.float32)
        if SPLIT:
            dq2 = tl.zeros([BLOCK_M, D1], tl.float32)
        for start_n in range(0, n, BLOCK_N):
            cols = start_n + tl.arange(0, BLOCK_N)
            k, k2 = _tiles(k_base, cols, n, offs_d, stride_ks, stride_kd, HEAD_DIM, SPLIT)
            v, v2 = _tiles(v_base, cols, n, offs_d, stride_vs, stride_vd, HEAD_DIM, SPLIT)
            s, d, idx, ok = _scores(_dot_nt(q, q2, k, k2, DOT_PRECISION, SPLIT), rows, cols, n, h, start64, pos_ptr,
                                    c2p_ptr, p2c_ptr, lut_ptr, bias_ptr, stride_cs, stride_ch, stride_bd, radius,
                                    sm_scale, HAS_C2P, HAS_P2C, HAS_BIAS)
            keep = ok
            if HAS_DROPOUT:    # the forward's mask, drawn once: this pass writes it for the key pass
                keep, packed = _keep_bits(seed_ptr, pid_bh, rows, start_n, max_seqlen, dropout_p, BLOCK_M, BLOCK_N)
                bits, bits_ok = _bits_ptrs(bits_ptr, pid_bh, rows, start_n, max_seqlen, BLOCK_N)
                tl.store(bits, packed, mask=bits_ok)
            # s is in natural-log units: exp2(s * log2(e)) = exp(s)
            _, ds = _bwd_tile(s, _dot_nt(do, do2, v, v2, DOT_PRECISION, SPLIT), lse, delta, ok, keep,
                              1.4426950408889634, dropout_p, HAS_DROPOUT)   # dL/ds
            dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)
            if SPLIT:
                dq2 += tl.dot(ds.to(k.dtype), k2, input_precision=DOT_PRECISION)
            if HAS_C2P:
                tl.atomic_add(dc2p_ptr + (start64 + rows[:, None]) * stride_cs + h * stride_ch + idx,
                              ds * sm_scale, mask=ok)
            if HAS_BIAS:
                tl.atomic_add(dbias_ptr + d * stride_bd + h, ds, mask=ok)
        dq_base = _head(dq_ptr, b, start64, h, 0, stride_gs, stride_gh)
        _store_tile(dq_base, dq * sm_scale, rows, n, offs_d, stride_gs, stride_gd, HEAD_DIM)
        if SPLIT:
            _store_tile(dq_base, dq2 * sm_scale, rows, n, offs_d + D1, stride_gs, stride_gd, HEAD_DIM)
    else:
        cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        k, k2 = _tiles(k_base, cols, n, offs_d, stride_ks, stride_kd, HEAD_DIM, SPLIT)
        v, v2 = _tiles(v_base, cols, n, offs_d, stride_vs, stride_vd, HEAD_DIM, SPLIT)
        dk = tl.zeros([BLOCK_N, D1], tl.float32)
        dv = tl.zeros([BLOCK_N, D1], tl.float32)
        if SPLIT:
            dk2 = tl.zeros([BLOCK_N, D1], tl.float32)
            dv2 = tl.zeros([BLOCK_N, D1], tl.float32)
        for start_m in range(0, n, BLOCK_M):
            rows = start_m + tl.arange(0, BLOCK_M)
            q, q2 = _tiles(q_base, rows, n, offs_d, stride_qs, stride_qd, HEAD_DIM, SPLIT)
            lse = tl.load(lse_ptr + stat_base + rows, mask=rows < n, other=float("inf"))
            delta = tl.load(delta_ptr + stat_base + rows, mask=rows < n, other=0.0)
            s, _, idx, ok = _scores(_dot_nt(q, q2, k, k2, DOT_PRECISION, SPLIT), rows, cols, n, h, start64, pos_ptr,
                                    c2p_ptr, p2c_ptr, lut_ptr, bias_ptr, stride_cs, stride_ch, stride_bd, radius,
                                    sm_scale, HAS_C2P, HAS_P2C, HAS_BIAS)
            keep = ok
            if HAS_DROPOUT:    # the query pass's bits
                bits, bits_ok = _bits_ptrs(bits_ptr, pid_bh, rows, pid * BLOCK_N, max_seqlen, BLOCK_N)
                keep = _unpack_bits(tl.load(bits, mask=bits_ok, other=0), BLOCK_M, BLOCK_N)
            do, do2 = _tiles(do_base, rows, n, offs_d, stride_ds, stride_dd, HEAD_DIM, SPLIT)
            p_drop, ds = _bwd_tile(s, _dot_nt(do, do2, v, v2, DOT_PRECISION, SPLIT), lse, delta, ok, keep,
                                   1.4426950408889634, dropout_p, HAS_DROPOUT)
            p_t = tl.trans(p_drop.to(do.dtype))
            ds_t = tl.trans(ds.to(q.dtype))
            dv += tl.dot(p_t, do, input_precision=DOT_PRECISION)
            dk += tl.dot(ds_t, q, input_precision=DOT_PRECISION)
            if SPLIT:
                dv2 += tl.dot(p_t, do2, input_precision=DOT_PRECISION)
                dk2 += tl.dot(ds_t, q2, input_precision=DOT_PRECISION)
            if HAS_P2C:
                tl.atomic_add(dp2c_ptr + (start64 + cols[None, :]) * stride_cs + h * stride_ch + idx,
                              ds * sm_scale, mask=ok)
        dk_base = _head(dk_ptr, b, start64, h, 0, stride_gs, stride_gh)
        dv_base = _head(dv_ptr, b, start64, h, 0, stride_gs, stride_gh)
        _store_tile(dk_base, dk * sm_scale, cols, n, offs_d, stride_gs, stride_gd, HEAD_DIM)
        _store_tile(dv_base, dv, cols, n, offs_d, stride_gs, stride_gd, HEAD_DIM)
        if SPLIT:
            _store_tile(dk_base, dk2 * sm_scale, cols, n, offs_d + D1, stride_gs, stride_gd, HEAD_DIM)
            _store_tile(dv_base, dv2, cols, n, offs_d + D1, stride_gs, stride_gd, HEAD_DIM)


def _fwd_words(config, meta, size):
    """attention.fwd_words plus, with c2p or p2c, the (BLOCK_M, BLOCK_N) relative index tile lut[d] they
    gather with (uncounted, c2p + p2c without dropout spilled 8-64 B within budget: 16-bit 64 x 64 at
    BLOCK_D 64 on sm_80 / sm_89, fp32 32 x 32 at BLOCK_D 32 and 16 x 32 on 4 warps at BLOCK_D 128 on
    sm_90); fp32 on 8 warps at BLOCK_D 32 over any budget: 16 x 32 put 8 B on the stack there (sm_89, TF32),
    where the estimate is small."""
    if size == 4 and meta["BLOCK_D"] <= 32 and config.num_warps == 8:
        return float("inf")
    index = config.kwargs["BLOCK_M"] * config.kwargs["BLOCK_N"] / (32 * config.num_warps)
    return fwd_words(config, meta, size) + (index if meta["HAS_C2P"] or meta["HAS_P2C"] else 0)


_FWD_CONFIGS, _fwd_prune = by_dtype(
    _configs([(64, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 3), (32, 64, 4, 2), (64, 32, 4, 2)]),
    _configs([(32, 64, 4, 2), (64, 32, 4, 2), (32, 32, 4, 2), (32, 32, 4, 1), (16, 32, 4, 1), (16, 32, 8, 1)]),
    {(2, 16): (64, 32, 4, 2), (2, 32): (64, 32, 4, 2), (2, 64): (32, 64, 4, 2), (2, 128): (32, 64, 4, 2),
     (4, 16): (32, 32, 4, 1), (4, 32): (32, 32, 4, 1), (4, 64): (32, 32, 4, 2), (4, 128): (16, 32, 8, 1)},
    narrow_keys(_fwd_words), FWD_BUDGET)
# ^ the config that runs untuned per (element size, BLOCK_D), where not the list's first
_fwd = TunedKernel(_relative_attention_fwd_kernel, _FWD_CONFIGS, _fwd_prune, key=_KEY, shared=shared_bytes(1.4, 1.75))
# dq and dk/dv programs write disjoint outputs; the scatter-adds make a re-run wrong, so no autotune
# timing runs on the backward: it launches its first config (reset_to_zero would also work).
_bwd = TunedKernel(_relative_attention_bwd_kernel, _BWD_CONFIGS, _bwd_prune, key=_KEY + ["ROWS"],
                   shared=shared_bytes(1.5, 1.75), autotune=False)


# ----------------------------------------------------------------------------------------------
# Launchers (validation of user input lives in fastbert.ops.relative_attention).

class _Call:
    """What the forward and backward share: sizes, the optional position inputs and the launch key."""

    def __init__(self, q, cu_seqlens, max_seqlen, positions, c2p, p2c, lut, bias, radius, scale, dropout_p, seed):
        head_dim = q.shape[-1]
        if head_dim > MAX_HEAD_DIM:
            raise ValueError(f"head_dim {head_dim} exceeds {MAX_HEAD_DIM}")
        if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"the Triton relative attention kernel takes float16, bfloat16 or float32, got {q.dtype}")
        if (c2p is not None or p2c is not None) and lut is None:
            raise ValueError("c2p / p2c need the relative index lut")
        if dropout_p > 0 and (seed is None or seed.dtype != torch.int64 or seed.numel() != 1):
            raise ValueError("attention dropout needs a one-element int64 seed tensor")
        self.batch, self.heads, self.max_seqlen = cu_seqlens.numel() - 1, q.shape[1], max_seqlen  # may be symbolic
        rel = c2p if c2p is not None else p2c
        self.cstrides = tuple(rel.stride()[:2]) if rel is not None else (0, 0)
        self.ptrs = (cu_seqlens, positions, q if c2p is None else c2p, q if p2c is None else p2c,
                     q if lut is None else lut, q if bias is None else bias, seed if dropout_p > 0 else q)
        self.flags = dict(HAS_C2P=c2p is not None, HAS_P2C=p2c is not None, HAS_BIAS=bias is not None,
                          HAS_DROPOUT=dropout_p > 0)
        self.scalars = (self.heads, self.max_seqlen, int(radius), float(scale), float(dropout_p))
        self.meta = dict(SEQ_BUCKET=seq_bucket(self.max_seqlen), HEAD_DIM=head_dim,
                         BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
                         DOT_PRECISION=dot_precision(q.dtype), **self.flags)
        self.key = (self.meta["SEQ_BUCKET"], head_dim, *self.flags.values(), q.dtype, self.meta["DOT_PRECISION"])
        self.bstride = (bias.stride(0),) if bias is not None else (0,)

    def grid(self, block):
        return lambda meta: (self.batch * self.heads, triton.cdiv(self.max_seqlen, meta[block]))


def relative_attention_fwd(q, k, v, cu_seqlens, max_seqlen, positions, *, c2p=None, p2c=None, lut=None,
                           bias=None, radius=0, scale, dropout_p=0.0, seed=None):
    """(out like q, contiguous; lse (batch, heads, max_seqlen) fp32). c2p / p2c (tokens, heads, K) and
    bias (2 radius + 1, heads) fp32 contiguous; positions (tokens,) and lut int32; seed (1,) int64 on
    q's device when dropout_p > 0."""
    c = _Call(q, cu_seqlens, max_seqlen, positions, c2p, p2c, lut, bias, radius, scale, dropout_p, seed)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.full((c.batch, c.heads, c.max_seqlen), float("inf"), dtype=torch.float32, device=q.device)
    if q.numel() == 0:
        return out, lse
    _fwd.launch(c.key, c.grid("BLOCK_M"), out, lse, q, k, v, *c.ptrs, *_strides4(q)[1:], *_strides4(k)[1:],
                *_strides4(v)[1:], *_strides4(out)[1:], *c.cstrides, *c.bstride, *c.scalars, **c.meta)
    return out, lse


def relative_attention_bwd(do, q, k, v, out, lse, cu_seqlens, max_seqlen, positions, *, c2p=None, p2c=None,
                           lut=None, bias=None, radius=0, scale, dropout_p=0.0, seed=None):
    """(dq, dk, dv like q; dc2p, dp2c (tokens, heads, K) fp32 or None; dbias (2 radius + 1, heads) fp32
    or None); the same seed and dropout_p as the forward."""
    c = _Call(q, cu_seqlens, max_seqlen, positions, c2p, p2c, lut, bias, radius, scale, dropout_p, seed)
    dq, dk, dv = (torch.empty(q.shape, dtype=q.dtype, device=q.device) for _ in range(3))
    dc2p = torch.zeros_like(c2p) if c2p is not None else None
    dp2c = torch.zeros_like(p2c) if p2c is not None else None
    dbias = torch.zeros_like(bias) if bias is not None else None
    if q.numel() == 0:
        return dq, dk, dv, dc2p, dp2c, dbias
    delta = torch.empty_like(lse)
    block_m = preprocess_block(c.meta["BLOCK_D"])
    launch(_attention_bwd_preprocess_kernel, (c.batch * c.heads, triton.cdiv(c.max_seqlen, block_m)),
           delta, out, do, cu_seqlens, *_strides4(out), *_strides4(do), c.heads, c.max_seqlen,
           HEAD_DIM=c.meta["HEAD_DIM"], BLOCK_D=c.meta["BLOCK_D"], IS_VARLEN=True, BLOCK_M=block_m)
    # the dropout mask as bits: the query pass draws it once and writes them, the key pass reads them
    bits = (torch.empty((c.batch * c.heads, c.max_seqlen, (c.max_seqlen + 7) // 8), dtype=torch.uint8,
                        device=q.device) if dropout_p > 0 else q)
    grads = (dq, dk, dv, dq if dc2p is None else dc2p, dq if dp2c is None else dp2c, dq if dbias is None else dbias,
             bits)
    args = (q, k, v, do, lse, delta, *c.ptrs, *_strides4(q)[1:], *_strides4(k)[1:], *_strides4(v)[1:],
            *_strides4(do)[1:], *_strides4(dq)[1:], *c.cstrides, *c.bstride, *c.scalars)
    for rows in (True, False):    # the query pass first: it writes the dropout bits
        _bwd.launch(c.key + (rows,), c.grid("BLOCK_M" if rows else "BLOCK_N"), *grads, *args, **c.meta, ROWS=rows)
    return dq, dk, dv, dc2p, dp2c, dbias
