"""launch_tuned: a tuned call launches the chosen config directly, under the key Triton itself uses.

Triton's autotuner cannot time configs without a GPU, so these tests fill its cache by hand: a key that
differed from Triton's own would send Triton's path to tuning, which raises here."""
import pytest
import torch
import triton
import triton.language as tl

from fastbert.kernels._autotune import launch_tuned, tuning_key

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"


@triton.jit
def _scale_kernel(out_ptr, x_ptr, n, factor, N_KEY, BLOCK: tl.constexpr, SHIFT: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(x_ptr + offs, mask=ok, other=0.0)
    tl.store(out_ptr + offs, x * factor + SHIFT, mask=ok)


def _tuner():
    configs = [triton.Config({"BLOCK": 32, "SHIFT": 1}, num_warps=1),
               triton.Config({"BLOCK": 64, "SHIFT": 2}, num_warps=2)]
    return triton.autotune(configs=configs, key=["N_KEY"])(_scale_kernel)


def _grid(meta, n=100):
    return (triton.cdiv(n, meta["BLOCK"]),)


def _inputs(dtype=torch.float32):
    x = torch.randn(100, dtype=dtype, device=DEVICE)
    return torch.empty_like(x), x


def test_key_matches_tritons_own():
    """Triton's Autotuner.run finds the config filed under tuning_key(), with args and kwargs mixed."""
    if GPU:
        pytest.skip("on a GPU Triton would tune a missing key instead of failing; the CPU run checks the key")
    tuner = _tuner()
    out, x = _inputs()
    args, kwargs = (out, x, 100), {"factor": 3.0, "N_KEY": 128}
    tuner.cache[tuning_key(tuner, args, kwargs)] = tuner.configs[1]
    tuner[_grid](*args, **kwargs)                       # Triton's own path: must hit the cache
    torch.testing.assert_close(out, x * 3.0 + 2)


def test_tuned_call_launches_the_cached_config_directly(monkeypatch):
    tuner = _tuner()
    out, x = _inputs(torch.float16)
    args, kwargs = (out, x, 100, 0.5), {"N_KEY": 64}
    key = tuning_key(tuner, args, kwargs)
    assert key == (64, "torch.float16", "torch.float16")
    tuner.cache[key] = tuner.configs[0]
    monkeypatch.setattr(type(tuner), "run", lambda *a, **k: pytest.fail("went through Autotuner.run"))
    launch_tuned(tuner, _grid, *args, **kwargs)
    torch.testing.assert_close(out, (x.float() * 0.5 + 1).half())


def test_untuned_key_goes_through_the_autotuner(monkeypatch):
    tuner = _tuner()
    out, x = _inputs()
    seen = []
    monkeypatch.setattr(type(tuner), "run", lambda self, *a, **k: seen.append(k))
    launch_tuned(tuner, _grid, out, x, 100, 2.0, N_KEY=32)
    assert seen and seen[0]["N_KEY"] == 32


def test_single_config_launches_without_a_key():
    tuner = triton.autotune(configs=[triton.Config({"BLOCK": 128, "SHIFT": 5}, num_warps=1)],
                            key=["N_KEY"])(_scale_kernel)
    out, x = _inputs()
    launch_tuned(tuner, _grid, out, x, 100, -1.0, N_KEY=7)
    torch.testing.assert_close(out, -x + 5)


def test_anything_else_is_launched_as_is():
    """A kernel that is not a Triton Autotuner (a plain JIT function, a wrapper) launches unchanged."""
    out, x = _inputs()
    launch_tuned(_scale_kernel, _grid, out, x, 100, 4.0, N_KEY=1, BLOCK=32, SHIFT=0)
    torch.testing.assert_close(out, x * 4.0)
