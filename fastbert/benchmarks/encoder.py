"""Embedding throughput: fastbert `Encoder.encode` vs sentence-transformers' `encode`, same checkpoint.

Workload: 2,000 lines of real English text (CPython's pydoc topics split into non-empty lines;
500 with quick=True), batch size 32, both libraries given the same list. Each library is timed
`repeats` times, interleaved (ST, fastbert, ST, fastbert, ...) so that load from other processes
hits both alike; the best time of each counts. The output check: every fastbert embedding has
cosine >= 0.99999 with sentence-transformers' (fp32; 0.999 in fp16/bf16).
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import time
from importlib import metadata

import torch

FULL_LINES, QUICK_LINES = 2000, 500
BATCH_SIZE = 32


def english_lines(n: int = FULL_LINES) -> list[str]:
    """The first n non-empty lines of CPython's pydoc topics (topics in sorted order)."""
    from pydoc_data.topics import topics

    lines = [line for key in sorted(topics) for line in topics[key].splitlines() if line.strip()]
    return lines[:n]


def device_name(device: str) -> str:
    if device == "cuda":
        return f"cuda: {torch.cuda.get_device_name(0)}"
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"cpu: {model} ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


def versions() -> dict:
    out = {"python": platform.python_version()}
    for dist in ("fastbert", "torch", "transformers", "sentence-transformers"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _best_time(fn, repeats: int, times: list) -> None:
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)


def run(model_dir, texts=None, quick: bool = False, device: str = "cpu", dtype: str = "float32",
        repeats: int | None = None, progress=None, lines: int | None = None) -> list[dict]:
    import fastbert

    n = lines or (QUICK_LINES if quick else FULL_LINES)  # lines: a smaller workload (CLI smoke tests)
    if texts is None or len(texts) < n:
        texts = english_lines(n)
    texts = list(texts[:n])
    repeats = repeats or (2 if quick else 3)
    torch_dtype = getattr(torch, dtype)
    say = progress or (lambda message: None)
    case = f"{len(texts)} lines, batch {BATCH_SIZE}, {dtype}, {torch.get_num_threads()} threads"

    say("loading fastbert.Encoder")
    encoder = fastbert.Encoder.from_pretrained(model_dir, device=device, dtype=torch_dtype)
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        SentenceTransformer = None
    rows = []
    fb_times, st_times = [], []
    stamp = {"device": device_name(device), "versions": versions(),
             "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}

    def fb_encode():
        return encoder.encode(texts, batch_size=BATCH_SIZE, convert_to_tensor=True)

    if SentenceTransformer is None:
        fb_encode()
        _best_time(fb_encode, repeats, fb_times)
        best = min(fb_times)
        return [{"name": "fastbert Encoder.encode", "case": case, "lines/s": len(texts) / best,
                 "seconds": best, "ok": None, "note": "sentence-transformers not installed", **stamp}]

    say("loading sentence-transformers")
    st = SentenceTransformer(str(model_dir), device=device)
    st.to(torch_dtype)

    def st_encode():
        return st.encode(texts, batch_size=BATCH_SIZE, convert_to_tensor=True)

    say("warm-up and output check")
    ref = st_encode().float()
    got = fb_encode().float()
    cosine = torch.nn.functional.cosine_similarity(got, ref.to(got.device), dim=1)
    min_cos = float(cosine.min())
    threshold = 0.99999 if torch_dtype == torch.float32 else 0.999
    for i in range(repeats):
        say(f"timing {i + 1}/{repeats}")
        _best_time(st_encode, 1, st_times)
        _best_time(fb_encode, 1, fb_times)
    st_best, fb_best = min(st_times), min(fb_times)
    rows.append({"name": "sentence-transformers encode", "case": case, "lines/s": len(texts) / st_best,
                 "seconds": st_best, "all_seconds": st_times, "ok": None, **stamp})
    rows.append({"name": "fastbert Encoder.encode", "case": case, "lines/s": len(texts) / fb_best,
                 "seconds": fb_best, "all_seconds": fb_times, "speedup": st_best / fb_best,
                 "min_cosine": min_cos, "ok": min_cos >= threshold,
                 "note": f"{st_best / fb_best:.2f}x sentence-transformers, min cosine {min_cos:.6f}", **stamp})
    return rows
