"""The one activation table: transformers' activation names (its ACT2FN keys) that fastbert runs.

Each name gives the function (as transformers computes it: "gelu" is the exact erf GELU, tanh only
for "gelu_new" / "gelu_pytorch_tanh") and the epilogue of fastbert.ops.linear that fuses it into
the GEMM before it (None: the function runs after the GEMM). The BERT-shaped families take the
fused ones (`FUSED`); the gated MLPs of the rotary families take any.
"""
import functools
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Activation:
    fn: Callable[[torch.Tensor], torch.Tensor]
    epilogue: Optional[str]    # fastbert.ops.linear's `activation=`, or None


GELU = Activation(F.gelu, "gelu")
GELU_TANH = Activation(functools.partial(F.gelu, approximate="tanh"), "gelu_tanh")
RELU = Activation(torch.relu, "relu")
SILU = Activation(F.silu, None)

ACTIVATIONS = {"gelu": GELU, "gelu_python": GELU, "gelu_new": GELU_TANH, "gelu_pytorch_tanh": GELU_TANH,
               "relu": RELU, "silu": SILU, "swish": SILU}
FUSED = sorted(name for name, a in ACTIVATIONS.items() if a.epilogue is not None)
