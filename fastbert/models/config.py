"""Config handling: transformers' own config classes, checked for what fastbert supports.

A model's `.config` is the `transformers` config object (BertConfig, RobertaConfig, ...), so it
saves, prints and compares exactly as transformers' does. `resolve()` reads the few numbers the
fast path needs into one flat `Dims`, whatever the family calls them (DistilBERT says `dim`).
"""
import json
import os
from dataclasses import dataclass
from typing import Optional

import torch

from fastbert.models.activations import ACTIVATIONS, FUSED, Activation
from fastbert.models.errors import ConfigError
from fastbert.models.registry import MODEL_TYPES, family


def activation_fn(name, source: str, key: str):
    """The function of transformers' activation `name` (the config's `key`), or a ConfigError."""
    if name not in ACTIVATIONS:
        raise ConfigError(f"{source}: {key}={name!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name].fn


@dataclass(frozen=True)
class Dims:
    model_type: str
    vocab_size: int
    embedding_size: int          # width of the embedding tables (ELECTRA/ALBERT may differ from hidden)
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    activation: Activation       # ACTIVATIONS[the config's hidden activation]
    layer_norm_eps: float
    max_position_embeddings: int
    type_vocab_size: int         # 0: no token type embeddings (DistilBERT)
    pad_token_id: Optional[int]
    hidden_dropout: float
    attention_dropout: float

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def read_config_dict(path: str) -> dict:
    """Parse a config.json with errors that name the file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object, got {type(data).__name__}")
    if "model_type" not in data:
        raise ConfigError(f"{path} has no 'model_type'; expected one of {MODEL_TYPES}")
    return data


def config_from_dict(data: dict, source: str = "config"):
    """A transformers config object from a config.json dict (after checking the model type)."""
    from transformers import AutoConfig

    model_type = data.get("model_type")
    family(model_type, source)
    fields = {k: v for k, v in data.items() if k not in ("model_type", "transformers_version")}
    for key in ("dtype", "torch_dtype"):
        value = fields.get(key)
        if value not in (None, "auto") and not (isinstance(value, str) and
                                                isinstance(getattr(torch, value, None), torch.dtype)):
            raise ConfigError(f"{source}: {key}={value!r} is not a torch dtype name (e.g. 'float32')")
    try:
        config = AutoConfig.for_model(model_type, **fields)
    except Exception as e:  # transformers raises several types for bad values; name the file
        raise ConfigError(f"{source}: invalid {model_type} config ({type(e).__name__}: {e})") from e
    check_supported(config, source)
    return config


def load_config(path: str):
    return config_from_dict(read_config_dict(path), source=path)


def check_supported(config, source: str = "config") -> None:
    """Raise ConfigError naming the first setting the fast path cannot honour."""
    fam = family(getattr(config, "model_type", None), source)
    pos = getattr(config, "position_embedding_type", "absolute")
    if pos not in (None, "absolute"):
        raise ConfigError(f"{source}: position_embedding_type={pos!r} is not supported "
                          "(fastbert implements absolute position embeddings only)")
    for flag in ("is_decoder", "add_cross_attention"):
        if getattr(config, flag, False):
            raise ConfigError(f"{source}: {flag}=True is not supported (fastbert runs bidirectional encoders)")
    act = getattr(config, fam.activation_key, None) if fam.activation_key else None
    if fam.activation_key and act not in FUSED:  # no key: the family's check_config reads it
        raise ConfigError(f"{source}: hidden activation {fam.activation_key}={act!r} is not supported; "
                          f"supported: {FUSED}")
    check_config = fam.hook("check_config")
    if check_config is not None:
        check_config(config, source)
    d = resolve(config)
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout",
                 "classifier_dropout_prob", "dropout", "attention_dropout", "qa_dropout", "seq_classif_dropout",
                 "summary_last_dropout", "summary_first_dropout"):
        p = getattr(config, name, None)
        if p is not None and not (isinstance(p, (int, float)) and 0 <= p <= 1):
            raise ConfigError(f"{source}: {name}={p!r} is not a probability in [0, 1]")
    for name in ("vocab_size", "hidden_size", "embedding_size", "num_heads", "num_layers", "intermediate_size",
                 "max_position_embeddings"):
        v = getattr(d, name)
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"{source}: {name}={v!r} must be a positive integer")
    if d.pad_token_id is not None and not 0 <= d.pad_token_id < d.vocab_size:
        raise ConfigError(f"{source}: pad_token_id={d.pad_token_id} is outside the vocabulary (size {d.vocab_size})")
    if d.hidden_size % d.num_heads:
        raise ConfigError(f"{source}: hidden size {d.hidden_size} is not a multiple of "
                          f"the number of attention heads {d.num_heads}")


def resolve(config) -> Dims:
    """The family's own `resolve_dims(config)` when it has one, else BertConfig's names."""
    resolve_dims = family(config.model_type).hook("resolve_dims")
    if resolve_dims is not None:
        return resolve_dims(config)
    emb = getattr(config, "embedding_size", None) or config.hidden_size
    return Dims(config.model_type, config.vocab_size, emb, config.hidden_size, config.num_hidden_layers,
                config.num_attention_heads, config.intermediate_size, ACTIVATIONS[config.hidden_act],
                float(config.layer_norm_eps), config.max_position_embeddings, config.type_vocab_size,
                config.pad_token_id, float(config.hidden_dropout_prob),
                float(config.attention_probs_dropout_prob))
