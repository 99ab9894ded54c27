#!/usr/bin/env bash
# Installs the Debian 12 packages APE needs, if any is missing. Safe to re-run.
set -euo pipefail
packages=(
  cmake ninja-build g++ pkg-config xz-utils
  libmlir-19-dev mlir-19-tools llvm-19-dev llvm-19-tools   # MLIR 19, FileCheck, lit
  libtorch-dev libopenblas0                                # LibTorch 1.13 (CPU) + fast BLAS
  libsentencepiece-dev libgtest-dev nlohmann-json3-dev libcli11-dev
  python3-torch python3-pytest
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "[ape] all Debian packages present"
  exit 0
fi
echo "[ape] installing: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
