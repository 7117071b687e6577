"""Where benchmark figures go: one JSON Lines file per kind of benchmark, one line per run, and one
RESULTS.md generated from them (docs/benchmarks.md, "Results files", describes every field).

    bench/results/<kind>.jsonl    suite (fastbert bench), tokenizer, kernels, encoder, ...
    bench/results/RESULTS.md      the latest run of each kind and variant in full, then the history

A run appends; nothing is rewritten but RESULTS.md, so the history stays in git as added lines.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

SCHEMA = 1
KIND = re.compile(r"^[a-z][a-z0-9_]*$")  # a file stem: suite, tokenizer, encoder_window, ...
HISTORY = 25                             # runs listed per kind in RESULTS.md
MAX_COLUMNS, MAX_ROWS = 12, 60           # a latest run's table in RESULTS.md


def repo_root() -> Path | None:
    """The source checkout fastbert runs from (an editable install), else None."""
    root = Path(__file__).resolve().parents[2]
    if (root / "setup.py").is_file() and (root / "bench").is_dir():
        return root
    return None


def default_dir() -> Path:
    """bench/results/ when run from inside the fastbert checkout, ./fastbert-bench/ otherwise."""
    root, cwd = repo_root(), Path.cwd().resolve()
    if root is not None and (cwd == root or root in cwd.parents):
        return root / "bench" / "results"
    return cwd / "fastbert-bench"


def git_commit(root: Path | None = None) -> tuple[str | None, bool | None]:
    """(HEAD's hash, whether the tree has uncommitted changes) of the checkout, (None, None) outside one."""
    root = root or repo_root()
    if root is None:
        return None, None
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None, None
    return head or None, bool(dirty)


def machine(device: str = "cpu") -> dict:
    """What the figures were measured on."""
    from fastbert.benchmarks.env import cpu_model

    info = {"device": device, "device_name": cpu_model(), "cpu": cpu_model(), "cores": os.cpu_count(),
            "platform": platform.platform()}
    if device == "cuda":
        import torch
        info.update(device_name=torch.cuda.get_device_name(0), cuda=torch.version.cuda)
    return info


def record(kind: str, figures, *, variant: str | None = None, device: str = "cpu",
           versions: dict | None = None, config: dict | None = None, text: str | None = None,
           command: str | None = None, date: str | None = None, machine_info: dict | None = None,
           source: str | None = None) -> dict:
    """One run as a results line; figures is the list of measured rows (dicts), as the bench made them."""
    from fastbert.benchmarks.env import versions as _versions

    if not KIND.match(kind):
        raise ValueError(f"kind must be a lower-case file stem like 'tokenizer', got {kind!r}")
    if figures is not None and not isinstance(figures, list):
        raise TypeError(f"figures must be a list of rows, got {type(figures).__name__}")
    commit, dirty = git_commit()
    return {
        "schema": SCHEMA, "kind": kind, "variant": variant,
        "date": date or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit, "dirty": dirty,
        "machine": machine_info or machine(device),
        "versions": versions if versions is not None else _versions(("fastbert", "torch", "transformers", "triton")),
        "command": command if command is not None else " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "config": config or {}, "figures": figures or [], "text": text, "source": source,
    }


def append(row: dict, out_dir: Path | None = None, *, markdown: bool = True) -> Path:
    """Append the run to out_dir/<kind>.jsonl (made if missing) and regenerate RESULTS.md beside it."""
    out_dir = Path(out_dir) if out_dir is not None else default_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{row['kind']}.jsonl"
    line = json.dumps(_finite(row), default=_plain, allow_nan=False, ensure_ascii=False)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
    if markdown:
        write_markdown(out_dir)
    return path


def _plain(value):
    """json.dumps' fallback: paths, numpy scalars and the like as plain values."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def _finite(value):
    """NaN and infinities as None (JSON has no spelling for them), tuples as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def read(out_dir: Path) -> dict[str, list[dict]]:
    """{kind: its runs, oldest first} from every *.jsonl in out_dir."""
    runs = {}
    for path in sorted(Path(out_dir).glob("*.jsonl")):
        with open(path, encoding="utf-8") as f:
            runs[path.stem] = [json.loads(line) for line in f if line.strip()]
    return runs


def _cell(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "..."


def _table(figures: list[dict]) -> list[str]:
    """A Markdown table of a run's rows: the scalar columns, first seen first."""
    rows = [f for f in figures if isinstance(f, dict)]
    columns = []
    for f in rows:
        for key, value in f.items():
            if key not in columns and not isinstance(value, (dict, list)):
                columns.append(key)
    columns = columns[:MAX_COLUMNS]
    if not columns:
        return []
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(_cell(f.get(c)) for c in columns) + " |" for f in rows[:MAX_ROWS]]
    if len(rows) > MAX_ROWS:
        out.append(f"\n{len(rows) - MAX_ROWS} more rows in the JSONL line.")
    return out


def _suite_table(run: dict) -> list[str]:
    from fastbert.benchmarks.report import Result, to_markdown

    fields = Result.__dataclass_fields__
    results = [Result(**{k: v for k, v in r.items() if k in fields}) for r in run["figures"]
               if isinstance(r, dict) and "section" in r]
    return to_markdown(results).splitlines() if results else _table(run["figures"])


def _label(run: dict) -> str:
    m = run.get("machine") or {}
    return f"{m.get('device_name') or m.get('device') or '?'} ({m.get('cores') or '?'} cores)" \
        if m.get("device") != "cuda" else str(m.get("device_name"))


def markdown(runs: dict[str, list[dict]]) -> str:
    """RESULTS.md: per kind, the latest run of each variant in full, then the latest runs in a list."""
    out = ["# Benchmark results", "",
           "Generated from the `*.jsonl` files in this folder (`python bench/results_md.py`); do not edit.",
           "Each line of a JSONL file is one run: machine, versions, commit, date and every figure",
           "(docs/benchmarks.md describes the fields and how each benchmark measures).", ""]
    for kind, rows in runs.items():
        out += [f"## {kind}", "", f"{len(rows)} runs in `{kind}.jsonl`.", ""]
        latest = {}
        for run in rows:
            if run.get("figures"):
                latest[(run.get("variant"), (run.get("machine") or {}).get("device"))] = run
        for (variant, device), run in latest.items():
            out += [f"### Latest {variant or 'run'} on {device or '?'}: {run.get('date', '?')[:10]}, "
                    f"{_label(run)}, commit {(run.get('commit') or '?')[:10]}", ""]
            out += (_suite_table(run) if kind == "suite" else _table(run["figures"])) + [""]
        out += ["### History (newest first)", "", "| date | variant | machine | commit | rows | from |",
                "|---|---|---|---|---|---|"]
        for run in reversed(rows[-HISTORY:]):
            out.append(f"| {run.get('date', '?')[:16]} | {run.get('variant') or '—'} | {_cell(_label(run))} | "
                       f"{(run.get('commit') or '—')[:10]} | {len(run.get('figures') or [])} | "
                       f"{_cell(run.get('source') or run.get('command'))} |")
        if len(rows) > HISTORY:
            out.append(f"\n{len(rows) - HISTORY} older runs in `{kind}.jsonl`.")
        out.append("")
    return "\n".join(out)


def write_markdown(out_dir: Path) -> Path:
    path = Path(out_dir) / "RESULTS.md"
    path.write_text(markdown(read(out_dir)), encoding="utf-8")
    return path
