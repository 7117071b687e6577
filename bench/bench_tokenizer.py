"""Tokenizer throughput: fastbert vs nanotoken, HF tokenizers and BertTokenizerFast, same text, one run.

    pytest bench/bench_tokenizer.py --benchmark-only      # pytest-benchmark (FASTBERT_BENCH_QUICK=1: less text)
    python bench/bench_tokenizer.py [--quick]               # table with ratios + JSON in bench/results/,
                                                            # then one text per call (tokenizer_latency)

The measurement logic lives in fastbert.benchmarks.tokenizer (also behind `fastbert bench`);
this file only wraps it.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from pathlib import Path

from fastbert.benchmarks import tokenizer as tb
from fastbert.benchmarks import tokenizer_latency as tl
from fastbert.benchmarks.env import default_model_dir

RESULTS = Path(__file__).resolve().parent / "results"


def model_dir() -> str:
    return str(default_model_dir())


# ---- pytest-benchmark ---------------------------------------------------------------------------------

try:
    import pytest
except ImportError:  # script use needs no pytest
    pytest = None

if pytest is not None:
    _QUICK = bool(os.environ.get("FASTBERT_BENCH_QUICK"))
    _CORES = os.cpu_count() or 1
    _THREADS = sorted({1, _CORES})

    @pytest.fixture(scope="module")
    def texts():
        return tb.default_texts(quick=_QUICK)

    @pytest.fixture(scope="module")
    def reference(texts):
        """BertTokenizerFast's output for every (text, path): what every peer must reproduce."""
        ref = tb.TransformersPeer(model_dir(), 1)
        ref.before_repeat()
        return {(name, path): getattr(ref, method)(docs)
                for name, docs in texts.items() for path, method in tb.PATHS.items()}

    @pytest.fixture(scope="module")
    def peers():
        return {}  # (peer class, threads) -> Peer, built once per module

    @pytest.mark.parametrize("threads", _THREADS, ids=lambda t: f"{t}thr")
    @pytest.mark.parametrize("peer_cls", tb.PEERS, ids=lambda c: c.name)
    @pytest.mark.parametrize("path", list(tb.PATHS))
    @pytest.mark.parametrize("text", ["english", "multilingual"])
    def test_tokenizer_throughput(benchmark, texts, reference, peers, text, path, peer_cls, threads):
        key = (peer_cls, threads)
        if key not in peers:
            try:
                peers[key] = peer_cls(model_dir(), threads)
            except ImportError as exc:
                if peer_cls is tb.FastbertPeer:
                    raise
                pytest.skip(f"{peer_cls.name} is not installed: {exc}")
        peer = peers[key]
        docs = texts[text]
        fn = getattr(peer, tb.PATHS[path])

        def setup():  # outside the timed region: thread setting, cold word caches
            peer.before_repeat()
            peer.clear_cache()
            return (docs,), {}

        out = benchmark.pedantic(fn, setup=setup, rounds=3 if _QUICK else 5, warmup_rounds=1)
        seconds = benchmark.stats.stats.median
        nbytes = tb.corpus.total_bytes(docs)
        match = tb.same_output(path, out, reference[(text, path)])
        benchmark.extra_info.update({
            "name": peer_cls.name, "path": path, "text": text, "threads": threads,
            "MB/s": nbytes / seconds / 1e6, "tokens/s": tb.count_tokens(path, out) / seconds,
            "ids_match": match, "device": tb.device(), "versions": tb.versions(),
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")})
        assert match, f"{peer_cls.name} differs from BertTokenizerFast: " + \
            tb.first_difference(path, out, reference[(text, path)], docs)


# ---- script -------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 KB of each text, fewer repeats")
    parser.add_argument("--warm-cache", action="store_true",
                        help="keep word caches between repeats (default: cleared before each)")
    parser.add_argument("--threads", default="1,all",
                        help="comma-separated thread counts; 'all' = every core (default 1,all)")
    parser.add_argument("--evict-caches", action="store_true",
                        help="write 64 MB before every timed call, so each starts on cold CPU caches")
    parser.add_argument("--no-latency", action="store_true",
                        help="skip the one-text-per-call latency table (fastbert.benchmarks.tokenizer_latency)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON files")
    args = parser.parse_args(argv)
    threads = tuple(None if t == "all" else int(t) for t in args.threads.split(","))
    tb.EVICT = args.evict_caches
    rows = tb.run(model_dir(), quick=args.quick, threads=threads, warm_cache=args.warm_cache,
                  progress=lambda message: print(f"  {message}", file=sys.stderr, flush=True))
    print(f"{tb.device()}; versions {rows[0]['versions'] if rows else {}}")
    print(tb.format_table(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = rows[0]["timestamp"].replace(":", "").replace("-", "")[:15] if rows else "empty"
    suffix = ("-evict" if args.evict_caches else "") + ("-quick" if args.quick else "")
    path = args.out / f"tokenizer-{stamp}{suffix}.json"
    path.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    print(f"JSON: {path}")
    if not args.no_latency:
        latency = tl.run(model_dir(), quick=args.quick,
                         progress=lambda message: print(f"  {message}", file=sys.stderr, flush=True))
        print("\nOne text per call (serial, caches cleared each round):")
        print(tl.format_table(latency))
        path = args.out / f"tokenizer-latency-{stamp}{'-quick' if args.quick else ''}.json"
        path.write_text(json.dumps(latency, indent=1), encoding="utf-8")
        print(f"JSON: {path}")
        rows = rows + latency
    return 1 if any(r.get("ids_match") is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
