"""ModernBERT (transformers' `modernbert`): pre-LayerNorm layers without biases, RoPE with separate
global and local theta, GeGLU MLP, alternating global and sliding-window (local) attention.

    tok_embeddings -> norm -> [attn_norm (Identity in layer 0) -> Wqkv -> RoPE -> attention -> Wo -> +x
                               mlp_norm -> Wi -> (act(input) * gate) -> Wo -> +x] x N -> final_norm

Parameter names are transformers' (`model.layers.{i}.attn.Wqkv.weight`, ...), so state_dicts load
strictly both ways. Config: transformers 5 reads both styles into `layer_types` +
`rope_parameters` (the older `global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta`
are converted by ModernBertConfig itself); a config object without them is read in the old style.
Local layers attend to keys with |i - j| <= local_attention // 2, as transformers' sliding mask.

RoPE: every rope_type transformers implements, per layer type (default, linear, dynamic, yarn,
longrope, llama3: the frequencies come from transformers' ROPE_INIT_FUNCTIONS), on inputs of any
length (no position table). `model.rotary_emb` is transformers' ModernBertRotaryEmbedding by name and
call; the encoder computes each layer type's cos / sin once per forward. dynamic and longrope depend
on the longest position: the padded width (max_seqlen on packed input), or the largest position_id
given (read on the host). transformers' dynamic RoPE keeps the longest length it has seen until an
input shorter than max_position_embeddings comes: its outputs depend on earlier calls; fastbert's do not.

Differences from transformers, by design (as for every fastbert family): padding rows of
last_hidden_state / hidden_states are zeros; the encoder runs on packed real tokens.
"""
import dataclasses
import sys
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from fastbert.models.config import ACTIVATIONS, ConfigError, Dims, activation_fn
from fastbert.models.heads import TaskModel, qa_loss, sequence_classification_loss
from fastbert.models.layers import EncoderLayer, LayerPacking, add_norm, apply_linear, residual_linear
from fastbert.models.outputs import (
    BaseModelOutput,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from fastbert.models.rotary_encoder import RotaryEncoderModel, RotaryFamily, check_probability, rotary_attention
from fastbert.ops.rotary import inv_freq

GLOBAL, LOCAL = "full_attention", "sliding_attention"


def layer_types(config) -> List[str]:
    types = getattr(config, "layer_types", None)
    if types is None:  # an old-style config object: every n-th layer is global
        every = getattr(config, "global_attn_every_n_layers", 3)
        types = [LOCAL if i % every else GLOBAL for i in range(config.num_hidden_layers)]
    return list(types)


def rope_parameters(config, kind: str, source: str) -> dict:
    """A layer type's RoPE settings (an old-style config: its theta, default RoPE), checked: a rope_type
    transformers implements, rotating the whole head (as transformers' ModernBERT, which has no partial
    rotation)."""
    params = getattr(config, "rope_parameters", None)
    what = f"rope_parameters[{kind!r}]"
    if params and params.get(kind) is not None:
        p = {"rope_type": "default", **params[kind]}
    else:
        old = {GLOBAL: ("global_rope_theta", 160_000.0), LOCAL: ("local_rope_theta", 10_000.0)}[kind]
        p = {"rope_type": "default", "rope_theta": float(getattr(config, old[0], old[1]))}
    if p["rope_type"] != "default" and p["rope_type"] not in ROPE_INIT_FUNCTIONS:
        raise ConfigError(f"{source}: {what} rope_type={p['rope_type']!r} is not supported (supported: "
                          f"{['default', *ROPE_INIT_FUNCTIONS]}, transformers' own)")
    if "rope_theta" not in p:
        raise ConfigError(f"{source}: {what} has no rope_theta")
    if p.get("partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError(f"{source}: {what} partial_rotary_factor={p['partial_rotary_factor']} is not supported "
                          "(ModernBERT rotates whole heads, in transformers too)")
    return p


def rope_theta(config, kind: str, source: str) -> float:
    return float(rope_parameters(config, kind, source)["rope_theta"])


def check_config(config, source: str = "config") -> None:
    """The registry's hook: raise ConfigError naming what fastbert's ModernBERT cannot honour."""
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "max_position_embeddings"):
        v = getattr(config, name)
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"{source}: {name}={v!r} must be a positive integer")
    if config.hidden_size % config.num_attention_heads:
        raise ConfigError(f"{source}: hidden size {config.hidden_size} is not a multiple of the number of "
                          f"attention heads {config.num_attention_heads}")
    if (config.hidden_size // config.num_attention_heads) % 2:
        raise ConfigError(f"{source}: head_dim {config.hidden_size // config.num_attention_heads} must be even "
                          "for rotary embeddings")
    types = layer_types(config)
    if len(types) != config.num_hidden_layers or set(types) - {GLOBAL, LOCAL}:
        raise ConfigError(f"{source}: layer_types={types!r} must list {config.num_hidden_layers} entries of "
                          f"{GLOBAL!r} / {LOCAL!r}")
    for kind in set(types):
        rope_theta(config, kind, source)
    if LOCAL in types and (not isinstance(config.local_attention, int) or config.local_attention < 0):
        raise ConfigError(f"{source}: local_attention={config.local_attention!r} must be a non-negative int")
    activation_fn(config.hidden_activation, source, "hidden_activation")
    activation_fn(config.classifier_activation, source, "classifier_activation")
    if config.classifier_pooling not in ("cls", "mean"):
        raise ConfigError(f"{source}: classifier_pooling={config.classifier_pooling!r} must be 'cls' or 'mean'")
    check_probability(config, ("attention_dropout", "embedding_dropout", "mlp_dropout", "classifier_dropout"),
                      source)


def resolve_dims(config) -> Dims:
    """The registry's hook: ModernBertConfig's names for the sizes every fastbert model reads."""
    return Dims(config.model_type, config.vocab_size, config.hidden_size, config.hidden_size,
                config.num_hidden_layers, config.num_attention_heads, config.intermediate_size,
                ACTIVATIONS[config.hidden_activation], float(config.norm_eps), config.max_position_embeddings, 0,
                config.pad_token_id, float(config.mlp_dropout), float(config.attention_dropout))


class ModernBertFamily(RotaryFamily):
    base_model_prefix = "model"
    model_types = ("modernbert",)
    init_zeroes_padding_row = False   # transformers' ModernBERT draws the whole token table, padding row too

    def init_std(self, module, name):
        """transformers' ModernBERT init: truncated normal, 'out' projections scaled by depth."""
        c = self.config
        std = c.initializer_range
        cutoff = c.initializer_cutoff_factor if c.initializer_cutoff_factor is not None else 3
        leaf = name.rpartition(".")[2]
        if name.endswith("classifier"):
            std = c.hidden_size ** -0.5
        elif leaf == "Wo" or name.endswith("head.dense") or name == "decoder":
            std = c.initializer_range / (2.0 * c.num_hidden_layers) ** 0.5
        return std, cutoff


def _norm(config):
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


# ---- modules under transformers' names ------------------------------------------------------------
class ModernBertEmbeddings(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = _norm(config)
        self.drop = nn.Dropout(config.embedding_dropout)

    def forward(self, input_ids, inputs_embeds, backend: str):     # packed (tokens,) ids or (tokens, hidden)
        x = inputs_embeds if inputs_embeds is not None else self.tok_embeddings(input_ids)
        return self.drop(add_norm(x, None, self.norm, backend))          # (tokens, hidden)


class ModernBertAttention(nn.Module):
    def __init__(self, config, layer_type: str):
        super().__init__()
        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.attention_bias)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)


class ModernBertMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.drop = nn.Dropout(config.mlp_dropout)


class ModernBertRotaryEmbedding(nn.Module):
    """transformers' ModernBertRotaryEmbedding by name and call: forward(x, position_ids, layer_type) ->
    (cos, sin) of shape position_ids.shape + (head_dim,); `tables` gives the encoder each layer type's
    (tokens, head_dim // 2) halves for fastbert's rotary op, once per forward."""

    def __init__(self, config, device=None):
        super().__init__()
        self.config = config
        self.original_max_seq_len = config.max_position_embeddings
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.rope_type = {kind: rope_parameters(config, kind, "config")["rope_type"]
                          for kind in sorted(set(layer_types(config)))}
        # (layer type, length or None, device) -> (inv_freq fp32, attention scaling): derived from the config
        # on first use, as plain attributes (not buffers: no state_dict entries, and nothing to fill on a
        # model built on the meta device)
        self._frequencies: Dict[tuple, Tuple[torch.Tensor, float]] = {}

    def __getattr__(self, name: str):
        # transformers' per-layer-type attributes ({layer_type}_inv_freq, ..._original_inv_freq,
        # ..._attention_scaling), at the config's length, on the CPU
        for kind in self.__dict__.get("rope_type", ()):
            if name in (f"{kind}_inv_freq", f"{kind}_original_inv_freq"):
                return self.frequencies(kind, None, "cpu")[0]
            if name == f"{kind}_attention_scaling":
                return self.frequencies(kind, None, "cpu")[1]
        return super().__getattr__(name)

    def _length(self, kind: str, seq_len: int) -> Optional[int]:
        """The length a layer type's frequencies depend on (None: the config's), as transformers'
        dynamic_rope_update: dynamic past max_position_embeddings, longrope's long factors past its
        original_max_position_embeddings."""
        rope_type = self.rope_type[kind]
        if "dynamic" in rope_type and seq_len > self.original_max_seq_len:
            return seq_len
        if rope_type == "longrope":
            self.frequencies(kind, None, "cpu")   # standardizes the config's rope_parameters first
            original = self.config.rope_parameters[kind]["original_max_position_embeddings"]
            return original + 1 if seq_len > original else None
        return None

    def frequencies(self, kind: str, length: Optional[int], device) -> Tuple[torch.Tensor, float]:
        key = (kind, length, torch.device(device))
        if key not in self._frequencies:
            rope_type = self.rope_type[kind]
            with torch.inference_mode(False), torch.no_grad():
                if rope_type == "default":
                    freqs, scaling = inv_freq(rope_theta(self.config, kind, "config"), self.head_dim), 1.0
                else:
                    freqs, scaling = ROPE_INIT_FUNCTIONS[rope_type](self.config, None, seq_len=length,
                                                                    layer_type=kind)
                if length is not None:   # transformers keeps the scaling of the config's length
                    scaling = self.frequencies(kind, None, device)[1]
                if freqs.shape != (self.head_dim // 2,):
                    raise ValueError(f"rope_type {rope_type!r} gave {tuple(freqs.shape)} frequencies for head_dim "
                                     f"{self.head_dim}; ModernBERT rotates whole heads")
                entry = (freqs.to(device=device, dtype=torch.float32), float(scaling))
            if length is None or rope_type == "longrope":   # dynamic lengths are not kept: one per input
                self._frequencies[key] = entry
            return entry
        return self._frequencies[key]

    def _needs_length(self, kind: str) -> bool:
        return "dynamic" in self.rope_type[kind] or self.rope_type[kind] == "longrope"

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str):
        seq_len = int(position_ids.max()) + 1 if self._needs_length(layer_type) and position_ids.numel() else 0
        freqs, scaling = self.frequencies(layer_type, self._length(layer_type, seq_len), x.device)
        angles = position_ids[..., None].float() * freqs
        emb = torch.cat((angles, angles), dim=-1)
        return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)

    def tables(self, positions: torch.Tensor, seq_len: Optional[int]) -> "RopeTables":
        """Each layer type's (cos, sin), (tokens, head_dim // 2) fp32, for (tokens,) positions; seq_len: the
        bound of the positions known on the host (None: read from them, for dynamic and longrope only)."""
        out = RopeTables()
        for kind in self.rope_type:
            n = seq_len
            if n is None and self._needs_length(kind):
                n = int(positions.max()) + 1 if positions.numel() else 0   # the caller's position_ids: a sync
            freqs, scaling = self.frequencies(kind, None if n is None else self._length(kind, n), positions.device)
            angles = positions.float()[:, None] * freqs                     # as transformers: fp32 products
            out[kind] = (angles.cos() * scaling, angles.sin() * scaling)
        return out


class RopeTables(dict):
    """{layer type: (cos, sin)} of one forward, called as rotary_attention calls a rope:
    (positions, layer type, dtype) -> the pair in that dtype."""

    def __call__(self, positions: torch.Tensor, kind: str, dtype: torch.dtype):
        cos, sin = self[kind]
        return cos.to(dtype), sin.to(dtype)


class ModernBertEncoderLayer(EncoderLayer):
    """A pre-LN layer of the common stack's steps, with rotary (global or local) attention."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.attn_norm = nn.Identity() if layer_idx == 0 else _norm(config)
        self.attn = ModernBertAttention(config, layer_types(config)[layer_idx])
        self.mlp_norm = _norm(config)
        self.mlp = ModernBertMLP(config)
        self.attention_type = layer_types(config)[layer_idx]
        self.theta = rope_theta(config, self.attention_type, "config")
        self.window = config.local_attention // 2 if self.attention_type == LOCAL else None
        self.num_heads = config.num_attention_heads
        self.attention_dropout = float(config.attention_dropout)
        self.act = activation_fn(config.hidden_activation, "config", "hidden_activation")

    def forward(self, x: torch.Tensor, packing: LayerPacking, output_attentions: bool = False,
                backend: str = "auto"):
        tokens, hidden = x.shape
        h = add_norm(x, None, self.attn_norm, backend, owner=self)
        qkv = apply_linear(h, self.attn.Wqkv, backend, owner=self)
        qkv = qkv.view(tokens, 3, self.num_heads, hidden // self.num_heads)  # no -1: tokens may be 0
        drop = self.attention_dropout if self.training else 0.0
        ctx, probs = rotary_attention(qkv, packing, packing.positions.rope, self.attention_type, self.window, drop,
                                      output_attentions, backend)
        x = residual_linear(ctx.reshape(tokens, hidden), self.attn.Wo, x, drop, backend)  # out_drop
        h = add_norm(x, None, self.mlp_norm, backend, owner=self)
        inp, gate = apply_linear(h, self.mlp.Wi, backend, owner=self).chunk(2, dim=-1)
        g = self.mlp.drop(self.act(inp) * gate)                                # (tokens, intermediate)
        return residual_linear(g, self.mlp.Wo, x, 0.0, backend), probs


# ---- the bare encoder -------------------------------------------------------------------------------
class ModernBertModel(ModernBertFamily, RotaryEncoderModel):
    has_token_types = False
    output_class = BaseModelOutput

    def __init__(self, config, add_pooling_layer: bool = False):
        super().__init__(config)
        c = self.config
        self.embeddings = ModernBertEmbeddings(c)
        self.rotary_emb = ModernBertRotaryEmbedding(c)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(c, i) for i in range(c.num_hidden_layers))
        self.final_norm = _norm(c)
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.tok_embeddings

    def embed(self, input_ids, token_type_ids, position_ids, inputs_embeds, backend):
        return self.embeddings(input_ids, inputs_embeds, backend)

    def finish(self, x):
        return add_norm(x, None, self.final_norm, self._backend)

    def max_sequence_length(self) -> int:
        return sys.maxsize   # RoPE has no table to run out of: transformers takes any length too

    def max_position_id(self) -> int:
        return sys.maxsize

    def run_encoder(self, x, packing, positions, output_attentions, hidden_states):
        # each layer type's cos / sin once for all layers; default positions are below the padded width
        rope = self.rotary_emb.tables(positions.rotary, None if positions.given else packing.seqlen)
        return super().run_encoder(x, packing, dataclasses.replace(positions, rope=rope), output_attentions,
                                   hidden_states)


# ---- heads ----------------------------------------------------------------------------------------
class ModernBertPredictionHead(nn.Module):
    """dense (classifier_bias) -> classifier_activation -> norm."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.norm = _norm(config)
        self.act = activation_fn(config.classifier_activation, "config", "classifier_activation")

    def forward(self, h):
        return F.layer_norm(self.act(self.dense(h)), self.norm.normalized_shape, self.norm.weight, self.norm.bias,
                            self.norm.eps)


def _pool(config, h, attention_mask, first_real: bool):
    """classifier_pooling over (batch, seq, hidden): 'cls' (first token; first real token when
    first_real, as transformers' multiple choice) or 'mean' over real tokens."""
    if config.classifier_pooling == "cls":
        if first_real and attention_mask is not None:
            return h[torch.arange(h.shape[0], device=h.device), attention_mask.argmax(dim=-1)]
        return h[:, 0]
    if attention_mask is None:
        attention_mask = torch.ones(h.shape[:2], dtype=h.dtype, device=h.device)
    m = attention_mask.to(h.dtype).unsqueeze(-1)
    return (h * m).sum(dim=1) / attention_mask.sum(dim=1, keepdim=True).to(h.dtype)


class _HeadNamed:
    """transformers names ModernBERT's prediction head `head`, which TaskModel uses for a method:
    a property returns the module (nn.Module keeps it in _modules, which plain lookup reads last).
    ModernBERT's task models have their own forwards, so TaskModel.head is not called."""

    @property
    def head(self) -> nn.Module:
        return self._modules["head"]


class _ModernBertTask(_HeadNamed, TaskModel, ModernBertFamily):
    base_class = ModernBertModel

    def build_head(self, config):
        self.head = ModernBertPredictionHead(config)
        self.drop = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, self.num_outputs(config))

    def num_outputs(self, config):
        return config.num_labels

    def run(self, input_ids, attention_mask, position_ids, inputs_embeds, output_attentions, output_hidden_states):
        return self.encode(input_ids, attention_mask, None, position_ids, inputs_embeds, output_attentions,
                           output_hidden_states)

    def logits_of(self, h):
        return self.classifier(self.drop(self.head(h)))


class ModernBertForMaskedLM(_HeadNamed, TaskModel, ModernBertFamily):
    """head -> decoder (tied to tok_embeddings, bias decoder_bias); sparse_prediction as transformers:
    with labels, logits only for the positions whose label is not sparse_pred_ignore_index."""
    base_class = ModernBertModel

    def build_head(self, config):
        self.head = ModernBertPredictionHead(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.decoder_bias)

    def tied_weights(self):
        return {"decoder.weight": "model.embeddings.tok_embeddings.weight"}

    def get_output_embeddings(self):
        return self.decoder

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                output_attentions=None, output_hidden_states=None, return_dict=None,
                token_type_ids=None):  # taken and ignored, as transformers' (no token types)
        out = self.encode(input_ids, attention_mask, None, position_ids, inputs_embeds, output_attentions,
                          output_hidden_states)
        h = out.last_hidden_state
        if self.config.sparse_prediction and labels is not None:
            labels = labels.reshape(-1)
            h = h.reshape(labels.shape[0], -1)
            keep = labels != self.config.sparse_pred_ignore_index
            h, labels = h[keep], labels[keep]
        logits = self.decoder(self.head(h))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))  # -100 ignored
        return self._finish(MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                           attentions=out.attentions), return_dict)


class ModernBertForSequenceClassification(_ModernBertTask):
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                output_attentions=None, output_hidden_states=None, return_dict=None,
                token_type_ids=None):  # taken and ignored, as transformers' (no token types)
        out = self.run(input_ids, attention_mask, position_ids, inputs_embeds, output_attentions,
                       output_hidden_states)
        logits = self.logits_of(_pool(self.config, out.last_hidden_state, attention_mask, first_real=False))
        loss = None if labels is None else sequence_classification_loss(self.config, logits, labels)
        return self._finish(SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                                     attentions=out.attentions), return_dict)


class ModernBertForTokenClassification(_ModernBertTask):
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                output_attentions=None, output_hidden_states=None, return_dict=None,
                token_type_ids=None):  # taken and ignored, as transformers' (no token types)
        out = self.run(input_ids, attention_mask, position_ids, inputs_embeds, output_attentions,
                       output_hidden_states)
        logits = self.logits_of(out.last_hidden_state)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, self.config.num_labels), labels.view(-1))  # -100 ignored
        return self._finish(TokenClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                                  attentions=out.attentions), return_dict)


class ModernBertForQuestionAnswering(_ModernBertTask):
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, start_positions=None,
                end_positions=None, inputs_embeds=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, token_type_ids=None):  # taken and ignored, as transformers'
        out = self.run(input_ids, attention_mask, position_ids, inputs_embeds, output_attentions,
                       output_hidden_states)
        start_logits, end_logits = self.logits_of(out.last_hidden_state).split(1, dim=-1)
        start_logits, end_logits = start_logits.squeeze(-1).contiguous(), end_logits.squeeze(-1).contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = qa_loss(start_logits, end_logits, start_positions, end_positions, attention_mask)
        return self._finish(QuestionAnsweringModelOutput(
            loss=loss, start_logits=start_logits, end_logits=end_logits, hidden_states=out.hidden_states,
            attentions=out.attentions), return_dict)


class ModernBertForMultipleChoice(_ModernBertTask):
    def num_outputs(self, config):
        return 1

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                output_attentions=None, output_hidden_states=None, return_dict=None,
                token_type_ids=None):  # taken and ignored, as transformers' (no token types)
        ref = input_ids if input_ids is not None else inputs_embeds
        if ref is None or ref.dim() < 3:
            raise ValueError("multiple choice inputs must be (batch, num_choices, seq), got shape "
                             f"{None if ref is None else tuple(ref.shape)}")
        num_choices = ref.shape[1]

        def flat(t, keep=1):
            return None if t is None else t.reshape(-1, *t.shape[-keep:])

        mask = flat(attention_mask)
        out = self.run(flat(input_ids), mask, flat(position_ids), flat(inputs_embeds, 2), output_attentions,
                       output_hidden_states)
        logits = self.logits_of(_pool(self.config, out.last_hidden_state, mask, first_real=True))
        logits = logits.view(-1, num_choices)
        loss = None if labels is None else F.cross_entropy(logits, labels)
        return self._finish(MultipleChoiceModelOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                                      attentions=out.attentions), return_dict)
