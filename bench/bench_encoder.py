"""Text to embeddings on the CPU: fastbert.Encoder against sentence-transformers and the engines users
pick (ONNX Runtime, OpenVINO, CTranslate2; fp32 and int8), in one interleaved run.

    python bench/bench_encoder.py [--quick] [--lines N] [--repeats R] [--threads T] [--lines-table]
                                  [--no-peers] [--no-int8] [--no-save] [--batch1-only]
    pytest bench/bench_encoder.py --benchmark-only   # pytest-benchmark, fastbert vs sentence-transformers

The workload, the peers and the columns are described in fastbert.benchmarks.encoder (also behind
`fastbert bench`) and fastbert.benchmarks.peers (pip install 'fastbert[peers]'; a missing peer is
skipped with its reason); this file wraps them, prints the table and appends the run to
bench/results/encoder.jsonl.
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
        from sentence_transformers import SentenceTransformer

        import fastbert

        model = fastbert.optimize(SentenceTransformer(model_dir(), device="cpu"))
        cosine = _time_encode(benchmark, model.encode, reference)
        assert cosine >= 0.99999, f"optimized embeddings differ from sentence-transformers': min cosine {cosine}"

    def test_fastbert_encode(benchmark, reference):
        import fastbert

        encoder = fastbert.Encoder.from_pretrained(model_dir(), device="cpu")
        cosine = _time_encode(benchmark, encoder.encode, reference)
        assert cosine >= 0.99999, f"fastbert embeddings differ from sentence-transformers': min cosine {cosine}"


# ---- script -------------------------------------------------------------------------------------------

def _table(rows) -> str:
    out = [f"{'engine':<44} {'sent/s':>7} {'x fastbert':>10} {'% GEMM':>7} {'b1 p50 ms':>9} {'b1 p99 ms':>9} "
           f"{'b1 x fastbert':>13} {'min cos':>8}"]
    for row in rows:
        if "sentences/s" not in row:
            value = f"{row['GFLOP/s']:.0f} GFLOP/s" if "GFLOP/s" in row else row.get("note", "")
            out.append(f"{row['name']:<44} {value}")
            continue
        out.append(f"{row['name']:<44} {row['sentences/s']:7.1f} {_x(row['x fastbert']):>10} "
                   f"{100 * row['GEMM fraction']:6.0f}% {_ms(row['batch1 p50 ms'])} {_ms(row['batch1 p99 ms'])} "
                   f"{_x(row['batch1 x fastbert']):>13} {row['min_cosine']:8.5f}")
    return "\n".join(out)


def _x(ratio) -> str:
    return "" if ratio is None else f"{ratio:.2f}x"


def _ms(value, digits: int = 1) -> str:
    return f"{'-' if value is None else f'{value:.{digits}f}':>9}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 texts, 2 rounds")
    parser.add_argument("--lines", type=int, default=None, help="texts to time (default 2,000)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, and each peer's (default 2)")
    parser.add_argument("--no-peers", action="store_true", help="fastbert and sentence-transformers only")
    parser.add_argument("--no-int8", action="store_true", help="fp32 engines only (calibrating int8 peers takes minutes)")
    parser.add_argument("--no-save", action="store_true", help="print the table only, append nothing to encoder.jsonl")
    parser.add_argument("--lines-table", action="store_true",
                        help="also the older short-lines workload (fastbert vs sentence-transformers)")
    parser.add_argument("--batch1-only", action="store_true",
                        help="only the batch-1 latency of fastbert and the peers, fp32 and int8 (each engine in its "
                             "own process); prints it, appends nothing")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of encoder.jsonl")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.batch1_only:
        peers = [] if args.no_peers else list(eb.PEERS)
        names = [eb.FASTBERT_FP32, *peers]
        if not args.no_int8:
            names += [eb.FASTBERT_INT8, *(f"{peer} int8" for peer in peers)]
        for row in eb.run_batch1(model_dir(), names=tuple(names), quick=args.quick, progress=say):
            print(f"{row['name']:<44} p50 {_ms(row['batch1 p50 ms'], 2)} ms  p99 {_ms(row['batch1 p99 ms'])} ms  "
                  f"{_x(row['batch1 x fastbert']):>6} x fastbert  {row.get('batch1 note', '')}")
        return 0
    rows = eb.run(model_dir(), quick=args.quick, repeats=args.repeats, lines=args.lines,
                  peers=not args.no_peers, int8=not args.no_int8, progress=say)
    print(rows[0]["device"], rows[0]["versions"])
    print(_table(rows))
    variant = "quick" if args.quick else None
    config = {"threads": args.threads, "lines": args.lines, "quick": args.quick, "batch_size": eb.BATCH_SIZE,
              "int8": not args.no_int8}
    if not args.no_save:
        print(f"JSONL: {append_run('encoder', rows, args.out, variant=variant, config=config)}")
    if args.lines_table:
        lines_rows = eb.run_lines(model_dir(), quick=args.quick, repeats=args.repeats, progress=say)
        for row in lines_rows:
            print(f"{row['name']:<44} {row['lines/s']:8.1f} lines/s  {row.get('note', '')}")
        if not args.no_save:
            append_run("encoder", lines_rows, args.out, variant="lines", config=config)
        rows += lines_rows
    return 1 if any(r.get("ok") is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
