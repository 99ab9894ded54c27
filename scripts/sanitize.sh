#!/usr/bin/env bash
# The test suites under AddressSanitizer and UndefinedBehaviorSanitizer (docs/reliability.md):
# builds everything into ./build-asan (or $APE_ASAN_BUILD_DIR) with
#   -fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined
# (any memory error or undefined behaviour stops the test that hit it), then runs the lit suites
# (apec, ape-opt), the GoogleTest suites (template, kernels, runtime, the kill -9 resume loop) and
# the framework suite (apec's emitted libraries, built by that suite's own project without
# sanitizers and loaded into Python). CUDA is off: nvcc does not pass the sanitizers to device
# code, and the CUDA suite needs no sanitizer to check what it checks. Not part of
# scripts/test.sh: a sanitized build and run take several times the plain ones.
#
#   scripts/sanitize.sh              build and run everything
#   scripts/sanitize.sh -R runtime   only the ctest suites matching a regex (and lit)
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
build=${APE_ASAN_BUILD_DIR:-build-asan}
venv=${APE_VENV:-$PWD/.venv}
python="$venv/bin/python"
[ -x "$python" ] || { echo "[ape] error: no $python: run scripts/install-deps.sh first" >&2; exit 1; }
if [ ! -f "$build/build.ninja" ]; then
  # vptr is off: Debian's libLLVM/libMLIR keep their classes' type information to themselves, so
  # UBSan's dynamic-type check misreads every call on an LLVM object made from our code.
  flags="-fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined"
  flags+=" -fno-omit-frame-pointer"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAPE_ENABLE_CUDA=OFF \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DMLIR_DIR=/usr/lib/llvm-19/lib/cmake/mlir \
    -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-19/build/utils/lit/lit.py \
    -DAPE_PYTHON="$python" \
    -DCMAKE_PREFIX_PATH="$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')" || exit 1
fi
cmake --build "$build" -- -j"$(nproc)" || exit 1

# Leaks: LibTorch and MLIR keep process-lifetime registries on purpose; sanitize.supp names
# them, every other leak fails. A sanitizer report is printed with its stack and fails the test.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/scripts/sanitize.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
status=0
echo "[ape] lit suites under ASan/UBSan"
/usr/bin/python3 /usr/lib/llvm-19/build/utils/lit/lit.py -sv "$build/test/lit" || status=1
echo "[ape] GoogleTest suites and the resume loop under ASan/UBSan"
# Left out: cpu_levels_isa reads the instruction sets of the kernels' object code, which the
# sanitizers' instrumentation changes, and cpu_levels_qemu runs the probe under qemu-x86_64, which
# cannot map ASan's shadow memory; both run in scripts/test.sh's plain build.
(cd "$build" && ctest -E '^(lit|cpu_levels_isa|cpu_levels_qemu)$' --output-on-failure -j2 --timeout 3600 "$@") ||
  status=1
if [ $# -eq 0 ]; then
  echo "[ape] framework suite (apec under ASan/UBSan emits the libraries)"
  # The emitted libraries are built without sanitizers and loaded into an uninstrumented
  # Python: only apec runs sanitized here.
  ASAN_OPTIONS=detect_leaks=0 test/python/run.sh "$build/framework-tests" "$build/tools/apec" -- -q || status=1
fi
echo "[ape] sanitized suites finished in $(( $(date +%s) - start )) s: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
