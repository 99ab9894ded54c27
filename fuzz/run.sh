#!/usr/bin/env bash
# Fuzzes apec for a given time (fuzz/README.md):
#   fuzz/run.sh SECONDS [libFuzzer options...]
# Builds the fuzz build (./build-fuzz, or $APE_FUZZ_BUILD_DIR: clang, ASan + UBSan, the MLIR side
# only) if needed, gathers the seed corpus (every spec of examples/encodings and every case of
# the lit suites, split at `// -----`: valid specs and the invalid-spec corpus), then runs
# apec-fuzzer on one core for SECONDS. The corpus it grows is kept in build-fuzz/corpus and
# reused by the next run; a crashing input is written to build-fuzz/crash-*. Exit status 0 when
# no crash, leak, sanitizer report or hang (timeout 10 s per input) was found.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:?usage: fuzz/run.sh SECONDS [libFuzzer options...]}
shift
build=${APE_FUZZ_BUILD_DIR:-build-fuzz}
cxx=${APE_FUZZ_CXX:-$(command -v clang++-19 || command -v clang++-14 || command -v clang++ || true)}
cc=${cxx/clang++/clang}
[ -n "$cxx" ] || { echo "[fuzz] error: no clang++ (scripts/install-deps.sh installs clang)" >&2; exit 1; }

if [ ! -f "$build/build.ninja" ]; then
  # Every MLIR-side library is instrumented for coverage (fuzzer-no-link) and checked by ASan
  # and UBSan (any undefined behaviour aborts); the fuzzer links libFuzzer's main.
  # -O1 with assertions on (no NDEBUG): MLIR's cast<> and our asserts abort on a broken
  # invariant, which the fuzzer then reports.
  flags="-O1 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
  flags+=" -fno-omit-frame-pointer -gline-tables-only"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE= -DAPE_FUZZ=ON \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DMLIR_DIR=/usr/lib/llvm-19/lib/cmake/mlir >/dev/null
fi
cmake --build "$build" --target apec-fuzzer -- -j"$(nproc)" | tail -1

# Seeds: the example specs, and every `// -----` case of the lit suites (RUN and CHECK lines
# are comments to the parser).
seeds="$build/seeds"
rm -rf "$seeds"
mkdir -p "$seeds" "$build/corpus"
cp examples/encodings/*.mlir "$seeds/"
for f in $(find test/lit -name '*.mlir' | sort); do
  awk -v out="$seeds/$(echo "${f#test/lit/}" | tr '/' '_')" '
    /^\/\/ -----/ { n++; next }
    { print > (out "." n ".mlir") }' "$f"
done
echo "[fuzz] $(ls "$seeds" | wc -l) seeds, $(ls "$build/corpus" | wc -l) inputs in the corpus; ${seconds} s"

# One job on one core; -timeout: an input that takes over 10 s is a hang; -max_len: specs up to
# 8 KB (the largest example is ~2 KB). ASan's leak check runs at exit.
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
  "$build/fuzz/apec-fuzzer" -max_total_time="$seconds" -timeout=10 -max_len=8192 \
    -dict=fuzz/mlir.dict -print_final_stats=1 -artifact_prefix="$build/" \
    "$@" "$build/corpus" "$seeds"
