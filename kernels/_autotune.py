"""Autotune only where a GPU runs the kernels.

Triton's autotuner needs a GPU driver to time configs; under TRITON_INTERPRET=1 on a machine without
one it raises. So a kernel wrapped here is autotuned over all its configs on a GPU and launched with
its first config under the interpreter (after the same prune, if one is given)."""
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
            return self.tuned[grid](*args, **kwargs)
        configs = self.prune(self.configs, {}, **kwargs) if self.prune is not None else self.configs
        first = configs[0]
        return self.kernel[grid](*args, **kwargs, **first.kwargs, num_warps=first.num_warps)
