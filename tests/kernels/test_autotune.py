"""TunedKernel: the interpreter launches the (pruned) config with the largest blocks; a tuned key launches the chosen
config directly, without Triton's autotuner; the chosen configs live in the TunedKernel object.

Triton's autotuner cannot time configs without a GPU, so the tuned-path tests replace its run() with
one that picks a config and launches it, as a real tuning would."""
import pytest
import torch
import triton
import triton.language as tl

from fastbert.kernels._autotune import TunedKernel, gpu_compiles


@triton.jit
def _scale_kernel(out_ptr, x_ptr, n, factor, N_KEY, BLOCK: tl.constexpr, SHIFT: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(x_ptr + offs, mask=ok, other=0.0)
    tl.store(out_ptr + offs, x * factor + SHIFT, mask=ok)


CONFIGS = [triton.Config({"BLOCK": 32, "SHIFT": 1}, num_warps=1),
           triton.Config({"BLOCK": 64, "SHIFT": 2}, num_warps=2)]


def _grid(meta, n=100):
    return (triton.cdiv(n, meta["BLOCK"]),)


def _inputs(device, dtype=torch.float32):
    x = torch.randn(100, dtype=dtype, device=device)
    return torch.empty_like(x), x


def test_without_a_gpu_the_largest_blocks_run(device):
    if gpu_compiles():
        pytest.skip("on a GPU the kernel is autotuned; the tuned-path tests cover it")
    tuned = TunedKernel(_scale_kernel, CONFIGS, key=["N_KEY"])
    assert tuned.tuner is None and tuned.autotunes()
    out, x = _inputs(device)
    tuned.launch(("k",), _grid, out, x, 100, 3.0, N_KEY=128)
    torch.testing.assert_close(out, x * 3.0 + 2)                 # CONFIGS[1]: fewer interpreted programs
    assert tuned.chosen == {("k",): CONFIGS[1].all_kwargs()}
    assert tuned.choosable({}, {})[0] is CONFIGS[0]              # what a GPU runs untuned


def test_shared_memory_prunes_for_the_device():
    sizes = {32: 40_000, 64: 120_000}
    tuned = TunedKernel(_scale_kernel, CONFIGS, key=["N_KEY"], shared=lambda c, nargs, meta: sizes[c.kwargs["BLOCK"]])
    assert tuned.choosable({}, {}, 99 * 1024) == CONFIGS[:1]
    assert tuned.choosable({}, {}, 227 * 1024) == CONFIGS and tuned.choosable({}, {}) == CONFIGS
    with pytest.raises(ValueError, match="no config fits"):
        tuned.choosable({}, {}, 30_000)


def test_prune_chooses_the_first_config(device):
    if gpu_compiles():
        pytest.skip("on a GPU the pruned configs are timed")
    tuned = TunedKernel(_scale_kernel, CONFIGS, key=["N_KEY"], prune=lambda configs, nargs, **kw: configs[1:])
    out, x = _inputs(device)
    tuned.launch(("k",), _grid, out, x, 100, -1.0, N_KEY=7)
    torch.testing.assert_close(out, -x + 2)


def _fake_tuning(tuner, pick, seen):
    def run(self, *args, grid, **kwargs):       # what Autotuner.run does once it has timed the configs
        seen.append(kwargs["N_KEY"])
        self.best_config = self.configs[pick]
        return self.fn.run(*args, grid=grid, **kwargs, **self.best_config.all_kwargs())
    return run


def test_first_call_tunes_then_the_chosen_config_launches_directly(device, monkeypatch):
    tuned = TunedKernel(_scale_kernel, CONFIGS, key=["N_KEY"], autotune=True)
    seen = []
    monkeypatch.setattr(type(tuned.tuner), "run", _fake_tuning(tuned.tuner, 1, seen))
    out, x = _inputs(device, torch.float16)
    key = (64, torch.float16)
    tuned.launch(key, _grid, out, x, 100, 0.5, N_KEY=64)
    torch.testing.assert_close(out, (x.float() * 0.5 + 2).half())
    assert seen == [64] and tuned.chosen[key] == CONFIGS[1].all_kwargs()
    monkeypatch.setattr(type(tuned.tuner), "run", lambda *a, **k: pytest.fail("went through Autotuner.run"))
    out2 = torch.empty_like(out)
    tuned.launch(key, _grid, out2, x, 100, 0.5, N_KEY=64)
    torch.testing.assert_close(out2, out)
    assert not hasattr(tuned.tuner, "_fastbert_launch_plan"), "nothing is kept on Triton's objects"


def test_each_key_is_tuned_once(device, monkeypatch):
    tuned = TunedKernel(_scale_kernel, CONFIGS, key=["N_KEY"], autotune=True)
    seen = []
    monkeypatch.setattr(type(tuned.tuner), "run", _fake_tuning(tuned.tuner, 0, seen))
    out, x = _inputs(device)
    for n_key in (16, 32, 16, 32, 16):
        tuned.launch((n_key,), _grid, out, x, 100, 2.0, N_KEY=n_key)
    assert seen == [16, 32]
    torch.testing.assert_close(out, x * 2.0 + 1)
