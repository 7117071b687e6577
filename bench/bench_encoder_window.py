"""Encoder.encode with sort windows (window i + 1 tokenized on a worker while the model runs window i)
against the whole input tokenized and sorted up front (sort_window=None), same encoder, same lines.

    python bench/bench_encoder_window.py [--lines 3000] [--window 1024] [--rounds 3] [--first-lines 100000]

Each round embeds new lines (a fresh tag before each, word caches cleared: no tokenizer cache
hits), once per mode, the two modes' order alternating from round to round, so load from other
processes hits both alike. Reported: per-mode medians of the whole call and of the time to the first
batch (encode's start to the model's first forward call), and the median of the per-round ratios
(whole-input time / window time: > 1 means windows are faster). On a CPU the model's forward
dominates (tokenization is well under 1% of the call), so expect a ratio near 1; what windows change
there is the time to the first batch and the memory held for ids. That is measured apart on a corpus
of --first-lines lines (the lines repeated, each under its own tag): encode stops at the model's
first forward call, so only the time to it is spent.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import statistics
import sys
import time
from pathlib import Path

import torch
from common import RESULTS, append_run, model_dir, say

from fastbert.benchmarks import encoder as eb
from fastbert.benchmarks.corpus import pydoc_lines
from fastbert.benchmarks.tokenizer import unseen


class _FirstBatch(Exception):
    """Raised by the model at its first forward call when only the time to it is wanted."""


def timed_encode(encoder, texts, sort_window, batch_size, stop_at_first=False):
    """(seconds for the call, seconds to the model's first forward call) of one encode."""
    first = []
    forward = encoder.model.forward_packed

    def spy(*args, **kwargs):
        if not first:
            first.append(time.perf_counter())
            if stop_at_first:
                raise _FirstBatch
        return forward(*args, **kwargs)

    encoder.model.forward_packed = spy
    try:
        start = time.perf_counter()
        encoder.encode(texts, batch_size=batch_size, sort_window=sort_window, convert_to_tensor=True)
    except _FirstBatch:
        pass
    finally:
        del encoder.model.forward_packed               # the bound method again
    return time.perf_counter() - start, first[0] - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=3000, help="lines embedded per call (default 3000)")
    parser.add_argument("--window", type=int, default=1024, help="sort_window of the windowed mode")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--first-lines", type=int, default=100_000,
                        help="corpus size for the time-to-first-batch part (default 100000; 0: skip)")
    parser.add_argument("--batch-size", type=int, default=eb.BATCH_SIZE)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of encoder_window.jsonl")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import fastbert

    encoder = fastbert.Encoder.from_pretrained(model_dir(), device="cpu")
    lines = pydoc_lines(args.lines)
    modes = {f"sort_window={args.window}": args.window, "sort_window=None": None}
    encoder.encode(unseen(lines[:256], "warm-up"), batch_size=args.batch_size)   # untimed
    times = {name: [] for name in modes}
    firsts = {name: [] for name in modes}
    for r in range(args.rounds):
        order = list(modes) if r % 2 == 0 else list(modes)[::-1]
        for k, name in enumerate(order):
            encoder.tokenizer.clear_cache()
            seconds, first = timed_encode(encoder, unseen(lines, f"r{r}m{k}"), modes[name], args.batch_size)
            times[name].append(seconds)
            firsts[name].append(first)
            say(f"round {r}: {name}: {seconds:.2f} s, first batch after {first * 1e3:.0f} ms")
    first_large = {name: [] for name in modes}
    big = [f"{k} {line}" for k, line in zip(range(args.first_lines), itertools.cycle(lines))]
    for r in range(args.rounds if big else 0):
        order = list(modes) if r % 2 == 0 else list(modes)[::-1]
        for k, name in enumerate(order):
            encoder.tokenizer.clear_cache()
            texts = unseen(big, f"r{r}m{k}")
            _, first = timed_encode(encoder, texts, modes[name], args.batch_size, stop_at_first=True)
            first_large[name].append(first)
            say(f"round {r}: {len(big)} lines, {name}: first batch after {first * 1e3:.0f} ms")
    windowed, whole = list(modes)
    rows = [{"name": name, "lines": len(lines), "batch_size": args.batch_size,
             "median_seconds": statistics.median(times[name]), "all_seconds": times[name],
             "median_first_batch_ms": 1e3 * statistics.median(firsts[name]),
             "all_first_batch_ms": [1e3 * f for f in firsts[name]],
             "first_batch_lines": len(big),
             "median_first_batch_ms_large": 1e3 * statistics.median(first_large[name]) if big else None,
             "all_first_batch_ms_large": [1e3 * f for f in first_large[name]]} for name in modes]
    ratios = [b / a for a, b in zip(times[windowed], times[whole])]
    rows[0]["speedup_vs_whole_input"] = statistics.median(ratios)
    rows[0]["all_ratios"] = ratios
    meta = {"device": eb.device_name("cpu"), "versions": eb.versions(),
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    rows = [{**row, **meta} for row in rows]
    print(meta["device"], meta["versions"])
    for row in rows:
        print(f"{row['name']:<20} median {row['median_seconds']:.2f} s  first batch "
              f"{row['median_first_batch_ms']:.0f} ms  [{', '.join(f'{t:.2f}' for t in row['all_seconds'])}]"
              + (f"; {len(big)} lines: first batch {row['median_first_batch_ms_large']:.0f} ms" if big else ""))
    print(f"whole-input time / window time, median of {len(ratios)} rounds: {rows[0]['speedup_vs_whole_input']:.3f}"
          f"  [{', '.join(f'{x:.3f}' for x in ratios)}]")
    print(f"appended to {append_run('encoder_window', rows, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
