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
# Limits: head_dim 1..128, padded to the next power of two >= 16 with masked loads, except where a pass
# takes the columns in two chunks, 64 and a power of two >= 16 (two dots where one would run on 128
# columns): head dims in (64, 96], 80 and 96 among them, in every pass and dtype, and every head dim past 64
# in the fp32 dk/dv pass (see second_chunk, dkdv_second_chunk, and the _CHUNKED_* config tables).
# Any sequence length, fp16 / bf16 / fp32 in, fp32 accumulation and statistics, output in the input dtype.
# fp32 products: TF32 tensor cores when torch.backends.cuda.matmul.allow_tf32 is set (as torch's own
# matmuls), else 3xTF32 (split operands, fp32 accuracy, still tensor cores): never "ieee", which
# lowers tl.dot to unrolled FMAs that spill. fp32 has config lists of its own that fit in shared memory.
# Dropout: keep(b, h, i, j) = u >= p, u the (j % 4)-th uniform of Philox4x32-10(seed, counter
# (i * ceil(L / 4) + j // 4, b*H + h)), L = max_seqlen: one Philox call per four scores, whatever the
# tile shape; kept probabilities are scaled by 1/(1-p). The seed is read from a one-element int64 device
# tensor (no host value per call: CUDA graphs capture a training step). Inference skips the lse store
# (STORE_LSE=False): only the backward reads it.
# Backward (deterministic, no atomics): delta = rowsum(dO * O); a dk/dv pass over key blocks and a
# dq pass over query blocks, with dS = P * (dP - delta) (dP taken through the dropout mask).
# The mask is drawn once in the backward: the dk/dv pass regenerates it from the seed and writes it as
# bits, (batch * heads, max_seqlen, ceil(max_seqlen / 8)) uint8 (byte j // 8 holds key j), which the dq
# pass reads. A bit is 1/8 byte of memory traffic per score where a Philox4x32-10 call is ~20 integer
# instructions per score, and the buffer lives only during the backward (1/32 of an fp32 score matrix).
# Saving it in the forward would hold it for every layer until the backward: O(L^2) activation memory,
# which flash attention exists to avoid.
# Sliding window (WINDOW > 0, ModernBERT's local layers): key j is visible to query i of the same
# sequence iff |pos_i - pos_j| <= window (a runtime half-width); pos is the offset inside the sequence
# (WINDOW=1) or a (tokens,) positions array (WINDOW=2, increasing inside each sequence, holes allowed).
# Each program walks only the blocks within +-window packed tokens of its own block (packed distance <=
# position distance, so no visible key lies outside): a local layer costs O(L * window), not O(L^2).
# Blocks at the window's edges are masked element-wise. WINDOW=0 compiles the global path unchanged.
# Math: Dao et al., "FlashAttention" (2022) and "FlashAttention-2" (2023).
import torch
import triton
import triton.language as tl

from fastbert.kernels._autotune import TunedKernel, launch
from fastbert.kernels._common import dropout_keep, dropout_keep4

LOG2E = 1.4426950408889634
MAX_HEAD_DIM = 128
SEQ_BUCKET_CAP = 4096


def seq_bucket(n: int) -> int:
    """Autotune key for a sequence length: next power of two in [16, SEQ_BUCKET_CAP]. A symbolic length
    (torch.compile) stays as it is: rounding it would specialise the graph on its value, and a traced
    launch runs a fixed config anyway."""
    if isinstance(n, torch.SymInt):
        return n
    return min(max(16, triton.next_power_of_2(max(int(n), 1))), SEQ_BUCKET_CAP)


def _configs(pairs):
    # all of them everywhere: TunedKernel times them on a GPU and runs the first under the interpreter
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in pairs]


_FWD_CONFIGS = _configs([(64, 64, 4, 2), (128, 64, 8, 3), (128, 64, 4, 3), (64, 32, 4, 3),
                         (128, 128, 8, 2), (64, 64, 4, 4)])
# (64, 64, 8 warps) is not a candidate: it spilled in both passes on sm_80 / sm_89 at every head dim,
# where 32 x 64 on 4 warps, the same words per thread (see fwd_words), did not
_BWD_CONFIGS = _configs([(64, 64, 4, 2), (32, 64, 4, 2), (64, 32, 4, 2), (128, 64, 8, 2),
                         (64, 128, 8, 2), (32, 32, 4, 3), (32, 32, 8, 3)])
# fp32 tiles are twice the bytes and 3xTF32 splits each operand: smaller tiles (one stage at head_dim 128 to fit
# 99 KB of shared memory; 16 warps are for the dk/dv pass under TF32 only, see dkdv_words)
_FWD_CONFIGS_FP32 = _configs([(64, 32, 4, 2), (128, 32, 8, 2), (32, 32, 4, 1), (64, 32, 4, 1), (16, 32, 4, 2),
                              (16, 32, 4, 1), (32, 32, 4, 2), (16, 16, 4, 1)])  # see _fwd_words
_BWD_CONFIGS_FP32 = _configs([(16, 32, 4, 2), (32, 32, 4, 2), (32, 64, 8, 2), (16, 32, 4, 1), (32, 32, 4, 1),
                              (16, 16, 4, 1), (16, 32, 8, 2), (16, 32, 8, 1), (16, 16, 8, 1), (16, 16, 16, 1)])
# The config that runs untuned (interpreter, torch.compile graphs, FASTBERT_AUTOTUNE=0) per BLOCK_D where
# the list's first one spills there (registers and spills measured with the AOT compile test, sm_80/89/90)
_FWD_DEFAULT = {(2, 128): (64, 32, 4, 3), (4, 16): (32, 32, 4, 2), (4, 32): (32, 32, 4, 2), (4, 64): (32, 32, 4, 1),
                (4, 128): (16, 32, 4, 2)}
_DKDV_DEFAULT = {(2, 16): (32, 32, 4, 3), (2, 32): (32, 32, 4, 3), (2, 64): (32, 32, 4, 3), (2, 128): (32, 32, 8, 3),
                 (4, 16): (16, 16, 4, 1), (4, 32): (16, 16, 4, 1), (4, 64): (16, 32, 8, 2), (4, 128): (16, 16, 8, 1)}
_DQ_DEFAULT = {(2, 16): (32, 32, 4, 3), (2, 32): (32, 32, 4, 3), (2, 64): (32, 64, 4, 2), (2, 128): (32, 64, 4, 2),
               (4, 128): (16, 16, 8, 1)}
_KEY = ["SEQ_BUCKET", "HEAD_DIM", "IS_VARLEN", "HAS_MASK", "HAS_DROPOUT", "WINDOW"]  # + argument dtypes


def dot_precision(dtype) -> str:
    """tl.dot's input_precision for q's dtype: fp32 through TF32 when torch allows TF32 matmuls, else
    3xTF32 (fp32 accuracy); 16-bit inputs take tensor cores whatever is asked."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "tf32x3"
    return "tf32"


def shared_bytes(factor16, factor32):
    """TunedKernel's `shared` for an attention kernel: a bound on a config's shared memory, the bytes of
    the tiles of each pipeline stage times a factor per kernel and dtype (MMA operand copies, 3xTF32's
    split operands), fitted to and checked against the compiler's figures by the AOT compile test."""
    def shared(config, nargs, meta):
        size = nargs["q_ptr"].element_size()
        tiles = config.num_stages * (config.kwargs["BLOCK_M"] + config.kwargs["BLOCK_N"]) * meta["BLOCK_D"] * size
        return int(tiles * (factor32 if size == 4 else factor16))
    return shared


def second_chunk(head_dim: int) -> int:
    """The forward's and dq pass's BLOCK_D2: for head dims in (64, 96] the width of the columns past 64 (16
    or 32), which then run as two chunks, 64 + BLOCK_D2 columns instead of 128 (80: 37% of the MMA work
    saved, 96: 25%); else 0, one chunk of BLOCK_D columns (a power of two: nothing to save)."""
    return max(16, triton.next_power_of_2(head_dim - 64)) if 64 < head_dim <= 96 else 0


def dkdv_second_chunk(head_dim: int, dtype) -> int:
    """The dk/dv kernel's BLOCK_D2: second_chunk(), and for fp32 also past head_dim 96 (64 + 64 at 128:
    16-bit tiles of 128 columns fit in registers whole, fp32 ones spilled even on 16 x 16 tiles)."""
    if dtype == torch.float32 and head_dim > 96:
        return 64
    return second_chunk(head_dim)


def preprocess_block(block_d: int) -> int:
    """Rows per program of the backward's preprocess (two (rows, BLOCK_D) fp32 tiles in registers: 64
    rows of 128 spill on 4 warps)."""
    return min(64, 4096 // block_d)


def _shape(config):
    return config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_warps, config.num_stages


# Register budgets, in estimated 32-bit words per thread (fwd_words, dq_words, dkdv_words) by element
# size: by_dtype's prune drops a config over its kernel's budget before it can be timed or run, as it
# would spill registers to local memory. Each budget sits between the largest estimate of a config
# that never spilled and the smallest of one that did, over every choosable config compiled for
# sm_80, sm_89 and sm_90, fp16 / bf16 / fp32 (3xTF32 and TF32), head dims 32-128, every flag (AOT
# compile test, tests/gpu_compile.py). The estimate counts the tiles; what else a thread holds
# (addresses, masks, loop state, temporaries) differs by kernel, hence a budget each; an fp32 operand
# is a full word, and 3xTF32 splits it in two where it is used, hence the smaller fp32 budgets.
FWD_BUDGET = {2: 140, 4: 44}
DQ_BUDGET = {2: 144, 4: 30}
DKDV_BUDGET = {2: 132, 4: 56}
# (the estimates and prunes are defined below the kernels: an edit above a kernel recompiles it)


@triton.jit
def _program(cu_ptr, n_heads, max_seqlen, IS_VARLEN: tl.constexpr):
    """This program's (batch * heads index, block index, batch, head (int64: it multiplies strides
    that may span all tokens), first token, length)."""
    pid_bh = tl.program_id(0)  # batch * heads on axis 0: axis 1 is limited to 65535
    pid = tl.program_id(1)
    b = pid_bh // n_heads
    h = (pid_bh % n_heads).to(tl.int64)
    if IS_VARLEN:
        start = tl.load(cu_ptr + b)
        n = tl.load(cu_ptr + b + 1) - start
    else:
        start = tl.full([], 0, tl.int32)  # a tensor, not a constexpr, in both branches
        n = start + max_seqlen
    return pid_bh, pid, b, h, start.to(tl.int64), n


@triton.jit
def _head(ptr, b, start64, h, stride_b, stride_s, stride_h):
    """Pointer to token 0 of sequence b, head h."""
    return ptr + b.to(tl.int64) * stride_b + start64 * stride_s + h * stride_h


@triton.jit
def _tile(base, rows, n, offs_d, stride_s, stride_d, HEAD_DIM: tl.constexpr):
    """(len(rows), BLOCK_D) rows of one head; zeros past the sequence and past head_dim."""
    return tl.load(base + rows[:, None] * stride_s + offs_d[None, :] * stride_d,
                   mask=(rows[:, None] < n) & (offs_d[None, :] < HEAD_DIM), other=0.0)


@triton.jit
def _store_tile(base, x, rows, n, offs_d, stride_s, stride_d, HEAD_DIM: tl.constexpr):
    """Stores x as _tile's rows and columns, in base's dtype."""
    tl.store(base + rows[:, None] * stride_s + offs_d[None, :] * stride_d, x.to(base.dtype.element_ty),
             mask=(rows[:, None] < n) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _key_valid(mask_ptr, stride_mb, stride_ms, b, cols, n, HAS_MASK: tl.constexpr):
    valid = cols < n
    if HAS_MASK:
        real = tl.load(mask_ptr + b.to(tl.int64) * stride_mb + cols * stride_ms, mask=valid, other=0)
        valid = valid & (real != 0)
    return valid


@triton.jit
def _keep(seed_ptr, bh, rows, col0, max_seqlen, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(BLOCK_M, BLOCK_N) dropout keep mask of rows x columns [col0, col0 + BLOCK_N) of head bh (col0 a
    multiple of 4): counters (row * ceil(max_seqlen / 4) + column // 4, bh)."""
    groups = col0 // 4 + tl.arange(0, BLOCK_N // 4)
    c0 = rows[:, None] * ((max_seqlen + 3) // 4) + groups[None, :]
    return dropout_keep(tl.load(seed_ptr), c0, bh, dropout_p, BLOCK_M, BLOCK_N)


@triton.jit
def _join4(a, b, c, d, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(BLOCK_M, BLOCK_N) from four (BLOCK_M, BLOCK_N // 4) tensors, interleaved as dropout_keep does."""
    return tl.reshape(tl.join(tl.join(a, b), tl.join(c, d)), (BLOCK_M, BLOCK_N))


@triton.jit
def _keep_bits(seed_ptr, bh, rows, col0, max_seqlen, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(_keep's mask, the same mask as (BLOCK_M, BLOCK_N // 8) uint8, a byte per 8 columns) from one draw:
    the four outputs of a Philox call give a nibble, two neighbouring groups' nibbles a byte."""
    groups = col0 // 4 + tl.arange(0, BLOCK_N // 4)                   # _keep's counters
    c0 = rows[:, None] * ((max_seqlen + 3) // 4) + groups[None, :]
    k0, k1, k2, k3 = dropout_keep4(tl.load(seed_ptr), c0, bh, dropout_p)
    nibble = k0.to(tl.int32) | (k1.to(tl.int32) << 1) | (k2.to(tl.int32) << 2) | (k3.to(tl.int32) << 3)
    lo, hi = tl.split(tl.reshape(nibble, (BLOCK_M, BLOCK_N // 8, 2)))
    return _join4(k0, k1, k2, k3, BLOCK_M, BLOCK_N), (lo | (hi << 4)).to(tl.uint8)


@triton.jit
def _unpack_bits(packed, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The (BLOCK_M, BLOCK_N) keep mask of _keep_bits' bytes."""
    byte = packed.to(tl.int32)
    nibble = tl.reshape(tl.join(byte & 15, byte >> 4), (BLOCK_M, BLOCK_N // 4))
    return _join4((nibble & 1) != 0, (nibble & 2) != 0, (nibble & 4) != 0, (nibble & 8) != 0, BLOCK_M, BLOCK_N)


@triton.jit
def _bits_ptrs(bits_ptr, bh, rows, col0, max_seqlen, BLOCK_N: tl.constexpr):
    """(pointers, in-bounds mask) of the mask bytes of rows x columns [col0, col0 + BLOCK_N) of head bh,
    col0 a multiple of 8."""
    n_bytes = (max_seqlen + 7) // 8
    groups = col0 // 8 + tl.arange(0, BLOCK_N // 8)
    ptrs = bits_ptr + bh.to(tl.int64) * max_seqlen * n_bytes + rows[:, None] * n_bytes + groups[None, :]
    return ptrs, (rows[:, None] < max_seqlen) & (groups[None, :] < n_bytes)


@triton.jit
def _window_span(first, size, n, window, STEP: tl.constexpr, WINDOW: tl.constexpr):
    """[lo, hi) of the other side's indices that indices [first, first + size) can see, lo a multiple
    of STEP: all n, or with a window only those within +-window (the loop bounds that skip blocks)."""
    lo = first * 0
    hi = n
    if WINDOW:
        lo = tl.maximum(first - window, 0) // STEP * STEP
        hi = tl.minimum(first + size + window, n)
    return lo, hi


@triton.jit
def _allowed(col_ok, pos_ptr, start64, rows, cols, n, window, WINDOW: tl.constexpr):
    """(rows x cols) visibility, broadcastable: the key mask, and with a window |pos_i - pos_j| <= window."""
    ok = col_ok[None, :]
    if WINDOW == 1:
        ok = ok & (tl.abs(rows[:, None] - cols[None, :]) <= window)
    elif WINDOW == 2:
        pr = tl.load(pos_ptr + start64 + rows, mask=rows < n, other=0).to(tl.int64)
        pc = tl.load(pos_ptr + start64 + cols, mask=cols < n, other=0).to(tl.int64)
        ok = ok & (tl.abs(pr[:, None] - pc[None, :]) <= window)
    return ok


@triton.jit
def _bwd_tile(s, dp, lse, delta, col_ok, keep, qk_scale, dropout_p, HAS_DROPOUT: tl.constexpr):
    """One (rows x cols) tile of the backward from its products s = Q K^T and dp = dO V^T: (P as the
    forward multiplied it into V, dS), P recomputed from the saved lse, dP taken through the dropout keep
    mask (HAS_DROPOUT; kept entries scaled by 1/(1-p), dropped ones 0). col_ok: (cols,) key validity, or
    a (rows, cols) visibility mask (window)."""
    p = tl.exp2(s * qk_scale - lse[:, None] * 1.4426950408889634)
    p = tl.where(col_ok, p, 0.0)
    p_drop = p
    if HAS_DROPOUT:
        scale_keep = 1.0 / (1.0 - dropout_p)
        p_drop = tl.where(keep, p * scale_keep, 0.0)
        dp = tl.where(keep, dp * scale_keep, 0.0)
    return p_drop, p * (dp - delta[:, None])


@triton.jit
def _attention_fwd_kernel(
    out_ptr,    # (batch, seq, heads, head_dim) or (total_tokens, heads, head_dim) output
    lse_ptr,    # (batch, heads, max_seqlen) fp32 logsumexp, +inf for rows without a real key (STORE_LSE)
    q_ptr,      # like out
    k_ptr,      # like out
    v_ptr,      # like out
    mask_ptr,   # (batch, seq) int8 key mask, nonzero = real token (HAS_MASK)
    cu_ptr,     # (batch + 1,) int32 sequence starts (IS_VARLEN)
    seed_ptr,   # (1,) int64 Philox seed (HAS_DROPOUT)
    pos_ptr,    # (total_tokens,) int positions for the window (WINDOW == 2)
    stride_qb, stride_qs, stride_qh, stride_qd,  # batch stride is 0 for varlen
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ob, stride_os, stride_oh, stride_od,
    stride_mb, stride_ms,
    n_heads, max_seqlen, sm_scale, dropout_p,
    window,      # half-width of the sliding window (WINDOW > 0)
    SEQ_BUCKET,  # autotune key only: seq_bucket(max_seqlen)
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_MASK: tl.constexpr, HAS_DROPOUT: tl.constexpr, STORE_LSE: tl.constexpr,
    WINDOW: tl.constexpr,  # 0 global; 1 window over offsets in the sequence; 2 over pos_ptr
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D2: tl.constexpr,  # second_chunk(): 0, or the width of the columns past 64
):
    # With BLOCK_D2 the columns are two chunks, [0, 64) and [64, 64 + BLOCK_D2): Q K^T is a sum of two
    # products, P V two accumulators, stored apart.
    D1: tl.constexpr = 64 if BLOCK_D2 else BLOCK_D
    pid_bh, pid_m, b, h, start64, n = _program(cu_ptr, n_heads, max_seqlen, IS_VARLEN)
    if pid_m * BLOCK_M >= n:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D1)
    k_base = _head(k_ptr, b, start64, h, stride_kb, stride_ks, stride_kh)
    v_base = _head(v_ptr, b, start64, h, stride_vb, stride_vs, stride_vh)
    q_base = _head(q_ptr, b, start64, h, stride_qb, stride_qs, stride_qh)
    q = _tile(q_base, rows, n, offs_d, stride_qs, stride_qd, HEAD_DIM)
    qk_scale = sm_scale * 1.4426950408889634  # exp2 instead of exp
    # A finite start for the running max: rows whose keys are all masked keep m finite, p = 0, l = 0.
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D1], tl.float32)
    if BLOCK_D2:
        offs_d2 = D1 + tl.arange(0, BLOCK_D2)
        q2 = _tile(q_base, rows, n, offs_d2, stride_qs, stride_qd, HEAD_DIM)
        acc2 = tl.zeros([BLOCK_M, BLOCK_D2], tl.float32)
    lo, hi = _window_span(pid_m * BLOCK_M, BLOCK_M, n, window, BLOCK_N, WINDOW)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = _key_valid(mask_ptr, stride_mb, stride_ms, b, cols, n, HAS_MASK)
        ok = _allowed(col_ok, pos_ptr, start64, rows, cols, n, window, WINDOW)
        kt = tl.trans(_tile(k_base, cols, n, offs_d, stride_ks, stride_kd, HEAD_DIM))  # (D1, BLOCK_N)
        v = _tile(v_base, cols, n, offs_d, stride_vs, stride_vd, HEAD_DIM)              # (BLOCK_N, D1)
        s = tl.dot(q, kt, input_precision=DOT_PRECISION)
        if BLOCK_D2:
            kt2 = tl.trans(_tile(k_base, cols, n, offs_d2, stride_ks, stride_kd, HEAD_DIM))
            s = tl.dot(q2, kt2, s, input_precision=DOT_PRECISION)
        s = tl.where(ok, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if HAS_DROPOUT:
            keep = _keep(seed_ptr, pid_bh, rows, start_n, max_seqlen, dropout_p, BLOCK_M, BLOCK_N)
            p = tl.where(keep, p * (1.0 / (1.0 - dropout_p)), 0.0)
        p = p.to(v.dtype)
        if BLOCK_D2:    # before the 64-wide product: see the dk/dv kernel
            v2 = _tile(v_base, cols, n, offs_d2, stride_vs, stride_vd, HEAD_DIM)
            acc2 = acc2 * alpha[:, None] + tl.dot(p, v2, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m_i = m_new
    has_key = l_i > 0.0
    l_safe = tl.where(has_key, l_i, 1.0)
    out_base = _head(out_ptr, b, start64, h, stride_ob, stride_os, stride_oh)
    _store_tile(out_base, acc / l_safe[:, None], rows, n, offs_d, stride_os, stride_od, HEAD_DIM)
    if BLOCK_D2:
        _store_tile(out_base, acc2 / l_safe[:, None], rows, n, offs_d2, stride_os, stride_od, HEAD_DIM)
    if STORE_LSE:
        lse = tl.where(has_key, (m_i + tl.log2(l_safe)) / 1.4426950408889634, float("inf"))
        tl.store(lse_ptr + pid_bh.to(tl.int64) * max_seqlen + rows, lse, mask=rows < n)


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
    pid_bh, pid_m, b, h, start64, n = _program(cu_ptr, n_heads, max_seqlen, IS_VARLEN)
    if pid_m * BLOCK_M >= n:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = _tile(_head(out_ptr, b, start64, h, stride_ob, stride_os, stride_oh), rows, n, offs_d,
              stride_os, stride_od, HEAD_DIM).to(tl.float32)
    do = _tile(_head(do_ptr, b, start64, h, stride_db, stride_ds, stride_dh), rows, n, offs_d,
               stride_ds, stride_dd, HEAD_DIM).to(tl.float32)
    tl.store(delta_ptr + pid_bh.to(tl.int64) * max_seqlen + rows, tl.sum(o * do, 1), mask=rows < n)


@triton.jit
def _dkdv_rows(lse_ptr, delta_ptr, bits_ptr, seed_ptr, stat_base, bh, rows, row_ok, col0, ok, max_seqlen, dropout_p,
               HAS_DROPOUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(lse, delta, keep mask) of the dk/dv pass's rows x columns [col0, col0 + BLOCK_N); with dropout the
    mask is drawn and its bits stored for the dq pass. ok: the visibility mask (keep without dropout)."""
    lse = tl.load(lse_ptr + stat_base + rows, mask=row_ok, other=float("inf"))
    delta = tl.load(delta_ptr + stat_base + rows, mask=row_ok, other=0.0)
    keep = ok
    if HAS_DROPOUT:
        keep, packed = _keep_bits(seed_ptr, bh, rows, col0, max_seqlen, dropout_p, BLOCK_M, BLOCK_N)
        bits, bits_ok = _bits_ptrs(bits_ptr, bh, rows, col0, max_seqlen, BLOCK_N)
        tl.store(bits, packed, mask=bits_ok)
    return lse, delta, keep


@triton.jit
def _attention_bwd_dkdv_kernel(
    dk_ptr,     # like k, contiguous
    dv_ptr,     # like v, contiguous (same strides as dk)
    bits_ptr,   # (batch * heads, max_seqlen, ceil(max_seqlen / 8)) uint8 dropout keep bits (HAS_DROPOUT)
    q_ptr, k_ptr, v_ptr,
    do_ptr,     # like q
    lse_ptr,    # (batch, heads, max_seqlen) fp32 from the forward
    delta_ptr,  # (batch, heads, max_seqlen) fp32 from the preprocess kernel
    mask_ptr, cu_ptr, seed_ptr, pos_ptr,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_db, stride_ds, stride_dh, stride_dd,   # dO
    stride_gb, stride_gs, stride_gh, stride_gd,   # dk and dv
    stride_mb, stride_ms,
    n_heads, max_seqlen, sm_scale, dropout_p, window,
    SEQ_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_MASK: tl.constexpr, HAS_DROPOUT: tl.constexpr, WINDOW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D2: tl.constexpr,  # dkdv_second_chunk(): 0, or the width of the columns past 64
):
    # Head dims 80 and 96, and fp32 past 96: the columns are two chunks, [0, 64) and [64, 64 + BLOCK_D2)
    # (BLOCK_D2 16 / 32 / 64 at head dims 80 / 96 / 128, so 80 and 96 are not padded to 128): Q K^T and
    # dO V^T are sums of two products, dk and dv two accumulators each. Every warp holds whole 16-row blocks
    # of q and dO as the first operands of Q K^T and dO V^T, twice under 3xTF32 (high and low parts): 128
    # columns wide that spilled at fp32 even on 16 x 16 tiles. The 64-wide chunk's dk / dv products come
    # last: Triton gives the chained dots the warp layout it picks for that one, where a (BLOCK_N, 16) or
    # (32, 32) product would stack the warps on rows and spill. 16-bit in two chunks: _CHUNKED_DKDV_16's configs.
    D1: tl.constexpr = 64 if BLOCK_D2 else BLOCK_D
    pid_bh, pid_n, b, h, start64, n = _program(cu_ptr, n_heads, max_seqlen, IS_VARLEN)
    if pid_n * BLOCK_N >= n:
        return
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D1)
    col_ok = _key_valid(mask_ptr, stride_mb, stride_ms, b, cols, n, HAS_MASK)
    q_base = _head(q_ptr, b, start64, h, stride_qb, stride_qs, stride_qh)
    do_base = _head(do_ptr, b, start64, h, stride_db, stride_ds, stride_dh)
    k_base = _head(k_ptr, b, start64, h, stride_kb, stride_ks, stride_kh)
    v_base = _head(v_ptr, b, start64, h, stride_vb, stride_vs, stride_vh)
    k = _tile(k_base, cols, n, offs_d, stride_ks, stride_kd, HEAD_DIM)        # (BLOCK_N, D1)
    v = _tile(v_base, cols, n, offs_d, stride_vs, stride_vd, HEAD_DIM)
    dk = tl.zeros([BLOCK_N, D1], tl.float32)
    dv = tl.zeros([BLOCK_N, D1], tl.float32)
    if BLOCK_D2:
        offs_d2 = D1 + tl.arange(0, BLOCK_D2)
        k2 = _tile(k_base, cols, n, offs_d2, stride_ks, stride_kd, HEAD_DIM)  # (BLOCK_N, BLOCK_D2)
        v2 = _tile(v_base, cols, n, offs_d2, stride_vs, stride_vd, HEAD_DIM)
        dk2 = tl.zeros([BLOCK_N, BLOCK_D2], tl.float32)
        dv2 = tl.zeros([BLOCK_N, BLOCK_D2], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    stat_base = pid_bh.to(tl.int64) * max_seqlen
    lo, hi = _window_span(pid_n * BLOCK_N, BLOCK_N, n, window, BLOCK_M, WINDOW)
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + offs_m
        row_ok = rows < n
        ok = _allowed(col_ok, pos_ptr, start64, rows, cols, n, window, WINDOW)
        q = _tile(q_base, rows, n, offs_d, stride_qs, stride_qd, HEAD_DIM)
        do = _tile(do_base, rows, n, offs_d, stride_ds, stride_dd, HEAD_DIM)
        # the row statistics and dropout mask (and the second chunk's q and dO) before the products, except for
        # fp32 in two chunks: q2 and dO2 between the chunks' products, the statistics after them (the orders
        # that compile to fewer registers: in fp32's, 16-bit 32 x 32 on 8 warps spilled 8-16 B on sm_90)
        LATE: tl.constexpr = BLOCK_D2 > 0 and q_ptr.dtype.element_ty == tl.float32
        if not LATE:
            lse, delta, keep = _dkdv_rows(lse_ptr, delta_ptr, bits_ptr, seed_ptr, stat_base, pid_bh, rows, row_ok,
                                          pid_n * BLOCK_N, ok, max_seqlen, dropout_p, HAS_DROPOUT, BLOCK_M, BLOCK_N)
            if BLOCK_D2:
                q2 = _tile(q_base, rows, n, offs_d2, stride_qs, stride_qd, HEAD_DIM)
                do2 = _tile(do_base, rows, n, offs_d2, stride_ds, stride_dd, HEAD_DIM)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)         # (BLOCK_M, BLOCK_N)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        if BLOCK_D2:
            if LATE:
                q2 = _tile(q_base, rows, n, offs_d2, stride_qs, stride_qd, HEAD_DIM)
                do2 = _tile(do_base, rows, n, offs_d2, stride_ds, stride_dd, HEAD_DIM)
            s = tl.dot(q2, tl.trans(k2), s, input_precision=DOT_PRECISION)
            dp = tl.dot(do2, tl.trans(v2), dp, input_precision=DOT_PRECISION)
        if LATE:
            lse, delta, keep = _dkdv_rows(lse_ptr, delta_ptr, bits_ptr, seed_ptr, stat_base, pid_bh, rows, row_ok,
                                          pid_n * BLOCK_N, ok, max_seqlen, dropout_p, HAS_DROPOUT, BLOCK_M, BLOCK_N)
        p_drop, ds = _bwd_tile(s, dp, lse, delta, ok, keep, qk_scale, dropout_p, HAS_DROPOUT)
        p_t = tl.trans(p_drop.to(do.dtype))
        ds_t = tl.trans(ds.to(q.dtype))
        if BLOCK_D2:
            dv2 += tl.dot(p_t, do2, input_precision=DOT_PRECISION)
            dk2 += tl.dot(ds_t, q2, input_precision=DOT_PRECISION)
        dv += tl.dot(p_t, do, input_precision=DOT_PRECISION)
        dk += tl.dot(ds_t, q, input_precision=DOT_PRECISION)
    dk_base = _head(dk_ptr, b, start64, h, stride_gb, stride_gs, stride_gh)
    dv_base = _head(dv_ptr, b, start64, h, stride_gb, stride_gs, stride_gh)
    _store_tile(dk_base, dk * sm_scale, cols, n, offs_d, stride_gs, stride_gd, HEAD_DIM)
    _store_tile(dv_base, dv, cols, n, offs_d, stride_gs, stride_gd, HEAD_DIM)
    if BLOCK_D2:
        _store_tile(dk_base, dk2 * sm_scale, cols, n, offs_d2, stride_gs, stride_gd, HEAD_DIM)
        _store_tile(dv_base, dv2, cols, n, offs_d2, stride_gs, stride_gd, HEAD_DIM)


@triton.jit
def _attention_bwd_dq_kernel(
    dq_ptr,     # like q, contiguous
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, mask_ptr, cu_ptr, pos_ptr,
    bits_ptr,   # the dk/dv pass's dropout keep bits (HAS_DROPOUT)
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_db, stride_ds, stride_dh, stride_dd,   # dO
    stride_gb, stride_gs, stride_gh, stride_gd,   # dq
    stride_mb, stride_ms,
    n_heads, max_seqlen, sm_scale, dropout_p, window,
    SEQ_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_MASK: tl.constexpr, HAS_DROPOUT: tl.constexpr, WINDOW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D2: tl.constexpr,  # second_chunk(): 0, or the width of the columns past 64, as in the forward
):
    D1: tl.constexpr = 64 if BLOCK_D2 else BLOCK_D
    pid_bh, pid_m, b, h, start64, n = _program(cu_ptr, n_heads, max_seqlen, IS_VARLEN)
    if pid_m * BLOCK_M >= n:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D1)
    row_ok = rows < n
    q_base = _head(q_ptr, b, start64, h, stride_qb, stride_qs, stride_qh)
    do_base = _head(do_ptr, b, start64, h, stride_db, stride_ds, stride_dh)
    q = _tile(q_base, rows, n, offs_d, stride_qs, stride_qd, HEAD_DIM)
    do = _tile(do_base, rows, n, offs_d, stride_ds, stride_dd, HEAD_DIM)
    stat_base = pid_bh.to(tl.int64) * max_seqlen
    lse = tl.load(lse_ptr + stat_base + rows, mask=row_ok, other=float("inf"))
    delta = tl.load(delta_ptr + stat_base + rows, mask=row_ok, other=0.0)
    k_base = _head(k_ptr, b, start64, h, stride_kb, stride_ks, stride_kh)
    v_base = _head(v_ptr, b, start64, h, stride_vb, stride_vs, stride_vh)
    qk_scale = sm_scale * 1.4426950408889634
    dq = tl.zeros([BLOCK_M, D1], tl.float32)
    if BLOCK_D2:
        offs_d2 = D1 + tl.arange(0, BLOCK_D2)
        q2 = _tile(q_base, rows, n, offs_d2, stride_qs, stride_qd, HEAD_DIM)
        do2 = _tile(do_base, rows, n, offs_d2, stride_ds, stride_dd, HEAD_DIM)
        dq2 = tl.zeros([BLOCK_M, BLOCK_D2], tl.float32)
    lo, hi = _window_span(pid_m * BLOCK_M, BLOCK_M, n, window, BLOCK_N, WINDOW)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = _key_valid(mask_ptr, stride_mb, stride_ms, b, cols, n, HAS_MASK)
        ok = _allowed(col_ok, pos_ptr, start64, rows, cols, n, window, WINDOW)
        k = _tile(k_base, cols, n, offs_d, stride_ks, stride_kd, HEAD_DIM)
        v = _tile(v_base, cols, n, offs_d, stride_vs, stride_vd, HEAD_DIM)
        keep = ok
        if HAS_DROPOUT:
            bits, bits_ok = _bits_ptrs(bits_ptr, pid_bh, rows, start_n, max_seqlen, BLOCK_N)
            keep = _unpack_bits(tl.load(bits, mask=bits_ok, other=0), BLOCK_M, BLOCK_N)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        if BLOCK_D2:
            k2 = _tile(k_base, cols, n, offs_d2, stride_ks, stride_kd, HEAD_DIM)
            v2 = _tile(v_base, cols, n, offs_d2, stride_vs, stride_vd, HEAD_DIM)
            s = tl.dot(q2, tl.trans(k2), s, input_precision=DOT_PRECISION)
            dp = tl.dot(do2, tl.trans(v2), dp, input_precision=DOT_PRECISION)
        _, ds = _bwd_tile(s, dp, lse, delta, ok, keep, qk_scale, dropout_p, HAS_DROPOUT)
        ds = ds.to(k.dtype)
        if BLOCK_D2:    # before the 64-wide product: see the dk/dv kernel
            dq2 += tl.dot(ds, k2, input_precision=DOT_PRECISION)
        dq += tl.dot(ds, k, input_precision=DOT_PRECISION)
    dq_base = _head(dq_ptr, b, start64, h, stride_gb, stride_gs, stride_gh)
    _store_tile(dq_base, dq * sm_scale, rows, n, offs_d, stride_gs, stride_gd, HEAD_DIM)
    if BLOCK_D2:
        _store_tile(dq_base, dq2 * sm_scale, rows, n, offs_d2, stride_gs, stride_gd, HEAD_DIM)


# Register estimates for the prunes (budgets above the kernels): a config's 32-bit words per thread for
# the tiles a program keeps in registers across its loop, each (rows x columns) / (32 * num_warps) words:
# fp32 accumulators and score-sized tiles (scores, probabilities, dropout draws, relative position
# terms) a word per element, tl.dot's first operands in the input dtype (q, dO, P, dS) half a word per
# 16-bit element. A config over budget would spill registers to local memory. In two column chunks
# (BLOCK_D2) the forward's and 16-bit dq pass's estimates still count BLOCK_D columns, a bound: a launch at
# head dim 80 or 96 chooses among the configs of 128 (the chunks' 16 / 32-wide tiles cost registers of their
# own); the 16-bit dk/dv and fp32 dq passes choose from the tables below.

# Two column chunks (head dims 80 and 96), where the estimates do not tell the configs that spill from those
# that do not: the configs that compiled without spills at both head dims, every flag, fp16 and bf16 / TF32
# and 3xTF32, on sm_80, sm_89 and sm_90 (AOT compile test). 16-bit dk/dv: the row statistics and both
# chunks' q and dO loaded before the products (see the kernel); 32 x 32 on 4 warps spilled 8 B at head_dim 96
# on sm_90 with 3 stages (255 registers with 2), 32 x 16 on 4 warps 8 B at 80 on sm_89, and 64 x 32, 32 x 64,
# 64 x 64 on 4 warps 8-850 B on every target.
_CHUNKED_DKDV_16 = [(32, 32, 8, 3), (32, 32, 8, 2), (32, 32, 8, 1), (16, 32, 4, 2), (16, 32, 4, 1)]
# fp32 dq by precision: TF32's one-chunk config, 16 x 16 on 8 warps, spilled 8 B at head_dim 80 on sm_80 and
# sm_89 (at 128 registers), 16 x 32 on 8 or 4 warps with 1 stage 8 B at 80 on sm_89, and on 4 warps with 2
# stages 8 B at 80 on sm_89 and 96 on sm_90; 3xTF32's 16 x 16 on 4 warps 8 B at 96 on sm_90, 16 x 32 on 4
# warps with 1 stage 8-24 B on sm_90, 16 x 16 on 16 warps 136-248 B.
_CHUNKED_DQ_FP32 = {"tf32": [(16, 32, 8, 2), (16, 16, 4, 1)],
                    "tf32x3": [(16, 32, 8, 2), (16, 32, 8, 1), (16, 16, 8, 1), (16, 32, 4, 2)]}

def fwd_words(config, meta, size):
    """Forward: the (BLOCK_M, BLOCK_D) output accumulator and q operand, the (BLOCK_M, BLOCK_N) scores,
    P operand, dropout draws and each relative position term (HAS_C2P / HAS_P2C / HAS_BIAS)."""
    m, n, d, e = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], meta["BLOCK_D"], size / 4
    if size == 4 and meta.get("BLOCK_D2") and config.num_stages == 1:    # 16 x 32 spilled 8-48 B at head_dim 96
        return float("inf")                                             # (3xTF32, dropout, sm_90)
    score_tiles = 1 + e + meta["HAS_DROPOUT"] + sum(meta.get(f, False) for f in ("HAS_C2P", "HAS_P2C", "HAS_BIAS"))
    return (m * d * (1 + e) + m * n * score_tiles) / (32 * config.num_warps)


def dq_words(config, meta, size):
    """dq pass: the dq accumulator and the q and dO operands (BLOCK_M, BLOCK_D); S and dP, the dS operand
    and the dropout mask (BLOCK_M, BLOCK_N)."""
    m, n, d, e = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], meta["BLOCK_D"], size / 4
    if size == 4 and meta["BLOCK_D2"]:      # fp32 in two chunks: the table decides
        return 0.0 if _shape(config) in _CHUNKED_DQ_FP32[meta["DOT_PRECISION"]] else float("inf")
    if config.num_warps == 16:      # the dk/dv pass's (see dkdv_words)
        return float("inf")
    return (m * d * (1 + 2 * e) + m * n * (2 + e + meta["HAS_DROPOUT"])) / (32 * config.num_warps)


def dkdv_words(config, meta, size):
    """dk/dv pass: the dk and dv accumulators and the k and v operands (BLOCK_N, head columns), S and dP,
    the P^T and dS^T operands and the dropout draws (BLOCK_M, BLOCK_N), the q and dO operands."""
    m, n, e = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], size / 4
    d = 64 + meta["BLOCK_D2"] if meta["BLOCK_D2"] else meta["BLOCK_D"]
    # 16-bit: in two chunks the table's configs only, in one chunk _BWD_CONFIGS' (the others, added for two
    # chunks, were not measured there)
    if size == 2 and (_shape(config) not in _CHUNKED_DKDV_16 if meta["BLOCK_D2"]
                      else _shape(config) not in map(_shape, _BWD_CONFIGS)):
        return float("inf")
    if size == 4 and d <= 32 and n > 16:    # spilled 8-64 B at fp32 BLOCK_D 32, where the estimate is small
        return float("inf")
    # fp32 in two column chunks under TF32 takes 16 x 16 on 16 warps (on 8 it spilled 8 B on sm_80); 16 warps
    # nowhere else (a thread has at most 128 registers there: 3xTF32 spilled 8-64 B)
    tf32_chunks = size == 4 and meta["BLOCK_D2"] > 0 and meta["DOT_PRECISION"] == "tf32"
    if (config.num_warps == 16 and not (tf32_chunks and m == n == 16)
            or tf32_chunks and (m, n, config.num_warps) == (16, 16, 8)):
        return float("inf")
    # fp32 TF32 with dropout at BLOCK_D 64: 16 x 32 on 8 warps and 2 stages, its default, spilled 8 B at 128
    # registers on sm_90 (within budget); 1 stage runs instead
    if (size == 4 and d == 64 and meta["HAS_DROPOUT"] and meta["DOT_PRECISION"] == "tf32"
            and _shape(config) == (16, 32, 8, 2)):
        return float("inf")
    return (n * d * (2 + 2 * e) + m * n * (2 + 2 * e + meta["HAS_DROPOUT"]) + m * d * 2 * e) / (32 * config.num_warps)


def narrow_keys(words):
    """words, with key blocks wider than the head-dim block (or 32) over any budget: at BLOCK_D 32 every
    64-wide one spilled in the dq pass (8-120 B) and the relative forward (24-72 B) on sm_80 / sm_89 /
    sm_90, where the same tiles fit at 64 (the estimate, smaller at 32, does not see it)."""
    def narrow(config, meta, size):
        return float("inf") if config.kwargs["BLOCK_N"] > max(meta["BLOCK_D"], 32) else words(config, meta, size)
    return narrow


# fp32 at BLOCK_D 128 in one chunk: a thread holds q whole (16 rows on 4 warps), 3xTF32 twice; ptxas
# capped some flag combinations at 168 registers (TF32 with a window and dropout at 128) and spilled 8-16 B,
# which no tile count tells apart: the configs that spilled there, by (DOT_PRECISION, IS_VARLEN,
# HAS_MASK, HAS_DROPOUT, WINDOW), over sm_80/89/90 (AOT compile test, every flag). Each combination keeps one.
_FWD_SPILLED_128 = {
    (16, 32, 4, 2): {("tf32x3", True, False, True, 0), ("tf32", True, False, True, 1)},
    (16, 32, 4, 1): {("tf32x3", False, False, False, 0), ("tf32x3", True, False, True, 1),
                     ("tf32", True, False, True, 1)},
    (16, 16, 4, 1): {("tf32x3", True, False, True, 0), ("tf32", True, False, False, 0)},
}


def _fwd_words(config, meta, size):
    """fwd_words, over any budget for the configs that spilled within it (AOT compile test, every flag,
    sm_80/89/90): 16-bit 64 x 32 on 3 stages at BLOCK_D 32 (8 B at 80 registers: the padded serving
    forward, sm_80); fp32 32 x 32 on 2 stages at BLOCK_D 32 with positions (WINDOW 2: 8 B at 96 registers,
    TF32, sm_80); at fp32 BLOCK_D 128 in one chunk those of _FWD_SPILLED_128; 16 x 16 (fp32) only there.
    (32 x 64, and 32 x 32 on 8 warps, are no fp32 candidates: they spilled.)"""
    shape, d, fp32 = _shape(config), meta["BLOCK_D"], size == 4
    one_chunk_128 = fp32 and d == 128 and not meta["BLOCK_D2"]
    flags = tuple(meta[f] for f in ("DOT_PRECISION", "IS_VARLEN", "HAS_MASK", "HAS_DROPOUT", "WINDOW"))
    if (not fp32 and d == 32 and shape == (64, 32, 4, 3)
            or fp32 and d == 32 and meta["WINDOW"] == 2 and shape == (32, 32, 4, 2)
            or one_chunk_128 and flags in _FWD_SPILLED_128.get(shape, ())
            or fp32 and shape[1] == 16 and not one_chunk_128):
        return float("inf")
    return fwd_words(config, meta, size)


def by_dtype(configs16, configs32, defaults=None, words=None, budget=None):
    """(configs, prune) of a kernel whose 16-bit and fp32 inputs tune over config lists of their own;
    defaults {(element size, BLOCK_D): (BLOCK_M, BLOCK_N, warps, stages)} goes first there. With words
    (an estimate of a config's register words per thread, see above) and budget {element size: words},
    the configs over budget are dropped: they would spill."""
    def prune(configs, nargs, **meta):
        size = nargs["q_ptr"].element_size()
        kept = configs[len(configs16):] if size == 4 else configs[:len(configs16)]
        if words is not None:
            kept = [c for c in kept if words(c, meta, size) <= budget[size]]
        first = (defaults or {}).get((size, meta["BLOCK_D"]))
        return sorted(kept, key=lambda c: _shape(c) != first)     # stable: the rest keep their order
    return configs16 + configs32, prune


_fwd = TunedKernel(_attention_fwd_kernel,
                   *by_dtype(_FWD_CONFIGS, _FWD_CONFIGS_FP32, _FWD_DEFAULT, _fwd_words, FWD_BUDGET),
                   key=_KEY + ["STORE_LSE"], shared=shared_bytes(1.0, 1.4))
# the 16-bit dk/dv pass's list: _BWD_CONFIGS and the ones of _CHUNKED_DKDV_16 it lacks
_DKDV_CONFIGS = _BWD_CONFIGS + _configs([c for c in _CHUNKED_DKDV_16 if c not in map(_shape, _BWD_CONFIGS)])
_dkdv = TunedKernel(_attention_bwd_dkdv_kernel,
                    *by_dtype(_DKDV_CONFIGS, _BWD_CONFIGS_FP32, _DKDV_DEFAULT, dkdv_words, DKDV_BUDGET),
                    key=_KEY, shared=shared_bytes(1.25, 1.75))
_dq = TunedKernel(_attention_bwd_dq_kernel,
                  *by_dtype(_BWD_CONFIGS, _BWD_CONFIGS_FP32, _DQ_DEFAULT, narrow_keys(dq_words), DQ_BUDGET),
                  key=_KEY, shared=shared_bytes(1.25, 1.75))


# ----------------------------------------------------------------------------------------------
# Launchers: plain functions over torch tensors (validation of user input lives in fastbert.ops).

def _strides4(t: torch.Tensor):
    """(batch, seq, head, dim) strides; varlen (total, heads, dim) tensors get batch stride 0."""
    return (0,) + tuple(t.stride()) if t.dim() == 3 else tuple(t.stride())


class _Call:
    """What one forward or backward call shares: layout, sizes, flags and the launch key."""

    def __init__(self, q, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed, window, positions):
        head_dim = q.shape[-1]
        if head_dim > MAX_HEAD_DIM:
            raise ValueError(f"head_dim {head_dim} exceeds {MAX_HEAD_DIM}")
        if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"the Triton attention kernel takes float16, bfloat16 or float32, got {q.dtype}")
        if dropout_p > 0 and (seed is None or seed.dtype != torch.int64 or seed.numel() != 1):
            raise ValueError("attention dropout needs a one-element int64 seed tensor")
        self.heads = q.shape[-2]
        self.varlen = cu_seqlens is not None
        if self.varlen:
            if max_seqlen is None:
                raise ValueError("varlen attention needs max_seqlen")
            self.batch, self.max_seqlen = cu_seqlens.numel() - 1, max_seqlen   # symbolic under torch.compile
            self.cu, self.mask, self.mstride = cu_seqlens, q, (0, 0)
        else:
            self.batch, self.max_seqlen, self.cu = q.shape[0], q.shape[1], q
            if key_mask is not None and key_mask.dtype != torch.int8:
                key_mask = (key_mask != 0).to(torch.int8)
            self.mask = q if key_mask is None else key_mask
            self.mstride = (0, 0) if key_mask is None else tuple(key_mask.stride())
        has_mask = key_mask is not None and not self.varlen
        self.dropout = dropout_p > 0
        self.seed = seed if self.dropout else q
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 0):
            raise ValueError(f"window must be an int >= 0 (the half-width), got {window!r}")
        if positions is not None and (window is None or not self.varlen or positions.dim() != 1
                                      or positions.shape[0] != q.shape[0] or positions.stride(0) != 1):
            raise ValueError(f"positions go with a window on varlen input, contiguous ({q.shape[0]},); got "
                             f"shape {tuple(positions.shape)}, window {window!r}, varlen {self.varlen}")
        flag = 0 if window is None else (1 if positions is None else 2)
        self.pos = q if positions is None else positions
        self.scalars = (self.heads, self.max_seqlen, float(scale), float(dropout_p), int(window or 0))
        self.meta = dict(SEQ_BUCKET=seq_bucket(self.max_seqlen), HEAD_DIM=head_dim,
                         BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
                         DOT_PRECISION=dot_precision(q.dtype),
                         IS_VARLEN=self.varlen, HAS_MASK=has_mask, HAS_DROPOUT=self.dropout, WINDOW=flag)
        self.key = (self.meta["SEQ_BUCKET"], head_dim, self.varlen, has_mask, self.dropout, flag, q.dtype,
                    self.meta["DOT_PRECISION"])

    def grid(self, block):
        return lambda meta: (self.batch * self.heads, triton.cdiv(self.max_seqlen, meta[block]))


def attention_fwd(q, k, v, *, scale, key_mask=None, cu_seqlens=None, max_seqlen=None,
                  dropout_p=0.0, seed=None, store_lse=True, window=None, positions=None):
    """out (like q, contiguous) and lse (batch, heads, max_seqlen) fp32, or None without store_lse.
    seed: a (1,) int64 tensor on q's device, needed when dropout_p > 0. window: sliding-window
    half-width (None: global); positions: q.shape[:-2] ints the window is measured in (None: offsets)."""
    c = _Call(q, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed, window, positions)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = (torch.empty((c.batch, c.heads, c.max_seqlen), dtype=torch.float32, device=q.device)
           if store_lse else None)
    if out.numel() == 0:
        return out, (lse.fill_(float("inf")) if store_lse else None)
    _fwd.launch(c.key + (store_lse,), c.grid("BLOCK_M"), out, lse if store_lse else out, q, k, v, c.mask,
                c.cu, c.seed, c.pos, *_strides4(q), *_strides4(k), *_strides4(v), *_strides4(out), *c.mstride,
                *c.scalars, **c.meta, STORE_LSE=store_lse, BLOCK_D2=second_chunk(c.meta["HEAD_DIM"]))
    return out, lse


def attention_bwd(do, q, k, v, out, lse, *, scale, key_mask=None, cu_seqlens=None, max_seqlen=None,
                  dropout_p=0.0, seed=None, window=None, positions=None):
    """(dq, dk, dv), each contiguous in q's shape and dtype; the same seed, window and positions as the
    forward."""
    c = _Call(q, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed, window, positions)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dv = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.numel() == 0:
        return dq, dk, dv
    delta = torch.empty_like(lse)
    block_m = preprocess_block(c.meta["BLOCK_D"])
    launch(_attention_bwd_preprocess_kernel, (c.batch * c.heads, triton.cdiv(c.max_seqlen, block_m)),
           delta, out, do, c.cu, *_strides4(out), *_strides4(do), c.heads, c.max_seqlen,
           HEAD_DIM=c.meta["HEAD_DIM"], BLOCK_D=c.meta["BLOCK_D"], IS_VARLEN=c.varlen, BLOCK_M=block_m)
    # the dropout mask as bits, written by the dk/dv pass and read by the dq pass (see the header)
    bits = (torch.empty((c.batch * c.heads, c.max_seqlen, (c.max_seqlen + 7) // 8), dtype=torch.uint8,
                        device=q.device) if c.dropout else q)
    strides = (*_strides4(q), *_strides4(k), *_strides4(v), *_strides4(do))
    _dkdv.launch(c.key, c.grid("BLOCK_N"), dk, dv, bits, q, k, v, do, lse, delta, c.mask, c.cu, c.seed, c.pos,
                 *strides, *_strides4(dk), *c.mstride, *c.scalars, **c.meta,
                 BLOCK_D2=dkdv_second_chunk(c.meta["HEAD_DIM"], q.dtype))
    _dq.launch(c.key, c.grid("BLOCK_M"), dq, q, k, v, do, lse, delta, c.mask, c.cu, c.pos, bits,
               *strides, *_strides4(dq), *c.mstride, *c.scalars, **c.meta, BLOCK_D2=second_chunk(c.meta["HEAD_DIM"]))
    return dq, dk, dv
