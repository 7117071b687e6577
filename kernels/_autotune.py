"""Autotune only where a GPU runs the kernels, and launch tuned kernels cheaply.

Triton's autotuner needs a GPU driver to time configs; under TRITON_INTERPRET=1 on a machine without
one it raises. So a kernel wrapped here is autotuned over all its configs on a GPU and launched with
its first config under the interpreter (after the same prune, if one is given).

launch_tuned() skips the autotuner's per-call bookkeeping once a config is chosen: on an H200 host
one Triton launch cost 50-120 us of CPU time, more than the kernels themselves at BERT sizes, and the
autotuner's part of it (three dicts, a scan of the argument names, a dict of the config's options per
call) is what can be dropped without touching Triton's launcher."""
import os

import torch
import triton


def _gpu_compiles() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") != "1" and torch.cuda.is_available()


class gpu_autotune:
    """`kernel` autotuned over `configs` (keyed on `key` plus the argument dtypes) on a GPU."""

    def __init__(self, kernel, configs, key, prune=None):
        self.kernel = kernel
        self.configs = configs
        self.prune = prune
        self.tuned = None
        if _gpu_compiles():
            pruning = {"early_config_prune": prune} if prune is not None else None
            self.tuned = triton.autotune(configs=configs, key=key, prune_configs_by=pruning)(kernel)

    def launch(self, grid, *args, **kwargs):
        if self.tuned is not None:
            return launch_tuned(self.tuned, grid, *args, **kwargs)
        configs = self.prune(self.configs, {}, **kwargs) if self.prune is not None else self.configs
        first = configs[0]
        return self.kernel[grid](*args, **kwargs, **first.kwargs, num_warps=first.num_warps)


class _Plan:
    """What launch_tuned needs of one autotuner, computed once."""

    def __init__(self, tuner):
        self.names = list(tuner.arg_names)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.keys = list(tuner.keys)
        # id(config) -> config.all_kwargs(), built once per config (a Config hashes by building
        # all_kwargs(), the very cost this saves); the configs live in the autotuner
        self.options = {}


def _plan(tuner) -> _Plan:
    plan = getattr(tuner, "_fastbert_launch_plan", None)  # kept on the autotuner it describes
    if plan is None:
        plan = tuner._fastbert_launch_plan = _Plan(tuner)
    return plan


def tuning_key(tuner, args, kwargs) -> tuple:
    """The key Triton's Autotuner.run files this call's config under: the `key` arguments' values,
    then the dtype of each kernel argument that has one, positional arguments first."""
    plan = _plan(tuner)
    n = len(args)
    key = []
    for name in plan.keys:
        if name in kwargs:
            key.append(kwargs[name])
        else:
            i = plan.index.get(name)
            if i is not None and i < n:
                key.append(args[i])
    for a in args[:len(plan.names)]:
        if hasattr(a, "dtype"):
            key.append(str(a.dtype))
    for name, a in kwargs.items():
        if name in plan.index and hasattr(a, "dtype"):
            key.append(str(a.dtype))
    return tuple(key)


def launch_tuned(tuner, grid, *args, **kwargs):
    """tuner[grid](*args, **kwargs), where tuner is a triton.autotune'd kernel. A call whose key the
    autotuner has tuned launches the JIT function with the chosen config directly; the first call
    for a key (and any config with a pre_hook) goes through the autotuner, which tunes and caches."""
    configs = getattr(tuner, "configs", None)
    if configs is None or not isinstance(getattr(tuner, "cache", None), dict) or not hasattr(tuner, "fn"):
        return tuner[grid](*args, **kwargs)  # not a Triton Autotuner (another version, or a wrapper)
    if len(configs) == 1:
        config = configs[0]
    else:
        config = tuner.cache.get(tuning_key(tuner, args, kwargs))
        if config is None:
            return tuner[grid](*args, **kwargs)
    if config.pre_hook is not None:
        return tuner[grid](*args, **kwargs)
    options = _plan(tuner).options
    opts = options.get(id(config))
    if opts is None:
        opts = options[id(config)] = config.all_kwargs()
    return tuner.fn[grid](*args, **kwargs, **opts)
