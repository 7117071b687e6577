"""DeBERTa-v2 / v3: disentangled attention (content->position "c2p" and position->content "p2c" terms
from relative embeddings `encoder.rel_embeddings` (2 span, hidden), optionally LayerNorm'd), relative
positions with or without log buckets, shared or separate position projections (`share_att_key`),
absolute position embeddings optional (`position_biased_input`), factorised embeddings
(`embedding_size` != hidden_size, via `embeddings.embed_proj`). Names are transformers', so

    fast = DebertaV2Model.from_hf_config(hf.config); fast.load_state_dict(hf.state_dict(), strict=True)

works both ways. Distances are measured between padded columns, as transformers does (0..len-1
per sequence on packed input). With type_vocab_size=0 token_type_ids are accepted and ignored, as
transformers does. pos_att_type "none" (what configs without relative terms say) adds no term, as
in transformers. Not supported (ConfigError): conv_kernel_size > 0 (DeBERTa-v2-xlarge's
convolution after the first layer), attention_head_size != hidden_size / heads, pos_att_type
entries other than c2p / p2c / none.

The position terms run in fastbert.ops.relative_attention.disentangled_attention (the flash kernel
gathering c2p / p2c tile by tile, or its blocked torch path), on the model's backend like the other
ops. Without relative_attention, or with no c2p / p2c term, the layer runs plain attention
(fastbert.ops.varlen_attention) with DeBERTa's scale.
"""
import math
import sys
from typing import List

import torch
import torch.nn.functional as F
from torch import nn

from fastbert import ops
from fastbert.models.config import ACTIVATIONS, ConfigError, Dims
from fastbert.models.heads import (MaskedLMModel, MultipleChoiceModel, QuestionAnsweringModel,
                                   SequenceClassificationModel, TokenClassificationModel, activation)
from fastbert.models.layers import FastLayer, LayerParts, is_plain, layer_packing, padded_columns
from fastbert.models.modeling import EncoderModel
from fastbert.models.outputs import BaseModelOutput
from fastbert.ops import relative_attention as rel_ops
from fastbert.ops.varlen import pack, token_positions

POS_ATT_TYPES = ("c2p", "p2c")
NO_TERM = "none"   # transformers' configs say pos_att_type="None" when there is no relative term


# ---- config ---------------------------------------------------------------------------------------------
def resolve_dims(config) -> Dims:
    emb = getattr(config, "embedding_size", None) or config.hidden_size
    return Dims(config.model_type, config.vocab_size, emb, config.hidden_size, config.num_hidden_layers,
                config.num_attention_heads, config.intermediate_size, ACTIVATIONS[config.hidden_act],
                float(config.layer_norm_eps), config.max_position_embeddings, config.type_vocab_size,
                config.pad_token_id, float(config.hidden_dropout_prob), float(config.attention_probs_dropout_prob))


def check_config(config, source: str) -> None:
    """DeBERTa-v2's settings fastbert refuses, then those it shares with v1 (check_common_config)."""
    conv = getattr(config, "conv_kernel_size", 0) or 0
    if conv > 0:
        raise ConfigError(f"{source}: conv_kernel_size={conv} is not supported (fastbert does not implement "
                          "DeBERTa's convolution layer)")
    head = getattr(config, "attention_head_size", None)
    if head is not None and head * config.num_attention_heads != config.hidden_size:
        raise ConfigError(f"{source}: attention_head_size={head} is not supported (fastbert needs "
                          f"hidden_size / num_attention_heads = {config.hidden_size // config.num_attention_heads})")
    norms = [x.strip() for x in str(getattr(config, "norm_rel_ebd", "none")).lower().split("|")]
    if any(n not in ("none", "layer_norm") for n in norms):
        raise ConfigError(f"{source}: norm_rel_ebd={config.norm_rel_ebd!r} is not supported "
                          "('none' or 'layer_norm')")
    check_common_config(config, source)


def check_common_config(config, source: str) -> None:
    """Settings that DeBERTa and DeBERTa-v2 read alike and fastbert refuses."""
    bad = [t for t in (config.pos_att_type or []) if t not in POS_ATT_TYPES + (NO_TERM,)]
    if bad:
        raise ConfigError(f"{source}: pos_att_type entries {bad} are not supported (supported: "
                          f"{POS_ATT_TYPES + (NO_TERM,)})")
    for name in ("pooler_hidden_act",):
        act = getattr(config, name, "gelu")
        if act not in ACTIVATIONS:
            raise ConfigError(f"{source}: {name}={act!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    emb = getattr(config, "embedding_size", None) or config.hidden_size
    if not getattr(config, "legacy", True) and emb != config.hidden_size:
        raise ConfigError(f"{source}: legacy=False with embedding_size={emb} != hidden_size={config.hidden_size} "
                          "is not supported (its MLM head multiplies hidden states by the word embeddings; "
                          "transformers fails on it too)")
    pooler = getattr(config, "pooler_hidden_size", config.hidden_size)
    if pooler != config.hidden_size:
        raise ConfigError(f"{source}: pooler_hidden_size={pooler} != hidden_size={config.hidden_size} "
                          "is not supported (transformers' classifier reads hidden_size features)")


class RelativeSpec:
    """The relative-position settings every layer reads (transformers' DisentangledSelfAttention)."""

    def __init__(self, config, v1: bool = False):
        # v1 (transformers' modeling_deberta) reads neither share_att_key nor position_buckets
        self.relative = bool(getattr(config, "relative_attention", False))
        self.types = tuple(config.pos_att_type or ())
        self.share_att_key = False if v1 else bool(getattr(config, "share_att_key", False))
        self.position_buckets = -1 if v1 else getattr(config, "position_buckets", -1)
        self.max_relative_positions = getattr(config, "max_relative_positions", -1)
        if self.max_relative_positions < 1:
            self.max_relative_positions = config.max_position_embeddings
        self.span = self.position_buckets if self.position_buckets > 0 else self.max_relative_positions
        # v2 counts the c2p / p2c terms; v1 counts every entry, "none" too (transformers' scale_factor)
        self.scale_factor = 1 + (len(self.types) if v1 else len([t for t in POS_ATT_TYPES if t in self.types]))
        self.terms = any(t in self.types for t in POS_ATT_TYPES)
        # the distance -> relative index table, built once per model (the layers share this spec)
        self.distances = rel_ops.DistanceCache(rel_ops.deberta_lut(
            self.span, self.position_buckets, self.max_relative_positions)) if self.relative else None


# ---- modules under transformers' names -------------------------------------------------------------------
class DebertaV2Embeddings(nn.Module):
    """word (+ position when position_biased_input) (+ token type) -> embed_proj -> LayerNorm, packed."""

    def __init__(self, config, d):
        super().__init__()
        self.word_embeddings = nn.Embedding(d.vocab_size, d.embedding_size, padding_idx=d.pad_token_id)
        self.position_biased_input = getattr(config, "position_biased_input", True)
        self.position_embeddings = (nn.Embedding(d.max_position_embeddings, d.embedding_size)
                                    if self.position_biased_input else None)
        self.token_type_embeddings = nn.Embedding(d.type_vocab_size, d.embedding_size) if d.type_vocab_size else None
        self.embed_proj = nn.Linear(d.embedding_size, d.hidden_size, bias=False) if d.embedding_size != d.hidden_size \
            else None
        self.LayerNorm = nn.LayerNorm(d.hidden_size, eps=d.layer_norm_eps)
        self.dropout = nn.Dropout(d.hidden_dropout)

    def max_sequence_length(self) -> int:
        return self.position_embeddings.num_embeddings if self.position_embeddings is not None else sys.maxsize

    def forward(self, input_ids, token_type_ids, position_ids, inputs_embeds=None, backend="auto"):
        x = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(position_ids)
        if self.token_type_embeddings is not None:
            x = x + (self.token_type_embeddings.weight[0] if token_type_ids is None
                     else self.token_type_embeddings(token_type_ids))
        if self.embed_proj is not None:
            x = self.embed_proj(x)
        norm = self.LayerNorm
        if is_plain(norm, nn.LayerNorm):
            x = ops.add_layer_norm(x, None, norm.weight, norm.bias, norm.eps, backend=backend)
        else:
            x = norm(x)
        return F.dropout(x, self.dropout.p, self.training)


class DisentangledSelfAttention(nn.Module):
    def __init__(self, config, d, spec: RelativeSpec):
        super().__init__()
        h = d.hidden_size
        self.query_proj, self.key_proj, self.value_proj = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        if spec.relative and not spec.share_att_key:
            if "c2p" in spec.types:
                self.pos_key_proj = nn.Linear(h, h)
            if "p2c" in spec.types:
                self.pos_query_proj = nn.Linear(h, h)


class _DenseNorm(nn.Module):
    def __init__(self, d_in, d):
        super().__init__()
        self.dense = nn.Linear(d_in, d.hidden_size)
        self.LayerNorm = nn.LayerNorm(d.hidden_size, eps=d.layer_norm_eps)


class DebertaV2Attention(nn.Module):
    def __init__(self, config, d, spec):
        super().__init__()
        self.self = DisentangledSelfAttention(config, d, spec)
        self.output = _DenseNorm(d.hidden_size, d)


class DebertaV2Intermediate(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.dense = nn.Linear(d.hidden_size, d.intermediate_size)


class DebertaV2Layer(FastLayer):
    def __init__(self, config, d, spec: RelativeSpec):
        super().__init__()
        self.attention = DebertaV2Attention(config, d, spec)
        self.intermediate = DebertaV2Intermediate(d)
        self.output = _DenseNorm(d.intermediate_size, d)
        self.spec = spec
        self.init_fast(d)

    def parts(self) -> LayerParts:
        a = self.attention
        return LayerParts(a.self.query_proj, a.self.key_proj, a.self.value_proj, a.output.dense, a.output.LayerNorm,
                          self.intermediate.dense, self.output.dense, self.output.LayerNorm)

    def _positional(self, rel: torch.Tensor):
        """(pos_key, pos_query), each (2 span, heads, head_dim) or None, from the relative embeddings."""
        s, a = self.spec, self.attention.self
        rel = F.dropout(rel, self.hidden_dropout, self.training)          # transformers' pos_dropout
        shape = (rel.shape[0], self.num_heads, self.hidden_size // self.num_heads)
        key = a.key_proj if s.share_att_key else getattr(a, "pos_key_proj", None)
        query = a.query_proj if s.share_att_key else getattr(a, "pos_query_proj", None)
        pos_key = key(rel).view(shape) if "c2p" in s.types else None
        pos_query = query(rel).view(shape) if "p2c" in s.types else None
        return pos_key, pos_query

    def attend(self, qkv, packing, output_attentions, dropout_p, backend):
        """Disentangled attention: c2p / p2c terms at the packing's relative positions."""
        q, k, v = qkv.unbind(1)
        s = self.spec
        if q.shape[0] == 0 and not output_attentions:  # no real token (an empty batch has no row for the kernel)
            return q.new_zeros(q.shape), None
        if not (s.relative and s.terms) and not output_attentions:
            scale = 1.0 / math.sqrt(q.shape[-1] * s.scale_factor)
            return ops.varlen_attention(q, k, v, packing.cu_seqlens, packing.max_seqlen, scale=scale,
                                        dropout_p=dropout_p, backend=backend), None
        pos_key, pos_query = self._positional(packing.context["rel"]) if s.relative and s.terms else (None, None)
        opts = dict(span=s.span, position_buckets=s.position_buckets, max_relative_positions=s.max_relative_positions,
                    scale_factor=s.scale_factor, dropout_p=dropout_p)
        if output_attentions:
            (qp, kp, vp), mask, positions = padded_columns(packing, q, k, v)
            out, probs = rel_ops.disentangled_attention_padded(qp, kp, vp, mask, positions, pos_key, pos_query, **opts)
            return pack(out, packing), probs
        return rel_ops.disentangled_attention(q, k, v, packing.cu_seqlens, packing.max_seqlen, packing.positions,
                                              pos_key, pos_query, backend=backend, distances=s.distances.on(q.device),
                                              **opts), None


class DebertaV2Encoder(nn.Module):
    def __init__(self, config, d):
        super().__init__()
        self.spec = spec = RelativeSpec(config)
        self.layer = nn.ModuleList(DebertaV2Layer(config, d, spec) for _ in range(d.num_layers))
        if spec.relative:
            self.rel_embeddings = nn.Embedding(2 * spec.span, d.hidden_size)
        self.norm_rel_ebd = [x.strip() for x in str(getattr(config, "norm_rel_ebd", "none")).lower().split("|")]
        if "layer_norm" in self.norm_rel_ebd:
            self.LayerNorm = nn.LayerNorm(d.hidden_size, eps=d.layer_norm_eps)

    def rel_embedding(self):
        """(2 span, hidden) relative embeddings, normalised once per forward as transformers does."""
        if not self.spec.relative:
            return None
        rel = self.rel_embeddings.weight
        return self.LayerNorm(rel) if hasattr(self, "LayerNorm") else rel


class DebertaV2Model(EncoderModel):
    base_model_prefix = "deberta"
    model_types = ("deberta-v2",)
    output_class = BaseModelOutput   # no pooler: the heads hold ContextPooler

    def __init__(self, config, add_pooling_layer: bool = False):
        if add_pooling_layer:
            raise ValueError(f"{type(self).__name__} has no pooler (transformers' DeBERTa has none; its "
                             "classification heads hold a ContextPooler); pass add_pooling_layer=False")
        super().__init__(config)
        self.embeddings = DebertaV2Embeddings(config, self.dims)
        self.encoder = DebertaV2Encoder(config, self.dims)
        self.post_init()

    def embed(self, input_ids, token_type_ids, position_ids, inputs_embeds, backend):
        return self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds, backend)

    def encoder_layers(self) -> List[FastLayer]:
        return list(self.encoder.layer)

    def _run_layers(self, x, packing, output_attentions, hidden_states):
        packing = layer_packing(packing, token_positions(packing, x.shape[0]), rel=self.encoder.rel_embedding())
        return super()._run_layers(x, packing, output_attentions, hidden_states)

    def _types(self, token_type_ids):
        return token_type_ids if self.dims.type_vocab_size else None   # no table: ignored, as transformers

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, output_attentions=None, output_hidden_states=None, return_dict=None, **kwargs):
        return super().forward(input_ids, attention_mask, self._types(token_type_ids), position_ids, inputs_embeds,
                               output_attentions, output_hidden_states, return_dict, **kwargs)

    def forward_packed(self, input_ids, cu_seqlens, max_seqlen, token_type_ids=None, position_ids=None):
        return super().forward_packed(input_ids, cu_seqlens, max_seqlen, self._types(token_type_ids), position_ids)

    def packed_states(self, input_ids, cu_seqlens, max_seqlen, token_type_ids=None, position_ids=None):
        return super().packed_states(input_ids, cu_seqlens, max_seqlen, self._types(token_type_ids), position_ids)

    def check_packed(self, input_ids, cu_seqlens, max_seqlen, token_type_ids=None, position_ids=None):
        return super().check_packed(input_ids, cu_seqlens, max_seqlen, self._types(token_type_ids), position_ids)


# ---- heads -----------------------------------------------------------------------------------------------
class _DebertaV2Head:
    base_class, base_model_prefix, model_types = DebertaV2Model, "deberta", ("deberta-v2",)


class _Transform(nn.Module):
    def __init__(self, d, width):
        super().__init__()
        self.dense = nn.Linear(d.hidden_size, width)
        self.LayerNorm = nn.LayerNorm(width, eps=d.layer_norm_eps)
        self.act = activation(d.activation)

    def forward(self, h):
        return self.LayerNorm(self.act(self.dense(h)))


class _LegacyPredictions(nn.Module):
    """cls.predictions: transform (hidden -> embedding_size), decoder (tied to the word embeddings), bias."""

    def __init__(self, d):
        super().__init__()
        self.transform = _Transform(d, d.embedding_size)
        self.decoder = nn.Linear(d.embedding_size, d.vocab_size)
        self.bias = nn.Parameter(torch.zeros(d.vocab_size))

    def forward(self, h):
        return self.decoder(self.transform(h))


class _LegacyMLMHead(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.predictions = _LegacyPredictions(d)


class _LMHead(nn.Module):
    """lm_predictions.lm_head (legacy=False): dense, act, LayerNorm, then h @ word_embeddings^T + bias."""

    def __init__(self, d):
        super().__init__()
        self.dense = nn.Linear(d.hidden_size, d.hidden_size)
        self.LayerNorm = nn.LayerNorm(d.hidden_size, eps=d.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(d.vocab_size))
        self.act = activation(d.activation)


class _OnlyLMHead(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lm_head = _LMHead(d)


class DebertaV2ForMaskedLM(_DebertaV2Head, MaskedLMModel):
    def __init__(self, config):
        self.legacy = getattr(config, "legacy", True)
        if self.legacy:
            self.lm_head_name, self.decoder = "cls", "cls.predictions.decoder"
            self.decoder_bias = "cls.predictions.bias"
        super().__init__(config)

    def build_head(self, config):
        if self.legacy:
            self.cls = _LegacyMLMHead(self.dims)
        else:
            self.lm_predictions = _OnlyLMHead(self.dims)

    def tied_weights(self):
        return super().tied_weights() if self.legacy else {}

    def get_output_embeddings(self):
        return self.cls.predictions.decoder if self.legacy else self.lm_predictions.lm_head.dense

    def mlm_logits(self, h):
        if self.legacy:
            return self.cls.predictions(h)
        head = self.lm_predictions.lm_head
        h = head.LayerNorm(head.act(head.dense(h)))
        return torch.matmul(h, self.deberta.embeddings.word_embeddings.weight.t()) + head.bias


class ContextPooler(nn.Module):
    """h[:, 0] -> dropout (pooler_dropout) -> dense -> pooler_hidden_act."""

    def __init__(self, config, d):
        super().__init__()
        self.dense = nn.Linear(d.hidden_size, d.hidden_size)
        self.dropout = nn.Dropout(config.pooler_dropout)
        self.act = activation(ACTIVATIONS[config.pooler_hidden_act])

    def forward(self, h):
        return self.act(self.dense(self.dropout(h[:, 0])))


class _Pooled:
    def build_head(self, config):
        self.pooler = ContextPooler(config, self.dims)
        self.classifier = nn.Linear(self.dims.hidden_size, self.num_outputs(config))
        p = getattr(config, "cls_dropout", None)
        self.dropout = nn.Dropout(self.dims.hidden_dropout if p is None else p)

    def num_outputs(self, config):
        return config.num_labels

    def classify(self, out):
        return self.classifier(self.dropout(self.pooler(out.last_hidden_state)))

    choice_logits = classify


def deberta_sequence_loss(config, logits, labels):
    """transformers' DeBERTa loss when problem_type is unset (it is not inferred and stored): MSE for
    one label, cross entropy over labels >= 0 for class ids, soft-label cross entropy otherwise."""
    n = config.num_labels
    if n == 1:
        return F.mse_loss(logits.view(-1).to(labels.dtype), labels.view(-1))
    if labels.dim() == 1 or labels.size(-1) == 1:
        index = (labels >= 0).nonzero()
        labels = labels.long()
        if index.size(0) == 0:
            return torch.tensor(0).to(logits)
        chosen = torch.gather(logits, 0, index.expand(index.size(0), logits.size(1)))
        return F.cross_entropy(chosen.view(-1, n).float(), torch.gather(labels, 0, index.view(-1)).view(-1))
    return -((F.log_softmax(logits, -1) * labels).sum(-1)).mean()


class DebertaV2ForSequenceClassification(_DebertaV2Head, _Pooled, SequenceClassificationModel):
    def loss(self, fields, labels):
        if self.config.problem_type is None:
            return deberta_sequence_loss(self.config, fields["logits"], labels)
        return super().loss(fields, labels)


class DebertaV2ForMultipleChoice(_DebertaV2Head, _Pooled, MultipleChoiceModel):
    def num_outputs(self, config):
        return 1


class DebertaV2ForTokenClassification(_DebertaV2Head, TokenClassificationModel):
    def token_dropout(self, config):
        return self.dims.hidden_dropout


class DebertaV2ForQuestionAnswering(_DebertaV2Head, QuestionAnsweringModel):
    pass
