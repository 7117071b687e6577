#!/usr/bin/env bash
# Builds the libFuzzer harness against the C++ core (every csrc/*.cpp but the Python-facing
# bindings.cpp and py_*.cpp) with AddressSanitizer + UndefinedBehaviorSanitizer.  Usage: csrc/fuzz/build.sh [OUT_DIR]
# Output: OUT_DIR/fuzz_tokenizer (default OUT_DIR: build/fuzz).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build/fuzz}
mkdir -p "$out"
CXX=${CXX:-clang++}
srcs=$(ls csrc/*.cpp | grep -v -e '/bindings\.cpp$' -e '/py_[a-z_]*\.cpp$' | sort)
# -O1 -g: readable stacks at a useful speed; UB aborts (no recover) so libFuzzer records it.
flags="-std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -Icsrc -pthread"
# One object per source, in parallel (2 cores in CI), then one link.
pids=()
for s in $srcs csrc/fuzz/fuzz_tokenizer.cpp; do
    o="$out/$(basename "${s%.cpp}").o"
    if [ ! -f "$o" ] || [ "$s" -nt "$o" ] || [ -n "$(find csrc -maxdepth 1 -name '*.h' -newer "$o")" ]; then
        $CXX $flags -c "$s" -o "$o" &
        pids+=($!)
    fi
done
for p in "${pids[@]}"; do wait "$p"; done
$CXX $flags "$out"/*.o -o "$out/fuzz_tokenizer"
echo "$out/fuzz_tokenizer"
