"""Autotune only where a GPU runs the kernels, and launch tuned kernels cheaply.

Triton's autotuner needs a GPU driver to time configs; under TRITON_INTERPRET=1 on a machine without
one it raises. So a TunedKernel is autotuned over all its configs on a GPU and launched with its first
config under the interpreter (after the same prune, if one is given).

The caller passes a key of its own (plain ints, bools and torch dtypes it already holds; at least as
fine as the autotuner's `key` plus the argument dtypes). The first call for a key goes through
Triton's autotuner, which times the configs; the config it chose is kept here, in this object, under
the caller's key, and later calls launch the JIT function with it directly: on an H200 host the
autotuner's per-call bookkeeping (dicts of the arguments, a string per tensor dtype for its key) was a
large part of a launch's 50-120 us of CPU time.

Under tracing (torch.compile, make_fx, fake tensors) the launch goes through torch.library.wrap_triton
with the JIT function and a fixed config: the one an eager call tuned for the same key, else the first
(pruned) config. Warm a model up eagerly before compiling it to get tuned configs in the graph."""
import os

import torch
import triton


def gpu_compiles() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") != "1" and torch.cuda.is_available()


_UNTRACED_OPTIONS = ("num_ctas", "maxnreg", "ir_override", "pre_hook", "num_buffers_warp_spec",
                     "num_consumer_groups", "reg_dec_producer", "reg_inc_consumer")


def tracing(t: torch.Tensor) -> bool:
    """True when t is a tracing stand-in (a fake or functional tensor under torch.compile, make_fx or
    opcheck) rather than real data: launches then go through torch.library.wrap_triton."""
    return type(t) is not torch.Tensor and isinstance(t, torch.Tensor)


def launch(kernel, grid, *args, **kwargs):
    """kernel[grid](*args, **kwargs) for a kernel with no configs, traced like TunedKernel.launch."""
    if tracing(args[0]):
        from torch.library import wrap_triton
        return wrap_triton(kernel)[grid](*args, **kwargs)
    return kernel[grid](*args, **kwargs)


class TunedKernel:
    """`kernel` with `configs`, autotuned on `key` (kernel argument names) on a GPU."""

    def __init__(self, kernel, configs, key, prune=None, *, autotune=None):
        self.kernel = kernel
        self.configs = list(configs)
        self.prune = prune
        autotune = gpu_compiles() if autotune is None else autotune
        pruning = {"early_config_prune": prune} if prune is not None else None
        self.tuner = (triton.autotune(configs=self.configs, key=key, prune_configs_by=pruning)(kernel)
                      if autotune and len(self.configs) > 1 else None)
        self.chosen = {}  # caller key -> the chosen config's kwargs (BLOCK sizes, num_warps, ...)

    def _first(self, kwargs):
        configs = self.prune(self.configs, {}, **kwargs) if self.prune is not None else self.configs
        return configs[0].all_kwargs()

    def launch(self, key, grid, *args, **kwargs):
        """kernel[grid](*args, **kwargs) with the config chosen for `key`; grid(meta) -> launch grid.
        args[0] must be a tensor (an output): its type tells a traced call from an eager one."""
        if tracing(args[0]):                            # a fixed config, recorded in the graph
            from torch.library import wrap_triton
            try:
                opts = self.chosen.get(key)
            except TypeError:                           # symbolic sizes in the key
                opts = None
            opts = opts if opts is not None else self._first(kwargs)
            # the meta-parameters and the launch options torch's kernel tracing takes
            opts = {k: v for k, v in opts.items() if v is not None and k not in _UNTRACED_OPTIONS}
            return wrap_triton(self.kernel)[grid({**kwargs, **opts})](*args, **kwargs, **opts)
        opts = self.chosen.get(key)
        if opts is None:
            if self.tuner is None:
                opts = self.chosen[key] = self._first(kwargs)
            else:
                self.tuner[grid](*args, **kwargs)       # times the configs, then launches the best
                self.chosen[key] = self.tuner.best_config.all_kwargs()
                return None
        return self.kernel[grid](*args, **kwargs, **opts)
