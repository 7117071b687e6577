"""Dynamic int8 linear on CPU: y = x W^T + b with W int8 per output channel, x quantized per call.

The GEMMs are torch's own int8 kernels, never a hand-written one; this file is the only place that
calls them, so the choice between them is made (and measured: bench/bench_quantized_linear.py) here:
  "per_token"          torch.ops.onednn.qlinear_pointwise on a qlinear_prepack'ed weight, activations
                       quantized per row (per token): asymmetric uint8 over [min(x_r, 0), max(x_r, 0)].
                       oneDNN takes one zero point per tensor, so it runs with scale 1 and zero point 0
                       (the exact sum of uint8 x int8 products, times the weight scales, in fp32) and
                       the row scales s_r and zero points z_r are applied after it:
                         y = s_r * (acc_rc - z_r * colsum_c) + b_c,   colsum_c = sum_k Wq_ck * w_scale_c
                       as one in-place scale and one rank-2 addmm_ (the bias rides along).
  "linear_dynamic"     torch.ops.quantized.linear_dynamic on a quantized.linear_prepack'ed weight (FBGEMM);
                       one asymmetric uint8 scale per tensor, chosen inside the op.
  "per_tensor"         torch.ops.onednn.qlinear_pointwise, x quantized per tensor here.
Per-tensor activation scales lose the small tokens to the largest one (all-MiniLM-L6-v2: min cosine
0.97 to fp32 embeddings); per-token scales keep each row's own range (0.99+). Weights: symmetric per
output channel, scale = max|W_row| / weight_max(), zero point 0.
Inference only: no autograd.
"""
import functools
import warnings
from dataclasses import dataclass
from typing import Optional

import torch

BACKENDS = ("per_token", "linear_dynamic", "per_tensor")
# bench/bench_quantized_linear.py, 2-core AVX-512 VNNI x86 at a quiet moment, 1,024 tokens, vs fp32
# oneDNN: per_token 1.9-2.5x, linear_dynamic 2.5-3.1x, per_tensor 2.2-2.9x. per_token is the
# accurate one, and the only one whose rows do not depend on each other (a text's vector is the same
# in any batch): fastbert.quantize uses it for every Linear unless told otherwise.
DEFAULT_BACKEND = "per_token"


def _has_vnni() -> bool:
    # Linux's CPU flags; elsewhere (no /proc) the 7-bit weights that are safe on every CPU
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = f.read()
    except OSError:
        return False
    return any(flag in flags for flag in (" avx512_vnni", " avx_vnni", " amx_int8"))


@functools.cache
def weight_max() -> int:
    """The largest |int8 weight|: 127 with VNNI or AMX, else 63. Read on first use, not at import.

    Without VNNI, x86 int8 GEMMs add pairs of u8 x s8 products in saturating int16: 255 * 63 * 2 fits,
    255 * 127 * 2 does not, so weights keep 7 bits there. VNNI (and AMX) accumulate in int32."""
    return 127 if _has_vnni() else 63


@dataclass
class PackedLinear:
    """A weight packed once for one backend; `qweight` / `scale` keep the int8 values themselves."""
    backend: str
    packed: object                    # the backend's prepacked weight
    qweight: torch.Tensor             # (out, in) int8
    scale: torch.Tensor               # (out,) float32
    bias: Optional[torch.Tensor]      # (out,) float32 or None
    reduce_range: bool
    rank2: Optional[torch.Tensor] = None   # per_token: (2, out) rows colsum and bias (zeros if none)
    zeros: Optional[torch.Tensor] = None   # oneDNN: the weight zero points, (out,) int64 zeros

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
    limit = weight_max()
    scale = w.abs().amax(dim=1) / limit
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))   # an all-zero row stays all zero
    q = torch.round(w / scale[:, None]).clamp_(-limit, limit).to(torch.int8)
    return q, scale


def quantize_rows(x: torch.Tensor):
    """(rows, k) float32 -> (uint8 (rows, k), scale (rows,), zero point (rows,) as float):
    x ~= scale_r * (q - zero_r), asymmetric over [min(x_r, 0), max(x_r, 0)], 0 exact.

    scale = range / 254 and zero = ceil(-min / scale) put x / scale + zero in [0, 255] (up to float
    rounding), so q = trunc(x / scale + zero + 0.5) (round half up) needs no clamp: three passes over
    x (mul, add_, the uint8 cast) instead of five. One level of 255 is the price."""
    # amin + amax: two passes, yet ~20x faster than torch.aminmax(dim=1) (torch 2.13, x86); and
    # mul + add_ beats addcmul's broadcasting path
    lo, hi = x.amin(dim=1).clamp_(max=0), x.amax(dim=1).clamp_(min=0)
    scale = (hi - lo) / 254
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))   # an all-zero row: q = 0
    zero = torch.ceil(-lo / scale)
    q = (x * scale.reciprocal()[:, None]).add_((zero + 0.5)[:, None]).to(torch.uint8)
    return q, scale, zero


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
    rank2 = None
    if backend == "linear_dynamic":
        zeros = torch.zeros(q.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # the prepack op takes a quantized tensor, deprecated as a user type
            warnings.simplefilter("ignore", UserWarning)
            qw = torch._make_per_channel_quantized_tensor(q, scale.double(), zeros, 0)
        packed = torch.ops.quantized.linear_prepack(qw, bias)
    else:
        packed = torch.ops.onednn.qlinear_prepack(q, None)
        zeros = torch.zeros(q.shape[0], dtype=torch.long)
        if backend == "per_token":
            colsum = q.float().sum(dim=1) * scale
            rank2 = torch.stack([colsum, bias if bias is not None else torch.zeros_like(colsum)])
    return PackedLinear(backend, packed, q, scale, bias, bool(reduce_range), rank2, zeros)


def _onednn(qx: torch.Tensor, x_scale: float, x_zero: int, packed: PackedLinear, bias) -> torch.Tensor:
    return torch.ops.onednn.qlinear_pointwise(
        qx, x_scale, x_zero, packed.packed, packed.scale, packed.zeros,
        bias, 1.0, 0, torch.float32, "none", [], "")


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
    if packed.backend == "per_token":
        qx, s, z = quantize_rows(x2)
        y = _onednn(qx, 1.0, 0, packed, None).mul_(s[:, None])       # s_r * acc_rc
        y.addmm_(torch.stack([-s * z, torch.ones_like(s)], dim=1), packed.rank2)  # - s_r z_r colsum_c + b_c
    elif packed.backend == "linear_dynamic":
        y = torch.ops.quantized.linear_dynamic(x2, packed.packed, packed.reduce_range)
    else:
        qx = torch.quantize_per_tensor_dynamic(x2, torch.quint8, packed.reduce_range)
        y = _onednn(qx.int_repr(), qx.q_scale(), qx.q_zero_point(), packed, packed.bias)
    return y.reshape(*lead, packed.out_features)
