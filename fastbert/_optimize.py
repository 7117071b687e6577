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

Containers are optimized through the transformers models inside them: a transformers Pipeline
(its `.model`), and sentence-transformers' SentenceTransformer, CrossEncoder and SparseEncoder
(every transformers model in their modules, e.g. the `auto_model` of a Transformer or
MLMTransformer); their other modules (Pooling, Dense, Normalize, SpladePooling, prompts, the
CrossEncoder activation) are untouched. Every model inside is checked before any is changed. As in
fastbert.Encoder, their CPU fp32 inference reads packed GEMM weights (EncoderModel.prepack_weights:
after a write through a parameter's `.data`, call it again on `model.base_model._fastbert_encoder`).
A peft PeftModel is optimized through the model it wraps, and an adapter layer already in a
transformers model (a module with a `base_layer` of the kind it replaces, as peft's LoRA layers
have) is moved into fastbert's encoder as it is, with its parameters: fastbert runs such a module
itself (that projection unfused), so the adapter keeps working, training and merging.
Unsupported models (another architecture, settings fastbert does not implement, decoders) raise
fastbert.models.config.ConfigError, a ValueError, naming the setting; other objects raise
TypeError naming their type and what is supported. Optimizing twice is a no-op.
"""
import inspect
import sys
import typing

import torch
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from fastbert.models.config import ConfigError, check_supported

_FAST_ARGS = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "inputs_embeds",
              "output_attentions", "output_hidden_states")
# transformers arguments the fast encoder cannot honour; accepted only at their "off" value
_OFF_ARGS = ("head_mask", "encoder_hidden_states", "encoder_attention_mask", "past_key_values", "cache",
             "use_cache")
# what transformers' heads pass down through **kwargs for their loss (Trainer's num_items_in_batch): the
# encoder has no use for it, and transformers' own encoder ignores it too
_LOSS_ARGS = ("num_items_in_batch",)


_SUPPORTED = ("a transformers PreTrainedModel of a supported family (see fastbert.models), a fastbert model, "
              "a transformers Pipeline, a peft PeftModel of one of those, or a sentence-transformers "
              "SentenceTransformer, CrossEncoder or SparseEncoder")
_SENTENCE_TRANSFORMERS_TYPES = ("SentenceTransformer", "CrossEncoder", "SparseEncoder")


def optimize(model):
    """Swap the encoder of a transformers model, or of the transformers models inside a Pipeline,
    SentenceTransformer, CrossEncoder or SparseEncoder, for fastbert's, in place.

    Returns `model` itself. Raises TypeError for other objects, and ConfigError (a ValueError) for
    transformers models fastbert cannot run, naming the model type or setting."""
    if _is_pipeline(model):
        optimize(model.model)
        return model
    if _is_peft_model(model):
        optimize(model.get_base_model())
        return model
    kind = _sentence_transformers_kind(model)
    if kind is not None:
        found = _transformers_models_in(model)
        children = list(model.children()) if isinstance(model, nn.Module) else []
        if not found:
            modules = [type(m).__name__ for m in children]
            raise TypeError(f"this {kind} has no transformers model to optimize (modules: {modules}); "
                            "fastbert optimizes the transformers model of a Transformer / MLMTransformer module")
        for inner in found:                            # all checked before any is changed
            _check(inner)
        flattening = [i for i, m in enumerate(children) if getattr(m, "can_flatten_inputs", False)]
        if flattening:  # flash attention's concatenated batches arrive as cu_seq_lens_* arguments
            raise ValueError(f"{kind} module(s) {flattening} send unpadded (flattened) inputs for flash "
                             "attention, which fastbert's encoder does not take; set "
                             f"model[{flattening[0]}].unpad_inputs = False first (fastbert skips padding itself)")
        for inner in found:
            optimize(inner)
            fast = inner.base_model.__dict__.get("_fastbert_encoder")
            if fast is not None:    # an inference container, as fastbert.Encoder: packed GEMM weights
                fast.prepack_weights()
        return model
    from fastbert.models.modeling import FastPreTrainedModel
    if isinstance(model, FastPreTrainedModel):
        return model                                   # already fastbert's own model
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"fastbert.optimize expects {_SUPPORTED}; got {_type_name(model)}")
    base = model.base_model
    if "_fastbert_encoder" in base.__dict__:
        return model                                   # optimized before
    source = _check(model)
    _swap_encoder(base, model.config, source)
    if model is not base:
        _hide_padding_from_loss(model)
    return model


def _check(model) -> str:
    """Raise ConfigError unless fastbert can run this transformers model; returns its description."""
    from fastbert.models.modeling import FastPreTrainedModel

    if isinstance(model, FastPreTrainedModel):
        return type(model).__name__
    config = model.config
    source = f"{type(model).__name__} (model_type={getattr(config, 'model_type', None)!r})"
    check_supported(config, source)
    from fastbert._quantize import QuantizedLinear
    quantized = [name for name, m in model.base_model.named_modules() if isinstance(m, QuantizedLinear)]
    if quantized:
        raise ConfigError(f"{source} is quantized already ({quantized[0]} is a QuantizedLinear); call "
                          "fastbert.optimize() first, then fastbert.quantize()")
    return source


def _type_name(obj) -> str:
    cls = type(obj)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _is_pipeline(obj) -> bool:
    pipelines = sys.modules.get("transformers.pipelines")  # a Pipeline exists only once it is imported
    return pipelines is not None and isinstance(obj, pipelines.Pipeline)


def _is_peft_model(obj) -> bool:
    peft = sys.modules.get("peft")  # a PeftModel exists only once peft is imported
    cls = getattr(peft, "PeftModel", None) if peft is not None else None
    return isinstance(cls, type) and isinstance(obj, cls)


def _sentence_transformers_kind(obj):
    """"SentenceTransformer", "CrossEncoder" or "SparseEncoder" for those objects, else None."""
    st = sys.modules.get("sentence_transformers")  # these exist only once sentence_transformers is imported
    if st is None:
        return None
    for name in _SENTENCE_TRANSFORMERS_TYPES:
        cls = getattr(st, name, None)
        if isinstance(cls, type) and isinstance(obj, cls):
            return name
    return None


def _transformers_models_in(container) -> list:
    """The outermost transformers (or fastbert) models among a sentence-transformers object's modules."""
    from transformers import PreTrainedModel

    from fastbert.models.modeling import FastPreTrainedModel

    models = (PreTrainedModel, FastPreTrainedModel)
    if not isinstance(container, nn.Module):           # CrossEncoder before sentence-transformers 4
        inner = getattr(container, "model", None)
        return [inner] if isinstance(inner, models) else []
    found = []

    def walk(module):
        for child in module.children():
            if isinstance(child, models):
                found.append(child)                    # its own submodules belong to it
            else:
                walk(child)

    walk(container)
    return found


def _swap_encoder(base: nn.Module, config, source: str) -> None:
    from fastbert.models.registry import model_class

    fast_cls = model_class(config.model_type, source=source)
    pooled = getattr(base, "pooler", None) is not None
    with torch.device("meta"):                         # built without memory; every tensor comes from base
        fast = fast_cls(config, add_pooling_layer=pooled)
    _move_adapters(fast, base)
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
    # transformers' gradient_checkpointing flag lives on the modules replaced below: keep it on base, where
    # its gradient_checkpointing_enable / _disable (which set every module's flag) reach it, and the
    # forward hands it to a fastbert encoder that checkpoints in its own loop; fastbert's layers are
    # GradientCheckpointingLayers that transformers' switch sets directly, and take over the replaced
    # layers' settings here
    base.gradient_checkpointing = any(getattr(m, "gradient_checkpointing", False) is True for m in base.modules())
    old_layers = [m for m in base.modules() if isinstance(m, GradientCheckpointingLayer)]
    new_layers = [m for m in fast.modules() if isinstance(m, GradientCheckpointingLayer)]
    for new, old in zip(new_layers, old_layers):
        if old.gradient_checkpointing:
            new.gradient_checkpointing, new._gradient_checkpointing_func = True, old._gradient_checkpointing_func
    _follow_order(fast, base)
    signature = inspect.signature(base.forward)
    output_class = _output_class(base.forward, fast)
    for name, child in fast.named_children():          # transformers' own children are replaced
        setattr(base, name, child)
    base.__dict__["_fastbert_encoder"] = fast          # not a registered child: no duplicate keys
    base.forward = _OptimizedForward(base, signature, output_class, layers_checkpoint=bool(new_layers))


def _move_adapters(fast: nn.Module, base: nn.Module) -> None:
    """Put into fast, at the same path, each module of base that wraps the kind of module fast has
    there (an adapter such as peft's lora.Linear around an nn.Linear: its `base_layer`). fast then
    holds the wrapper itself, with its parameters under transformers' names, and runs it as a module."""
    from fastbert.models.layers import adapter_base_layer

    ours = dict(fast.named_modules())
    for name, module in base.named_modules():
        inner, target = adapter_base_layer(module), ours.get(name)
        if not name or target is None or inner is None or type(inner) is not type(target):
            continue
        parent, _, attr = name.rpartition(".")
        setattr(fast.get_submodule(parent) if parent else fast, attr, module)


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

    def __init__(self, owner: nn.Module, signature: inspect.Signature, output_class, layers_checkpoint: bool):
        self.owner, self.__signature__, self.output_class = owner, signature, output_class
        self.layers_checkpoint = layers_checkpoint   # fastbert's layers take transformers' switch themselves

    @property
    def __code__(self):  # torch.export reads the forward's code object (to name what it traces)
        return type(self).__call__.__code__

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
        if "token_type_ids" not in self.__signature__.parameters and not owner._fastbert_encoder.has_token_types:
            given.pop("token_type_ids", None)   # through **kwargs: transformers' model ignores it (DistilBERT)
        call = {}
        for name, value in given.items():
            if name in _FAST_ARGS:
                call[name] = value
            elif value is None or name in _LOSS_ARGS or (name in _OFF_ARGS and value is False):
                continue
            elif name in _OFF_ARGS:
                raise ValueError(f"{type(owner).__name__} optimized by fastbert: {name} is not supported")
            else:
                raise TypeError(f"{type(owner).__name__} optimized by fastbert: unexpected argument {name!r}")
        fast = owner._fastbert_encoder
        fast.training = owner.training                 # the shared children follow owner.train() already
        if not self.layers_checkpoint and fast.gradient_checkpointing != bool(owner.gradient_checkpointing):
            if owner.gradient_checkpointing:
                fast.activation_checkpointing_enable()
            else:
                fast.activation_checkpointing_disable()
        out = self.output_class(**dict(fast(**call, return_dict=True)))
        if return_dict is None:
            return_dict = getattr(owner.config, "return_dict", True)
        if return_dict:
            return out
        if owner.config.model_type in _TUPLE_KEEPS_POOLER and "pooler_output" in out.__dataclass_fields__:
            # transformers' MPNetModel: (sequence_output, pooled_output, ...) even when pooled_output is None;
            # its heads read hidden_states and attentions from outputs[2:]
            rest = tuple(v for v in (out.hidden_states, out.attentions) if v is not None)
            return (out.last_hidden_state, out.pooler_output) + rest
        return out.to_tuple()


# model types whose transformers base model keeps the pooler's slot in its return_dict=False tuple
_TUPLE_KEEPS_POOLER = ("mpnet",)


def _hide_padding_from_loss(model: nn.Module) -> None:
    """Heads whose loss could read padded positions (question answering, token classification, masked
    LM) get a forward that hides them, as fastbert's own heads do (see fastbert.models.heads): the fast
    encoder's padded rows are zeros, so the head's outputs there are its bias alone."""
    name = type(model).__name__
    kind = next((k for suffix, k in _PADDING_BLIND_HEADS if name.endswith(suffix)), None)
    if kind is not None:
        model.forward = _LossWithoutPadding(model, kind)


_PADDING_BLIND_HEADS = (("ForQuestionAnswering", "qa"), ("ForTokenClassification", "labels"),
                        ("ForMaskedLM", "labels"))


class _LossWithoutPadding:
    """An optimized head's forward: transformers' own, with padded positions kept out of the loss (QA:
    padded logits out of the softmax and targets on padding ignored, as fastbert.models.heads.qa_loss;
    per-token labels at padded positions ignored). Outputs other than the loss are transformers'. A plain
    object, as _OptimizedForward, so that copy.deepcopy(model) rebinds it."""

    def __init__(self, owner: nn.Module, kind: str):
        self.owner, self.kind = owner, kind
        self.__signature__ = inspect.signature(owner.forward)

    @property
    def __code__(self):
        return type(self).__call__.__code__

    def __call__(self, *args, **kwargs):
        from fastbert.models.heads import ignore_padding, qa_loss

        forward = type(self.owner).forward.__get__(self.owner)
        given = self.__signature__.bind(*args, **kwargs).arguments
        kw = self.__signature__.parameters
        given = {**{k: v for k, v in given.items() if kw[k].kind is not inspect.Parameter.VAR_KEYWORD},
                 **next((v for k, v in given.items() if kw[k].kind is inspect.Parameter.VAR_KEYWORD), {})}
        mask = given.get("attention_mask")
        if mask is None:
            return forward(**given)
        if self.kind == "labels":
            if given.get("labels") is not None:
                given["labels"] = ignore_padding(given["labels"], mask)
            return forward(**given)
        start, end = given.pop("start_positions", None), given.pop("end_positions", None)
        if start is None or end is None:
            return forward(**given, start_positions=start, end_positions=end)
        return_dict = given.pop("return_dict", None)
        out = forward(**given, return_dict=True)
        loss = qa_loss(out.start_logits, out.end_logits, start, end, mask)
        out = type(out)(loss=loss, **{k: v for k, v in out.items() if k != "loss"})
        if return_dict is None:
            return_dict = getattr(self.owner.config, "return_dict", True)
        return out if return_dict else out.to_tuple()
