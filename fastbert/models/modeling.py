"""What every fastbert model shares: construction from a transformers config, strict checkpoint
loading, save_pretrained, input checks, and the encoder loop over packed tokens.

Sharing parameters with a transformers model (what fastbert.optimize builds on):

    fast = fastbert.BertModel.from_hf_config(hf_model.config)
    fast.load_state_dict(hf_model.state_dict(), strict=True)      # same keys, both ways

or, to share the very same tensors instead of copying them, `fast.load_state_dict(sd, strict=True,
assign=True)` (torch >= 2.1), or `fast.share_parameters_with(hf_model)`.
"""
import contextlib
import copy
import inspect
import json
import logging
import os
import re
from typing import Dict, Iterable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import save_on_cpu
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from fastbert.models.config import check_supported, config_from_dict, resolve
from fastbert.models.layers import FastLayer
from fastbert.models.outputs import BaseModelOutput, BaseModelOutputWithPooling
from fastbert.models.registry import family
from fastbert.ops._dispatch import BACKENDS
from fastbert.padding import Packing, mask_stats, pack, packed_positions, repad, unpad

logger = logging.getLogger("fastbert")

# non-persistent buffers of transformers' embeddings, present in some older checkpoints
_IGNORED_BUFFERS = re.compile(r"(^|\.)embeddings\.(position_ids|token_type_ids)$")
_POOLER = re.compile(r"(^|\.)pooler\.")
# what save_pretrained writes (and transformers reads): single files, shards and their indexes
_WEIGHTS_FILE = re.compile(r"^(model|pytorch_model)(-\d{5}-of-\d{5})?\.(safetensors|bin)(\.index\.json)?$")


# A traced graph would keep one batch's packing (lengths, longest row) as constants, and be wrong on
# any other mask; torch.export stops at the data-dependent shapes. torch.compile handles both.
_NOT_EXPORTABLE = (
    "fastbert's forward removes padding by the values of the attention mask, so its shapes depend on the "
    "data: torch.jit.trace and torch.onnx.export(dynamo=False) would keep one batch's layout (and give wrong "
    "outputs on other masks), and torch.export cannot capture it. To export, use transformers' model with the "
    "same weights (fastbert keeps transformers' parameter names): "
    "transformers.AutoModel.from_config(model.config) (or the head's class), then "
    ".load_state_dict(model.state_dict()); for a model changed by fastbert.optimize(), export it before "
    "optimizing. torch.compile(model) works as it is.")


class CheckpointError(ValueError):
    """A checkpoint whose keys or shapes do not fit the model."""


def _fmt_shape(t) -> str:
    return str(tuple(t.shape))


class FastPreTrainedModel(PreTrainedModel):
    """Base of every fastbert model (bare encoders and heads).

    A transformers PreTrainedModel to the code that asks (`isinstance`), so that transformers.Trainer
    saves its checkpoints with this class's save_pretrained (a folder both libraries load) instead of a
    bare state dict. Built as a plain nn.Module: PreTrainedModel.__init__ would pick an attention
    implementation and a loss for transformers' own modules, and fastbert runs neither. Everything
    fastbert defines below (from_pretrained, save_pretrained, device, dtype, tie_weights, ...) is its own."""

    base_model_prefix = "bert"
    model_types: Tuple[str, ...] = ("bert",)
    # what transformers.Trainer and friends read from a model
    main_input_name = "input_ids"
    input_modalities = "text"  # transformers pipelines' repr reads it
    supports_gradient_checkpointing = True
    _keys_to_ignore_on_save = None

    def __init__(self, config):
        nn.Module.__init__(self)
        if isinstance(config, dict):
            config = config_from_dict(config)
        check_supported(config, type(self).__name__)
        if config.model_type not in self.model_types:
            raise ValueError(f"{type(self).__name__} needs a config with model_type in {self.model_types}, "
                             f"got {config.model_type!r}")
        self.config = config
        self.name_or_path = getattr(config, "name_or_path", "")   # transformers': where it was loaded from
        self.dims = resolve(config)
        self.gradient_checkpointing = False
        self._checkpoint_options = ({"use_reentrant": False}, 1, False)  # (checkpoint kwargs, every n, offload)

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, config, backend: str = "auto"):
        """A model with transformers' initialisation, ready for load_state_dict(hf.state_dict())."""
        model = cls(config)
        model.init_weights()
        model.backend = backend
        return model

    @classmethod
    def from_pretrained(cls, path_or_hub_id: str, dtype=None, device=None, backend: str = "auto", *,
                        torch_dtype=None, device_map=None, ignore_mismatched_sizes: bool = False,
                        revision=None, cache_dir=None, local_files_only: bool = False, token=None,
                        low_cpu_mem_usage=None, trust_remote_code=None, attn_implementation=None, **kwargs):
        """Load a config.json + weights checkpoint (local dir, HF cache or hub); strict (see load_checkpoint).
        `backend` ("auto" | "triton" | "torch") is the model's op backend (see `backend`). A peft adapter
        (a folder or hub id with adapter_config.json and no config.json) loads its base model this way,
        then the adapter on it: a peft.PeftModel around fastbert's model (transformers' from_pretrained
        gives its own model with the adapter inside; both run the adapter).

        transformers' arguments mean what they mean there: `torch_dtype` is the old name of `dtype`;
        `device_map` names one device ("cpu", "cuda:1", a GPU index, or "auto": the GPU when there is
        one); `revision`, `cache_dir`, `local_files_only` and `token` are for a hub id;
        `ignore_mismatched_sizes` re-initialises head weights whose shape differs from the checkpoint's
        (a new num_labels). Other keyword arguments set config attributes (num_labels, id2label,
        output_hidden_states, classifier_dropout, ...) or, when the config has no such attribute, go to
        the model's constructor (add_pooling_layer); anything else is a TypeError. `low_cpu_mem_usage`
        and `trust_remote_code` change nothing: fastbert always builds on the meta device before
        loading, and never runs code from a checkpoint. `attn_implementation` is refused: fastbert's
        attention is its own."""
        from fastbert.hub import load_adapter, load_checkpoint_files, resolve_directory

        if attn_implementation is not None:
            raise ValueError(f"attn_implementation={attn_implementation!r}: fastbert runs its own attention "
                             "(on packed tokens, without padding) whatever transformers' setting; drop the argument")
        dtype = _dtype_argument(dtype, torch_dtype)
        device = _device_argument(device, device_map)
        directory = resolve_directory(path_or_hub_id, revision=revision, cache_dir=cache_dir,
                                      local_files_only=local_files_only, token=token)
        # a peft adapter: its base model (revision is the adapter's), then the adapter
        adapted = load_adapter(directory, lambda base: cls.from_pretrained(
            base, dtype=dtype, device=device, backend=backend, ignore_mismatched_sizes=ignore_mismatched_sizes,
            cache_dir=cache_dir, local_files_only=local_files_only, token=token, **kwargs))
        if adapted is not None:
            return adapted
        config, state, source = load_checkpoint_files(directory)
        # as transformers records it (peft writes it into a saved adapter as its base model)
        config.name_or_path = str(path_or_hub_id)
        init_kwargs = cls._config_arguments(config, kwargs)
        return cls.from_state_dict(config, state, dtype=dtype, device=device, source=source, backend=backend,
                                   ignore_mismatched_sizes=ignore_mismatched_sizes, **init_kwargs)

    @classmethod
    def _config_arguments(cls, config, kwargs) -> dict:
        """transformers' rule for from_pretrained's other keyword arguments: one that names a config
        attribute sets it; the rest go to the constructor, which must take them. -> the constructor's."""
        takes = set(inspect.signature(cls.__init__).parameters) - {"self", "config"}
        init_kwargs, unknown = {}, []
        for key, value in kwargs.items():
            if hasattr(config, key):
                setattr(config, key, value)
            elif key in takes:
                init_kwargs[key] = value
            else:
                unknown.append(key)
        if unknown:
            raise TypeError(f"{cls.__name__}.from_pretrained got unexpected arguments {sorted(unknown)}: "
                            f"neither attributes of {type(config).__name__} nor arguments of {cls.__name__}()")
        if "id2label" in kwargs and "num_labels" in kwargs and len(config.id2label) != kwargs["num_labels"]:
            raise ValueError(f"num_labels={kwargs['num_labels']} but id2label has {len(config.id2label)} labels")
        return init_kwargs

    @classmethod
    def from_state_dict(cls, config, state: Dict[str, torch.Tensor], dtype=None, device=None,
                        source: str = "state_dict", backend: str = "auto", ignore_mismatched_sizes: bool = False,
                        **init_kwargs):
        dtype = _resolve_dtype(dtype, config, state)
        with torch.device("meta"):
            model = cls(config, **init_kwargs)
        model.load_checkpoint(state, dtype=dtype, device=device or "cpu", source=source,
                              ignore_mismatched_sizes=ignore_mismatched_sizes)
        model.backend = backend
        return model.eval()

    # ---- op backend -----------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """Which implementation every fastbert op of this model runs: "auto" (Triton kernels on CUDA,
        torch on CPU), "triton" (the kernels; on CPU only under TRITON_INTERPRET=1) or "torch" (the
        pure-torch references). Held by the bare encoder and passed to each op call."""
        return self.base_model._backend

    @backend.setter
    def backend(self, value: str) -> None:
        if value not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {value!r}")
        self.base_model._backend = value

    # ---- weights --------------------------------------------------------------------------------
    @property
    def base_model(self) -> nn.Module:
        return getattr(self, self.base_model_prefix, self)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def tied_weights(self) -> Dict[str, str]:
        """{parameter name: name of the parameter it shares} when word embeddings are tied."""
        return {}

    def tie_weights(self) -> None:
        if not getattr(self.config, "tie_word_embeddings", True):
            return
        for dst, src in self.tied_weights().items():
            owner, name = self._owner(dst)
            setattr(owner, name, self.get_parameter(src))

    def _owner(self, key: str) -> Tuple[nn.Module, str]:
        path, _, name = key.rpartition(".")
        return self.get_submodule(path), name

    def get_input_embeddings(self) -> nn.Embedding:
        base = self.base_model
        return base.embeddings.word_embeddings if base is self else base.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        old = self.get_input_embeddings()
        for parent in self.modules():
            for name, child in parent.named_children():
                if child is old:
                    setattr(parent, name, value)

    def resize_token_embeddings(self, new_num_tokens: Optional[int] = None, pad_to_multiple_of: Optional[int] = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        """transformers' resize after adding tokens: the input embeddings get `new_num_tokens` rows (rounded
        up to `pad_to_multiple_of`), the old rows kept; new rows drawn around the old rows' mean and
        covariance (mean_resizing, transformers' default) or initialised as fresh weights. A tied decoder
        follows the embeddings; the head's other vocabulary-sized parameters (decoder biases) are resized
        alike, new entries at the old ones' mean (or zero). config.vocab_size is updated."""
        old = self.get_input_embeddings()
        if new_num_tokens is None and pad_to_multiple_of is None:
            return old
        n = old.num_embeddings if new_num_tokens is None else int(new_num_tokens)
        if pad_to_multiple_of:
            n = -(-n // pad_to_multiple_of) * pad_to_multiple_of
        if n < 1:
            raise ValueError(f"new_num_tokens must be at least 1, got {n}")
        old_n = old.num_embeddings
        new = nn.Embedding(n, old.embedding_dim, padding_idx=old.padding_idx if (old.padding_idx or 0) < n else None,
                           device=old.weight.device, dtype=old.weight.dtype)
        with torch.no_grad():
            new.weight[:min(n, old_n)] = old.weight[:min(n, old_n)]
            if n > old_n:
                new.weight[old_n:] = _added_rows(old.weight, n - old_n, mean_resizing, self.config)
        new.weight.requires_grad_(old.weight.requires_grad)
        self.set_input_embeddings(new)
        tied = set(self.tied_weights()) if getattr(self.config, "tie_word_embeddings", True) else set()
        base = self.base_model_prefix + "."
        heads = [] if self.base_model is self else [(k, p) for k, p in self.named_parameters(remove_duplicate=False)
                                                     if not k.startswith(base) and k not in tied]
        for key, p in heads:
            if p.dim() >= 1 and p.shape[0] == old_n:   # a vocabulary-sized head parameter (decoder, its bias)
                with torch.no_grad():
                    grown = torch.empty((n, *p.shape[1:]), dtype=p.dtype, device=p.device)
                    grown[:min(n, old_n)] = p[:min(n, old_n)]
                    if n > old_n:
                        grown[old_n:] = (_added_rows(p, n - old_n, mean_resizing, self.config) if p.dim() == 2
                                         else (p.mean() if mean_resizing else 0.0))
                owner, name = self._owner(key)
                setattr(owner, name, nn.Parameter(grown, requires_grad=p.requires_grad))
        for m in self.modules():  # keep nn.Linear's out_features true to its weight
            if isinstance(m, nn.Linear) and m.out_features != m.weight.shape[0]:
                m.out_features = m.weight.shape[0]
        self.config.vocab_size = n
        self.tie_weights()
        return self.get_input_embeddings()

    def init_weights(self, modules: Optional[Iterable[nn.Module]] = None) -> None:
        """transformers' initialisation: normal(0, initializer_range) weights, zero biases, unit norms."""
        std = getattr(self.config, "initializer_range", 0.02)
        modules = list(self.modules() if modules is None else modules)
        with torch.no_grad():
            for m in modules:
                if isinstance(m, nn.Linear):
                    m.weight.normal_(0.0, std)
                    if m.bias is not None:
                        m.bias.zero_()
                elif isinstance(m, nn.Embedding):
                    m.weight.normal_(0.0, std)
                    if m.padding_idx is not None:
                        m.weight[m.padding_idx].zero_()
                elif isinstance(m, nn.LayerNorm):
                    m.weight.fill_(1.0)
                    m.bias.zero_()
                for name, p in m.named_parameters(recurse=False):
                    if name == "bias" and not isinstance(m, (nn.Linear, nn.LayerNorm)):
                        p.zero_()  # MLM output bias
            fixed_tables = getattr(self.base_model, "init_fixed_tables", None)
            if fixed_tables is not None:  # a family's tables that are not random (DistilBERT's sinusoids)
                fixed_tables(modules)
        self.tie_weights()

    def share_parameters_with(self, other: nn.Module) -> "FastPreTrainedModel":
        """Use `other`'s parameter tensors (same names) in place of ours: no copy, both see updates."""
        theirs = dict(other.named_parameters(remove_duplicate=False))
        ours = dict(self.named_parameters(remove_duplicate=False))
        missing = sorted(set(ours) - set(theirs))
        if missing:
            raise CheckpointError(f"{type(other).__name__} lacks parameters {missing[:8]}")
        for name in ours:
            owner, attr = self._owner(name)
            if theirs[name].shape != ours[name].shape:
                raise CheckpointError(f"{name}: shape {_fmt_shape(theirs[name])} != {_fmt_shape(ours[name])}")
            setattr(owner, attr, theirs[name])
        return self

    def load_checkpoint(self, state: Dict[str, torch.Tensor], dtype=None, device="cpu",
                        source: str = "state_dict", ignore_mismatched_sizes: bool = False) -> None:
        """Strict, transformers-compatible loading (also works on a model built on the meta device).

        Encoder keys must match exactly (names and shapes) or CheckpointError names them; a "bert."-
        style prefix is added or stripped as needed; old LayerNorm gamma/beta names are renamed; the
        position_ids/token_type_ids buffers some checkpoints carry are ignored. Head (and pooler)
        weights missing from a base checkpoint are initialised as transformers does, with a warning
        naming them; weights of another head are left unused, with a warning. With
        `ignore_mismatched_sizes`, head weights whose shape differs from the model's (a classifier
        for another num_labels) are initialised afresh instead, with a warning; an encoder weight of
        another shape is still an error."""
        state, foreign = self._normalize_keys(state)
        expected = dict(self.named_parameters(remove_duplicate=False))
        tied = self.tied_weights() if getattr(self.config, "tie_word_embeddings", True) else {}
        head_prefix = "" if self.base_model is self else self.base_model_prefix + "."

        def is_encoder(key):
            return key.startswith(head_prefix) and not _POOLER.search(key)

        if ignore_mismatched_sizes:
            resized = [k for k in state if k in expected and not is_encoder(k)
                       and tuple(state[k].shape) != tuple(expected[k].shape)]
            if resized:
                logger.warning("%s: %s weights of another shape than the checkpoint's, initialised afresh "
                               "(ignore_mismatched_sizes=True): %s", source, type(self).__name__,
                               ", ".join(f"{k} {_fmt_shape(state[k])} -> {_fmt_shape(expected[k])}" for k in resized))
                state = {k: v for k, v in state.items() if k not in resized}

        unexpected = [k for k in state if k not in expected]
        missing = [k for k in expected if k not in state and k not in tied]
        bad_unexpected = [k for k in unexpected if is_encoder(k)]
        bad_missing = [k for k in missing if is_encoder(k)]
        mismatched = [k for k in state if k in expected and tuple(state[k].shape) != tuple(expected[k].shape)]
        not_float = [k for k in state if k in expected and not state[k].is_floating_point()]
        if bad_unexpected or bad_missing or mismatched or not_float:
            lines = [f"{source} does not fit {type(self).__name__}:"]
            lines += [f"  missing: {k} {_fmt_shape(expected[k])}" for k in bad_missing]
            lines += [f"  unexpected: {k} {_fmt_shape(state[k])}" for k in bad_unexpected]
            lines += [f"  shape mismatch: {k}: checkpoint {_fmt_shape(state[k])}, model {_fmt_shape(expected[k])}"
                      for k in mismatched]
            lines += [f"  not floating point: {k} has dtype {state[k].dtype}" for k in not_float]
            raise CheckpointError("\n".join(lines))
        unused = foreign + [k for k in unexpected if not is_encoder(k)]
        if unused:
            logger.warning("%s: weights not used by %s: %s", source, type(self).__name__, ", ".join(unused))
        if missing:
            logger.warning("%s: %s weights newly initialised (not in the checkpoint; train them before use): %s",
                           source, type(self).__name__, ", ".join(missing))
        for key, param in expected.items():
            if key in tied or key not in state:
                continue
            value = state[key].to(device=device, dtype=dtype if state[key].is_floating_point() else None)
            owner, name = self._owner(key)
            setattr(owner, name, nn.Parameter(value, requires_grad=param.requires_grad))
        fresh = {self._owner(k)[0] for k in missing}
        for m in fresh:
            for name, p in list(m.named_parameters(recurse=False)):
                if p.is_meta:
                    setattr(m, name, nn.Parameter(torch.empty(p.shape, dtype=dtype or p.dtype, device=device)))
        if fresh:
            self.init_weights(fresh)
        self.tie_weights()

    def _normalize_keys(self, state: Dict[str, torch.Tensor]) -> Tuple[Dict[str, torch.Tensor], List[str]]:
        """-> (state under this model's names, keys of a head this bare model does not have)."""
        out = {}
        for k, v in state.items():
            if _IGNORED_BUFFERS.search(k):
                continue
            k = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", k)) if "LayerNorm" in k else k
            out[k] = v
        prefix = self.base_model_prefix + "."
        has_prefix = any(k.startswith(prefix) for k in out)
        if self.base_model is not self and not has_prefix:        # base checkpoint into a head model
            return {prefix + k: v for k, v in out.items()}, []
        if self.base_model is self and has_prefix:                # head checkpoint into a bare model
            return ({k[len(prefix):]: v for k, v in out.items() if k.startswith(prefix)},
                    [k for k in out if not k.startswith(prefix)])
        return out, []

    def save_pretrained(self, save_directory: str, *, is_main_process: bool = True, state_dict=None,
                        safe_serialization: bool = True, max_shard_size="50GB", push_to_hub: bool = False) -> None:
        """config.json + model.safetensors that transformers' from_pretrained loads, with transformers'
        arguments: only the main process writes (is_main_process); `state_dict` is saved instead of the
        model's own (as accelerate's gathered one); safe_serialization=False writes pytorch_model.bin;
        files above `max_shard_size` (an int of bytes or "500MB", "5GB") are split into shards with an
        index, as transformers writes them. push_to_hub is refused (upload the folder yourself)."""
        if push_to_hub:
            raise ValueError("save_pretrained(push_to_hub=True) is not supported: save the folder, then upload it "
                             "with huggingface_hub (HfApi().upload_folder)")
        if not is_main_process:
            return
        from huggingface_hub import split_torch_state_dict_into_shards
        from safetensors.torch import save_file

        os.makedirs(save_directory, exist_ok=True)
        tied = set(self.tied_weights()) if getattr(self.config, "tie_word_embeddings", True) else set()
        source = self.state_dict() if state_dict is None else state_dict
        state = {k: v.detach().contiguous().cpu() for k, v in source.items() if k not in tied}
        config = copy.deepcopy(self.config)
        config.architectures = [type(self).__name__]
        config.dtype = self.dtype
        config.save_pretrained(save_directory)
        pattern = "model{suffix}.safetensors" if safe_serialization else "pytorch_model{suffix}.bin"
        split = split_torch_state_dict_into_shards(state, filename_pattern=pattern, max_shard_size=max_shard_size)
        for old in os.listdir(save_directory):  # an earlier save's weights would be read instead of these
            if _WEIGHTS_FILE.match(old) and old not in split.filename_to_tensors:
                os.remove(os.path.join(save_directory, old))
        for filename, keys in split.filename_to_tensors.items():
            part = {k: state[k] for k in keys}
            if safe_serialization:
                save_file(part, os.path.join(save_directory, filename), metadata={"format": "pt"})
            else:
                torch.save(part, os.path.join(save_directory, filename))
        if split.is_sharded:
            index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
            name = "model.safetensors.index.json" if safe_serialization else "pytorch_model.bin.index.json"
            with open(os.path.join(save_directory, name), "w", encoding="utf-8") as f:
                json.dump(index, f, indent=2, sort_keys=True)

    # ---- training switches --------------------------------------------------------------------
    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, every_n_layers: int = 1,
                                        offload: bool = False) -> None:
        """Recompute encoder layers in the backward instead of keeping their activations (training only),
        as transformers: every `every_n_layers`-th layer; kwargs go to torch.utils.checkpoint (default
        use_reentrant=False); offload=True keeps the saved layer inputs in host memory."""
        if not isinstance(every_n_layers, int) or every_n_layers < 1:
            raise ValueError(f"every_n_layers must be a positive int, got {every_n_layers!r}")
        kwargs = {"use_reentrant": False, **(activation_checkpointing_kwargs or {})}
        if kwargs["use_reentrant"]:
            # as transformers: reentrant checkpointing gives layer weights gradients only when the layer's
            # input requires grad, which frozen embeddings (LoRA, adapters) do not
            self.enable_input_require_grads()
        for m in self.modules():
            if isinstance(m, FastPreTrainedModel):
                m.gradient_checkpointing = True
                m._checkpoint_options = (kwargs, every_n_layers, bool(offload))

    def enable_input_require_grads(self) -> None:
        """transformers' switch: the input embeddings' output requires grad even when the embeddings are
        frozen, so that gradients reach trainable weights inside reentrant-checkpointed layers."""
        def make_inputs_require_grads(module, inputs, output):
            output.requires_grad_(True)

        self.disable_input_require_grads()
        self._require_grads_hook = self.get_input_embeddings().register_forward_hook(make_inputs_require_grads)

    def disable_input_require_grads(self) -> None:
        hook = self.__dict__.pop("_require_grads_hook", None)
        if hook is not None:
            hook.remove()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, every_n_layers: int = 1,
                                      offload: bool = False) -> None:
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, every_n_layers, offload)

    def activation_checkpointing_disable(self) -> None:
        for m in self.modules():
            if isinstance(m, FastPreTrainedModel):
                m.gradient_checkpointing = False

    gradient_checkpointing_disable = activation_checkpointing_disable

    @property
    def is_activation_checkpointing(self) -> bool:
        return self.gradient_checkpointing

    is_gradient_checkpointing = is_activation_checkpointing

    @classmethod
    def can_generate(cls) -> bool:
        return False  # encoders only

    def _finish(self, output, return_dict: Optional[bool]):
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        return output if return_dict else output.to_tuple()


def _floating(dtype: torch.dtype, where: str) -> torch.dtype:
    if not dtype.is_floating_point:
        raise ValueError(f"{where} is {dtype}; a model's weights need a floating dtype (float32, float16, bfloat16)")
    return dtype


def _added_rows(old: torch.Tensor, k: int, mean_resizing: bool, config) -> torch.Tensor:
    """k new rows for a vocabulary-sized matrix, as transformers makes them: around the old rows' mean
    with a tiny multiple of their covariance (mean_resizing; the mean itself when the covariance is not
    positive definite), else normal(0, initializer_range)."""
    if not mean_resizing:
        return torch.randn(k, old.shape[1], dtype=old.dtype, device=old.device) * getattr(config, "initializer_range", 0.02)
    x = old.detach().float()
    mean = x.mean(0)
    centered = x - mean
    cov = centered.T @ centered / x.shape[0]
    if bool((torch.linalg.eigvalsh(cov) > 0).all()):
        dist = torch.distributions.MultivariateNormal(mean, covariance_matrix=1e-9 * cov)
        rows = dist.sample((k,))
    else:
        rows = mean.expand(k, -1)
    return rows.to(old.dtype)


def _dtype_argument(dtype, torch_dtype):
    """from_pretrained's dtype, also given under transformers' old name torch_dtype."""
    if torch_dtype is None or dtype is None or dtype == torch_dtype:
        return torch_dtype if dtype is None else dtype
    raise ValueError(f"dtype={dtype!r} and torch_dtype={torch_dtype!r} disagree (torch_dtype is transformers' "
                     "old name of dtype): pass one")


def _device_argument(device, device_map) -> Optional[torch.device]:
    """from_pretrained's device, also given as transformers' device_map naming one device."""
    if device_map is None:
        return device
    if isinstance(device_map, dict):
        raise ValueError("device_map as a dict (parts of a model on several devices) is not supported: "
                         "fastbert loads a model onto one device; pass it as device= or device_map='cuda:0'")
    if device_map == "auto":
        device_map = "cuda" if torch.cuda.is_available() else "cpu"
    elif isinstance(device_map, int) and not isinstance(device_map, bool):
        device_map = f"cuda:{device_map}"  # transformers: an index is that GPU
    try:
        chosen = torch.device(device_map)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device_map={device_map!r} is not one device (fastbert loads a model onto one "
                         "device: 'cpu', 'cuda', 'cuda:1', a GPU index or 'auto')") from e
    if device is not None and torch.device(device) != chosen:
        raise ValueError(f"device={device!r} and device_map={device_map!r} disagree: pass one")
    return chosen


def _resolve_dtype(dtype, config, state) -> Optional[torch.dtype]:
    """None/"auto": the config's dtype entry, else the checkpoint's first floating dtype (as transformers)."""
    if isinstance(dtype, torch.dtype):
        return _floating(dtype, "dtype")
    if dtype not in (None, "auto"):
        if not isinstance(dtype, str) or not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"dtype must be a torch.dtype, 'auto' or a name like 'float16', got {dtype!r}")
        return _floating(getattr(torch, dtype), "dtype")
    # transformers 5 calls it `dtype` (reading the old `torch_dtype` only logs a deprecation warning)
    named = config.dtype if hasattr(config, "dtype") else getattr(config, "torch_dtype", None)
    if isinstance(named, torch.dtype):
        return _floating(named, "config.json's dtype")
    if isinstance(named, str) and isinstance(getattr(torch, named, None), torch.dtype):
        return _floating(getattr(torch, named), "config.json's dtype")
    for v in state.values():
        if v.is_floating_point():
            return v.dtype
    return None


# ---------------------------------------------------------------------------------------------------
# bare encoders
# ---------------------------------------------------------------------------------------------------
class EncoderModel(FastPreTrainedModel):
    """A bare encoder: embeddings -> unpad -> layers -> repad -> (pooler), or, from packed inputs,
    embeddings -> layers (`forward_packed`).

    Families supply `embed(input_ids, token_type_ids, position_ids, inputs_embeds, backend)` on packed
    (tokens,) tensors -> (tokens, hidden), `layers()` (in execution order) and `pool(sequence_output)`
    (None without a pooler). Position ids follow the registry's convention for the model type
    (`padded_positions` / `packed_positions`; a family with another scheme overrides them). Padding
    positions of last_hidden_state and of hidden_states are zeros (transformers computes them on
    padding tokens; nothing should read them)."""

    has_token_types = True
    output_class = BaseModelOutputWithPooling

    def __init__(self, config):
        super().__init__(config)
        self._backend = "auto"

    def token_types(self, token_type_ids):
        """The token type ids the model reads: a family without token type embeddings (DistilBERT,
        MPNet, ModernBERT) takes them and ignores them, as transformers' models do (a BERT tokenizer
        next to such a checkpoint returns them, and pipelines pass them on)."""
        return token_type_ids if self.has_token_types else None

    def embed(self, input_ids, token_type_ids, position_ids, inputs_embeds, backend: str) -> torch.Tensor:
        raise NotImplementedError

    def layers(self) -> List[FastLayer]:
        raise NotImplementedError

    def pool(self, sequence_output: torch.Tensor) -> Optional[torch.Tensor]:
        return None

    def max_sequence_length(self) -> int:
        return self.embeddings.max_sequence_length()

    # ---- position ids, packed ---------------------------------------------------------------------------
    def position_offset(self) -> int:
        return family(self.dims.model_type).position_offset(self.dims.pad_token_id)

    def padded_positions(self, packing: Packing, input_ids, position_ids) -> torch.Tensor:
        """(tokens,) position ids of the real tokens of a padded batch, as transformers numbers them:
        by column, or (RoBERTa-like) padding_idx + running count of non-pad ids."""
        b, s, device = packing.batch, packing.seqlen, packing.cu_seqlens.device
        if position_ids is not None:
            return pack(position_ids.expand(b, s), packing)
        offset = self.position_offset()
        if not family(self.dims.model_type).roberta_positions:
            column = torch.arange(s, device=device).repeat(b) if packing.indices is None else packing.indices % s
            return column + offset
        if input_ids is None:  # no ids to find padding in: sequential, as transformers
            return pack(torch.arange(offset, s + offset, device=device).expand(b, s), packing)
        real = input_ids.ne(self.dims.pad_token_id).int()
        return pack(torch.cumsum(real, dim=1).type_as(real) * real + self.dims.pad_token_id, packing)

    def packed_positions(self, cu_seqlens: torch.Tensor, tokens: int, position_ids) -> torch.Tensor:
        """(tokens,) position ids of packed sequences: 0..len-1 each (plus the family's offset)."""
        if position_ids is not None:
            return position_ids
        return packed_positions(cu_seqlens, tokens, self.position_offset())

    # ---- entry points --------------------------------------------------------------------------------
    def _run_layers(self, x, packing, output_attentions: bool, hidden_states: Optional[list]):
        attentions = [] if output_attentions else None
        checkpointing = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        ckpt_kwargs, every, offload = self._checkpoint_options
        backend = self._backend
        for i, layer in enumerate(self.layers()):
            if checkpointing and i % every == 0:
                with save_on_cpu(pin_memory=x.is_cuda) if offload else contextlib.nullcontext():
                    x, probs = checkpoint(layer, x, packing, output_attentions, backend, **ckpt_kwargs)
            else:
                x, probs = layer(x, packing, output_attentions, backend)
            if hidden_states is not None:
                hidden_states.append(repad(x, packing))
            if output_attentions:
                attentions.append(probs)
        return x, attentions

    def run_encoder(self, x, packing, positions, output_attentions: bool, hidden_states: Optional[list]):
        """The padded forward's hook after the embeddings: `positions` is what `padded_positions`
        gave; -> (x, attentions), the repadded states appended to `hidden_states`."""
        return self._run_layers(x, packing, output_attentions, hidden_states)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, output_attentions=None, output_hidden_states=None, return_dict=None,
                **kwargs):
        """transformers' padded forward; one device-to-host sync (input ranges and mask lengths together)."""
        if kwargs:
            raise TypeError(f"{type(self).__name__}.forward got unexpected arguments {sorted(kwargs)}")
        if torch.jit.is_tracing() or torch.compiler.is_exporting():
            raise RuntimeError(_NOT_EXPORTABLE)
        self._check_embedding_hooks()
        if output_attentions is None:
            output_attentions = getattr(self.config, "output_attentions", False)
        if output_hidden_states is None:
            output_hidden_states = getattr(self.config, "output_hidden_states", False)
        token_type_ids = self.token_types(token_type_ids)
        batch, seqlen, device, stats = check_inputs(self, input_ids, attention_mask, token_type_ids, position_ids,
                                                    inputs_embeds)
        packing = unpad(attention_mask, batch, seqlen, device, host_stats=stats)
        positions = self.padded_positions(packing, input_ids, position_ids)
        x = self.embed(None if input_ids is None else pack(input_ids, packing),
                       None if token_type_ids is None else pack(token_type_ids, packing), positions,
                       None if inputs_embeds is None else pack(inputs_embeds, packing), self._backend)
        hidden_states = [repad(x, packing)] if output_hidden_states else None
        x, attentions = self.run_encoder(x, packing, positions, bool(output_attentions), hidden_states)
        sequence_output = hidden_states[-1] if output_hidden_states else repad(x, packing)
        out = self.output_class(last_hidden_state=sequence_output,
                                hidden_states=tuple(hidden_states) if output_hidden_states else None,
                                attentions=tuple(attentions) if output_attentions else None,
                                **({"pooler_output": self.pool(sequence_output)}
                                   if self.output_class is BaseModelOutputWithPooling else {}))
        return self._finish(out, return_dict)

    def _check_embedding_hooks(self) -> None:
        # transformers' Trainer(neftune_noise_alpha=...) hooks the input embeddings, expecting a
        # (batch, seq, hidden) output whose seq is the padded length; fastbert embeds packed tokens
        if self.training and getattr(self.get_input_embeddings(), "neftune_noise_alpha", None) is not None:
            raise ValueError("NEFTune (TrainingArguments(neftune_noise_alpha=...)) is not supported: its noise is "
                             "scaled by the padded sequence length of a (batch, seq, hidden) embedding output, and "
                             "fastbert embeds only the real tokens, packed; train without neftune_noise_alpha")

    def forward_packed(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                       token_type_ids: Optional[torch.Tensor] = None,
                       position_ids: Optional[torch.Tensor] = None) -> BaseModelOutput:
        """The packed entry: real tokens back to back, no padding anywhere.

        input_ids (tokens,) integer; cu_seqlens (batch + 1,) int32 cumulative lengths; max_seqlen a
        Python int >= the longest sequence; token_type_ids / position_ids (tokens,) or None (type 0;
        positions 0..len-1 per sequence, plus the family's offset). -> BaseModelOutput with
        last_hidden_state (tokens, hidden). Never waits for the device (no value is read on the
        host), so torch.compile(fullgraph=True) and CUDA graphs can capture it; values are checked
        by `check_packed` (call it on the host copy before uploading)."""
        token_type_ids = self.token_types(token_type_ids)
        check_packed_shapes(self, input_ids, cu_seqlens, max_seqlen, token_type_ids, position_ids)
        self._check_embedding_hooks()
        tokens = input_ids.shape[0]
        packing = Packing(None, cu_seqlens, max_seqlen, cu_seqlens.shape[0] - 1, max_seqlen)
        x = self.embed(input_ids, token_type_ids, self.packed_positions(cu_seqlens, tokens, position_ids), None,
                       self._backend)
        if cu_seqlens.shape[0] > 1:   # an empty batch (the tokenizer's packed output for []) has no tokens to run
            x, _ = self._run_layers(x, packing, False, None)
        return BaseModelOutput(last_hidden_state=x)

    def check_packed(self, input_ids, cu_seqlens, max_seqlen, token_type_ids=None, position_ids=None) -> None:
        """Value checks for forward_packed's inputs (reads them: run it on the host copy)."""
        check_packed(self, input_ids, cu_seqlens, max_seqlen, token_type_ids, position_ids)


def _range_checks(model: EncoderModel, input_ids, token_type_ids, position_ids) -> list:
    """(name, tensor, low, high exclusive, what) for the value ranges of the given inputs."""
    d = model.dims
    checks = []
    if input_ids is not None:
        # the table as it is now: transformers' resize_token_embeddings on an optimized model swaps it
        table = model.get_input_embeddings()
        vocab = table.num_embeddings if isinstance(table, nn.Embedding) else d.vocab_size
        checks.append(("token id", input_ids, 0, vocab, "vocab size"))
    if token_type_ids is not None:
        checks.append(("token type id", token_type_ids, 0, d.type_vocab_size, "type_vocab_size"))
    if position_ids is not None:
        checks.append(("position id", position_ids, 0, d.max_position_embeddings, "max_position_embeddings"))
    return [c for c in checks if c[1].numel()]


def _raise_out_of_range(checks: list, stats: list) -> None:
    for i, (name, _, low, high, what) in enumerate(checks):
        lo, hi = stats[2 * i], stats[2 * i + 1]
        bad = lo if lo < low else hi if hi >= high else None
        if bad is not None:
            raise ValueError(f"{name} {bad} is out of range for {what} {high} (valid: {low}..{high - 1})")


def _check_integer(name: str, t: torch.Tensor, dim: int, layout: str) -> None:
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D {layout}, got shape {tuple(t.shape)}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")


def _check_device(model: EncoderModel, device) -> None:
    weight = model.get_input_embeddings().weight
    if device != weight.device:
        raise ValueError(f"inputs are on {device} but {type(model).__name__} is on {weight.device}; "
                         f"move them with .to({str(weight.device)!r})")


def check_inputs(model: EncoderModel, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds):
    """Shape and range checks -> (batch, seq, device, mask stats for unpad or None), with one host
    sync for all value ranges and the mask's lengths together (no device-side asserts)."""
    d = model.dims
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of input_ids or inputs_embeds")
    if input_ids is not None:
        _check_integer("input_ids", input_ids, 2, "(batch, seq)")
        shape, device = tuple(input_ids.shape), input_ids.device
    else:
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != d.embedding_size:
            raise ValueError(f"inputs_embeds must be (batch, seq, {d.embedding_size}), "
                             f"got shape {tuple(inputs_embeds.shape)}")
        shape, device = tuple(inputs_embeds.shape[:2]), inputs_embeds.device
    _check_device(model, device)
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but input_ids has shape {shape}")
    if position_ids is not None and (position_ids.dim() != 2 or position_ids.shape[1] != shape[1]
                                     or position_ids.shape[0] not in (1, shape[0])):
        raise ValueError(f"position_ids must have shape (batch, seq) = {shape} or (1, seq), "
                         f"got {tuple(position_ids.shape)}")
    limit = model.max_sequence_length()
    if shape[1] > limit and position_ids is None:
        raise ValueError(f"sequence length {shape[1]} exceeds the model's limit of {limit} tokens "
                         f"(max_position_embeddings={d.max_position_embeddings})")
    checks = _range_checks(model, input_ids, token_type_ids, position_ids)
    values = [s.long() for c in checks for s in (c[1].min(), c[1].max())]
    if attention_mask is not None:
        values.extend(mask_stats(attention_mask).unbind())
    if not values:
        return shape[0], shape[1], device, None
    stats = torch.stack(values).tolist()                       # the one sync
    _raise_out_of_range(checks, stats)
    return shape[0], shape[1], device, (stats[-2:] if attention_mask is not None else None)


def check_packed_shapes(model: EncoderModel, input_ids, cu_seqlens, max_seqlen, token_type_ids, position_ids):
    """forward_packed's checks that need no tensor values (shapes, dtypes, devices, host ints); its
    callers have passed token_type_ids through model.token_types."""
    _check_integer("input_ids", input_ids, 1, "(tokens,) packed ids")
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype != torch.int32 or cu_seqlens.shape[0] < 1:
        raise ValueError(f"cu_seqlens must be 1-D int32 of length batch + 1 >= 1, got {cu_seqlens.dtype} "
                         f"shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.shape[0] == 1 and input_ids.shape[0]:
        raise ValueError(f"cu_seqlens of length 1 is a batch of no sequences, but input_ids has "
                         f"{input_ids.shape[0]} tokens")
    if isinstance(max_seqlen, (bool, torch.Tensor)) or not isinstance(max_seqlen, (int, torch.SymInt)) or max_seqlen < 0:
        raise ValueError(f"max_seqlen must be a non-negative Python int (reading a tensor would sync), "
                         f"got {max_seqlen!r}")
    _check_device(model, input_ids.device)
    if cu_seqlens.device != input_ids.device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but input_ids is on {input_ids.device}")
    for name, t in (("token_type_ids", token_type_ids), ("position_ids", position_ids)):
        if t is not None:
            _check_integer(name, t, 1, "(tokens,)")
            if t.shape != input_ids.shape or t.device != input_ids.device:
                raise ValueError(f"{name} must match input_ids {tuple(input_ids.shape)} on {input_ids.device}, "
                                 f"got {tuple(t.shape)} on {t.device}")
    limit = model.max_sequence_length()
    if max_seqlen > limit and position_ids is None:
        raise ValueError(f"max_seqlen {max_seqlen} exceeds the model's limit of {limit} tokens "
                         f"(max_position_embeddings={model.dims.max_position_embeddings})")


def check_packed(model: EncoderModel, input_ids, cu_seqlens, max_seqlen, token_type_ids=None,
                 position_ids=None) -> None:
    """Every check of forward_packed's inputs, values included (reads them: one sync on a device)."""
    token_type_ids = model.token_types(token_type_ids)
    check_packed_shapes(model, input_ids, cu_seqlens, max_seqlen, token_type_ids, position_ids)
    checks = _range_checks(model, input_ids, token_type_ids, position_ids)
    if checks:
        _raise_out_of_range(checks, torch.stack([s.long() for c in checks for s in (c[1].min(), c[1].max())]).tolist())
    cu = cu_seqlens.tolist()
    lengths = [b - a for a, b in zip(cu[:-1], cu[1:])] or [0]
    if cu[0] != 0 or cu[-1] != input_ids.shape[0]:
        raise ValueError(f"cu_seqlens must start at 0 and end at the token count {input_ids.shape[0]}, "
                         f"got {cu[0]} ... {cu[-1]}")
    if any(n < 0 for n in lengths):
        raise ValueError(f"cu_seqlens must be non-decreasing, got {cu}")
    if max(lengths) > max_seqlen:
        raise ValueError(f"max_seqlen={max_seqlen} is smaller than the longest sequence ({max(lengths)})")
