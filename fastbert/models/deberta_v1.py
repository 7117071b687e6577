"""DeBERTa (v1, `model_type` "deberta"): DeBERTa-v2's model with v1's attention parameters.

What differs from DeBERTa-v2 (fastbert/models/deberta.py, which this file builds on):
- one `in_proj` (3 hidden, hidden) without bias, its rows interleaved per head ([q | k | v] of head 0,
  then head 1, ...), plus `q_bias` and `v_bias` (no key bias);
- the position projections are `pos_proj` (c2p, no bias) and `pos_q_proj` (p2c), never shared;
- relative positions are plain distances clamped to `max_relative_positions` (no log buckets, no
  `norm_rel_ebd`); transformers slices the table to the sequence length, which gives the same scores
  as clamping into the whole (2 max_relative_positions, hidden) table;
- no MultipleChoice head (transformers has none for DeBERTa v1).
Embeddings (`position_biased_input`, `embedding_size` via `embed_proj`), LayerNorm names, the c2p / p2c
math (fastbert.ops.relative_attention), ContextPooler and the heads are DeBERTa-v2's. Refused with a
ConfigError: `talking_head=True`, and what DeBERTa-v2 refuses among the settings v1 reads too; v2-only
settings (`position_buckets`, `share_att_key`, `norm_rel_ebd`, `conv_kernel_size`, `attention_head_size`)
are ignored, as transformers' v1 ignores them.
"""
from typing import Optional

import torch
from torch import nn

from fastbert.models import deberta as v2
from fastbert.models.config import ConfigError
from fastbert.models.layers import FastLayer, LayerParts, call_module
from fastbert.models.modeling import EncoderModel
from fastbert.ops.linear import linear

resolve_dims = v2.resolve_dims


def check_config(config, source: str) -> None:
    """v1 ignores v2's settings as transformers' v1 does (position_buckets, share_att_key, norm_rel_ebd,
    conv_kernel_size, attention_head_size): only what both read is checked, and talking_head."""
    if getattr(config, "talking_head", False):
        raise ConfigError(f"{source}: talking_head=True is not supported (fastbert does not implement DeBERTa's "
                          "talking-head projections)")
    v2.check_common_config(config, source)


class DisentangledSelfAttention(nn.Module):
    # DeBERTa-v2's layer reads the position projections under its own names (share_att_key is off in v1)
    pos_key_proj = property(lambda self: self.pos_proj)
    pos_query_proj = property(lambda self: self.pos_q_proj)

    def __init__(self, config, d, spec: v2.RelativeSpec):
        super().__init__()
        h = d.hidden_size
        self.in_proj = nn.Linear(h, 3 * h, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(h))
        self.v_bias = nn.Parameter(torch.zeros(h))
        if spec.relative:
            if "c2p" in spec.types:
                self.pos_proj = nn.Linear(h, h, bias=False)
            if "p2c" in spec.types:
                self.pos_q_proj = nn.Linear(h, h)


class DebertaAttention(nn.Module):
    def __init__(self, config, d, spec):
        super().__init__()
        self.self = DisentangledSelfAttention(config, d, spec)
        self.output = v2._DenseNorm(d.hidden_size, d)


class DebertaLayer(v2.DebertaV2Layer):
    def __init__(self, config, d, spec: v2.RelativeSpec):
        FastLayer.__init__(self)                      # v2's __init__ would build v2's attention parameters
        self.attention = DebertaAttention(config, d, spec)
        self.intermediate = v2.DebertaV2Intermediate(d)
        self.output = v2._DenseNorm(d.intermediate_size, d)
        self.spec = spec
        self.init_fast(d)

    def parts(self) -> LayerParts:
        a = self.attention
        return LayerParts(None, None, None, a.output.dense, a.output.LayerNorm, self.intermediate.dense,
                          self.output.dense, self.output.LayerNorm)

    def _qkv(self, p: Optional[LayerParts], x: torch.Tensor, backend: str) -> torch.Tensor:
        a = self.attention.self
        tokens, heads, head_dim = x.shape[0], self.num_heads, self.head_dim
        q_bias, v_bias = a.q_bias.view(heads, head_dim), a.v_bias.view(heads, head_dim)
        bias = torch.stack([q_bias, torch.zeros_like(q_bias), v_bias], 1).flatten()   # in_proj's row order
        if type(a.in_proj) is nn.Linear and a.in_proj.bias is None and not a.in_proj._forward_hooks \
                and not a.in_proj._forward_pre_hooks:
            qkv = linear(x, a.in_proj.weight, bias, backend=backend)
        else:                                         # a wrapped / adapted in_proj runs as a module
            qkv = call_module(a.in_proj, x, 3 * self.hidden_size, owner=self) + bias
        return qkv.view(tokens, heads, 3, head_dim).transpose(1, 2)   # (tokens, 3, heads, head_dim)


class DebertaEncoder(nn.Module):
    rel_embedding = v2.DebertaV2Encoder.rel_embedding

    def __init__(self, config, d):
        super().__init__()
        self.spec = spec = v2.RelativeSpec(config, v1=True)
        self.layer = nn.ModuleList(DebertaLayer(config, d, spec) for _ in range(d.num_layers))
        if spec.relative:
            self.rel_embeddings = nn.Embedding(2 * spec.span, d.hidden_size)


class DebertaModel(v2.DebertaV2Model):
    model_types = ("deberta",)

    def __init__(self, config, add_pooling_layer: bool = False):
        if add_pooling_layer:
            raise ValueError(f"{type(self).__name__} has no pooler (transformers' DeBERTa has none; its "
                             "classification heads hold a ContextPooler); pass add_pooling_layer=False")
        EncoderModel.__init__(self, config)          # v2's __init__ would build a v2 encoder
        self.embeddings = v2.DebertaV2Embeddings(config, self.dims)
        self.encoder = DebertaEncoder(config, self.dims)
        self.post_init()


# ---- heads: DeBERTa-v2's, on the v1 encoder -----------------------------------------------------------------
class _DebertaHead:
    base_class, base_model_prefix, model_types = DebertaModel, "deberta", ("deberta",)


class DebertaForMaskedLM(_DebertaHead, v2.DebertaV2ForMaskedLM):
    pass


class DebertaForSequenceClassification(_DebertaHead, v2.DebertaV2ForSequenceClassification):
    pass


class DebertaForTokenClassification(_DebertaHead, v2.DebertaV2ForTokenClassification):
    pass


class DebertaForQuestionAnswering(_DebertaHead, v2.DebertaV2ForQuestionAnswering):
    pass
