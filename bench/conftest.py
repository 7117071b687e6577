"""Shared set-up for the pytest-benchmark suites: `pytest bench/ --benchmark-only`.

- Collects bench_*.py (pytest's default pattern is test_*.py; pyproject's testpaths is tests/ only,
  so `pytest` alone never runs the benchmarks).
- Without a GPU, Triton runs in its interpreter: TRITON_INTERPRET must be set before triton is
  first imported, so it is set here, as in tests/conftest.py.
- Tests marked `gpu` skip visibly when CUDA is absent.
"""
import os
import shutil
import subprocess

import pytest


def _has_cuda_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


HAS_GPU = _has_cuda_gpu()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collect_file(file_path, parent):
    # Files named on the command line are collected by pytest itself; only add the others.
    if (file_path.suffix == ".py" and file_path.name.startswith("bench_")
            and not parent.session.isinitpath(file_path)):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none found: nvidia-smi -L failed)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def time_memory_bound(benchmark):
    """run(fn, nbytes, device): times fn() (synchronizing on CUDA) and records GB/s = nbytes / median."""
    import torch

    def run(fn, nbytes, device):
        def timed():
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
        fn()  # compile / autotune outside the timed region
        benchmark(timed)
        if benchmark.stats:  # None under --benchmark-disable (one plain call, nothing timed)
            benchmark.extra_info["GB/s"] = nbytes / benchmark.stats.stats.median / 1e9
    return run
