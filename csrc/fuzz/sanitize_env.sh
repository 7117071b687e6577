#!/usr/bin/env bash
# Builds an ASan+UBSan copy of fastbert._C (setup.py's FASTBERT_SANITIZE=1) with clang in a copy of
# the tree, leaving the normal build untouched, and writes DIR/env.sh, which sets PYTHONPATH (so
# `import fastbert` is the copy), LD_PRELOAD (clang's ASan runtime, which must come first in a
# python process) and the sanitizer options.        Usage: csrc/fuzz/sanitize_env.sh DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$(realpath -m "$1")
py=${PYTHON:-.venv/bin/python}
case $py in /*) ;; */*) py=$PWD/$py ;; esac  # absolute (a venv path is kept as is, not resolved)
mkdir -p "$dir"
# The sources only: setup.py, csrc/, the package, kernels (fastbert.kernels) and tests/ (run from the copy).
tar cf - --exclude='*.so' --exclude=__pycache__ setup.py pyproject.toml README.md csrc/*.cpp csrc/*.h fastbert kernels tests \
    | tar xf - -C "$dir"
runtime=$(clang++ -print-file-name=libclang_rt.asan-x86_64.so)
[ -f "$runtime" ] || { echo "no ASan runtime at $runtime" >&2; exit 1; }
(cd "$dir" && FASTBERT_SANITIZE=1 CC=clang CXX=clang++ LDSHARED="clang++ -shared" \
    "$py" setup.py -q build_ext --inplace -j 2 >/dev/null)
ls "$dir"/fastbert/_C*.so >/dev/null
symbolizer=$(command -v llvm-symbolizer || ls /usr/lib/llvm-*/bin/llvm-symbolizer 2>/dev/null | tail -1 || true)
cat > "$dir/env.sh" <<ENV
export PYTHONPATH="$dir\${PYTHONPATH:+:\$PYTHONPATH}"
export LD_PRELOAD="$runtime"
# Leaks: off here, because CPython and torch keep memory to the end on purpose; leak_check.sh runs
# LeakSanitizer and counts only the leaks whose stack goes through fastbert's own code.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_odr_violation=0:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export ASAN_SYMBOLIZER_PATH="$symbolizer"
ENV
echo "$dir/env.sh"
