"""Embedding throughput: fastbert `Encoder.encode` vs sentence-transformers' `encode`, same checkpoint.

Workload: 2,000 lines of real English text (CPython's pydoc topics split into non-empty lines,
corpus.pydoc_lines; 500 with quick=True), batch size 32, every library given the same list. The
tokenizer runs inside the timed call, and fastbert's caches whole texts and words: so each repeat
(and the untimed first call) gets the lines under a tag no earlier call used (a number and a space
before each, tokenizer.Rounds), text new to every tokenizer, and the word caches are cleared before
each. Each library is timed `repeats` times, interleaved (ST, fastbert, ST, fastbert, ...) so that
load from other processes hits both alike; the best time of each counts. The output check, on the
first call's lines: every fastbert embedding has cosine >= 0.99999 with sentence-transformers'
(fp32; 0.999 in fp16/bf16).
"""
from __future__ import annotations

import datetime as _dt
import itertools
import os
import time

import torch

from fastbert.benchmarks import env
from fastbert.benchmarks.corpus import pydoc_lines
from fastbert.benchmarks.tokenizer import Rounds

FULL_LINES, QUICK_LINES = 2000, 500
BATCH_SIZE = 32


def device_name(device: str) -> str:
    if device == "cuda":
        return f"cuda: {torch.cuda.get_device_name(0)}"
    return f"cpu: {env.cpu_model()} ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


def versions() -> dict:
    return env.versions(("fastbert", "torch", "transformers", "sentence-transformers"))


def run(model_dir, texts=None, quick: bool = False, device: str = "cpu", dtype: str = "float32",
        repeats: int | None = None, progress=None, lines: int | None = None) -> list[dict]:
    """One row per implementation: lines/s (best of `repeats`), and for fastbert the output check.

    Peers: sentence-transformers as it is, and the same SentenceTransformer after fastbert.optimize
    (its own tokenizer and character-length batching, fastbert's encoder). texts: the lines to
    embed (default corpus.pydoc_lines()); lines: how many (default 2,000; 500 with quick)."""
    import fastbert

    n = lines or (QUICK_LINES if quick else FULL_LINES)  # lines: a smaller workload (CLI smoke tests)
    texts = list(texts[:n]) if texts is not None else pydoc_lines(n)
    repeats = repeats or (2 if quick else 3)
    torch_dtype = getattr(torch, dtype)
    say = progress or (lambda message: None)
    case = f"{len(texts)} lines, batch {BATCH_SIZE}, {dtype}, {torch.get_num_threads()} threads"
    stamp = {"device": device_name(device), "versions": versions(),
             "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}

    say("loading fastbert.Encoder")
    encoder = fastbert.Encoder.from_pretrained(model_dir, device=device, dtype=torch_dtype)
    runs = {"fastbert Encoder.encode":
            lambda lines: encoder.encode(lines, batch_size=BATCH_SIZE, convert_to_tensor=True)}
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        SentenceTransformer = None
    if SentenceTransformer is not None:
        say("loading sentence-transformers")
        plain = SentenceTransformer(str(model_dir), device=device).to(torch_dtype)
        optimized = fastbert.optimize(SentenceTransformer(str(model_dir), device=device).to(torch_dtype))
        runs = {"sentence-transformers encode":
                lambda lines: plain.encode(lines, batch_size=BATCH_SIZE, convert_to_tensor=True),
                "sentence-transformers + fastbert.optimize":
                lambda lines: optimized.encode(lines, batch_size=BATCH_SIZE, convert_to_tensor=True),
                **runs}

    models = [encoder] + ([plain, optimized] if SentenceTransformer is not None else [])

    def clear_caches():  # the tokenizers that cache words (fastbert's): nothing kept from a round
        for model in models:
            clear = getattr(getattr(model, "tokenizer", None), "clear_cache", None)
            if clear is not None:
                clear()

    rounds = Rounds(texts, itertools.count(1))  # round r: the same lines for all, new to every tokenizer
    say("warm-up and output check")
    outputs = {name: fn(rounds(0)).float() for name, fn in runs.items()}
    times = {name: [] for name in runs}
    for i in range(1, repeats + 1):                    # interleaved: outside load hits all alike
        say(f"timing {i}/{repeats}")
        lines_i = rounds(i)
        for name, fn in runs.items():
            clear_caches()
            start = time.perf_counter()
            fn(lines_i)
            times[name].append(time.perf_counter() - start)

    ref_name = "sentence-transformers encode"
    ref = outputs.get(ref_name)
    threshold = 0.99999 if torch_dtype == torch.float32 else 0.999
    rows = []
    for name in runs:
        best = min(times[name])
        row = {"name": name, "case": case, "lines/s": len(texts) / best, "seconds": best,
               "all_seconds": times[name], "ok": None, **stamp}
        if ref is None:
            row["note"] = "sentence-transformers not installed: no reference to check against"
        elif name != ref_name:
            cosine = torch.nn.functional.cosine_similarity(outputs[name], ref.to(outputs[name].device), dim=1)
            speedup = min(times[ref_name]) / best
            row.update(speedup=speedup, min_cosine=float(cosine.min()), ok=float(cosine.min()) >= threshold,
                       note=f"{speedup:.2f}x sentence-transformers, min cosine {float(cosine.min()):.6f}")
        rows.append(row)
    return rows
