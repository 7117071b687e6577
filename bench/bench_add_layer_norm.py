"""add+LayerNorm timings with pytest-benchmark: fastbert.ops.add_layer_norm vs F.layer_norm(x + r).

    pytest bench/bench_add_layer_norm.py --benchmark-only

CPU: fastbert's torch path (what the models run on CPU) against plain torch at BERT-base's hidden
size 768, forward and forward+backward. GPU (marked `gpu`, skipped visibly elsewhere): the Triton
kernel at batch 32 x seq 128 in fp16. extra_info["GB/s"] = bytes read + written by the fused op /
median time (forward: x and r in, y out; training adds the saved sum; backward: dy and the sum in,
dx out). The full GPU table lives in bench/bench_kernels.py.
"""
import pytest
import torch
import torch.nn.functional as F

from fastbert.ops import add_layer_norm

CPU_TOKENS, GPU_TOKENS, HIDDEN = 4096, 32 * 128, 768
TENSORS = {False: 3, True: 7}  # (tokens x hidden) tensors the fused op reads + writes


def _case(kind, train, device, dtype, backend):
    g = torch.Generator().manual_seed(0)
    tokens = CPU_TOKENS if device == "cpu" else GPU_TOKENS
    x, r = (torch.randn(tokens, HIDDEN, generator=g).to(device, dtype).requires_grad_(train) for _ in range(2))
    w = (1 + 0.1 * torch.randn(HIDDEN, generator=g)).to(device, dtype).requires_grad_(train)
    b = torch.randn(HIDDEN, generator=g).to(device, dtype).requires_grad_(train)
    call = {"torch": lambda: F.layer_norm(x + r, (HIDDEN,), w, b, 1e-12),
            "fastbert": lambda: add_layer_norm(x, r, w, b, 1e-12, backend=backend)}[kind]
    if not train:
        return call, x
    dy = torch.randn_like(x)

    def step():
        x.grad = r.grad = w.grad = b.grad = None
        call().backward(dy)
    return step, x


@pytest.mark.parametrize("train", [False, True], ids=["forward", "fwd+bwd"])
@pytest.mark.parametrize("kind", ["torch", "fastbert"])
def test_add_layer_norm_cpu(benchmark, time_memory_bound, kind, train):
    benchmark.group = f"add_layer_norm cpu fp32 {'fwd+bwd' if train else 'forward'}"
    fn, x = _case(kind, train, "cpu", torch.float32, "torch")
    time_memory_bound(fn, TENSORS[train] * x.numel() * x.element_size(), "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("train", [False, True], ids=["forward", "fwd+bwd"])
@pytest.mark.parametrize("kind", ["torch", "fastbert"])
def test_add_layer_norm_gpu(benchmark, time_memory_bound, kind, train):
    if not torch.cuda.is_available():
        pytest.skip("the Triton kernel is timed on a CUDA GPU only")
    benchmark.group = f"add_layer_norm cuda fp16 {'fwd+bwd' if train else 'forward'}"
    fn, x = _case(kind, train, "cuda", torch.float16, "triton")
    time_memory_bound(fn, TENSORS[train] * x.numel() * x.element_size(), "cuda")
