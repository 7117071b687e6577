"""MPNet: BERT's post-LN layer (q/k/v/o under `attention.attn`) plus a relative position bias, one
`encoder.relative_attention_bias` table (buckets, heads) shared by every layer, and RoBERTa-style
position ids (padding_idx 1). Names are transformers', so

    fast = MPNetModel.from_hf_config(hf.config); fast.load_state_dict(hf.state_dict(), strict=True)

works both ways. As transformers does, the bias uses 32 buckets and a maximum distance of 128
whatever `relative_attention_num_buckets` says (a table with fewer rows cannot be indexed, so such
a config is refused), and distances are measured between padded columns (0..len-1 per sequence on
packed input). No token type embeddings: forward takes token_type_ids and ignores them, as transformers'.

The bias attention is fastbert.ops.relative_attention.relative_bias_attention (the flash kernel with
the bias added tile by tile, or its blocked torch path), on the model's backend like the other ops.
The relative positions reach the layers in their packing (layers.LayerPacking), as DeBERTa's do.
"""
from typing import List

import torch
from torch import nn

from fastbert.models.config import ACTIVATIONS, ConfigError, Dims
from fastbert.models.embeddings import Embeddings
from fastbert.models.heads import (MaskedLMModel, MultipleChoiceModel, PooledClassifier, Pooler,
                                   QuestionAnsweringModel, RobertaLMHead, SequenceClassificationModel,
                                   TokenClassificationModel)
from fastbert.models.layers import FastLayer, LayerParts, layer_packing, padded_columns
from fastbert.models.modeling import EncoderModel
from fastbert.ops import relative_attention as rel_ops
from fastbert.ops.varlen import pack, token_positions

NUM_BUCKETS, MAX_DISTANCE = 32, 128   # transformers' MPNetEncoder.compute_position_bias defaults


# ---- config ---------------------------------------------------------------------------------------------
def resolve_dims(config) -> Dims:
    """MPNet has no token types; padding_idx is 1 whatever pad_token_id says (as transformers)."""
    return Dims(config.model_type, config.vocab_size, config.hidden_size, config.hidden_size,
                config.num_hidden_layers, config.num_attention_heads, config.intermediate_size,
                ACTIVATIONS[config.hidden_act], float(config.layer_norm_eps), config.max_position_embeddings, 0,
                1, float(config.hidden_dropout_prob), float(config.attention_probs_dropout_prob))


def check_config(config, source: str) -> None:
    n = config.relative_attention_num_buckets
    if not isinstance(n, int) or n < NUM_BUCKETS:
        raise ConfigError(f"{source}: relative_attention_num_buckets={n!r}: MPNet's relative bias always uses "
                          f"{NUM_BUCKETS} buckets (transformers does the same), so the table needs >= "
                          f"{NUM_BUCKETS} rows")


# ---- modules under transformers' names -------------------------------------------------------------------
class MPNetSelfAttention(nn.Module):
    def __init__(self, d):
        super().__init__()
        h = d.hidden_size
        self.q, self.k, self.v, self.o = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)


class MPNetAttention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.attn = MPNetSelfAttention(d)
        self.LayerNorm = nn.LayerNorm(d.hidden_size, eps=d.layer_norm_eps)


class _Dense(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.dense = nn.Linear(d_in, d_out)


class MPNetOutput(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.dense = nn.Linear(d.intermediate_size, d.hidden_size)
        self.LayerNorm = nn.LayerNorm(d.hidden_size, eps=d.layer_norm_eps)


class MPNetLayer(FastLayer):
    def __init__(self, d):
        super().__init__()
        self.attention = MPNetAttention(d)
        self.intermediate = _Dense(d.hidden_size, d.intermediate_size)
        self.output = MPNetOutput(d)
        self.init_fast(d)

    def parts(self) -> LayerParts:
        a = self.attention
        return LayerParts(a.attn.q, a.attn.k, a.attn.v, a.attn.o, a.LayerNorm, self.intermediate.dense,
                          self.output.dense, self.output.LayerNorm)

    def attend(self, qkv, packing, output_attentions, dropout_p, backend):
        """Attention plus the bias table[bucket(p_j - p_i), head], p the packing's relative positions."""
        q, k, v = qkv.unbind(1)
        table = packing.context["table"]
        opts = dict(num_buckets=NUM_BUCKETS, max_distance=MAX_DISTANCE, dropout_p=dropout_p)
        if output_attentions:
            (qp, kp, vp), mask, positions = padded_columns(packing, q, k, v)
            out, probs = rel_ops.relative_bias_attention_padded(qp, kp, vp, mask, positions, table, **opts)
            return pack(out, packing), probs
        if q.shape[0] == 0:  # no real token (an empty batch has no row for the kernel)
            return q.new_zeros(q.shape), None
        return rel_ops.relative_bias_attention(q, k, v, packing.cu_seqlens, packing.max_seqlen, packing.positions,
                                               table, backend=backend, distances=packing.context["distances"],
                                               **opts), None


class MPNetEncoder(nn.Module):
    def __init__(self, config, d):
        super().__init__()
        self.layer = nn.ModuleList(MPNetLayer(d) for _ in range(d.num_layers))
        self.relative_attention_bias = nn.Embedding(config.relative_attention_num_buckets, d.num_heads)
        self.distances = rel_ops.DistanceCache(rel_ops.mpnet_distances(NUM_BUCKETS, MAX_DISTANCE))  # built once


class MPNetModel(EncoderModel):
    base_model_prefix = "mpnet"
    model_types = ("mpnet",)
    has_token_types = False

    def __init__(self, config, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = Embeddings(self.dims)
        self.encoder = MPNetEncoder(config, self.dims)
        self.pooler = Pooler(self.dims.hidden_size) if add_pooling_layer else None
        self.post_init()

    def embed(self, input_ids, token_type_ids, position_ids, inputs_embeds, backend):
        return self.embeddings(input_ids, None, position_ids, inputs_embeds, backend)

    def short_embeddings(self):
        return self.embeddings

    def encoder_layers(self) -> List[FastLayer]:
        return list(self.encoder.layer)

    def pool(self, sequence_output):
        return None if self.pooler is None else self.pooler(sequence_output)

    def _run_layers(self, x, packing, output_attentions, hidden_states):
        packing = layer_packing(packing, token_positions(packing, x.shape[0]),
                                table=self.encoder.relative_attention_bias.weight,
                                distances=self.encoder.distances.on(x.device))
        return super()._run_layers(x, packing, output_attentions, hidden_states)


# ---- heads -----------------------------------------------------------------------------------------------
class _MPNetHead:
    base_class, base_model_prefix, model_types = MPNetModel, "mpnet", ("mpnet",)


class MPNetForMaskedLM(_MPNetHead, MaskedLMModel):
    lm_head_name, decoder, decoder_bias = "lm_head", "lm_head.decoder", "lm_head.bias"

    def build_head(self, config):
        self.lm_head = RobertaLMHead(self.dims)   # dense, exact GELU, layer_norm, decoder, bias: MPNetLMHead


class MPNetClassificationHead(nn.Module):
    """h[:, 0] -> dropout -> dense -> tanh -> dropout -> out_proj (dropout: hidden_dropout_prob)."""

    def __init__(self, config, d):
        super().__init__()
        self.dense = nn.Linear(d.hidden_size, d.hidden_size)
        self.dropout = nn.Dropout(d.hidden_dropout)
        self.out_proj = nn.Linear(d.hidden_size, config.num_labels)

    def forward(self, h):
        x = self.dropout(torch.tanh(self.dense(self.dropout(h[:, 0]))))
        return self.out_proj(x)


class MPNetForSequenceClassification(_MPNetHead, SequenceClassificationModel):
    def build_head(self, config):
        self.classifier = MPNetClassificationHead(config, self.dims)

    def classify(self, out):
        return self.classifier(out.last_hidden_state)


class MPNetForMultipleChoice(_MPNetHead, PooledClassifier, MultipleChoiceModel):
    def pooled_dropout(self, config):
        return self.dims.hidden_dropout

    def num_outputs(self, config):
        return 1


class MPNetForTokenClassification(_MPNetHead, TokenClassificationModel):
    def token_dropout(self, config):
        return self.dims.hidden_dropout


class MPNetForQuestionAnswering(_MPNetHead, QuestionAnsweringModel):
    pass
