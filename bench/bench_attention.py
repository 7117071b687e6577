"""Attention timings with pytest-benchmark: fastbert.ops attention vs F.scaled_dot_product_attention.

    pytest bench/bench_attention.py --benchmark-only

CPU: the torch path (what the models run on CPU) against plain SDPA with a key-padding mask, at a
small BERT shape with random padding (half the slots on average), forward and forward+backward; the
varlen entry point skips the padding's work. GPU (marked `gpu`, skipped visibly elsewhere): the Triton
kernel against SDPA at BERT-base shapes in fp16. The inputs and calls here are the ones
bench/bench_kernels.py times on a GPU (its full table, TFLOP/s, every SDPA backend and the checks).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from common import pytest

from fastbert.ops import attention, varlen_attention

CPU_SHAPE = dict(batch=8, seq=128, heads=12, head_dim=64)
GPU_SHAPE = dict(batch=32, seq=512, heads=12, head_dim=64)


def padding_lengths(batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    """Random lengths in [1, seq]: on average half of each padded batch is padding."""
    return torch.randint(1, seq + 1, (batch,), generator=gen)


def mask_from_lengths(lengths: torch.Tensor, seq: int, device) -> torch.Tensor:
    """(batch, seq) int32 key-padding mask, 1 on real tokens."""
    return (torch.arange(seq)[None, :] < lengths[:, None]).to(device=device, dtype=torch.int32)


@dataclass
class Inputs:
    """One padded attention batch and its packed (varlen) form."""
    q: torch.Tensor          # (batch, seq, heads, head_dim), as k and v
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor       # (batch, seq) int32, 1 on real tokens
    lengths: torch.Tensor    # (batch,) on the CPU
    cu: torch.Tensor         # (batch + 1,) int32 cumulative lengths, on q's device
    max_len: int

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """(batch, seq, ...) -> (real tokens, ...): the rows of real tokens, in order."""
        real = self.mask.bool().flatten().nonzero().squeeze(1)
        return t.reshape(-1, *t.shape[2:])[real].contiguous()


def inputs(batch, seq, heads, head_dim, device, dtype, gen) -> Inputs:
    lengths = padding_lengths(batch, seq, gen)
    q, k, v = (torch.randn(batch, seq, heads, head_dim, generator=gen).to(device, dtype) for _ in range(3))
    cu = torch.zeros(batch + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    return Inputs(q, k, v, mask_from_lengths(lengths, seq, device), lengths, cu.to(device), int(lengths.max()))


def sdpa(q, k, v, mask):
    """SDPA on (batch, seq, heads, head_dim) tensors with a (batch, seq) key-padding mask."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask.bool()[:, None, None, :])
    return out.transpose(1, 2)


def calls(x: Inputs, backend):
    """{kind: (f, its tensor inputs)}: f(*inputs) is one attention forward."""
    return {
        "sdpa": (lambda a, b, c: sdpa(a, b, c, x.mask), (x.q, x.k, x.v)),
        "fastbert_padded": (lambda a, b, c: attention(a, b, c, x.mask, backend=backend), (x.q, x.k, x.v)),
        "fastbert_varlen": (lambda a, b, c: varlen_attention(a, b, c, x.cu, x.max_len, backend=backend),
                            tuple(x.pack(t) for t in (x.q, x.k, x.v))),
    }


def _timed(benchmark, kind, train, device):
    shape, dtype, backend = ((CPU_SHAPE, torch.float32, "torch") if device == "cpu"
                             else (GPU_SHAPE, torch.float16, "triton"))
    fn, tensors = calls(inputs(**shape, device=device, dtype=dtype, gen=torch.Generator().manual_seed(0)),
                        backend)[kind]
    leaves = [t.detach().requires_grad_(train) for t in tensors]
    grad = torch.ones_like(fn(*leaves)) if train else None
    call = (lambda: fn(*leaves).backward(grad)) if train else (lambda: fn(*leaves))
    call()  # compile and autotune outside the timed region

    def timed():
        call()
        if device == "cuda":
            torch.cuda.synchronize()
    with torch.inference_mode(False):
        benchmark(timed)


if pytest is not None:
    @pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
    @pytest.mark.parametrize("train", [False, True], ids=["forward", "fwd+bwd"])
    @pytest.mark.parametrize("kind", ["sdpa", "fastbert_padded", "fastbert_varlen"])
    def test_attention(benchmark, kind, train, device):
        if device == "cuda" and not torch.cuda.is_available():
            pytest.skip("the Triton kernel is timed on a CUDA GPU only")
        benchmark.group = f"attention {device} {'fwd+bwd' if train else 'forward'}"
        _timed(benchmark, kind, train, device)
