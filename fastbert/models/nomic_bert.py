"""NomicBERT (transformers' `nomic_bert`, e.g. nomic-embed-text): BERT-shaped post-LayerNorm layers
with rotary position embeddings instead of position embeddings, bias-free q/k/v/o projections and
a SwiGLU MLP (down(act(gate(x)) * up(x))).

    word + token_type embeddings -> LayerNorm -> [q/k/v (one fused GEMM) -> RoPE -> attention -> o_proj
                                                  -> add+LayerNorm -> gate/up (one GEMM) -> act * up
                                                  -> down_proj -> add+LayerNorm] x N -> (pooler)

Parameter names are transformers' (`layers.{i}.self_attn.q_proj.weight`, ...). Heads as transformers
5 has them: masked LM (tied decoder), sequence classification (on the pooler) and token
classification. The WordPiece vocabulary goes through fastbert's C++ tokenizer.
"""
import re
from typing import Dict

import torch
from torch import nn

from fastbert.models.config import ACTIVATIONS, ConfigError, Dims, activation_fn
from fastbert.models.heads import (MaskedLMModel, PooledClassifier, Pooler, SequenceClassificationModel,
                                   TokenClassificationModel)
from fastbert.models.layers import FastLayer, LayerParts, add_norm, fused_linear
from fastbert.models.loading import CheckpointError
from fastbert.models.outputs import BaseModelOutputWithPooling
from fastbert.models.rotary_encoder import (RotaryEncoderModel, RotaryFamily, check_probability, check_rope_type,
                                            rotary_attention)
from fastbert.ops.rotary import Rotary


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def check_config(config, source: str = "config") -> None:
    """The registry's hook: raise ConfigError naming what fastbert's NomicBERT cannot honour."""
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "max_position_embeddings", "type_vocab_size"):
        v = getattr(config, name)
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"{source}: {name}={v!r} must be a positive integer")
    if _head_dim(config) % 2:
        raise ConfigError(f"{source}: head_dim {_head_dim(config)} must be even for rotary embeddings")
    check_rope_type(config.rope_parameters, source, "rope_parameters")
    activation_fn(config.hidden_act, source, "hidden_act")
    check_probability(config, ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"),
                      source)


def resolve_dims(config) -> Dims:
    """The registry's hook (BertConfig's names)."""
    return Dims(config.model_type, config.vocab_size, config.hidden_size, config.hidden_size,
                config.num_hidden_layers, config.num_attention_heads, config.intermediate_size,
                ACTIVATIONS[config.hidden_act], float(config.layer_norm_eps), config.max_position_embeddings,
                config.type_vocab_size, config.pad_token_id, float(config.hidden_dropout_prob),
                float(config.attention_probs_dropout_prob))


# nomic-ai's original parameter names (what transformers' save_pretrained writes for nomic_bert, and what
# the Hub checkpoints hold) -> transformers' module names; transformers converts the same way on load
_ORIGINAL_NAMES = [(re.compile(p), r) for p, r in (
    (r"(^|\.)encoder\.layers\.", r"\1layers."), (r"(^|\.)emb_ln\.", r"\1embeddings.LayerNorm."),
    (r"\.attn\.out_proj\.", ".self_attn.o_proj."), (r"\.mlp\.fc11\.", ".mlp.up_proj."),
    (r"\.mlp\.fc12\.", ".mlp.gate_proj."), (r"\.mlp\.fc2\.", ".mlp.down_proj."),
    (r"\.norm1\.", ".post_attention_layernorm."), (r"\.norm2\.", ".post_mlp_layernorm."))]
_WQKV = re.compile(r"^(.*)\.attn\.Wqkv\.weight$")


def from_original_names(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A state dict under nomic-ai's names (fused attn.Wqkv, fc11/fc12/fc2, norm1/norm2, emb_ln) with
    transformers' names; keys already in transformers' names pass unchanged."""
    out = {}
    for key, value in state.items():
        for pattern, repl in _ORIGINAL_NAMES:
            key = pattern.sub(repl, key)
        fused = _WQKV.match(key)
        if fused:
            if value.shape[0] % 3:
                raise CheckpointError(f"{key}: fused Wqkv of shape {tuple(value.shape)} does not split in 3")
            for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3, dim=0)):
                out[f"{fused.group(1)}.self_attn.{name}.weight"] = part
        else:
            out[key] = value
    return out


class NomicBertFamily(RotaryFamily):
    base_model_prefix = "nomic_bert"
    model_types = ("nomic_bert",)

    def _normalize_keys(self, state):
        return super()._normalize_keys(from_original_names(state))


# ---- modules under transformers' names ------------------------------------------------------------
class NomicBertEmbeddings(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids, inputs_embeds, backend: str):   # packed (tokens,) inputs
        x = inputs_embeds if inputs_embeds is not None else self.word_embeddings(input_ids)
        if token_type_ids is None:
            types = self.token_type_embeddings.weight[0].to(x.dtype).expand_as(x)   # type 0 everywhere
        else:
            types = self.token_type_embeddings(token_type_ids).to(x.dtype)
        return self.dropout(add_norm(x, types, self.LayerNorm, backend))   # (tokens, hidden)


class NomicBertAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        inner = config.num_attention_heads * _head_dim(config)
        self.q_proj = nn.Linear(config.hidden_size, inner, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, inner, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, inner, bias=False)
        self.o_proj = nn.Linear(inner, config.hidden_size, bias=False)


class NomicBertMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)


class NomicBertLayer(FastLayer):
    """The common post-LN layer with rotary attention and a SwiGLU MLP."""

    def __init__(self, config, dims: Dims, rope: Rotary):
        super().__init__()
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = NomicBertMLP(config)
        self.self_attn = NomicBertAttention(config)
        self.post_mlp_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.init_fast(dims)
        self.head_dim = _head_dim(config)   # config.head_dim may differ from hidden_size / heads
        self.theta = float(config.rope_parameters["rope_theta"])
        self._rope = [rope]   # shared with the model; a list so it is not registered twice
        self._mlp_cache = {}

    def parts(self) -> LayerParts:
        a = self.self_attn
        return LayerParts(a.q_proj, a.k_proj, a.v_proj, a.o_proj, self.post_attention_layernorm, None,
                          self.mlp.down_proj, self.post_mlp_layernorm)

    def attend(self, qkv, packing, output_attentions, dropout_p, backend):
        return rotary_attention(qkv, packing, self._rope[0], self.theta, None, dropout_p, output_attentions, backend)

    def ffn_hidden(self, x, p, backend):
        m = self.mlp
        gate, up = fused_linear(x, (m.gate_proj, m.up_proj), self._mlp_cache, backend, owner=self).chunk(2, dim=-1)
        return self.activation.fn(gate) * up                    # (tokens, intermediate)


# ---- the bare encoder -------------------------------------------------------------------------------
class NomicBertModel(NomicBertFamily, RotaryEncoderModel):
    output_class = BaseModelOutputWithPooling

    def __init__(self, config, add_pooling_layer: bool = False):
        super().__init__(config)
        c = self.config
        self.embeddings = NomicBertEmbeddings(c)
        self.pooler = Pooler(c.hidden_size) if add_pooling_layer else None
        self.rotary = Rotary(_head_dim(c), c.max_position_embeddings)
        self.layers = nn.ModuleList(NomicBertLayer(c, self.dims, self.rotary) for _ in range(c.num_hidden_layers))
        self.post_init()

    def embed(self, input_ids, token_type_ids, position_ids, inputs_embeds, backend):
        return self.embeddings(input_ids, token_type_ids, inputs_embeds, backend)

    def pool(self, sequence_output):
        return None if self.pooler is None else self.pooler(sequence_output)


# ---- heads ----------------------------------------------------------------------------------------
class NomicBertPredictionHeadTransform(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.act = activation_fn(config.hidden_act, "config", "hidden_act")

    def forward(self, h):
        return self.layer_norm(self.act(self.dense(h)))


class NomicBertLMPredictionHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.transform = NomicBertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, h):
        return self.decoder(self.transform(h))


class NomicBertOnlyMLMHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.predictions = NomicBertLMPredictionHead(config)

    def forward(self, h):
        return self.predictions(h)


class NomicBertForMaskedLM(MaskedLMModel, NomicBertFamily):
    base_class = NomicBertModel
    lm_head_name, decoder, decoder_bias = "cls", "cls.predictions.decoder", "cls.predictions.bias"

    def build_head(self, config):
        self.cls = NomicBertOnlyMLMHead(config)


class NomicBertForSequenceClassification(PooledClassifier, SequenceClassificationModel, NomicBertFamily):
    base_class = NomicBertModel


class NomicBertForTokenClassification(TokenClassificationModel, NomicBertFamily):
    base_class = NomicBertModel
