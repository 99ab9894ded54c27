#!/usr/bin/env bash
# Configures and builds into ./build (or $APE_BUILD_DIR): everything, or the targets given.
# LibTorch is the one of the project's PyTorch (scripts/install-deps.sh: .venv, or $APE_VENV).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${APE_BUILD_DIR:-build}
venv=${APE_VENV:-$PWD/.venv}
if [ ! -f "$build/build.ninja" ]; then
  python="$venv/bin/python"
  [ -x "$python" ] || { echo "[ape] error: no $python: run scripts/install-deps.sh first" >&2; exit 1; }
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DMLIR_DIR=/usr/lib/llvm-19/lib/cmake/mlir \
    -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-19/build/utils/lit/lit.py \
    -DAPE_PYTHON="$python" \
    -DCMAKE_PREFIX_PATH="$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
    ${APE_CMAKE_ARGS:-}  # extra cache settings, e.g. APE_CMAKE_ARGS=-DAPE_CUDA_ALL_ENCODINGS=ON
elif [ -n "${APE_CMAKE_ARGS:-}" ]; then
  # An existing build takes new cache settings too (the first configure's stay unless overridden).
  cmake -S . -B "$build" ${APE_CMAKE_ARGS}
fi
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$build" "${targets[@]}" -- -j"$(nproc)"
