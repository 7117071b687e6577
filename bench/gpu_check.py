"""The GPU check: stages that each fit one call on a lent GPU machine (<= 5 minutes), run one by one.

    python bench/gpu_check.py --stage install --wheel dist/fastbert-*.whl   # or: from source, no deps
    python bench/gpu_check.py --stage kernels          # kernel tests on CUDA (fp64 references)
    python bench/gpu_check.py --stage ops              # element-wise kernels, autotune, CUDA graphs
    python bench/gpu_check.py --stage bench            # kernel and end-to-end timings (GPU rows only)
    python bench/gpu_check.py --dry-run --stage all    # on CPU: every stage's plumbing (pip --dry-run,
                                                       # pytest --collect-only, the bench's --help)

Each call writes its whole log (gpu-check.log), a Markdown table of its steps (gpu-check.md) and the
bench's JSONL rows (results/) under --out (default $OUT, else a new temporary folder) and prints the
headline rows last. Nothing needs the internet: `install` takes a wheel built elsewhere, or builds this
tree without build isolation and without dependencies. Python steps run from a scratch folder, not the
repository root, so they import the installed fastbert (the source tree would shadow it there; no
editable install needed). GPU steps run first; there are no CPU rows. The exit status is the number of
failed steps."""
import argparse
import glob
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

KERNEL_TESTS = ["tests/ops/test_attention.py", "tests/ops/test_relative_attention.py",
                "tests/ops/test_sliding_window.py"]
OP_TESTS = ["tests/ops/test_rotary.py", "tests/ops/test_bias_gelu.py", "tests/ops/test_add_layer_norm.py",
            "tests/kernels/test_autotune.py", "tests/test_cuda_graphs.py"]
STAGE_LIMIT_S = 290  # one stage per call, with room for the machine's start under a 5-minute call


def _pytest(files, limit):
    # one config per kernel (FASTBERT_AUTOTUNE=0): correctness needs no timing, and timing every
    # config of every specialisation would not fit; -x stops at the first wrong number
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-x", "-p", "no:cacheprovider", "--rootdir", str(REPO),
           *[str(REPO / f) for f in files]]
    return dict(cmd=cmd, dry=cmd + ["--collect-only"], env={"FASTBERT_AUTOTUNE": "0"}, limit=limit, gpu=True)


def steps(stage, out, wheel=None):
    """[(name, {cmd, env, limit, gpu})] of a stage, in the order they run (GPU steps first)."""
    env_probe = [sys.executable, "-c",
                 "import torch, triton, fastbert, fastbert.kernels as k; "
                 "print('torch', torch.__version__, 'cuda', torch.version.cuda, '| triton', triton.__version__); "
                 "print('fastbert from', fastbert.__file__, '| kernels from', k.__file__); "
                 "print('device:', torch.cuda.get_device_name() if torch.cuda.is_available() else 'none')"]
    pip = [sys.executable, "-m", "pip", "install", "--no-deps"]
    install = pip + (["--force-reinstall", wheel] if wheel else ["--no-build-isolation", str(REPO)])
    bench = [sys.executable, str(REPO / "bench" / "bench_kernels.py")]
    plan = {
        "install": [("install", dict(cmd=install, dry=install[:4] + ["--dry-run"] + install[4:], limit=240))],
        "kernels": [("attention kernels vs fp64 references (CUDA)", _pytest(KERNEL_TESTS, 250))],
        "ops": [("element-wise kernels, autotune, CUDA graphs (CUDA)", _pytest(OP_TESTS, 250))],
        "bench": [("kernel and model timings (CUDA)", dict(
            cmd=bench + ["--budget-s", "200", "--out", str(out / "results")], dry=bench + ["--help"], limit=250,
            gpu=True))],
    }
    if stage == "all":
        chosen = [s for name in ("install", "kernels", "ops", "bench") for s in plan[name]]
    else:
        chosen = plan[stage]
    return [("environment", dict(cmd=env_probe, limit=40))] + chosen


class Log:
    """Everything printed also goes to out/gpu-check.log."""

    def __init__(self, path):
        self.f = open(path, "a", buffering=1)
        self.start = time.perf_counter()

    def say(self, line):
        text = f"[gpu_check {time.perf_counter() - self.start:5.0f}s] {line}"
        print(text, flush=True)
        self.f.write(text + "\n")


def run_step(log, name, spec, workdir, dry_run):
    """(status, seconds, last line) of one step; its output goes into the log as it comes."""
    cmd, limit = (spec.get("dry", spec["cmd"]) if dry_run else spec["cmd"]), spec["limit"]
    log.say(f"== {name} (limit {limit}s): {shlex.join(cmd)}")
    env = {**os.environ, **spec.get("env", {})}
    env.pop("TRITON_INTERPRET", None)
    start = time.perf_counter()
    last = ""
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)
    # a silent hang ends at the limit too (a dry run, on a CPU machine's slower imports, gets more)
    watchdog = threading.Timer(limit * (4 if dry_run else 1), proc.kill)
    watchdog.start()
    try:
        for line in proc.stdout:
            log.f.write(line)
            last = line.strip() or last
        rc = proc.wait()
    finally:
        watchdog.cancel()
    seconds = time.perf_counter() - start
    status = ("dry-run ok" if dry_run else "ok") if rc == 0 else ("timeout" if rc == -9 else f"failed ({rc})")
    log.say(f"-- {name}: {status} in {seconds:.0f}s: {last[:160]}")
    return status, seconds, last


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stage", choices=("install", "kernels", "ops", "bench", "all"),
                   help="required on a GPU; --dry-run defaults to all")
    p.add_argument("--wheel", help="install this wheel (no dependencies) in the install stage")
    p.add_argument("--out", default=os.environ.get("OUT") or None, help="output folder (default $OUT, else a temp dir)")
    p.add_argument("--dry-run", action="store_true", help="run on CPU: the plumbing, no GPU step, no install")
    a = p.parse_args(argv)
    a.stage = a.stage or ("all" if a.dry_run else None)
    if a.stage in ("all", None) and not a.dry_run:
        p.error("pass --stage: all of them run longer than one call; run install, kernels, ops and bench one by one")
    if a.wheel:
        found = sorted(glob.glob(a.wheel))
        if not found:
            p.error(f"no wheel matches {a.wheel}")
        a.wheel = os.path.abspath(found[-1])
    out = Path(a.out or tempfile.mkdtemp(prefix="gpu-check-")).resolve()
    (out / "results").mkdir(parents=True, exist_ok=True)
    log = Log(out / "gpu-check.log")
    log.say(f"stage {a.stage}{' (dry run)' if a.dry_run else ''}; output in {out}")
    if not a.dry_run and a.stage != "install":
        import torch
        if not torch.cuda.is_available():
            log.say("no CUDA device visible to torch: use --dry-run on CPU")
            return 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-cwd-") as workdir:   # not the repository root
        for name, spec in steps(a.stage, out, a.wheel):
            status, seconds, last = run_step(log, name, spec, workdir, a.dry_run)
            rows.append((name, "GPU" if spec.get("gpu") else "host", status, seconds, last))
    table = ["| step | on | status | seconds | last line |", "|---|---|---|---|---|"]
    table += [f"| {n} | {on} | {s} | {sec:.0f} | {last[:120].replace('|', '/')} |" for n, on, s, sec, last in rows]
    (out / "gpu-check.md").write_text("\n".join(table) + "\n")
    failed = sum(not s.endswith("ok") for _, _, s, _, _ in rows)
    log.say(f"log {out / 'gpu-check.log'}, table {out / 'gpu-check.md'}, results {out / 'results'}")
    print("\n".join(table))          # the headline rows, last
    return failed


if __name__ == "__main__":
    sys.exit(main())
