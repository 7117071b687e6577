"""x W^T + b with an optional epilogue: GELU (erf or tanh), ReLU, or a residual add.

- `linear_ref`: F.linear, then the activation or the add. Pure torch; the test oracle.
- oneDNN (`torch.ops.mkldnn._linear_pointwise`, the op torch.compile's CPU backend emits) for CPU
  fp32 inference (no tensor needs a gradient), backend="auto" only, eager only: the epilogue runs inside the
  GEMM, so FFN1's 4x-wide activation is written once instead of read and written again, and the
  residual add after an output projection costs no extra pass. On a 2-core x86 box this is
  1.2-1.7x faster than F.linear for BERT's shapes.
- `pack_weight`: packed copies of a weight (a PackedWeight) that `linear(..., packed=)` reads instead
  of the plain weight. Up to OWN_MAX_TOKENS tokens on one intra-op thread (an Encoder's small batch
  on a busy machine), where the CPU has AVX-512, the call runs fastbert's own fp32 GEMM
  (fastbert._C.linear_f32, csrc/py_linear.cpp) on its copy in 32-column panels, with the epilogue
  in the kernel's store: at a few dozen tokens a GEMM mostly streams its
  weight, and this kernel reads each panel once for every row, with the next panel prefetched (the
  24 GEMMs of MiniLM-L6 at 26 tokens, 2-core AVX-512 guest: 0.81-0.85x the time of MKL's packed
  GEMM on 2 threads, 0.89-0.99x on 1; at 64 tokens on 1 thread 1.06x, hence the limit; on 2 threads
  it waits for the ops between GEMMs to leave torch's OpenMP threads, see OWN_MAX_TOKENS). Elsewhere
  up to MKL_MAX_TOKENS tokens the call runs MKL's packed GEMM (`torch.ops.mkl._mkl_linear` on a
  `cblas_sgemm_pack`ed copy), then its epilogue as one in-place op: about 1 us of fixed cost per
  call against oneDNN's 13 (all 36 GEMMs of MiniLM-L6, 1 thread: 2.1-2.2 ms against oneDNN's
  2.8-2.9 at 9 tokens, 3.2 against 3.8 at 18, 4.6 against 5.4 at 30; at 512 tokens oneDNN is
  ahead). Past MKL_MAX_TOKENS, oneDNN on its blocked copy (no weight reorder per call: at batch 1
  that reorder is most of a GEMM). Each copy is made when a call first needs it and does not follow
  later writes to the weight: its owner remakes it (fastbert.models.layers.PackedWeights).
- Elsewhere (CUDA, autograd, other dtypes, backend="torch" or "triton"): F.linear, with the GELU
  epilogue as fastbert.ops.bias_gelu on the same backend (its Triton kernel on CUDA).
Past a few dozen CPU tokens, and on CUDA, GEMMs stay with torch (oneDNN / MKL / cuBLAS): there a
GEMM is compute-bound and their kernels are as fast as a hand-written one; there is no Triton GEMM.
"""
from typing import Optional

import torch
import torch.nn.functional as F

from fastbert import _C
from fastbert.ops._dispatch import BACKENDS
from fastbert.ops.bias_gelu import bias_gelu

ACTIVATIONS = (None, "gelu", "gelu_tanh", "relu")
_ONEDNN = getattr(torch.ops.mkldnn, "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None
_MKL = (torch.ops.mkl._mkl_linear.default
        if torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear") else None)
# token counts up to which a packed weight runs MKL's packed GEMM (oneDNN past it); the copy is packed
# for this many rows and serves any row count up to it (tested: tests/ops/test_linear.py)
MKL_MAX_TOKENS = 128
# token counts up to which a packed weight runs fastbert's own GEMM (AVX-512 CPUs only): past about
# 40 rows MKL's packed GEMM is as fast on one thread (its copy packs for more rows). On one intra-op
# thread only: on two, a layer's torch ops between its GEMMs (LayerNorm) wake torch's OpenMP
# threads, which then spin on the core the GEMM's own pool needs, and a batch-1 MiniLM forward took
# 7.9-8.1 ms against 4.5-4.8 with MKL's GEMM on those OpenMP threads (5.2-5.6 against 11 with
# OMP_WAIT_POLICY=PASSIVE), though the GEMMs alone run 0.81-0.85x MKL's time there.
OWN_MAX_TOKENS = 40
# token counts up to which a CPU fp32 inference forward runs on fastbert's own kernels end to end, with
# no torch op that wakes OpenMP's threads before or between its GEMMs: the embeddings' LayerNorm
# (fastbert.ops.add_layer_norm) and the whole layer stack in one C++ call (fastbert.models.layers'
# run_lean). There the own GEMM runs on any thread count. One text's layers on 2 threads, MiniLM-L6,
# ms (medians of 4 alternating rounds, the stack sharing its steps in one pool run): 56 tokens 5.6
# against 7.1 one op at a time, 72 tokens 7.2 against 8.2, 80 tokens 8.0 against 9.2, 88 tokens 10.8
# against 9.6, 96 tokens 11.6 against 10.4; hence 80.
STACK_MAX_TOKENS = 80
_OWN = _C.linear_f32_available()
# activation -> (oneDNN post-op, its algorithm)
_EPILOGUE = {None: ("none", ""), "gelu": ("gelu", "none"), "gelu_tanh": ("gelu", "tanh"), "relu": ("relu", "")}


def _check(x, weight, bias, activation, residual, backend) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if activation is not None and residual is not None:
        raise ValueError("linear takes one epilogue: an activation or a residual, not both")
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} does not fit weight {tuple(weight.shape)} (in_features last)")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    if residual is not None and tuple(residual.shape) != (*x.shape[:-1], weight.shape[0]):
        raise ValueError(f"residual must have shape {(*x.shape[:-1], weight.shape[0])}, got {tuple(residual.shape)}")


def uses_cpu_gemm(x: torch.Tensor, weight: torch.Tensor, backend: str = "auto", bias: Optional[torch.Tensor] = None,
                  residual: Optional[torch.Tensor] = None) -> bool:
    """True when `linear` runs this call as CPU fp32 inference: one oneDNN GEMM with its epilogue
    fused, or with a packed weight and few tokens MKL's packed GEMM and its epilogue. Never while
    torch.compile traces: the op has no fake kernel, and Inductor makes the same fusion itself
    from F.linear (with weights it packs). Never when any operand needs a gradient: the op has no
    backward, so a trainable bias beside a frozen weight (BitFit) would get none."""
    operands = (x, weight, bias, residual)
    return (backend == "auto" and _ONEDNN is not None and not torch.compiler.is_compiling()
            and x.device.type == "cpu" and x.dim() == 2
            and x.dtype == weight.dtype == torch.float32
            and not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in operands)))


def linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
               activation: Optional[str] = None, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Pure-torch reference: act(x W^T + b) or x W^T + b + residual."""
    y = F.linear(x, weight, bias)
    if activation == "gelu":
        y = F.gelu(y)
    elif activation == "gelu_tanh":
        y = F.gelu(y, approximate="tanh")
    elif activation == "relu":
        y = torch.relu(y)
    return y if residual is None else y + residual


class PackedWeight:
    """pack_weight(weight): the packed copies of one weight that `linear(..., packed=)` reads:
    fastbert's own (up to OWN_MAX_TOKENS tokens, on AVX-512 CPUs), MKL's (up to MKL_MAX_TOKENS
    tokens, where MKL is available) and oneDNN's (more tokens), each made from the weight when a call
    first needs it. A copy, once made, does not follow writes to the weight."""
    __slots__ = ("weight", "shape", "_own", "_mkl", "_onednn")

    def __init__(self, weight: torch.Tensor):
        with torch.no_grad():
            self.weight = weight.detach().contiguous()
        self.shape = self.weight.shape
        self._own = self._mkl = self._onednn = None

    def uses_own(self, tokens: int) -> bool:
        """fastbert's own GEMM for this call: few tokens, on one intra-op thread (see OWN_MAX_TOKENS)."""
        return _OWN and tokens <= OWN_MAX_TOKENS and torch.get_num_threads() == 1

    def uses_mkl(self, tokens: int) -> bool:
        return _MKL is not None and tokens <= MKL_MAX_TOKENS and not self.uses_own(tokens)

    def own(self) -> torch.Tensor:
        """(ceil(out / 32), in, 32): 32-column panels, the columns past `out` zero (csrc/py_linear.cpp)."""
        if self._own is None:
            n, k = self.shape
            with torch.inference_mode(False), torch.no_grad():  # a normal tensor, usable outside inference mode
                own = torch.empty((n + 31) // 32, k, 32)         # torch's CPU allocator aligns to 64 bytes
                _C.linear_f32_pack(self.weight.numpy(), own.numpy())
            self._own = own
        return self._own

    def mkl(self) -> torch.Tensor:
        if self._mkl is None:
            with torch.no_grad():
                self._mkl = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, MKL_MAX_TOKENS)
        return self._mkl

    def onednn(self) -> torch.Tensor:
        if self._onednn is None:
            with torch.no_grad():
                self._onednn = torch.ops.mkldnn._reorder_linear_weight(self.weight)
        return self._onednn


def pack_weight(weight: torch.Tensor) -> PackedWeight:
    """The packed copies of a CPU fp32 (out, in) weight for `linear(..., packed=)` (see PackedWeight)."""
    if _ONEDNN is None or weight.device.type != "cpu" or weight.dtype != torch.float32 or weight.dim() != 2:
        raise ValueError(f"pack_weight takes a 2-D float32 CPU weight with oneDNN available, got "
                         f"{tuple(weight.shape)} {weight.dtype} on {weight.device}")
    return PackedWeight(weight)


def packed_linear(x: torch.Tensor, packed: PackedWeight, bias: Optional[torch.Tensor] = None,
                  activation: Optional[str] = None, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`linear` on its CPU inference path with a packed weight, without its checks: for a caller that
    made them once for many calls (fastbert.models.layers' lean plans). x (tokens, in) fp32 CPU."""
    if packed.uses_own(x.shape[0]):         # bias, erf GELU or residual in the kernel's store
        y = torch.empty(x.shape[0], packed.shape[0])
        _C.linear_f32(x.contiguous().numpy(), packed.own().numpy(), None if bias is None else bias.detach().numpy(),
                      y.numpy(), None if residual is None else residual.contiguous().numpy(), activation == "gelu",
                      torch.get_num_threads())
        return y if activation in (None, "gelu") else _activate_(y, activation)
    if packed.uses_mkl(x.shape[0]):         # the bias rides in the GEMM, the epilogue in place after it
        y = _MKL(x, packed.mkl(), packed.weight, bias, x.shape[0])
        if residual is not None:
            return y.add_(residual)
        return y if activation is None else _activate_(y, activation)
    return _onednn_linear(x, packed.onednn(), bias, activation, residual)


def _activate_(y: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "relu":
        return y.relu_()
    return torch._C._nn.gelu_(y, approximate="tanh" if activation == "gelu_tanh" else "none")


def _onednn_linear(x, w, bias, activation, residual) -> torch.Tensor:
    x = x.contiguous()
    if residual is not None:
        return _ONEDNN.binary(x, residual.contiguous(), w, bias, "add")
    attr, algorithm = _EPILOGUE[activation]
    return _ONEDNN(x, w, bias, attr, [None] if attr in ("none", "gelu") else [], algorithm)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
           activation: Optional[str] = None, residual: Optional[torch.Tensor] = None,
           backend: str = "auto", packed: Optional[PackedWeight] = None) -> torch.Tensor:
    """act(x W^T + b) (activation "gelu" = exact erf GELU, "gelu_tanh", "relu"), or with
    residual: x W^T + b + residual. Same result on every path, within float rounding.
    packed: pack_weight(weight), read instead of weight on the CPU inference path (uses_cpu_gemm);
    the caller vouches that it is current."""
    _check(x, weight, bias, activation, residual, backend)
    if packed is not None and not (isinstance(packed, PackedWeight) and packed.shape == weight.shape):
        got = tuple(packed.shape) if isinstance(packed, PackedWeight) else type(packed).__name__
        raise ValueError(f"packed must be pack_weight(weight) for weight {tuple(weight.shape)}, got {got}")
    if uses_cpu_gemm(x, weight, backend, bias, residual) and (residual is None or residual.dtype == x.dtype):
        if packed is not None:
            return packed_linear(x, packed, bias, activation, residual)
        return _onednn_linear(x, weight, bias, activation, residual)
    if activation in ("gelu", "gelu_tanh") and bias is not None:
        h = F.linear(x, weight)                                  # bias is fused into the GELU below
        approximate = "tanh" if activation == "gelu_tanh" else "none"
        return bias_gelu(h, bias.to(h.dtype), approximate=approximate, backend=backend)  # autocast: h may be bf16
    return linear_ref(x, weight, bias, activation, residual)
