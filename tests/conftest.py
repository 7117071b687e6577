"""Test-session setup: without a GPU, Triton kernels run in Triton's interpreter.

TRITON_INTERPRET must be set before triton is first imported, so it is set here."""
import os
import shutil
import subprocess


def _has_cuda_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


if not _has_cuda_gpu():
    os.environ.setdefault("TRITON_INTERPRET", "1")
