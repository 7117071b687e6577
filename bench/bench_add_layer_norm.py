"""add+LayerNorm timings with pytest-benchmark: fastbert.ops.add_layer_norm vs F.layer_norm(x + r).

    pytest bench/bench_add_layer_norm.py --benchmark-only

CPU: fastbert's torch path (what the models run on CPU) against plain torch at BERT-base's hidden
size 768, forward and forward+backward. GPU (marked `gpu`, skipped visibly elsewhere): the Triton
kernel at batch 32 x seq 128 in fp16. extra_info["GB/s"] = bytes read + written by the fused op /
median time (forward: x and r in, y out; training adds the saved sum; backward: dy and the sum in,
dx out). The inputs and calls here are the ones bench/bench_kernels.py times and checks on a GPU.
"""
import torch
import torch.nn.functional as F
from common import elementwise_test, pytest

from fastbert.ops import add_layer_norm

CPU_TOKENS, GPU_TOKENS, WIDTH = 4096, 32 * 128, 768
TENSORS = {"fwd": 3, "fwd+bwd": 7}  # (tokens x width) tensors the fused op reads + writes
NAMES = ("y", "dx", "dresidual", "dweight", "dbias")  # the output, then the gradient of each input
LABELS = {"fastbert": "fastbert add_layer_norm", "torch": "torch F.layer_norm(x + r)"}
EPS = 1e-12  # BERT's


def inputs(tokens, width, device, dtype, gen):
    """x and the residual r (tokens, width), LayerNorm weight and bias (width,)."""
    x, r = (torch.randn(tokens, width, generator=gen).to(device, dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(width, generator=gen)).to(device, dtype)
    return x, r, w, torch.randn(width, generator=gen).to(device, dtype)


def calls(backend):
    """{kind: f(x, r, w, b)}: the fused op and its unfused torch peer."""
    return {"fastbert": lambda x, r, w, b: add_layer_norm(x, r, w, b, EPS, backend=backend),
            "torch": lambda x, r, w, b: F.layer_norm(x + r, (x.shape[-1],), w, b, EPS)}


if pytest is not None:
    test_add_layer_norm = elementwise_test(__name__)
