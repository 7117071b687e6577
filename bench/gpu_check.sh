#!/usr/bin/env bash
# One prepared check for a machine with a CUDA GPU, in under 10 minutes (the step timeouts add up to
# 590 s when fastbert is already installed; the install step, when needed, adds up to 150 s):
#   1. install fastbert in place (no dependencies when torch, triton and transformers are there);
#   2. the GPU-marked tests, then the kernel tests on CUDA (compiled kernels, not the interpreter);
#   3. python bench/bench_kernels.py (correctness checks + kernel timings, CSV/JSON in bench/results/),
#      then the GPU rows of bench_relative_attention.py and bench_long.py --part attention;
#   4. fastbert bench --device cuda --dtype float16, when the CLI has those flags.
# Every step runs under `timeout`; everything is printed and tee'd into
# bench/results/gpu-check-<UTC date>.log. The exit status is the number of failed steps.
#
#   bash bench/gpu_check.sh            # the full check
#   bash bench/gpu_check.sh --dry-run  # the steps that need no GPU (install check, collection, CLI flags)
set -u -o pipefail

cd "$(dirname "$0")/.."
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
PY=${PYTHON:-python}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p bench/results
LOG=bench/results/gpu-check-$STAMP.log
[ $DRY = 1 ] && LOG=$(mktemp -t gpu-check-dry.XXXXXX.log)
START=$(date +%s)
FAILED=0

say() { echo "[gpu_check $(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }

# step NAME SECONDS COMMAND...: run under timeout, output into the log, count failures
step() {
    local name=$1 limit=$2
    shift 2
    say "== $name (timeout ${limit}s): $*"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ]; then say "-- $name: ok"; else say "-- $name: FAILED (exit $rc)"; FAILED=$((FAILED + 1)); fi
}

say "log: $LOG"
say "host: $(uname -a)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>&1 | tee -a "$LOG"
$PY - <<'EOF' 2>&1 | tee -a "$LOG"
import importlib
for name in ("torch", "triton", "transformers"):
    try:
        mod = importlib.import_module(name)
        print(f"{name} {mod.__version__}")
    except Exception as e:
        print(f"{name} missing ({type(e).__name__})")
import torch
print("cuda available:", torch.cuda.is_available(), "| torch cuda:", torch.version.cuda)
EOF

# 1. install: nothing when this tree is already installed (editable, extension built); else only
#    fastbert itself when its dependencies are present. A dry run never installs (it must not pull a
#    CUDA torch into a CPU machine's Python).
if [ $DRY = 1 ]; then
    say "dry run: no install"
elif $PY -c "import os, sys, fastbert._C, fastbert.kernels as k; sys.exit(os.path.realpath(k.__file__) != os.path.realpath('kernels/__init__.py'))" 2>/dev/null; then
    say "fastbert from this tree is installed, with its extension: no install"
elif $PY -c "import torch, triton, transformers" 2>/dev/null; then
    step "install (no deps)" 150 $PY -m pip install -q --no-build-isolation --no-deps -e .
else
    step "install" 150 $PY -m pip install -q -e ".[test]"
fi
step "import check" 60 $PY -c "import fastbert, fastbert.kernels, fastbert.ops, torch; print(fastbert.__file__); print(sorted(n for n in dir(torch.ops.fastbert) if not n.startswith('_')))"

KERNEL_TESTS="tests/ops/test_attention.py tests/ops/test_relative_attention.py tests/ops/test_sliding_window.py tests/ops/test_rotary.py
    tests/ops/test_bias_gelu.py tests/ops/test_add_layer_norm.py tests/kernels/test_autotune.py tests/test_cuda_graphs.py tests/ops/test_backend.py"
if [ $DRY = 1 ]; then
    step "collect gpu tests" 120 $PY -m pytest -m gpu --collect-only -q --continue-on-collection-errors tests
    step "collect kernel tests" 120 $PY -m pytest --collect-only -q $KERNEL_TESTS
else
    if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        say "no CUDA device visible to torch: nothing to check here (use --dry-run on CPU)"
        exit 1
    fi
    # 2. tests: GPU-marked ones everywhere, then every kernel test on CUDA (device fixture = cuda)
    step "pytest -m gpu" 80 $PY -m pytest -m gpu -q -rs --continue-on-collection-errors tests
    step "kernel tests on CUDA" 170 $PY -m pytest -q -rs -x $KERNEL_TESTS
    # 3. kernel bench: its own budget keeps it inside the timeout (first-call compiles and autotuning)
    step "bench_kernels" 120 $PY bench/bench_kernels.py --budget-s 80
    # 3b. the position-scheme kernels' GPU rows (DeBERTa c2p/p2c vs transformers and FlexAttention;
    #     ModernBERT's local window vs FlexAttention), one repeat each
    step "bench_relative_attention" 60 $PY bench/bench_relative_attention.py --layers 1 --repeats 1
    step "bench_long attention" 50 $PY bench/bench_long.py --part attention --repeats-attention 3
fi

# 4. the CLI bench, when it takes --device and --dtype
if $PY -m fastbert.cli bench --help 2>/dev/null | grep -q -- "--dtype"; then
    if [ $DRY = 1 ]; then
        step "fastbert bench --help" 60 $PY -m fastbert.cli bench --help
    else
        step "fastbert bench" 50 $PY -m fastbert.cli bench --device cuda --dtype float16 --quick
    fi
else
    say "fastbert bench has no --device/--dtype flags here: skipped"
fi

say "done in $(( $(date +%s) - START ))s, $FAILED failed step(s); log: $LOG"
exit $FAILED
