"""The fast path shared by every family: one post-LN transformer layer on packed tokens.

    x (tokens, hidden) ─► fused QKV GEMM ─► varlen attention ─► out GEMM ─► add+LayerNorm
                       ─► FFN1 GEMM (no bias) ─► bias+GELU ─► FFN2 GEMM ─► add+LayerNorm

Parameters keep transformers' separate query/key/value Linear modules (names, sharing, loading);
their weights are concatenated at run time. Without autograd the concatenation is cached and
rebuilt only when a weight changes (data_ptr or in-place `_version` bump, e.g. an optimizer
step or load_state_dict); with autograd it is a plain torch.cat so gradients reach each Linear.

`output_attentions=True` uses an unfused padded attention (softmax probabilities materialised);
everything else uses fastbert.ops.varlen_attention, attention dropout in training included (inside
the kernel on CUDA). Dropout sites are transformers' per family (see `init_fast`). Under autocast
the GEMM outputs are low precision while the residual stream is not: add+LayerNorm then takes both
in their promoted dtype, as transformers' `LayerNorm(dense(x) + residual)` does.

CPU inference (fp32, no autograd): the GEMMs run as oneDNN linear (torch.ops.mkldnn._linear_pointwise,
the op torch.compile's CPU backend emits), which on a 2-core x86 box is 1.2-1.7x faster than
F.linear for these shapes, and FFN1's bias+GELU (or ReLU) runs in that GEMM's epilogue instead of
as a separate pass (fastbert.ops.bias_gelu's torch path would read and write the 4x-wide
activation twice). Everywhere else (CUDA, autograd, other dtypes) it is F.linear + fastbert.ops.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from fastbert import ops
from fastbert.padding import Packing


_ONEDNN = getattr(torch.ops.mkldnn, "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None
_EPILOGUE = {"none": ("gelu", "none"), "tanh": ("gelu", "tanh"), "relu": ("relu", "")}


def use_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """oneDNN linear for CPU fp32 inference (no tensor needs a gradient)."""
    return (_ONEDNN is not None and x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32
            and x.dim() == 2 and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    if use_onednn(x, weight):
        return _ONEDNN(x.contiguous(), weight, bias, "none", [None], "")
    return F.linear(x, weight, bias)


def ffn_in(x: torch.Tensor, layer: nn.Linear, activation: str) -> torch.Tensor:
    """act(x W^T + b): one oneDNN GEMM with the activation in its epilogue, or F.linear + fused op."""
    if use_onednn(x, layer.weight):
        attr, algorithm = _EPILOGUE[activation]
        return _ONEDNN(x.contiguous(), layer.weight, layer.bias, attr, [None] if attr == "gelu" else [],
                       algorithm)
    h = F.linear(x, layer.weight)                                # (tokens, intermediate), bias fused below
    if activation == "relu":
        return torch.relu(h + layer.bias)
    return ops.bias_gelu(h, layer.bias.to(h.dtype), approximate=activation)  # autocast: h may be bf16


def fused_qkv(q: nn.Linear, k: nn.Linear, v: nn.Linear, cache: dict) -> Tuple[torch.Tensor, torch.Tensor]:
    params = (q.weight, k.weight, v.weight, q.bias, k.bias, v.bias)
    if torch.is_grad_enabled() and any(p.requires_grad for p in params):
        return torch.cat(params[:3]), torch.cat(params[3:])
    key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)
    if cache.get("key") != key:
        with torch.inference_mode(False), torch.no_grad():  # a normal tensor, usable outside inference mode
            cache["weight"], cache["bias"] = torch.cat(params[:3]), torch.cat(params[3:])
        cache["key"] = key
    return cache["weight"], cache["bias"]


def padded_attention(q, k, v, packing: Packing, dropout_p: float, need_probs: bool):
    """Unfused attention on a padded copy: (tokens, heads, dim) -> same, plus probs (batch, heads, s, s).

    Padded query rows are computed and dropped; padded keys get the dtype's min score (not -inf,
    so nothing turns into NaN in forward or backward)."""
    b, s = packing.batch, packing.seqlen
    keep = torch.zeros(b * s, dtype=torch.bool, device=q.device)
    if packing.indices is None:
        keep[:] = True
    else:
        keep[packing.indices] = True
    bias = torch.zeros(b, 1, 1, s, dtype=q.dtype, device=q.device)
    bias.masked_fill_(~keep.view(b, 1, 1, s), torch.finfo(q.dtype).min)

    def pad(t):  # (tokens, heads, dim) -> (batch, heads, seq, dim)
        flat = t.new_zeros((b * s,) + tuple(t.shape[1:]))
        flat = flat.index_copy(0, packing.indices, t) if packing.indices is not None else t.reshape(flat.shape)
        return flat.view(b, s, *t.shape[1:]).transpose(1, 2)

    qp, kp, vp = pad(q), pad(k), pad(v)
    probs = None
    if need_probs:
        scores = torch.matmul(qp, kp.transpose(-1, -2)) / math.sqrt(q.shape[-1]) + bias
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        out = torch.matmul(F.dropout(probs, dropout_p, training=dropout_p > 0), vp)
    else:
        out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=bias, dropout_p=dropout_p)
    out = out.transpose(1, 2).reshape(b * s, *q.shape[1:])
    if packing.indices is not None:
        out = out.index_select(0, packing.indices)
    return out, probs


def add_norm(h: torch.Tensor, x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """LayerNorm(h + x); under autocast h (a GEMM output) and x can differ in dtype: promote both."""
    if h.dtype != x.dtype:
        dtype = torch.promote_types(h.dtype, x.dtype)
        h, x = h.to(dtype), x.to(dtype)
    return ops.add_layer_norm(h, x, norm.weight, norm.bias, norm.eps)


def output_add_norm(h: torch.Tensor, dense: nn.Linear, residual: torch.Tensor, norm: nn.LayerNorm,
                    dropout_p: float) -> torch.Tensor:
    """LayerNorm(dropout(dense(h)) + residual). For CPU inference without dropout the residual add
    runs in the oneDNN GEMM's epilogue and the LayerNorm alone follows (one pass fewer)."""
    if dropout_p == 0.0 and residual.dtype == h.dtype and use_onednn(h, dense.weight):
        s = _ONEDNN.binary(h.contiguous(), residual.contiguous(), dense.weight, dense.bias, "add")
        return ops.add_layer_norm(s, None, norm.weight, norm.bias, norm.eps)
    a = F.dropout(linear(h, dense.weight, dense.bias), dropout_p, dropout_p > 0)
    return add_norm(a, residual, norm)


class LayerParts:
    """The modules one layer is made of, under whatever names the family uses."""
    __slots__ = ("query", "key", "value", "attn_out", "attn_norm", "ffn_in", "ffn_out", "ffn_norm")

    def __init__(self, query, key, value, attn_out, attn_norm, ffn_in, ffn_out, ffn_norm):
        self.query, self.key, self.value = query, key, value
        self.attn_out, self.attn_norm = attn_out, attn_norm
        self.ffn_in, self.ffn_out, self.ffn_norm = ffn_in, ffn_out, ffn_norm


class FastLayer(nn.Module):
    """Mixin for a family's layer module: subclasses set `parts()` and call `init_fast(dims)`."""

    def init_fast(self, dims, attn_output_dropout: bool = True, ffn_output_dropout: bool = True) -> None:
        """The flags say where the family applies hidden dropout, as transformers does: BERT-shaped
        layers after both output projections, DistilBERT not after the attention one, ALBERT not
        after the FFN one."""
        self.num_heads = dims.num_heads
        self.activation = dims.activation
        self.hidden_dropout = dims.hidden_dropout
        self.attn_output_dropout = dims.hidden_dropout if attn_output_dropout else 0.0
        self.ffn_output_dropout = dims.hidden_dropout if ffn_output_dropout else 0.0
        self.attention_dropout = dims.attention_dropout
        self._qkv_cache = {}

    def parts(self) -> LayerParts:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, packing: Packing, output_attentions: bool = False
                ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        p = self.parts()
        tokens, hidden = x.shape
        weight, bias = fused_qkv(p.query, p.key, p.value, self._qkv_cache)
        qkv = linear(x, weight, bias).view(tokens, 3, self.num_heads, hidden // self.num_heads)
        q, k, v = qkv.unbind(1)                                  # (tokens, heads, head_dim) views
        attn_p = self.attention_dropout if self.training else 0.0
        probs = None
        if output_attentions:
            ctx, probs = padded_attention(q, k, v, packing, attn_p, output_attentions)
        elif tokens == 0:
            ctx = q.new_zeros(q.shape)
        else:
            ctx = ops.varlen_attention(q, k, v, packing.cu_seqlens, packing.max_seqlen, dropout_p=attn_p)
        train = self.training
        x = output_add_norm(ctx.reshape(tokens, hidden), p.attn_out, x, p.attn_norm,
                            self.attn_output_dropout if train else 0.0)
        h = ffn_in(x, p.ffn_in, self.activation)                 # (tokens, intermediate)
        x = output_add_norm(h, p.ffn_out, x, p.ffn_norm, self.ffn_output_dropout if train else 0.0)
        return x, probs
