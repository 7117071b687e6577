"""bias+GELU timings with pytest-benchmark: fastbert.ops.bias_gelu vs F.gelu(x + b).

    pytest bench/bench_bias_gelu.py --benchmark-only

CPU: fastbert's torch path (what the models run on CPU) against plain torch on BERT-base's FFN
activations (tokens x 3072), forward and forward+backward. GPU (marked `gpu`, skipped visibly
elsewhere): the Triton kernel at batch 32 x seq 128 in fp16. extra_info["GB/s"] = bytes read + written
by the fused op / median time (forward: x in, y out; backward: dy and x in, dx out). The inputs and
calls here are the ones bench/bench_kernels.py times and checks on a GPU (its full table).
"""
import torch
import torch.nn.functional as F
from common import elementwise_test, pytest

from fastbert.ops import bias_gelu

CPU_TOKENS, GPU_TOKENS, WIDTH = 1024, 32 * 128, 3072
TENSORS = {"fwd": 2, "fwd+bwd": 5}  # (tokens x width) tensors the fused op reads + writes
NAMES = ("y", "dx", "dbias")        # the output, then the gradient of each input
LABELS = {"fastbert": "fastbert bias_gelu", "torch": "torch F.gelu(x + b)"}


def inputs(tokens, width, device, dtype, gen):
    """x (tokens, width), the FFN's intermediate activations, and its bias (width,)."""
    x = torch.randn(tokens, width, generator=gen).to(device, dtype)
    return x, torch.randn(width, generator=gen).to(device, dtype)


def calls(backend):
    """{kind: f(x, b)}: the fused op and its unfused torch peer."""
    return {"fastbert": lambda x, b: bias_gelu(x, b, backend=backend), "torch": lambda x, b: F.gelu(x + b)}


if pytest is not None:
    test_bias_gelu = elementwise_test(__name__)
