"""Embedding throughput: fastbert.Encoder.encode vs sentence-transformers' encode (as is, and after
fastbert.optimize), same checkpoint.

    pytest bench/bench_encoder.py --benchmark-only   # pytest-benchmark (FASTBERT_BENCH_QUICK=1: 500 lines)
    python bench/bench_encoder.py [--quick]          # all, interleaved; ratios, cosine check, JSON

2,000 non-empty lines of CPython's pydoc topics, batch size 32, fp32. The measurement logic lives in
fastbert.benchmarks.encoder (also behind `fastbert bench`); this file only wraps it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from fastbert.benchmarks import encoder as eb
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

    @pytest.fixture(scope="module")
    def texts():
        return eb.english_lines(eb.QUICK_LINES if _QUICK else eb.FULL_LINES)

    @pytest.fixture(scope="module")
    def reference(texts):
        st = pytest.importorskip("sentence_transformers")
        model = st.SentenceTransformer(model_dir(), device="cpu")
        return model, model.encode(texts, batch_size=eb.BATCH_SIZE, convert_to_tensor=True)

    def test_sentence_transformers_encode(benchmark, texts, reference):
        model, _ = reference
        benchmark.pedantic(model.encode, args=(texts,), kwargs={"batch_size": eb.BATCH_SIZE},
                           rounds=2 if _QUICK else 3, warmup_rounds=1)
        benchmark.extra_info.update({"lines/s": len(texts) / benchmark.stats.stats.min,
                                     "device": eb.device_name("cpu"), "versions": eb.versions()})

    def test_sentence_transformers_optimized_encode(benchmark, texts, reference):
        import fastbert
        from sentence_transformers import SentenceTransformer

        model = fastbert.optimize(SentenceTransformer(model_dir(), device="cpu"))
        got = benchmark.pedantic(model.encode, args=(texts,),
                                 kwargs={"batch_size": eb.BATCH_SIZE, "convert_to_tensor": True},
                                 rounds=2 if _QUICK else 3, warmup_rounds=1)
        cosine = torch.nn.functional.cosine_similarity(got, reference[1], dim=1).min().item()
        benchmark.extra_info.update({"lines/s": len(texts) / benchmark.stats.stats.min, "min_cosine": cosine,
                                     "device": eb.device_name("cpu"), "versions": eb.versions()})
        assert cosine >= 0.99999, f"optimized embeddings differ from sentence-transformers': min cosine {cosine}"

    def test_fastbert_encode(benchmark, texts, reference):
        import fastbert

        encoder = fastbert.Encoder.from_pretrained(model_dir(), device="cpu")
        got = benchmark.pedantic(encoder.encode, args=(texts,),
                                 kwargs={"batch_size": eb.BATCH_SIZE, "convert_to_tensor": True},
                                 rounds=2 if _QUICK else 3, warmup_rounds=1)
        cosine = torch.nn.functional.cosine_similarity(got, reference[1], dim=1).min().item()
        benchmark.extra_info.update({"lines/s": len(texts) / benchmark.stats.stats.min, "min_cosine": cosine,
                                     "device": eb.device_name("cpu"), "versions": eb.versions()})
        assert cosine >= 0.99999, f"fastbert embeddings differ from sentence-transformers': min cosine {cosine}"


# ---- script -------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 lines, 2 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs of each (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = eb.run(model_dir(), quick=args.quick, repeats=args.repeats,
                  progress=lambda message: print(f"  {message}", file=sys.stderr, flush=True))
    print(rows[0]["device"], rows[0]["versions"])
    for row in rows:
        times = ", ".join(f"{t:.2f}" for t in row.get("all_seconds", []))
        print(f"{row['name']:<42} {row['lines/s']:8.1f} lines/s  best {row['seconds']:.2f} s  [{times}]"
              + (f"  {row['note']}" if row.get("note") else ""))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"encoder-{rows[0]['timestamp'].replace(':', '').replace('-', '')[:15]}.json"
    path.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    print(f"JSON: {path}")
    return 1 if any(r.get("ok") is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
