"""Choose between the Triton kernel and the torch reference for one op call.

backend="auto"   -> Triton for CUDA tensors (when triton imports), torch otherwise.
backend="triton" -> the kernel; on CPU only under TRITON_INTERPRET=1, else a clear error.
backend="torch"  -> the pure-torch reference.
"""
import functools
import os

import torch

BACKENDS = ("auto", "triton", "torch")


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def triton_op(name: str, *, mutates_args):
    """Decorator registering a fastbert op: torch.library.triton_op where triton imports, else a plain
    torch.library.custom_op. Both give the same operator (schema from the annotations; the caller adds
    the fake and autograd); triton_op also lets torch.compile see the Triton kernels inside, which
    needs triton: without it torch would log "Triton not available" once per op, with nothing to see."""
    if triton_available():
        return torch.library.triton_op(name, mutates_args=mutates_args)
    return torch.library.custom_op(name, mutates_args=mutates_args)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(backend: str, *tensors: torch.Tensor) -> bool:
    """True when this call should run the Triton kernel."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torch":
        return False
    on_cuda = all(t.is_cuda for t in tensors)
    if backend == "auto":
        return on_cuda and triton_available()
    if not triton_available():
        raise RuntimeError("backend='triton' needs the `triton` package (pip install triton)")
    if not on_cuda and not interpreting():
        devices = sorted({str(t.device) for t in tensors})
        raise RuntimeError(
            f"backend='triton' needs CUDA tensors, got tensors on {devices}; on CPU set "
            "TRITON_INTERPRET=1 before triton is imported to run the kernel in Triton's interpreter")
    return True


def records_grad(*tensors) -> bool:
    """True when autograd would record a call on these tensors; otherwise an op can run its forward
    kernel directly and skip autograd.Function's per-call host cost (inference)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def run_kernel(t: torch.Tensor, interpret: bool) -> bool:
    """Inside a fastbert custom op: True for the Triton kernel (CUDA tensors, or CPU tensors with
    interpret=True, which run it in Triton's interpreter), False for the torch reference (CPU)."""
    if interpret and t.device.type != "cpu":
        raise ValueError(f"interpret=True runs the kernel in Triton's interpreter on CPU tensors; got {t.device}")
    return interpret or t.device.type == "cuda"


def draw_seed(device, generator=None) -> torch.Tensor:
    """A (1,) int64 Philox seed for a kernel's dropout, drawn on `device` from torch's generator for it
    (or from `generator`, then moved): no host value, so a CUDA graph can capture the draw."""
    gen_device = generator.device if generator is not None else device
    seed = torch.randint(0, 2**31 - 1, (1,), generator=generator, device=gen_device, dtype=torch.int64)
    return seed.to(device)


def dropout_seed(dropout_p: float, device, generator=None):
    """draw_seed when the kernel drops attention probabilities (dropout_p > 0), else None."""
    return draw_seed(device, generator) if dropout_p > 0 else None
