"""transformers' from_pretrained arguments, emulated: dtype / torch_dtype, device / device_map, and
the keyword arguments that set config attributes or go to the constructor."""
import inspect
from typing import Optional

import torch


def config_arguments(cls, config, kwargs) -> dict:
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


def floating(dtype: torch.dtype, where: str) -> torch.dtype:
    if not dtype.is_floating_point:
        raise ValueError(f"{where} is {dtype}; a model's weights need a floating dtype (float32, float16, bfloat16)")
    return dtype


def dtype_argument(dtype, torch_dtype):
    """from_pretrained's dtype, also given under transformers' old name torch_dtype."""
    if torch_dtype is None or dtype is None or dtype == torch_dtype:
        return torch_dtype if dtype is None else dtype
    raise ValueError(f"dtype={dtype!r} and torch_dtype={torch_dtype!r} disagree (torch_dtype is transformers' "
                     "old name of dtype): pass one")


def device_argument(device, device_map) -> Optional[torch.device]:
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


def resolve_dtype(dtype, config, state) -> Optional[torch.dtype]:
    """None/"auto": the config's dtype entry, else the checkpoint's first floating dtype (as transformers)."""
    if isinstance(dtype, torch.dtype):
        return floating(dtype, "dtype")
    if dtype not in (None, "auto"):
        if not isinstance(dtype, str) or not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"dtype must be a torch.dtype, 'auto' or a name like 'float16', got {dtype!r}")
        return floating(getattr(torch, dtype), "dtype")
    # transformers 5 calls it `dtype` (reading the old `torch_dtype` only logs a deprecation warning)
    named = config.dtype if hasattr(config, "dtype") else getattr(config, "torch_dtype", None)
    if isinstance(named, torch.dtype):
        return floating(named, "config.json's dtype")
    if isinstance(named, str) and isinstance(getattr(torch, named, None), torch.dtype):
        return floating(getattr(torch, named), "config.json's dtype")
    for v in state.values():
        if v.is_floating_point():
            return v.dtype
    return None

