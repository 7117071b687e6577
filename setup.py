"""Builds fastbert's one extension, ``fastbert._C`` (C++17, pybind11, no libtorch), from the sorted
sources in ``csrc/``, and installs the Triton kernels in ``kernels/`` as ``fastbert.kernels``.
The project's metadata, dependencies and extras are in pyproject.toml.

Environment switches (read at build time):
  FASTBERT_SANITIZE=1     AddressSanitizer + UBSan build (csrc/fuzz/ci.sh)
  FASTBERT_STAGE_TIMES=1  a bench build: encode_batch's stage timers (csrc/stage_clock.h), read by
                          the tokenizer bench's --scaling; without it they are not compiled in
"""
import os
from glob import glob

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import find_packages, setup

# Compile the csrc/ sources in parallel (one job per core; NPY_NUM_BUILD_JOBS overrides).
ParallelCompile("NPY_NUM_BUILD_JOBS").install()

SANITIZE = os.environ.get("FASTBERT_SANITIZE") == "1"
STAGE_TIMES = os.environ.get("FASTBERT_STAGE_TIMES") == "1"


def _compile_args():
    if SANITIZE:
        return ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                "-fno-sanitize-recover=undefined"]
    return ["-O3"]


ext_modules = [
    Pybind11Extension(
        "fastbert._C",
        sorted(glob("csrc/*.cpp")),  # sorted: reproducible builds (pybind11 python_example)
        include_dirs=["csrc"],
        depends=sorted(glob("csrc/*.h")),  # a changed header rebuilds the extension, as a source does
        cxx_std=17,
        define_macros=[("FASTBERT_STAGE_TIMES", "1")] if STAGE_TIMES else [],
        extra_compile_args=_compile_args(),
        extra_link_args=["-fsanitize=address,undefined"] if SANITIZE else [],
    ),
]

setup(
    # kernels/ installs as fastbert.kernels, never as a top-level `kernels` (a PyPI name that is taken)
    packages=find_packages(include=["fastbert", "fastbert.*"]) + ["fastbert.kernels"],
    package_dir={"fastbert": "fastbert", "fastbert.kernels": "kernels"},
    ext_modules=ext_modules,
    cmdclass={"build_ext": build_ext},
)
