#!/usr/bin/env bash
# The framework-interop tests (docs/frameworks.md): apec emits the PyTorch operator library of
# every example encoding (examples/encodings/*.mlir) and the C ABI of rope, alibi, cable, expe
# and rope_transition; one CMake project builds them with examples/c (the operators' CUDA kernels for rope and
# cable where PyTorch has CUDA and nvcc is found); pytest checks them (test/python/test_*.py).
#
#   test/python/run.sh WORKDIR [APEC] [-- PYTEST_ARGS...]
#
# With APEC (e.g. build/tools/apec) the folders are emitted into WORKDIR/emitted first; without it
# WORKDIR/emitted must hold them already (a machine without MLIR, e.g. a GPU machine with another
# PyTorch: copy WORKDIR/emitted there). APE_PYTHON is the interpreter whose torch is tested
# (default: the project venv of scripts/install-deps.sh, .venv or $APE_VENV). Exit status: pytest's.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:?usage: test/python/run.sh WORKDIR [APEC] [-- PYTEST_ARGS...]}
shift
apec=""
if [ $# -gt 0 ] && [ "$1" != "--" ]; then apec=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" == "--" ]; then shift; fi
python=${APE_PYTHON:-${APE_VENV:-$root/.venv}/bin/python}
# The C ABIs to emit, the one list of them (CMakeLists.txt builds and test_c_abi.py tests what is
# emitted). Deliberately a subset: the C entry points are the same for every encoding, so one of
# each kind of input (a rotation, a param bias, a token feature, an override with its fixed
# sigma) covers them while keeping the build short, and an inference-only one (the attention
# transition: its args hold the layer, its backward refuses); examples/c uses rope's.
c_abi=(rope alibi cable expe rope_transition)
mkdir -p "$work"
work=$(cd "$work" && pwd)
# An absolute apec: the tests run from test/python (ape.load refuses an APE_APEC it cannot run).
if [ -n "$apec" ]; then apec=$(cd "$(dirname "$apec")" && pwd)/$(basename "$apec"); fi

if [ -n "$apec" ]; then
  for spec in "$root"/examples/encodings/*.mlir; do
    enc=$(basename "$spec" .mlir)
    emit=torch-library
    [[ " ${c_abi[*]} " == *" $enc "* ]] && emit=torch-library,c-abi
    # The CUDA kernels the operators call (compiled for APE_CUDA_ENCODINGS of CMakeLists.txt):
    # one tensor-core and one fp32 variant.
    "$apec" "$spec" -o "$work/emitted" --emit=$emit --cuda-dtypes=bf16,f32 --cuda-head-dims=64 \
      --expect-name "$enc" --source-name "examples/encodings/$enc.mlir"
  done
fi

if [ ! -f "$work/build/CMakeCache.txt" ]; then
  cmake -S "$root/test/python" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS_RELEASE=-O2 -DCMAKE_C_FLAGS_RELEASE=-O2 \
    -DAPE_EMITTED_DIR="$work/emitted" -DAPE_PYTHON="$python" >"$work/configure.log" 2>&1 ||
    { cat "$work/configure.log"; exit 1; }
fi
cmake --build "$work/build" -- -j"$(nproc)"

export APE_TEST_ARTIFACTS="$work/build"
# ape.load (test_ape_load.py): the apec of this run, and a spec cache (scripts/test.sh shares the
# build's, where the tutorial's test built the same library already).
if [ -n "$apec" ]; then export APE_APEC="$apec"; fi
export APE_CACHE_DIR=${APE_CACHE_DIR:-$work/spec-cache}
# One OpenMP thread (APE_PYTEST_THREADS to change it; scripts/test.sh exports OMP_NUM_THREADS=2
# for the GoogleTest suites): the problems are tiny, and on a shared 2-core machine a second
# thread that is not scheduled stalls every call (measured: 9 us per small forward with 1 thread,
# 12 ms with 2 while other processes held the cores).
export OMP_NUM_THREADS=${APE_PYTEST_THREADS:-1}
# torch.compile's caches (compiled kernels, graphs) in the work folder: a fresh WORKDIR measures
# a cold start, as CI does.
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$work/inductor-cache}
cd "$root/test/python"
exec "$python" -m pytest -p no:cacheprovider "$@"
