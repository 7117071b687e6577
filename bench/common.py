"""What the bench/ scripts share: where results go (one JSONL per kind, docs/benchmarks.md), the
default checkpoint, progress lines, and
pytest (optional: the scripts also run without it, as plain programs).

Importable as `common` both from `python bench/<script>.py` (the script's folder is on sys.path)
and under `pytest bench/` (bench/ has no __init__.py, so pytest puts the folder on sys.path).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from fastbert.benchmarks import results
from fastbert.hub import default_model_dir

RESULTS = Path(__file__).resolve().parent / "results"
QUICK = bool(os.environ.get("FASTBERT_BENCH_QUICK"))  # pytest-benchmark runs: smaller workloads

try:
    import pytest
except ImportError:  # script use needs no pytest
    pytest = None


def model_dir() -> str:
    return str(default_model_dir())


def say(message) -> None:
    """Progress callback for the measurement modules: one indented line on stderr."""
    print(f"  {message}", file=sys.stderr, flush=True)


def append_run(kind: str, rows: list[dict], out_dir: Path = RESULTS, *, variant: str | None = None,
               device: str = "cpu", config: dict | None = None) -> Path:
    """Append the run's rows to out_dir/<kind>.jsonl as one line and regenerate RESULTS.md there;
    returns the JSONL's path. The rows' own "versions" (the measurement modules put them on every
    row) become the line's."""
    versions = next((r["versions"] for r in rows if isinstance(r.get("versions"), dict)), None)
    return results.append(results.record(kind, rows, variant=variant, device=device, versions=versions,
                                         config=config), out_dir)


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure_forward(fn, repeats: int):
    """(best seconds, peak MiB resident above the set before the call, last output) of fn() under
    inference_mode, repeated; Linux only (reads and resets the high-water mark in /proc/self)."""
    import time

    import torch

    times, peak, out = [], 0, None
    for _ in range(repeats):
        out = None
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                                       # reset the RSS high-water mark
        before = _rss_kb("VmRSS")
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = fn()
        times.append(time.perf_counter() - t0)
        peak = max(peak, _rss_kb("VmHWM") - before)
    return min(times), round(peak / 1024, 1), out


def elementwise_test(module_name: str):
    """The pytest-benchmark test of an element-wise op's bench file (bench_bias_gelu.py, ...): each kind
    of its calls(), forward and forward+backward, on CPU and (marked `gpu`) on CUDA. The module gives
    inputs(tokens, width, device, dtype, gen), calls(backend), CPU_TOKENS / GPU_TOKENS, WIDTH and
    TENSORS (tensors of tokens x width read + written per pass: the GB/s)."""
    import torch

    op = sys.modules[module_name]
    stem = module_name.removeprefix("bench_")

    @pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
    @pytest.mark.parametrize("passname", list(op.TENSORS))
    @pytest.mark.parametrize("kind", ["torch", "fastbert"])
    def test(benchmark, time_memory_bound, kind, passname, device):
        if device == "cuda" and not torch.cuda.is_available():
            pytest.skip("the Triton kernel is timed on a CUDA GPU only")
        dtype, backend, tokens = ((torch.float32, "torch", op.CPU_TOKENS) if device == "cpu"
                                  else (torch.float16, "triton", op.GPU_TOKENS))
        benchmark.group = f"{stem} {device} {str(dtype)[6:]} {passname}"
        train = passname != "fwd"
        leaves = [t.requires_grad_(train) for t in
                  op.inputs(tokens, op.WIDTH, device, dtype, torch.Generator().manual_seed(0))]
        fn, dy = op.calls(backend)[kind], torch.randn_like(leaves[0])

        def step():
            if not train:
                return fn(*leaves)
            for t in leaves:
                t.grad = None
            fn(*leaves).backward(dy)
        time_memory_bound(step, op.TENSORS[passname] * leaves[0].numel() * leaves[0].element_size(), device)
    return test
