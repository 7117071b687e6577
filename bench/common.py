"""What the bench/ scripts share: where results go, the default checkpoint, progress lines, and
pytest (optional: the scripts also run without it, as plain programs).

Importable as `common` both from `python bench/<script>.py` (the script's folder is on sys.path)
and under `pytest bench/` (bench/ has no __init__.py, so pytest puts the folder on sys.path).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from fastbert.benchmarks.env import default_model_dir

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


def write_json(out_dir: Path, name: str, rows) -> Path:
    """rows as indented JSON in out_dir/name (made if missing); returns the path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    path.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return path


def stamp(rows) -> str:
    """The first row's ISO timestamp as a file-name part, 20261201T224037."""
    return rows[0]["timestamp"].replace(":", "").replace("-", "")[:15] if rows else "empty"
