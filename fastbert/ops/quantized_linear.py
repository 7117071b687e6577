"""Dynamic int8 linear on CPU: y = x W^T + b with W int8 per output channel, x quantized per call.

The GEMMs are torch's own int8 kernels, never a hand-written one; this file is the only place that
calls them, so the choice between them is made (and measured: bench/bench_quantized_linear.py) here:
  "linear_dynamic"     torch.ops.quantized.linear_dynamic on a torch.ops.quantized.linear_prepack'ed
                       weight (FBGEMM under the default x86 engine); quantizes x per tensor inside
                       the op, fp32 out.
  "qlinear_pointwise"  torch.ops.onednn.qlinear_pointwise on a torch.ops.onednn.qlinear_prepack'ed
                       weight; x is quantized per tensor here (torch.quantize_per_tensor_dynamic).
Weights: symmetric per output channel, scale = max|W_row| / 63, q = round(W / scale) in [-63, 63]
(zero point 0; 7 bits, see WEIGHT_MAX). Activations: asymmetric uint8 per tensor over
[min(x, 0), max(x, 0)], all 8 bits; `reduce_range=True` (torch's eager default, 7-bit activations)
is available but off: on all-MiniLM-L6-v2 the activation range is the scarcer precision.
Inference only: no autograd.
"""
import warnings
from dataclasses import dataclass
from typing import Optional

import torch

BACKENDS = ("linear_dynamic", "qlinear_pointwise")
# measured with bench/bench_quantized_linear.py (2-core AVX2 x86, MiniLM GEMMs over 2,048 tokens)
DEFAULT_BACKEND = "linear_dynamic"
# AVX2 int8 GEMMs (no VNNI) add pairs of u8 x s8 products in saturating int16: 255 * 63 * 2 fits,
# 255 * 127 * 2 does not. So weights keep 7 bits and activations all 8 (rather than torch's
# reduce_range, 7-bit activations): the per-tensor activation range is the scarcer precision.
WEIGHT_MAX = 63


@dataclass
class PackedLinear:
    """A weight packed once for one backend; `qweight` / `scale` keep the int8 values themselves."""
    backend: str
    packed: object                    # the backend's prepacked weight
    qweight: torch.Tensor             # (out, in) int8
    scale: torch.Tensor               # (out,) float32
    bias: Optional[torch.Tensor]      # (out,) float32 or None
    reduce_range: bool

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1]

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]


def quantize_weight(weight: torch.Tensor):
    """(out, in) float weight -> (int8 (out, in), float32 scale (out,)), symmetric per row."""
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (out_features, in_features), got shape {tuple(weight.shape)}")
    if not weight.is_floating_point():
        raise TypeError(f"weight must be a float tensor, got {weight.dtype}")
    w = weight.detach().float().cpu()
    scale = w.abs().amax(dim=1) / WEIGHT_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))   # an all-zero row stays all zero
    q = torch.round(w / scale[:, None]).clamp_(-WEIGHT_MAX, WEIGHT_MAX).to(torch.int8)
    return q, scale


def pack(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, backend: Optional[str] = None,
         reduce_range: bool = False) -> PackedLinear:
    """Quantizes and packs an nn.Linear-shaped weight (out, in) and bias (out,) for `backend`."""
    backend = backend or DEFAULT_BACKEND
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    q, scale = quantize_weight(weight)
    if bias is not None:
        if bias.shape != (q.shape[0],):
            raise ValueError(f"bias shape {tuple(bias.shape)} does not match weight's {q.shape[0]} outputs")
        bias = bias.detach().float().cpu().contiguous()
    if backend == "linear_dynamic":
        zeros = torch.zeros(q.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # the prepack op takes a quantized tensor, deprecated as a user type
            warnings.simplefilter("ignore", UserWarning)
            qw = torch._make_per_channel_quantized_tensor(q, scale.double(), zeros, 0)
        packed = torch.ops.quantized.linear_prepack(qw, bias)
    else:
        packed = torch.ops.onednn.qlinear_prepack(q, None)
    return PackedLinear(backend, packed, q, scale, bias, bool(reduce_range))


def quantized_linear(x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
    """x (..., in) float32 on CPU -> (..., out) float32."""
    if x.device.type != "cpu" or x.dtype != torch.float32:
        raise TypeError(f"int8 linear takes float32 CPU input, got {x.dtype} on {x.device}")
    if x.shape[-1] != packed.in_features:
        raise ValueError(f"input has {x.shape[-1]} features, the int8 weight expects {packed.in_features}")
    if torch.is_grad_enabled() and x.requires_grad:
        raise RuntimeError("int8 linear is inference only: call it under torch.no_grad() / inference_mode()")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, packed.in_features).contiguous()
    if x2.shape[0] == 0:
        return x.new_zeros(*lead, packed.out_features)
    if packed.backend == "linear_dynamic":
        y = torch.ops.quantized.linear_dynamic(x2, packed.packed, packed.reduce_range)
    else:
        qx = torch.quantize_per_tensor_dynamic(x2, torch.quint8, packed.reduce_range)
        y = torch.ops.onednn.qlinear_pointwise(
            qx.int_repr(), qx.q_scale(), qx.q_zero_point(), packed.packed, packed.scale,
            torch.zeros(packed.out_features, dtype=torch.long), packed.bias, 1.0, 0, torch.float32,
            "none", [], "")
    return y.reshape(*lead, packed.out_features)
