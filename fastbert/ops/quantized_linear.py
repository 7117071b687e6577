"""Dynamic int8 linear on CPU: y = x W^T + b with W int8 per output channel, x quantized per call.

The GEMMs here are torch's own int8 kernels (the one exception, a short text's whole stack in C++, is
below); this file is the only place that calls them, so the choice between them is made (and
measured: bench/bench_quantized_linear.py) here:
  "per_token"          torch.ops.onednn.qlinear_pointwise on a qlinear_prepack'ed weight, activations
                       quantized per row (per token) around the row's midpoint: x ~= m_r + s_r * q,
                       q int8 in [-127, 127], m_r = (max x_r + min x_r) / 2, s_r = (max - min) / 254.
                       oneDNN takes one activation scale per tensor, so it runs with scale 1 (the exact
                       int32 sums times the weight scales, acc_rc, in fp32) and the rows follow in one
                       in-place pass (the bias and, when asked, the GELU ride along):
                         y = s_r * acc_rc + m_r * wsum_c + b_c,   wsum_c = sum_k Wq_ck * w_scale_c
                       The quantization and that pass are fastbert._C's (csrc/py_quantized_linear.cpp): one pass
                       over memory each, where torch ops took six and three, on torch's thread count.
                       Up to INT_MM_MAX_ROWS rows (a short text alone), on a weight of up to
                       INT_MM_MAX_WEIGHT values, the GEMM is torch._int_mm on the int8 weight as it is,
                       0.3-0.8x qlinear_pointwise's time there: it gives the int32 sums themselves, and
                       the pass makes acc_rc of them as oneDNN does (float(sum) * w_scale_c, rounded
                       once), so both GEMMs give a row the same bits. oneDNN gets the codes as uint8
                       q + 128 with zero point 128 (the same sums): its prepacked weight is for uint8
                       input, and int8 input runs its reference kernel on CPUs without AMX (1000x
                       slower, seen on an AVX-512 VNNI Xeon guest whose AMX was hidden).
                       One short text alone (fastbert.Encoder's batch 1, AVX-512 VNNI) runs its whole
                       int8 stack in C++ (csrc/py_layers.cpp) on fastbert's few-row int8 GEMM
                       (gemm_panels), whose int32 sums are these GEMMs' exact ones.
                       (symmetric scales, m_r = 0, save both passes but cost accuracy: min cosine
                       0.992 instead of 0.997 over 2,000 paragraphs with all-MiniLM-L6-v2).
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

import numpy as np
import torch

from fastbert import _C

BACKENDS = ("per_token", "linear_dynamic", "per_tensor")
# bench/bench_quantized_linear.py, 2-core AVX-512 VNNI x86 at a quiet moment, 1,024 tokens, vs fp32
# oneDNN: per_token 1.9-2.5x, linear_dynamic 2.5-3.1x, per_tensor 2.2-2.9x. per_token is the
# accurate one, and the only one whose rows do not depend on each other (a text's vector is the same
# in any batch): fastbert.quantize uses it for every Linear unless told otherwise.
DEFAULT_BACKEND = "per_token"

# Up to this many rows torch._int_mm is the per_token GEMM, qlinear_pointwise beyond: at a batch-1
# text's ~20 rows _int_mm took 0.3-0.8x qlinear_pointwise's time on all-MiniLM-L6-v2's four shapes in a
# loop, and the whole int8 encode 0.86x; from ~128 rows on it is as slow or slower on some shapes. In an
# encode, where each weight comes in cold, 64 and a limit of 32 were even on ~50-row batches, and 256
# took 1.0x on ~85 rows and 1.09x on ~170 (2-core AVX-512 VNNI x86, torch 2.13). Only for weights of at
# most INT_MM_MAX_WEIGHT values (all-MiniLM-L6-v2's largest, 384 x 1536), in a loop at 18 rows: bert-base's
# 768 x 768, the same size, took 1.08x (0.91x at 48 rows), its 768 x 2304 2.1x, 768 x 3072 2.2x,
# 3072 x 768 1.3x, bert-large's 1024 x 4096 1.7x.
INT_MM_MAX_ROWS = 64
INT_MM_MAX_WEIGHT = 384 * 1536


@functools.cache
def cpu_flags() -> frozenset:
    """The CPU's feature flags as Linux lists them; empty where /proc/cpuinfo cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _has_vnni() -> bool:
    # elsewhere (no /proc) the 7-bit weights that are safe on every CPU
    return bool(cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"})


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
    zeros: Optional[torch.Tensor] = None   # oneDNN: the weight zero points, (out,) int64 zeros
    # per_token, what the row passes read, as numpy arrays made once (a tensor's .numpy() costs about
    # half a microsecond, and a GEMM took a dozen): (out,) wsum_c, the bias (zeros if none), the weight
    # scales (scale's memory); and qweight transposed, (in, out), for torch._int_mm on few rows (None
    # for a weight of more than INT_MM_MAX_WEIGHT values: oneDNN's GEMM at any row count)
    wsum: Optional[np.ndarray] = None
    bias_or_zeros: Optional[np.ndarray] = None
    w_scale: Optional[np.ndarray] = None
    qweight_t: Optional[torch.Tensor] = None
    # the weight in the few-row int8 GEMM's panels (gemm_panels), made on first use
    panels: Optional[torch.Tensor] = None

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
    """(rows, k) float32 contiguous -> (int8 (rows, k), scale (rows, 1), midpoint (rows, 1)): x ~= mid_r +
    scale_r * q, q = round((x - mid_r) / scale_r) in [-127, 127] (a constant row: q = 0, x = mid)."""
    q, scale, mid = _quantize_rows(x)
    return q, torch.from_numpy(scale), torch.from_numpy(mid)


def _quantize_rows(x: torch.Tensor):
    """quantize_rows with the scales and midpoints as the numpy arrays the row passes read: allocated by
    numpy, a quarter of torch.empty's cost, and no .numpy() conversion after."""
    q = np.empty(x.shape, dtype=np.int8)
    scale, mid = np.empty((x.shape[0], 1), dtype=np.float32), np.empty((x.shape[0], 1), dtype=np.float32)
    _C.int8_quantize_rows(x.numpy(), q, scale, mid, torch.get_num_threads())
    return torch.from_numpy(q), scale, mid


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
    return pack_quantized(q, scale, bias, backend, bool(reduce_range))


def join(packs) -> PackedLinear:
    """One PackedLinear for several on the same input, their outputs side by side: the int8 rows and
    their scales are joined as they are, so each output is what its own weight gives (the int32 sums
    are exact; the float rescale may differ by an ulp), for one activation quantization and one GEMM
    instead of one each."""
    packs = list(packs)
    first = packs[0]
    if any((p.backend, p.reduce_range, p.in_features) != (first.backend, first.reduce_range, first.in_features)
           for p in packs) or len({p.bias is None for p in packs}) != 1:
        raise ValueError("join takes weights packed for the same backend and input width, all with a bias or none")
    bias = None if first.bias is None else torch.cat([p.bias for p in packs])
    return pack_quantized(torch.cat([p.qweight for p in packs]), torch.cat([p.scale for p in packs]), bias,
                          first.backend, first.reduce_range)


def pack_quantized(q: torch.Tensor, scale: torch.Tensor, bias: Optional[torch.Tensor], backend: str,
                   reduce_range: bool) -> PackedLinear:
    """Packs int8 weights already quantized per row (int8 (out, in), float32 scale (out,)) for `backend`."""
    zeros = torch.zeros(q.shape[0], dtype=torch.long)
    if backend == "linear_dynamic":
        with warnings.catch_warnings():  # the prepack op takes a quantized tensor, deprecated as a user type
            warnings.simplefilter("ignore", UserWarning)
            qw = torch._make_per_channel_quantized_tensor(q, scale.double(), zeros, 0)
        prepacked = torch.ops.quantized.linear_prepack(qw, bias)
    else:
        prepacked = torch.ops.onednn.qlinear_prepack(q, None)
    out = PackedLinear(backend, prepacked, q, scale, bias, reduce_range, zeros)
    if backend == "per_token":
        scale = scale.float().contiguous()
        wsum = q.float().sum(dim=1) * scale
        out.wsum = wsum.numpy()
        out.bias_or_zeros = (bias if bias is not None else torch.zeros_like(wsum)).float().contiguous().numpy()
        out.w_scale = scale.numpy()
        out.qweight_t = q.t() if q.numel() <= INT_MM_MAX_WEIGHT else None
    return out


def gemm_panels(packed: PackedLinear) -> np.ndarray:
    """packed's int8 weight in the panels of fastbert's few-row int8 GEMM (fastbert._C.int8_gemm_pack, for
    the short forward of one text on AVX-512 VNNI: csrc/py_quantized_linear.cpp), made once and kept with
    it. That GEMM's sums are exact, the same int32 as torch._int_mm's and oneDNN's."""
    if packed.panels is None:
        n, k = packed.qweight.shape
        panels = torch.empty((n + 31) // 32, _C.int8_panel_bytes(k), dtype=torch.int8)   # 64-byte aligned
        _C.int8_gemm_pack(packed.qweight.contiguous().numpy(), panels.numpy())
        packed.panels = panels
    return packed.panels.numpy()


@dataclass
class QuantizedRows:
    """Activations quantized per row as the per_token GEMM takes them (x ~= mid + scale * q): q (rows, k)
    int8, scale and mid (rows, 1) float32 numpy arrays (the row passes' own); `lead` the leading shape of
    the float tensor they stand for."""
    q: torch.Tensor
    scale: np.ndarray
    mid: np.ndarray
    lead: tuple


def _onednn(qx: torch.Tensor, x_scale: float, x_zero: int, packed: PackedLinear, bias) -> torch.Tensor:
    return torch.ops.onednn.qlinear_pointwise(
        qx, x_scale, x_zero, packed.packed, packed.scale, packed.zeros,
        bias, 1.0, 0, torch.float32, "none", [], "")


def _rows(x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
    """x (..., in) checked, as a contiguous (rows, in) matrix."""
    if x.device.type != "cpu" or x.dtype != torch.float32:
        raise TypeError(f"int8 linear takes float32 CPU input, got {x.dtype} on {x.device}")
    if x.shape[-1] != packed.in_features:
        raise ValueError(f"input has {x.shape[-1]} features, the int8 weight expects {packed.in_features}")
    if torch.is_grad_enabled() and x.requires_grad:
        raise RuntimeError("int8 linear is inference only: call it under torch.no_grad() / inference_mode()")
    return x.reshape(-1, packed.in_features).contiguous()


def _per_token_gemm(q: torch.Tensor, packed: PackedLinear):
    """The per_token GEMM of int8 rows q (rows, in), as a rescale pass takes it: (sums, y, w_scale), sums
    the numpy array the pass reads, y the float32 (rows, out) tensor on sums' memory the pass leaves the
    result in, w_scale the weight scales the pass still applies (None: oneDNN applied them). Both GEMMs
    give the exact int32 sums, and the pass rounds float(sum) * w_scale_c as oneDNN does, so a row gets
    the same bits from either (a text's vector does not depend on its batch's size)."""
    if q.shape[0] <= INT_MM_MAX_ROWS and packed.qweight_t is not None:
        acc = torch._int_mm(q, packed.qweight_t)
        return acc.numpy(), acc.view(torch.float32), packed.w_scale
    y = _onednn(q.view(torch.uint8) ^ 128, 1.0, 128, packed, None)
    return y.numpy(), y, None


def _per_token_sums(x2: torch.Tensor, packed: PackedLinear):
    """_per_token_gemm of x2 (rows, in) quantized per row, and each row's scale and midpoint (rows, 1)."""
    qx, s, mid = _quantize_rows(x2)
    return (*_per_token_gemm(qx, packed), s, mid)


def quantized_linear(x: torch.Tensor, packed: PackedLinear, gelu: bool = False) -> torch.Tensor:
    """x (..., in) float32 on CPU -> (..., out) float32; gelu: GELU (erf) of it, in the same pass where
    the backend has one (per_token)."""
    x2 = _rows(x, packed)
    lead = x.shape[:-1]
    if x2.shape[0] == 0:
        return x.new_zeros(*lead, packed.out_features)
    if packed.backend == "per_token":
        sums, y, w_scale, s, mid = _per_token_sums(x2, packed)
        _C.int8_rescale_rows(sums, s, mid, packed.wsum, packed.bias_or_zeros, gelu, torch.get_num_threads(),
                             w_scale=w_scale)
        return y.reshape(*lead, packed.out_features)
    if packed.backend == "linear_dynamic":
        y = torch.ops.quantized.linear_dynamic(x2, packed.packed, packed.reduce_range)
    else:
        qx = torch.quantize_per_tensor_dynamic(x2, torch.quint8, packed.reduce_range)
        y = _onednn(qx.int_repr(), qx.q_scale(), qx.q_zero_point(), packed, packed.bias)
    y = y.reshape(*lead, packed.out_features)
    return torch.nn.functional.gelu(y) if gelu else y


def quantized_linear_gelu_rows(x: torch.Tensor, packed: PackedLinear) -> QuantizedRows:
    """GELU(x W^T + b), quantized per row as the next per_token GEMM takes it: the codes and scales
    quantize_rows gives on quantized_linear(x, packed, gelu=True), made in its rescale pass without
    the float32 output going through memory (the FFN's inner activation: 4 x hidden per token)."""
    if packed.backend != "per_token":
        raise ValueError(f"quantized GELU rows come from the per_token backend, not {packed.backend!r}")
    x2 = _rows(x, packed)
    rows, n = x2.shape[0], packed.out_features
    q = np.empty((rows, n), dtype=np.int8)
    qs, qm = np.empty((rows, 1), dtype=np.float32), np.empty((rows, 1), dtype=np.float32)
    if rows:
        sums, _, w_scale, s, mid = _per_token_sums(x2, packed)
        _C.int8_rescale_gelu_quantize(sums, s, mid, packed.wsum, packed.bias_or_zeros, q, qs, qm,
                                      torch.get_num_threads(), w_scale=w_scale)
    return QuantizedRows(torch.from_numpy(q), qs, qm, tuple(x.shape[:-1]))


def quantized_linear_add_norm(x, packed: PackedLinear, residual: torch.Tensor, norm_weight: torch.Tensor,
                              norm_bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """layer_norm(quantized_linear(x) + residual) over the last dimension: the post-LN step, in the
    pass after the GEMM (per_token; the other backends run the steps one by one). x: a float32 tensor,
    or QuantizedRows for a per_token weight (quantized_linear_gelu_rows' output)."""
    lead = x.lead if isinstance(x, QuantizedRows) else tuple(x.shape[:-1])
    if residual.shape != (*lead, packed.out_features) or residual.dtype != torch.float32:
        raise ValueError(f"the residual must be float32 of shape {(*lead, packed.out_features)}, "
                         f"got {residual.dtype} {tuple(residual.shape)}")
    if isinstance(x, QuantizedRows):
        if packed.backend != "per_token" or x.q.shape[1] != packed.in_features:
            raise ValueError(f"QuantizedRows of width {x.q.shape[1]} need a per_token weight of that input "
                             f"width, got {packed.backend!r} with {packed.in_features}")
        if x.q.shape[0] == 0:
            return residual.clone()
        sums, y, w_scale = _per_token_gemm(x.q, packed)
        s, mid = x.scale, x.mid
    else:
        x2 = _rows(x, packed)
        if packed.backend != "per_token" or x2.shape[0] == 0:
            y = quantized_linear(x, packed) + residual
            return torch.nn.functional.layer_norm(y, y.shape[-1:], norm_weight, norm_bias, eps)
        sums, y, w_scale, s, mid = _per_token_sums(x2, packed)
    weight = norm_weight.detach().float().contiguous()
    bias = torch.zeros_like(weight) if norm_bias is None else norm_bias.detach().float().contiguous()
    _C.int8_rescale_add_norm(sums, s, mid, packed.wsum, packed.bias_or_zeros,
                             residual.reshape(y.shape).contiguous().numpy(), weight.numpy(), bias.numpy(), float(eps),
                             torch.get_num_threads(), w_scale=w_scale)
    return y.reshape(residual.shape)
