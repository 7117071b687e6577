"""bias+GELU timings with pytest-benchmark: fastbert.ops.bias_gelu vs F.gelu(x + b).

    pytest bench/bench_bias_gelu.py --benchmark-only

CPU: fastbert's torch path (what the models run on CPU) against plain torch on BERT-base's FFN
activations (tokens x 3072), forward and forward+backward. GPU (marked `gpu`, skipped visibly
elsewhere): the Triton kernel at batch 32 x seq 128 in fp16. extra_info["GB/s"] = bytes read + written
by the fused op / median time (forward: x in, y out; backward: dy and x in, dx out). The full GPU
table lives in bench/bench_kernels.py.
"""
import pytest
import torch
import torch.nn.functional as F

from fastbert.ops import bias_gelu

CPU_TOKENS, GPU_TOKENS, WIDTH = 1024, 32 * 128, 3072
TENSORS = {False: 2, True: 5}  # (tokens x width) tensors the fused op reads + writes


def _case(kind, train, device, dtype, backend):
    g = torch.Generator().manual_seed(0)
    tokens = CPU_TOKENS if device == "cpu" else GPU_TOKENS
    x = torch.randn(tokens, WIDTH, generator=g).to(device, dtype).requires_grad_(train)
    b = torch.randn(WIDTH, generator=g).to(device, dtype).requires_grad_(train)
    call = {"torch": lambda: F.gelu(x + b), "fastbert": lambda: bias_gelu(x, b, backend=backend)}[kind]
    if not train:
        return call, x
    dy = torch.randn_like(x)

    def step():
        x.grad = b.grad = None
        call().backward(dy)
    return step, x


@pytest.mark.parametrize("train", [False, True], ids=["forward", "fwd+bwd"])
@pytest.mark.parametrize("kind", ["torch", "fastbert"])
def test_bias_gelu_cpu(benchmark, time_memory_bound, kind, train):
    benchmark.group = f"bias_gelu cpu fp32 {'fwd+bwd' if train else 'forward'}"
    fn, x = _case(kind, train, "cpu", torch.float32, "torch")
    time_memory_bound(fn, TENSORS[train] * x.numel() * x.element_size(), "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("train", [False, True], ids=["forward", "fwd+bwd"])
@pytest.mark.parametrize("kind", ["torch", "fastbert"])
def test_bias_gelu_gpu(benchmark, time_memory_bound, kind, train):
    if not torch.cuda.is_available():
        pytest.skip("the Triton kernel is timed on a CUDA GPU only")
    benchmark.group = f"bias_gelu cuda fp16 {'fwd+bwd' if train else 'forward'}"
    fn, x = _case(kind, train, "cuda", torch.float16, "triton")
    time_memory_bound(fn, TENSORS[train] * x.numel() * x.element_size(), "cuda")
