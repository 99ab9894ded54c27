#!/usr/bin/env bash
# Installs what APE needs, if anything is missing. Safe to re-run; prints the Python to use.
#   - Debian 12 packages: MLIR/LLVM 19 (FileCheck, lit), SentencePiece, GoogleTest, CLI11, ...
#   - a project virtual environment with the pinned PyTorch from PyPI (its LibTorch is what the
#     runtime, the tools, the tests and the emitted operator libraries build against; see
#     docs/pytorch.md). Default location .venv/ in the checkout; APE_VENV overrides it. A venv
#     that already has the pinned torch is reused as it is (no network).
set -euo pipefail
cd "$(dirname "$0")/.."

# The pinned PyTorch (docs/pytorch.md says why this one) and the Python packages of the tests.
torch_pin="torch==2.15.0"
python_packages=(numpy pytest expecttest sentencepiece)  # sentencepiece: scripts/ape_spm.py's test

packages=(
  cmake ninja-build g++ pkg-config xz-utils
  ccache                  # compiler cache: a clean checkout reuses earlier builds' objects
  libmlir-19-dev mlir-19-tools llvm-19-dev llvm-19-tools   # MLIR 19, FileCheck, lit
  libopenblas0                                             # fast BLAS for the fp64 references
  libsentencepiece-dev libgtest-dev nlohmann-json3-dev libcli11-dev
  libboost-context-dev                                     # fibers of the SIMT emulator
  libgloo-dev          # Gloo's headers for LibTorch's c10d Gloo header (docs/distributed.md)
  clang libclang-rt-dev                                    # libFuzzer, ASan, UBSan (fuzz/run.sh)
  libomp-dev           # Clang's omp.h: the emitted sources checked against Clang's warnings (lit)
  python3 python3-venv
  qemu-user                    # the kernels on emulated older CPUs (test/unit/cpu_levels_qemu.sh)
  gnuplot-nox                  # the extrapolation study's plot (scripts/study.sh, docs/study.md)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "[ape] all Debian packages present" >&2
else
  echo "[ape] installing: ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

venv=${APE_VENV:-$PWD/.venv}
py="$venv/bin/python"
want=${torch_pin#torch==}
have=$("$py" -c 'import torch, sys; sys.stdout.write(torch.__version__.split("+")[0])' 2>/dev/null || true)
if [ "$have" != "$want" ] || ! "$py" -c 'import numpy, pytest, expecttest, sentencepiece' 2>/dev/null; then
  echo "[ape] PyTorch $want into $venv (first time: a few GB from PyPI; pip's cache makes it quick afterwards)" >&2
  [ -x "$py" ] || /usr/bin/python3 -m venv "$venv" >&2
  "$py" -m pip install -q --disable-pip-version-check "$torch_pin" "${python_packages[@]}" >&2
  have=$("$py" -c 'import torch, sys; sys.stdout.write(torch.__version__.split("+")[0])')
  [ "$have" = "$want" ] || { echo "[ape] error: $venv has torch $have, wanted $want" >&2; exit 1; }
else
  echo "[ape] PyTorch $have present in $venv" >&2
fi
