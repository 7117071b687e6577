"""Loading and saving: from_pretrained (local folder, HF cache, hub, peft adapter), strict
checkpoint loading with transformers' key conventions, parameter sharing, and save_pretrained
(safetensors or .bin, sharded as transformers writes them)."""
import copy
import json
import logging
import os
import re
from typing import Dict, List, Tuple

import torch
from torch import nn
from transformers.utils import logging as hf_logging

from fastbert.models.hf_arguments import config_arguments, device_argument, dtype_argument, resolve_dtype

logger = logging.getLogger("fastbert")

# non-persistent buffers of transformers' embeddings, present in some older checkpoints
_IGNORED_BUFFERS = re.compile(r"(^|\.)embeddings\.(position_ids|token_type_ids)$")
_POOLER = re.compile(r"(^|\.)pooler\.")
# what save_pretrained writes (and transformers reads): single files, shards and their indexes
_WEIGHTS_FILE = re.compile(r"^(model|pytorch_model)(-\d{5}-of-\d{5})?\.(safetensors|bin)(\.index\.json)?$")


class CheckpointError(ValueError, RuntimeError):
    """A checkpoint whose keys or shapes do not fit the model (a RuntimeError, as transformers raises
    for a shape mismatch, and a ValueError)."""


def _fmt_shape(t) -> str:
    return str(tuple(t.shape))


class CheckpointIO:
    """FastPreTrainedModel's loading and saving (a mixin: it reads the model's config, tied_weights,
    base_model and init_weights)."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, dtype=None, device=None, backend: str = "auto", *,
                        config=None, state_dict=None, output_loading_info: bool = False,
                        torch_dtype=None, device_map=None, ignore_mismatched_sizes: bool = False,
                        revision=None, cache_dir=None, local_files_only: bool = False, token=None,
                        low_cpu_mem_usage=None, trust_remote_code=None, attn_implementation=None, **kwargs):
        """Load a config.json + weights checkpoint (local dir, HF cache or hub); strict (see load_checkpoint).
        `backend` ("auto" | "triton" | "torch") is the model's op backend (see `backend`). A peft adapter
        (a folder or hub id with adapter_config.json and no config.json) loads its base model this way,
        then the adapter on it: a peft.PeftModel around fastbert's model (transformers' from_pretrained
        gives its own model with the adapter inside; both run the adapter).

        transformers' arguments mean what they mean there: `config` is used instead of the checkpoint's
        config.json, `state_dict` instead of its weights (then `pretrained_model_name_or_path` may be
        None, with `config` given: with no checkpoint, the state_dict's missing encoder weights are
        initialised with a warning, as transformers does); `output_loading_info=True` returns (model, {"missing_keys",
        "unexpected_keys", "mismatched_keys", "error_msgs"}) and, the caller reading that report, missing
        or unexpected encoder weights are reported there instead of raising (freshly initialised);
        `torch_dtype` is the old name of `dtype`; `device_map` names one device ("cpu", "cuda:1", a GPU
        index, or "auto": the GPU when there is one); `revision`, `cache_dir`, `local_files_only` and
        `token` are for a hub id; `ignore_mismatched_sizes` re-initialises head weights whose shape
        differs from the checkpoint's (a new num_labels); without it a shape mismatch is a RuntimeError
        (CheckpointError), as in transformers. `attn_implementation` is recorded on the config ("eager":
        the unfused attention; see modeling.ATTN_IMPLEMENTATIONS). Other keyword arguments set config
        attributes (num_labels, id2label, output_hidden_states, classifier_dropout, ...) or, when the
        config has no such attribute, go to the model's constructor (add_pooling_layer); anything else
        is a TypeError. `low_cpu_mem_usage` and `trust_remote_code` change nothing: fastbert always
        builds on the meta device before loading, and never runs code from a checkpoint. Refused (a
        RuntimeError) inside a `torch.device("meta")` context, which would leave every weight empty."""
        from fastbert.hub import load_adapter, load_config, load_state, resolve_directory

        if torch.empty(0).is_meta:
            raise RuntimeError("You are using `from_pretrained` with a meta device context manager "
                               "(torch.device('meta')): the loaded weights would be discarded; load outside it, "
                               "or build the model there with cls(config) for an empty one")
        dtype = dtype_argument(dtype, torch_dtype)
        device = device_argument(device, device_map)
        if pretrained_model_name_or_path is None:
            if config is None or state_dict is None:
                raise ValueError("from_pretrained(None, ...) needs both config= and state_dict= (there is no "
                                 "checkpoint to read them from)")
            directory, source = None, "state_dict"
        else:
            directory = resolve_directory(pretrained_model_name_or_path, revision=revision, cache_dir=cache_dir,
                                          local_files_only=local_files_only, token=token)
            # a peft adapter: its base model (revision is the adapter's), then the adapter
            adapted = load_adapter(directory, lambda base: cls.from_pretrained(
                base, dtype=dtype, device=device, backend=backend, ignore_mismatched_sizes=ignore_mismatched_sizes,
                cache_dir=cache_dir, local_files_only=local_files_only, token=token, **kwargs))
            if adapted is not None:
                return adapted
            source = directory
        loaded_config = config is None
        if loaded_config:
            config = load_config(os.path.join(directory, "config.json"))
            # as transformers records it (peft writes it into a saved adapter as its base model)
            config.name_or_path = str(pretrained_model_name_or_path)
        if state_dict is None:
            state_dict = load_state(directory)
        if attn_implementation is not None:
            config._attn_implementation = attn_implementation
        elif loaded_config and config._attn_implementation is None:
            config._attn_implementation = "sdpa"      # a config of its own: named as transformers names its default
        init_kwargs = config_arguments(cls, config, kwargs)
        # Strict for a checkpoint; with no checkpoint named, the caller's state_dict is a starting point, as in
        # transformers: missing or unexpected encoder weights are warned about (and the missing initialised).
        model, info = cls._from_state_dict_reporting(config, state_dict, dtype=dtype, device=device, source=source,
                                                     backend=backend, ignore_mismatched_sizes=ignore_mismatched_sizes,
                                                     report=output_loading_info or directory is None, **init_kwargs)
        return (model, info) if output_loading_info else model

    @classmethod
    def from_state_dict(cls, config, state: Dict[str, torch.Tensor], dtype=None, device=None,
                        source: str = "state_dict", backend: str = "auto", ignore_mismatched_sizes: bool = False,
                        **init_kwargs):
        return cls._from_state_dict_reporting(config, state, dtype=dtype, device=device, source=source,
                                              backend=backend, ignore_mismatched_sizes=ignore_mismatched_sizes,
                                              **init_kwargs)[0]

    @classmethod
    def _from_state_dict_reporting(cls, config, state, dtype=None, device=None, source: str = "state_dict",
                                   backend: str = "auto", ignore_mismatched_sizes: bool = False, report: bool = False,
                                   **init_kwargs):
        """-> (model in eval mode, loading info as transformers' output_loading_info gives it)."""
        dtype = resolve_dtype(dtype, config, state)
        with torch.device("meta"):
            model = cls(config, **init_kwargs)
        info = model.load_checkpoint(state, dtype=dtype, device=device or "cpu", source=source,
                                     ignore_mismatched_sizes=ignore_mismatched_sizes, report=report)
        model.backend = backend
        return model.eval(), info

    def share_parameters_with(self, other: nn.Module) -> "CheckpointIO":
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
                        source: str = "state_dict", ignore_mismatched_sizes: bool = False,
                        report: bool = False) -> dict:
        """Strict, transformers-compatible loading (also works on a model built on the meta device).

        Encoder keys must match exactly (names and shapes) or CheckpointError names them; a "bert."-
        style prefix is added or stripped as needed; old LayerNorm gamma/beta names are renamed; the
        position_ids/token_type_ids buffers some checkpoints carry are ignored. Head (and pooler)
        weights missing from a base checkpoint are initialised as transformers does, with a warning
        naming them; weights of another head are left unused, with a warning. With
        `ignore_mismatched_sizes`, head weights whose shape differs from the model's (a classifier
        for another num_labels) are initialised afresh instead, with a warning; an encoder weight of
        another shape is still an error. With `report` (from_pretrained's output_loading_info), missing
        and unexpected encoder weights are reported instead of raising: the missing ones initialised.
        -> {"missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"} as transformers reports."""
        state, foreign = self._normalize_keys(state)
        expected = dict(self.named_parameters(remove_duplicate=False))
        tied = self.tied_weights() if getattr(self.config, "tie_word_embeddings", True) else {}
        head_prefix = "" if self.base_model is self else self.base_model_prefix + "."

        def is_encoder(key):
            return key.startswith(head_prefix) and not _POOLER.search(key)

        resized = []
        if ignore_mismatched_sizes:
            resized = [k for k in state if k in expected and not is_encoder(k)
                       and tuple(state[k].shape) != tuple(expected[k].shape)]
            if resized:   # reported where transformers reports it, in its words
                hf_logging.get_logger("transformers.modeling_utils").warning(
                    "%s: %s weights initialised afresh (ignore_mismatched_sizes=True): %s", source, type(self).__name__,
                    ", ".join(f"{k}: Reinit due to size mismatch - ckpt: {_fmt_shape(state[k])} vs model: "
                              f"{_fmt_shape(expected[k])}" for k in resized))
                state = {k: v for k, v in state.items() if k not in resized}

        unexpected = [k for k in state if k not in expected]
        missing = [k for k in expected if k not in state and k not in tied]
        bad_unexpected = [k for k in unexpected if is_encoder(k)]
        bad_missing = [k for k in missing if is_encoder(k)]
        mismatched = [k for k in state if k in expected and tuple(state[k].shape) != tuple(expected[k].shape)]
        not_float = [k for k in state if k in expected and not state[k].is_floating_point()]
        info = {"missing_keys": set(missing), "unexpected_keys": set(foreign + unexpected),
                "mismatched_keys": set(resized), "error_msgs": []}
        if report:   # the caller reads the report: only what cannot load at all raises
            bad_unexpected, bad_missing = [], []
        if bad_unexpected or bad_missing or mismatched or not_float:
            lines = [f"{source} does not fit {type(self).__name__}:"]
            lines += [f"  missing: {k} {_fmt_shape(expected[k])}" for k in bad_missing]
            lines += [f"  unexpected: {k} {_fmt_shape(state[k])}" for k in bad_unexpected]
            lines += [f"  shape mismatch: {k}: checkpoint {_fmt_shape(state[k])}, model {_fmt_shape(expected[k])}"
                      for k in mismatched]
            lines += [f"  not floating point: {k} has dtype {state[k].dtype}" for k in not_float]
            raise CheckpointError("\n".join(lines))
        unused = foreign + [k for k in unexpected if report or not is_encoder(k)]
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
        owners = {self._owner(k)[0] for k in missing}
        fresh = [m for m in self.modules() if m in owners]   # in model order: the same init on every run
        for m in fresh:
            for name, p in list(m.named_parameters(recurse=False)):
                if p.is_meta:
                    setattr(m, name, nn.Parameter(torch.empty(p.shape, dtype=dtype or p.dtype, device=device)))
        self.initialize_modules(fresh)
        self.tie_weights()
        return info

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

