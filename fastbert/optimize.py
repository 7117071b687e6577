"""fastbert.optimize(model): put fastbert's encoder inside an existing transformers model, in place.

    model = transformers.AutoModelForSequenceClassification.from_pretrained(...)
    fastbert.optimize(model)            # same object back; same outputs (within 1e-4 in fp32), faster

How: the transformers base model (`model.bert`, `model.roberta`, ..., or the model itself when it
is bare) keeps its identity, class, config and methods, but its children (embeddings, encoder /
transformer, pooler) become fastbert's modules built around the very same nn.Parameter objects
(no copy: tied weights stay tied, `.to()` / `.half()` / optimizers / load_state_dict act on the
tensors both share), and its forward becomes fastbert's (packed real tokens, fused QKV, fused
kernels). Parameter names do not change, so state_dict keys and save_pretrained checkpoints stay
transformers'. The head (classifier, MLM, QA...) is transformers' own and untouched; it calls the
base model as before and gets transformers' output class back.

A sentence_transformers.SentenceTransformer is optimized through the transformers model inside
each of its Transformer modules. Unsupported models (another architecture, relative position
embeddings, decoders) raise fastbert.models.config.ConfigError, a ValueError, naming the setting.
Optimizing twice is a no-op.
"""
import inspect
import sys
import types
import typing

import torch
from torch import nn

from fastbert.models.config import ConfigError, check_supported

_FAST_ARGS = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "inputs_embeds",
              "output_attentions", "output_hidden_states")
# transformers arguments the fast encoder cannot honour; accepted only at their "off" value
_OFF_ARGS = ("head_mask", "encoder_hidden_states", "encoder_attention_mask", "past_key_values", "cache",
             "use_cache")


def optimize(model):
    """Swap the encoder of a transformers model (or of a SentenceTransformer) for fastbert's, in place.

    Returns `model` itself. Raises TypeError for objects that are neither, and ConfigError (a
    ValueError) for transformers models fastbert cannot run, naming the model type or setting."""
    if _is_sentence_transformer(model):
        found = [m for m in model.children() if _hf_model_of(m) is not None]
        if not found:
            raise TypeError("this SentenceTransformer has no transformers-backed Transformer module to optimize")
        for module in found:
            optimize(_hf_model_of(module))
        return model
    from fastbert.models.modeling import FastPreTrainedModel
    if isinstance(model, FastPreTrainedModel):
        return model                                   # already fastbert's own model
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"fastbert.optimize expects a transformers PreTrainedModel or a "
                        f"sentence_transformers.SentenceTransformer, got {type(model).__name__}")
    base = model.base_model
    if "_fastbert_encoder" in base.__dict__:
        return model                                   # optimized before
    config = model.config
    source = f"{type(model).__name__} (model_type={getattr(config, 'model_type', None)!r})"
    check_supported(config, source)
    _swap_encoder(base, config, source)
    return model


def _is_sentence_transformer(obj) -> bool:
    st = sys.modules.get("sentence_transformers")  # a SentenceTransformer exists only once it is imported
    return st is not None and isinstance(obj, st.SentenceTransformer)


def _hf_model_of(module):
    """The transformers model inside a sentence-transformers Transformer module, else None."""
    from transformers import PreTrainedModel

    inner = getattr(module, "auto_model", None)
    return inner if isinstance(inner, PreTrainedModel) else None


def _swap_encoder(base: nn.Module, config, source: str) -> None:
    from fastbert.models.registry import model_class

    fast_cls = model_class(config.model_type, source=source)
    pooled = getattr(base, "pooler", None) is not None
    with torch.device("meta"):                         # built without memory; every tensor comes from base
        fast = fast_cls(config, add_pooling_layer=pooled)
    theirs = dict(base.named_parameters(remove_duplicate=False))
    ours = dict(fast.named_parameters(remove_duplicate=False))
    extra = sorted(set(theirs) - set(ours))
    if extra:
        raise ConfigError(f"{source}: parameters fastbert's {fast_cls.__name__} has no place for: {extra[:8]}")
    fast.share_parameters_with(base)                   # same nn.Parameter objects, shapes checked
    leftover = [name for name, b in fast.named_buffers() if b.is_meta]
    if leftover:
        raise ConfigError(f"{source}: fastbert's {fast_cls.__name__} buffers {leftover} have no source")
    fast.train(base.training)
    _follow_order(fast, base)
    signature = inspect.signature(base.forward)
    output_class = _output_class(base.forward, fast)
    for name, child in fast.named_children():          # transformers' own children are replaced
        setattr(base, name, child)
    base.__dict__["_fastbert_encoder"] = fast          # not a registered child: no duplicate keys
    base.forward = _OptimizedForward(base, signature, output_class)


def _follow_order(fast: nn.Module, hf: nn.Module) -> None:
    """Reorder fast's submodules and parameters as transformers registers them, recursively, so
    that state_dict() lists the same keys in the same order as before optimize()."""
    for attr in ("_modules", "_parameters"):
        ours, theirs = getattr(fast, attr), getattr(hf, attr)
        rank = {name: i for i, name in enumerate(theirs)}
        ordered = sorted(ours, key=lambda name: rank.get(name, len(rank)))
        for name in ordered:
            ours[name] = ours.pop(name)               # re-insert: moves the key to the end
    for name, child in fast.named_children():
        other = getattr(hf, name, None)
        if isinstance(other, nn.Module):
            _follow_order(child, other)


def _output_class(forward, fast):
    """transformers' output class from the forward's return annotation (e.g. BaseModelOutput)."""
    from transformers.utils import ModelOutput

    try:
        hint = typing.get_type_hints(forward).get("return")
    except Exception:
        hint = None
    for cls in (typing.get_args(hint) or (hint,)):
        if isinstance(cls, type) and issubclass(cls, ModelOutput):
            return cls
    from transformers.modeling_outputs import BaseModelOutput, BaseModelOutputWithPooling
    return BaseModelOutputWithPooling if "pooler" in dict(fast.named_children()) else BaseModelOutput


class _OptimizedForward:
    """The base model's forward after optimize(): transformers' signature, fastbert's computation.

    An instance attribute of the base model (so only that model changes); a plain object rather
    than a closure so that copy.deepcopy(model) rebinds it to the copy."""

    def __init__(self, owner: nn.Module, signature: inspect.Signature, output_class):
        self.owner, self.__signature__, self.output_class = owner, signature, output_class

    def __call__(self, *args, **kwargs):
        owner = self.owner
        bound = self.__signature__.bind(*args, **kwargs)
        given = {}
        for name, value in bound.arguments.items():
            if self.__signature__.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                given.update(value)
            else:
                given[name] = value
        return_dict = given.pop("return_dict", None)
        call = {}
        for name, value in given.items():
            if name in _FAST_ARGS:
                call[name] = value
            elif value is None or (name in _OFF_ARGS and value is False):
                continue
            elif name in _OFF_ARGS:
                raise ValueError(f"{type(owner).__name__} optimized by fastbert: {name} is not supported")
            else:
                raise TypeError(f"{type(owner).__name__} optimized by fastbert: unexpected argument {name!r}")
        fast = owner._fastbert_encoder
        fast.training = owner.training                 # the shared children follow owner.train() already
        out = self.output_class(**dict(fast(**call, return_dict=True)))
        if return_dict is None:
            return_dict = getattr(owner.config, "return_dict", True)
        return out if return_dict else out.to_tuple()


class _CallableModule(types.ModuleType):
    """`fastbert.optimize` names both this module and the function: importing the module makes
    the package attribute the module, so the module itself calls through to the function."""

    def __call__(self, model):
        return optimize(model)


sys.modules[__name__].__class__ = _CallableModule
