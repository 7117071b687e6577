"""fastbert.quantize(model, "int8"): dynamic int8 Linear layers for CPU inference, opt-in.

Every nn.Linear child of `model` (any nn.Module: a fastbert model, a transformers one, a
SentenceTransformer) is replaced, in place, by a QuantizedLinear: the weight quantized per output
channel and packed once, activations quantized per call, the GEMM one of torch's own int8 kernels
(fastbert.ops.quantized_linear). Embeddings, LayerNorms and attention stay fp32.

Activation scales (backend=None): per token everywhere, so a text's vector does not depend on the
texts batched with it (one scale per tensor, as FBGEMM's linear_dynamic takes, lets the largest
token of any text set every other text's step), and small tokens keep their own range: measured on
all-MiniLM-L6-v2 by fake-quantizing one Linear kind at a time, per-tensor scales cost min cosine
0.995 / 0.986 / 0.986 on the value and both FFN GEMMs, per-token 0.998 on each. Each token's int8
codes span its own [min, max] around their midpoint (fastbert.ops.quantized_linear); attention reads
the fp32 outputs of the query / key / value GEMMs and is not quantized, so no scale is shared across
tokens anywhere: a text's vector is the same alone and in any batch.
"""
import warnings
from typing import Iterable, Optional

import numpy as np
import torch
from torch import nn

from fastbert.ops import quantized_linear as ql

DTYPES = ("int8",)


class QuantizedLinear(nn.Module):
    """A drop-in for an inference-only nn.Linear: int8 weight per output channel, fp32 in and out.

    The int8 weight, its scales and the bias are buffers (they travel in state_dict); the packed
    form the GEMM reads is built at construction and again after load_state_dict."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 backend: Optional[str] = None, reduce_range: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.backend = backend or ql.DEFAULT_BACKEND
        self.reduce_range = reduce_range
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(out_features))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        self._repack()

    @classmethod
    def from_linear(cls, linear: nn.Linear, backend: Optional[str] = None,
                    reduce_range: bool = False) -> "QuantizedLinear":
        if linear.weight.device.type != "cpu":
            raise ValueError(f"int8 quantization is for CPU models; this Linear is on {linear.weight.device}")
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.in_features, module.out_features = linear.in_features, linear.out_features
        module.backend = backend or ql.DEFAULT_BACKEND
        module.reduce_range = reduce_range
        packed = ql.pack(linear.weight, linear.bias, backend=module.backend, reduce_range=reduce_range)
        module.register_buffer("qweight", packed.qweight)
        module.register_buffer("weight_scale", packed.scale)
        module.register_buffer("bias", packed.bias)
        module._packed = packed
        return module

    def _repack(self) -> None:
        bias = None if self.bias is None else self.bias.float().contiguous()
        self._packed = ql.pack_quantized(self.qweight, self.weight_scale.float(), bias, self.backend,
                                         bool(self.reduce_range))

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._repack()

    def dequantized_weight(self) -> torch.Tensor:
        """The (out, in) float32 weight the int8 GEMM multiplies by."""
        return self.qweight.float() * self.weight_scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ql.quantized_linear(x, self._packed)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, int8 per-channel, backend={self.backend}")


def quantize(model: nn.Module, dtype: str = "int8", skip: Iterable[str] = (),
             backend: Optional[str] = None) -> nn.Module:
    """Replaces each nn.Linear in `model` by a QuantizedLinear, in place, and returns `model`.

    skip: qualified module names (as in model.named_modules()) to keep in fp32, e.g. a
    classifier head. backend: one of fastbert.ops.quantized_linear.BACKENDS for every Linear, or
    None: the measured choice per layer role (see the module docstring)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if backend is not None and backend not in ql.BACKENDS:
        raise ValueError(f"backend must be one of {ql.BACKENDS} or None, got {backend!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    skip = set(skip)
    names = {name for name, _ in model.named_modules()}
    unknown = sorted(skip - names)
    if unknown:
        raise ValueError(f"skip names modules that are not in the model: {unknown}")
    adapters = _adapter_wrappers(model)
    inside = tuple(f"{name}." for name in adapters)
    targets = [(name, m) for name, m in model.named_modules()   # subclasses may carry their own forward
               if type(m) is nn.Linear and name and name not in skip and not name.startswith(inside)]
    if adapters:
        warnings.warn(f"fastbert.quantize: {len(adapters)} Linear(s) with an adapter stay float32 (an adapter "
                      f"reads its base layer's weight, and its own Linears train): {adapters[:3]}; call the "
                      "adapter model's merge_and_unload() first to quantize them too", UserWarning,
                      stacklevel=2)
    if not targets:
        raise ValueError(f"{type(model).__name__} has no nn.Linear layers to quantize")
    bad = [name for name, m in targets if m.weight.device.type != "cpu" or m.weight.dtype != torch.float32]
    if bad:
        m = dict(targets)[bad[0]]
        raise ValueError(f"int8 quantization takes a float32 CPU model; {bad[0]} is {m.weight.dtype} on "
                         f"{m.weight.device}")
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, QuantizedLinear.from_linear(linear, backend=backend or ql.DEFAULT_BACKEND))
    return model


def _adapter_wrappers(model: nn.Module) -> list:
    """Names of the modules that wrap a Linear with an adapter (peft's LoRA layers)."""
    from fastbert.models.layers import adapter_base_layer

    return [name for name, m in model.named_modules() if name and isinstance(adapter_base_layer(m), nn.Linear)]


# ---- embedding precision: sentence-transformers' quantize_embeddings math, without importing it ----

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")


def _to_numpy(x):
    if isinstance(x, torch.Tensor):        # dtype kept (bfloat16, which numpy lacks, as float32)
        x = x.detach()
        return (x.float() if x.dtype == torch.bfloat16 else x).cpu().numpy()
    return np.asarray(x)


def embedding_ranges(embeddings: np.ndarray, precision: str, calibration=None) -> np.ndarray:
    """(2, dim): per-dimension min and max of `calibration` (else of the embeddings themselves)."""
    if calibration is None:
        if embeddings.ndim == 1 or embeddings.shape[0] == 1:
            raise ValueError(f"cannot compute {precision} quantization ranges from a single embedding: "
                             "pass ranges or calibration_embeddings from a representative set")
        calibration = embeddings
    return np.vstack((np.min(calibration, axis=0), np.max(calibration, axis=0)))


def quantize_embeddings(embeddings, precision: str, ranges: Optional[np.ndarray] = None,
                        calibration_embeddings: Optional[np.ndarray] = None):
    """Float embeddings -> `precision`, byte for byte as sentence_transformers.quantization's
    quantize_embeddings: int8 / uint8 split each dimension's [min, max] (from `ranges`, else
    calibration_embeddings, else the embeddings themselves) into 256 buckets; binary / ubinary keep
    the sign bit of each dimension, 8 per byte (binary as int8: the packed byte - 128).
    A list of (tokens, dim) matrices (token embeddings) shares one set of ranges."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if isinstance(embeddings, list):
        if not embeddings:
            return []
        mats = [_to_numpy(e) for e in embeddings]
        if mats[0].ndim == 2:
            if precision.endswith("int8") and ranges is None:
                data = np.concatenate(mats, axis=0) if calibration_embeddings is None else calibration_embeddings
                if len(data):
                    ranges = embedding_ranges(data, precision, calibration_embeddings)
            return [quantize_embeddings(m, precision, ranges, calibration_embeddings) for m in mats]
        embeddings = np.array(mats)
    else:
        embeddings = _to_numpy(embeddings)
    if embeddings.dtype in (np.int8, np.uint8):
        raise TypeError("embeddings to quantize must be float, not int8 / uint8")
    if embeddings.ndim == 2 and embeddings.shape[0] == 0:
        dim = embeddings.shape[1]
        if precision.endswith("int8"):
            return np.zeros((0, dim), dtype=np.int8 if precision == "int8" else np.uint8)
        if precision.endswith("binary"):
            return np.zeros((0, (dim + 7) // 8), dtype=np.int8 if precision == "binary" else np.uint8)
    if precision == "float32":
        return embeddings.astype(np.float32)
    if precision.endswith("int8"):
        if ranges is None:
            ranges = embedding_ranges(embeddings, precision, calibration_embeddings)
        ranges = ranges.astype(np.float32, copy=False)
        starts = ranges[0, :]
        steps = (ranges[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)       # a constant dimension: one bucket
        buckets = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
        return buckets.astype(np.uint8) if precision == "uint8" else (buckets - 128).astype(np.int8)
    bits = np.packbits(embeddings > 0, axis=-1)
    return (bits - 128).astype(np.int8) if precision == "binary" else bits
