"""Autotune only where a GPU runs the kernels, and launch tuned kernels cheaply.

Triton's autotuner needs a GPU driver to time configs; under TRITON_INTERPRET=1 on a machine without
one it raises. So a TunedKernel is autotuned over its choosable configs on a GPU (after its prune, and
without the configs whose shared memory the device cannot give a block), and launched with one of them
untuned: the first on a GPU (with FASTBERT_AUTOTUNE=0 or under tracing), the one with the largest
blocks under the interpreter. The AOT compile test (tests/kernels/test_gpu_compile.py) checks that the
first never spills and that every choosable config fits each target's shared memory.

The caller passes a key of its own (plain ints, bools and torch dtypes it already holds; at least as
fine as the autotuner's `key` plus the argument dtypes). The first call for a key goes through
Triton's autotuner, which times the configs; the config it chose is kept here, in this object, under
the caller's key, and later calls launch the JIT function with it directly: on an H200 host the
autotuner's per-call bookkeeping (dicts of the arguments, a string per tensor dtype for its key) was a
large part of a launch's 50-120 us of CPU time.

Under tracing (torch.compile, make_fx, fake tensors) the launch goes through torch.library.wrap_triton
with the JIT function and a fixed config: the one an eager call tuned for the same key, else the first
(pruned) config. Warm a model up eagerly before compiling it to get tuned configs in the graph.
Every launch runs with its first tensor's CUDA device current (Triton launches on the current one)."""
import contextlib
import os

import torch
import triton


def gpu_compiles() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") != "1" and torch.cuda.is_available()


def autotune_enabled() -> bool:
    """Autotune on a GPU unless FASTBERT_AUTOTUNE=0 (read at import): then every launch runs its first
    choosable config, as under the interpreter (correctness checks that must not time every config)."""
    return gpu_compiles() and os.environ.get("FASTBERT_AUTOTUNE", "1") != "0"


_UNTRACED_OPTIONS = ("num_ctas", "maxnreg", "ir_override", "pre_hook", "num_buffers_warp_spec",
                     "num_consumer_groups", "reg_dec_producer", "reg_inc_consumer")


def tracing(t: torch.Tensor) -> bool:
    """True when t is a tracing stand-in (a fake or functional tensor under torch.compile, make_fx or
    opcheck) rather than real data: launches then go through torch.library.wrap_triton."""
    return type(t) is not torch.Tensor and isinstance(t, torch.Tensor)


def on_device(t: torch.Tensor):
    """The context a launch for tensor t runs in: t's CUDA device made current (Triton launches on the
    current device, which need not be t's: a model on cuda:1 with cuda:0 current), else nothing."""
    if t.device.type == "cuda" and t.device.index is not None and t.device.index != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


def launch(kernel, grid, *args, **kwargs):
    """kernel[grid](*args, **kwargs) for a kernel with no configs, traced like TunedKernel.launch."""
    if tracing(args[0]):
        from torch.library import wrap_triton
        return wrap_triton(kernel)[grid](*args, **kwargs)
    with on_device(args[0]):
        return kernel[grid](*args, **kwargs)


def shared_memory_limit(device) -> int:
    """Shared memory one block may use on `device` (bytes, with the opt-in), None off CUDA."""
    if getattr(device, "type", None) != "cuda":
        return None
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin


def _block_elements(config) -> int:
    n = 1
    for name, value in config.kwargs.items():
        n *= value if name.startswith("BLOCK") else 1
    return n


class TunedKernel:
    """`kernel` with `configs`, autotuned on `key` (kernel argument names) on a GPU.

    prune(configs, nargs, **kwargs) keeps the configs worth timing for a launch (nargs: the kernel's
    arguments by name); shared(config, nargs, kwargs) bounds the shared memory a config needs (bytes, at
    least what the compiler allocates: the AOT compile test checks it), so configs that cannot launch on
    the device are pruned before timing.
    autotune=False: a GPU runs the first choosable config too (kernels a timing re-run would break)."""

    def __init__(self, kernel, configs, prune=None, *, key, shared=None, autotune=None):
        self.kernel = kernel
        self.configs = list(configs)
        self.prune = prune
        self.shared = shared
        self.autotune_on_gpu = True if autotune is None else autotune
        autotune = autotune_enabled() if autotune is None else autotune
        pruning = {"early_config_prune": self._device_prune} if prune or shared else None
        self.tuner = (triton.autotune(configs=self.configs, key=key, prune_configs_by=pruning)(kernel)
                      if autotune and len(self.configs) > 1 else None)
        self.chosen = {}  # caller key -> the chosen config's kwargs (BLOCK sizes, num_warps, ...)

    def autotunes(self) -> bool:
        """Whether a GPU times the choosable configs (else it runs the first)."""
        return self.autotune_on_gpu and len(self.configs) > 1

    def choosable(self, nargs, kwargs, shared_limit=None):
        """The configs a launch with these arguments (by name) and meta kwargs may run with, the
        default first, on a device with shared_limit bytes of shared memory per block (None: any)."""
        configs = self.prune(self.configs, nargs, **kwargs) if self.prune is not None else self.configs
        if self.shared is not None and shared_limit is not None:
            configs = [c for c in configs if self.shared(c, nargs, kwargs) <= shared_limit]
        if not configs:
            raise ValueError(f"{self.kernel.fn.__name__}: no config fits {shared_limit} B of shared memory "
                             f"for {kwargs}")
        return configs

    def _device_prune(self, configs, nargs, **kwargs):
        device = next((t.device for t in nargs.values() if isinstance(t, torch.Tensor)), None)
        return self.choosable(nargs, kwargs, shared_memory_limit(device))

    def _first(self, args, kwargs):
        """The config an untuned launch runs: the first choosable one; under the interpreter the one with
        the largest blocks (fewest programs: each is slow there; registers and spills do not exist)."""
        nargs = dict(zip(self.kernel.arg_names, args))
        configs = self.choosable(nargs, kwargs, shared_memory_limit(args[0].device))
        if os.environ.get("TRITON_INTERPRET", "0") == "1":
            return max(configs, key=_block_elements).all_kwargs()     # max keeps the first of equals
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
            opts = opts if opts is not None else self._first(args, kwargs)
            # the meta-parameters and the launch options torch's kernel tracing takes
            opts = {k: v for k, v in opts.items() if v is not None and k not in _UNTRACED_OPTIONS}
            return wrap_triton(self.kernel)[grid({**kwargs, **opts})](*args, **kwargs, **opts)
        with on_device(args[0]):
            opts = self.chosen.get(key)
            if opts is None:
                if self.tuner is None:
                    opts = self.chosen[key] = self._first(args, kwargs)
                else:
                    self.tuner[grid](*args, **kwargs)   # times the configs, then launches the best
                    self.chosen[key] = self.tuner.best_config.all_kwargs()
                    return None
            return self.kernel[grid](*args, **kwargs, **opts)
