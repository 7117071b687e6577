"""Attention timings with pytest-benchmark: fastbert.ops attention vs F.scaled_dot_product_attention.

    pytest bench/bench_attention.py --benchmark-only

CPU: the torch path (what the models run on CPU) against plain SDPA with a key-padding mask, at a
small BERT shape with 50% padding, forward and forward+backward; the varlen entry point skips the
padding's work. GPU (marked `gpu`, skipped visibly elsewhere): the Triton kernel against SDPA at
BERT-base shapes in fp16. The full GPU table with TFLOP/s lives in bench/bench_kernels.py.
"""
import pytest
import torch
import torch.nn.functional as F

from fastbert.ops import attention, varlen_attention

CPU_SHAPE = dict(batch=8, seq=128, heads=12, head_dim=64)
GPU_SHAPE = dict(batch=32, seq=512, heads=12, head_dim=64)


def _inputs(batch, seq, heads, head_dim, device, dtype, requires_grad=False):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, seq, heads, head_dim, generator=g).to(device, dtype).requires_grad_(requires_grad)
               for _ in range(3))
    lengths = torch.randint(seq // 4, seq + 1, (batch,), generator=g)
    lengths[0] = seq                                                  # about 50% padding overall
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).to(device)
    cu = torch.zeros(batch + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    packed = [t.detach()[mask].requires_grad_(requires_grad) for t in (q, k, v)]
    return q, k, v, mask, packed, cu.to(device), seq


def _sdpa(q, k, v, mask):
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask[:, None, None, :])
    return out.transpose(1, 2)


def _cases(device, dtype, backend):
    def make(kind, train):
        q, k, v, mask, packed, cu, seq = _inputs(**(CPU_SHAPE if device == "cpu" else GPU_SHAPE),
                                                 device=device, dtype=dtype, requires_grad=train)
        calls = {
            "sdpa": lambda: _sdpa(q, k, v, mask),
            "fastbert_padded": lambda: attention(q, k, v, mask, backend=backend),
            "fastbert_varlen": lambda: varlen_attention(*packed, cu, seq, backend=backend),
        }
        call = calls[kind]
        if not train:
            return lambda: call()
        grad = torch.ones_like(call())
        return lambda: call().backward(grad)
    return make


def _run(benchmark, fn, device):
    def timed():
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    with torch.inference_mode(False):
        benchmark(timed)


@pytest.mark.parametrize("train", [False, True], ids=["forward", "fwd+bwd"])
@pytest.mark.parametrize("kind", ["sdpa", "fastbert_padded", "fastbert_varlen"])
def test_attention_cpu(benchmark, kind, train):
    benchmark.group = f"attention cpu fp32 {'fwd+bwd' if train else 'forward'}"
    fn = _cases("cpu", torch.float32, "torch")(kind, train)
    _run(benchmark, fn, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("train", [False, True], ids=["forward", "fwd+bwd"])
@pytest.mark.parametrize("kind", ["sdpa", "fastbert_padded", "fastbert_varlen"])
def test_attention_gpu(benchmark, kind, train):
    if not torch.cuda.is_available():
        pytest.skip("the Triton kernel is timed on a CUDA GPU only")
    benchmark.group = f"attention cuda fp16 {'fwd+bwd' if train else 'forward'}"
    fn = _cases("cuda", torch.float16, "triton")(kind, train)
    fn()  # compile and autotune outside the timed region
    _run(benchmark, fn, "cuda")
