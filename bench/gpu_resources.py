"""Registers, spills and shared memory of every kernel launch the ops make, compiled for NVIDIA targets
without a GPU (the sweep of tests/gpu_compile.py, cached on disk by kernel source hash).

    python bench/gpu_resources.py                          # the configs that run untuned
    python bench/gpu_resources.py --scope all              # every choosable config (~25 min cold on 2 cores)
    python bench/gpu_resources.py --scope all --all-variants   # ... of every flag combination, not only the
                                                               # quick ones (the AOT test's)
    python bench/gpu_resources.py --scope all --problems-only   # only what the AOT test would flag
    python bench/gpu_resources.py --scope all --kernels attention.   # one kernel file's kernels

Prints one row per compile: kernel, variant (the launch's constexpr flags), config, target,
registers, spills (stack frame bytes), shared memory (bytes / the target's per-block limit), and
whether the config is the one that runs untuned (default). fp32 attention is compiled with 3xTF32 and
with TF32 (DOT_PRECISION in the variant). Run it with TRITON_INTERPRET unset."""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import gpu_compile  # noqa: E402  (tests/ on the path first)


def table(rows):
    """Markdown table of sweep rows, sorted by kernel, variant, config and target."""
    lines = ["| kernel | variant | dtype | config | target | default | registers | spills (B) | shared (B) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["kernel"], r["variant"], r["config"], r["target"])):
        shared = "-" if r["shared"] is None else f"{r['shared']} / {r['limit']}"
        registers = "FAILED" if r["registers"] is None else r["registers"]
        spills = "-" if r["spills"] is None else r["spills"]
        lines.append(f"| {r['kernel']} | {r['variant']} | {r['dtype']} | {r['config']} | {r['target']} | "
                     f"{'yes' if r['default'] else ''} | {registers} | {spills} | {shared} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scope", choices=("default", "all"), default="default")
    p.add_argument("--dtypes", nargs="+", default=list(gpu_compile.DTYPES))
    p.add_argument("--head-dims", nargs="+", type=int, default=list(gpu_compile.HEAD_DIMS))
    p.add_argument("--hiddens", nargs="+", type=int, default=list(gpu_compile.HIDDENS))
    p.add_argument("--targets", nargs="+", type=int, default=list(gpu_compile.TARGETS))
    p.add_argument("--all-variants", action="store_true", help="every flag combination, not only the heaviest")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--cache", default=gpu_compile.DEFAULT_CACHE)
    p.add_argument("--problems-only", action="store_true")
    p.add_argument("--kernels", nargs="+", default=None, metavar="PREFIX",
                   help="only kernels whose module.name starts with one of these (attention. for "
                        "fastbert.kernels.attention's)")
    a = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: the kernels must be JIT functions to compile them")
    launches = gpu_compile.record_ops(a.dtypes, a.head_dims, a.hiddens, quick=not a.all_variants)
    if a.kernels:
        launches = [x for x in launches if f"{x.module}.{x.name}".startswith(tuple(a.kernels))]
    jobs = gpu_compile.jobs_for(launches, a.targets, a.scope)
    print(f"{len(launches)} launches, {len(jobs)} compiles", file=sys.stderr)
    rows = gpu_compile.compile_all(jobs, a.cache, a.workers)
    found = gpu_compile.problems(rows)
    if not a.problems_only:
        print(table(rows))
    failed = sum(r["error"] is not None for r in rows)
    spills = [r for r in rows if r["spills"]]
    over = sum(r["shared"] is not None and r["shared"] > r["limit"] for r in rows)
    print(f"\n{len(rows)} compiles, {failed} failed, {len(spills)} with spills "
          f"({sum(r['default'] for r in spills)} default), {over} over shared memory; {len(found)} problems")
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
