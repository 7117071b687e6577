"""Embedding throughput: fastbert.Encoder.encode vs sentence-transformers' encode (as is, and after
fastbert.optimize), same checkpoint.

    pytest bench/bench_encoder.py --benchmark-only   # pytest-benchmark (FASTBERT_BENCH_QUICK=1: 500 lines)
    python bench/bench_encoder.py [--quick]          # all, interleaved; ratios, cosine check, a line in bench/results/encoder.jsonl

2,000 non-empty lines of CPython's pydoc topics, batch size 32, fp32; every round's lines are new to
every tokenizer (a fresh tag before each). The measurement logic lives in fastbert.benchmarks.encoder
(also behind `fastbert bench`); this file only wraps it.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
from common import QUICK, RESULTS, append_run, model_dir, pytest, say

from fastbert.benchmarks import encoder as eb
from fastbert.benchmarks.corpus import pydoc_lines
from fastbert.benchmarks.tokenizer import unseen

# ---- pytest-benchmark ---------------------------------------------------------------------------------

if pytest is not None:
    _TAGS = itertools.count(1)  # every round of every test: lines no tokenizer has met

    @pytest.fixture(scope="module")
    def reference():
        st = pytest.importorskip("sentence_transformers")
        return st.SentenceTransformer(model_dir(), device="cpu")

    def _time_encode(benchmark, encode, reference):
        """Times encode(lines) on new lines each round; returns the min cosine of the last round's
        embeddings with sentence-transformers' on the same lines."""
        texts, last = pydoc_lines(eb.QUICK_LINES if QUICK else eb.FULL_LINES), []

        def setup():
            last[:] = unseen(texts, next(_TAGS))
            return (last,), {"batch_size": eb.BATCH_SIZE, "convert_to_tensor": True}

        got = benchmark.pedantic(encode, setup=setup, rounds=2 if QUICK else 3, warmup_rounds=1)
        want = reference.encode(list(last), batch_size=eb.BATCH_SIZE, convert_to_tensor=True)
        cosine = torch.nn.functional.cosine_similarity(got, want, dim=1).min().item()
        benchmark.extra_info.update({"lines/s": len(texts) / benchmark.stats.stats.min, "min_cosine": cosine,
                                     "device": eb.device_name("cpu"), "versions": eb.versions()})
        return cosine

    def test_sentence_transformers_encode(benchmark, reference):
        _time_encode(benchmark, reference.encode, reference)

    def test_sentence_transformers_optimized_encode(benchmark, reference):
        import fastbert
        from sentence_transformers import SentenceTransformer

        model = fastbert.optimize(SentenceTransformer(model_dir(), device="cpu"))
        cosine = _time_encode(benchmark, model.encode, reference)
        assert cosine >= 0.99999, f"optimized embeddings differ from sentence-transformers': min cosine {cosine}"

    def test_fastbert_encode(benchmark, reference):
        import fastbert

        encoder = fastbert.Encoder.from_pretrained(model_dir(), device="cpu")
        cosine = _time_encode(benchmark, encoder.encode, reference)
        assert cosine >= 0.99999, f"fastbert embeddings differ from sentence-transformers': min cosine {cosine}"


# ---- script -------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 lines, 2 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs of each (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of encoder.jsonl")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = eb.run(model_dir(), quick=args.quick, repeats=args.repeats,
                  progress=say)
    print(rows[0]["device"], rows[0]["versions"])
    for row in rows:
        times = ", ".join(f"{t:.2f}" for t in row.get("all_seconds", []))
        print(f"{row['name']:<42} {row['lines/s']:8.1f} lines/s  best {row['seconds']:.2f} s  [{times}]"
              + (f"  {row['note']}" if row.get("note") else ""))
    variant = "quick" if args.quick else None
    print(f"appended to {append_run('encoder', rows, args.out, variant=variant, config={'threads': args.threads})}")
    return 1 if any(r.get("ok") is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
