"""The repository's kernels/ folder is installed as fastbert.kernels. Run from the repository root
(pytest, `python -c`), it also sits on sys.path under the top-level name `kernels`, which belongs to
Hugging Face's package of that name, a dependency of transformers >= 5.25 that transformers imports."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_top_level_kernels_from_the_repository_root_is_hugging_faces():
    """Found by use: with transformers 5.25, importing transformers' models from the repository root
    failed (ImportError: cannot import name 'CUDAProperties' from 'kernels'), as this folder shadowed
    Hugging Face's `kernels`. From the root, `import kernels` now gives the installed package, and
    fastbert.kernels stays fastbert's."""
    installed = [p for p in sys.path if p and Path(p).resolve() != REPO]
    spec = importlib.machinery.PathFinder.find_spec("kernels", installed)
    if spec is None:
        pytest.skip("Hugging Face's `kernels` package is not installed (transformers < 5.25 does not need it)")
    code = ("import kernels, fastbert.kernels, transformers.modeling_utils; "
            f"assert kernels.__file__ == {spec.origin!r}, kernels.__file__; "
            "assert fastbert.kernels.__file__ != kernels.__file__; "
            "import fastbert.kernels.attention")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
