"""Attention over packed sequences on the CPU with no padding: one SDPA call per run of equal lengths.

Packed (tokens, heads, head_dim) sequences that sit next to each other with the same length are a
(count, length, heads, head_dim) view of the packed tensor (splitting the token dimension needs no
copy), so each run is one unmasked torch SDPA call (its CPU flash kernel) on its own rows, and its
output is written straight back into the packed result. Against the padded reference
(attention.varlen_attention_ref: gather to (batch, max_seqlen), masked SDPA, scatter back) this
skips the gathers, the mask and the work on padding keys; and a sequence's output no longer depends
on the other sequences of its batch: the kernel's blocking follows its own length only, so a text's
result is bit for bit the same alone and in any batch (fastbert's int8 path relies on that: one
flipped rounding in an int8 GEMM input moves the whole vector).

Batches that fastbert.Encoder forms are sorted by length, so their runs are few; unsorted batches
fall back to the padded reference beyond MAX_RUNS runs (a call costs tens of microseconds).
Inference only (no dropout, no autograd), float32 / float64, not under torch.compile (it reads
cu_seqlens on the host).

float32 with head_dim 16, 32, ... 128 on an AVX-512 CPU (BERT's 32 and 64) takes fastbert._C's
attention_packed instead (csrc/py_attention.cpp): one pass per (sequence, head), its scores kept in
cache, any number of lengths in any order (torch's flash kernel, at head_dim 32 and 12 heads on one
thread, took 4.7x its time at 8 tokens, 1.7x at 64, 1.3x at 128, 1.2x at 256). Same property: a sequence's bits
do not depend on the batch (nor on the thread count).
"""
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from fastbert import _C

MAX_RUNS = 64


def length_runs(cu_seqlens: torch.Tensor) -> List[Tuple[int, int, int]]:
    """(first token, sequence count, length) of each run of adjacent equal-length sequences."""
    bounds = cu_seqlens.tolist()
    runs, i, batch = [], 0, len(bounds) - 1
    while i < batch:
        length, j = bounds[i + 1] - bounds[i], i + 1
        while j < batch and bounds[j + 1] - bounds[j] == length:
            j += 1
        runs.append((bounds[i], j - i, length))
        i = j
    return runs


def _inference(q, k, v, cu_seqlens, dropout_p) -> bool:
    """CPU float32 / float64 inference outside torch.compile: the calls this module serves."""
    return not (q.device.type != "cpu" or cu_seqlens.device.type != "cpu" or dropout_p != 0.0
                or q.dtype not in (torch.float32, torch.float64) or not q.dtype == k.dtype == v.dtype
                or torch.compiler.is_compiling()
                or (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))))


def runs_apply(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
               dropout_p: float) -> Optional[List[Tuple[int, int, int]]]:
    """The runs when this path serves the call, else None (the caller takes the padded reference)."""
    if not _inference(q, k, v, cu_seqlens, dropout_p):
        return None
    runs = length_runs(cu_seqlens)
    return runs if len(runs) <= MAX_RUNS else None


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     scale: float) -> Optional[torch.Tensor]:
    """fastbert._C's kernel on (tokens, heads, head_dim) float32 q, k, v (any token stride) -> a new
    contiguous output; None where it does not run (dtype, head_dim, a CPU without AVX-512)."""
    dim = q.shape[-1]
    if q.dtype != torch.float32 or dim % 16 or dim > 128 or any(
            t.stride(2) != 1 or t.stride(1) != dim for t in (q, k, v)):
        return None
    return packed_attention_calls(cu_seqlens, dim, float(scale))(q, k, v)


def packed_attention_calls(cu_seqlens: torch.Tensor, head_dim: int, scale: float):
    """For many calls over the same sequences (a forward's layers): (q, k, v) -> packed_attention's
    result, with what each call would check and convert done once (the bounds as int64, the thread
    count). q, k, v float32 CPU, each token's heads and head_dim contiguous (_C checks it). None where
    the kernel cannot run this head_dim; the callable answers None on a CPU without AVX-512."""
    if head_dim % 16 or head_dim > 128:
        return None
    bounds = cu_seqlens.to(torch.int64).numpy()
    threads = torch.get_num_threads()

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Optional[torch.Tensor]:
        out = torch.empty(q.shape, dtype=q.dtype)
        return out if _C.attention_packed(q.numpy(), k.numpy(), v.numpy(), bounds, out.numpy(), scale,
                                          threads) else None
    return call


def varlen_attention_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                         dropout_p: float, scale: float) -> Optional[torch.Tensor]:
    """The packed attention of a CPU inference call: fastbert._C's kernel, else one SDPA per run; None
    when neither serves it (the caller takes the padded reference)."""
    if not _inference(q, k, v, cu_seqlens, dropout_p):
        return None
    out = packed_attention(q, k, v, cu_seqlens, scale)
    if out is not None:
        return out
    runs = length_runs(cu_seqlens)          # the call's checks are done: runs_apply's without them
    return varlen_attention_runs(q, k, v, runs, scale) if len(runs) <= MAX_RUNS else None


def varlen_attention_runs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, runs, scale: float) -> torch.Tensor:
    """(tokens, heads, head_dim) q, k, v (any strides with a contiguous last dim) -> same shape, contiguous."""
    out = q.new_empty(q.shape)
    heads, dim = q.shape[1], q.shape[2]
    for start, count, length in runs:
        if length == 0:
            continue
        rows = slice(start, start + count * length)
        # (count, heads, length, dim) views of the run's rows
        qh, kh, vh = (t[rows].view(count, length, heads, dim).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(qh, kh, vh, scale=scale)
        out[rows].view(count, length, heads, dim).copy_(o.transpose(1, 2))
    return out
