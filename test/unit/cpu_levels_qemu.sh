#!/usr/bin/env bash
# The kernels of ape_kernels on CPUs older than this one, emulated by qemu-x86_64 (user mode):
#   - Haswell (AVX2 + FMA, no AVX-512): the dispatcher must choose avx2 by itself, and the
#     results must match a native run forced to avx2 (APE_CPU_LEVEL=avx2);
#   - Nehalem (SSE4.2, no AVX): baseline, against a native baseline run;
#   - APE_CPU_LEVEL=avx512 on the emulated Haswell: refused with a message, exit status 1.
# An AVX-512 (or, on Nehalem, any AVX) instruction reached on those paths would stop the run with
# SIGILL. QEMU 7.2's TCG emulates AVX2 and FMA but not AVX-512.
#
#   cpu_levels_qemu.sh QEMU PROBE WORKDIR     (ctest: cpu_levels_qemu; exit 77 = skipped)
set -euo pipefail
qemu=$1 probe=$2 work=$3
mkdir -p "$work"
runnable=$("$probe" --levels | sed -n 's/^runnable: //p')
echo "host runs: $runnable"

# emulate CPU LEVEL: the emulated CPU must choose LEVEL and match the host forced to it.
emulate() {
  local cpu=$1 level=$2
  if [[ ", $runnable," != *", $level,"* ]]; then
    echo "this host cannot run $level: no native run to compare the emulated $cpu with" >&2
    exit 77
  fi
  echo "== native, APE_CPU_LEVEL=$level"
  APE_CPU_LEVEL=$level OMP_NUM_THREADS=2 "$probe" --write "$work/$level.bin"
  echo "== qemu-x86_64 -cpu $cpu (APE_CPU_LEVEL unset)"
  env -u APE_CPU_LEVEL OMP_NUM_THREADS=2 "$qemu" -cpu "$cpu" "$probe" --compare "$work/$level.bin" \
    --expect-level "$level"
}
emulate Haswell avx2
emulate Nehalem baseline

echo "== qemu-x86_64 -cpu Haswell, APE_CPU_LEVEL=avx512 (must be refused)"
set +e
out=$(APE_CPU_LEVEL=avx512 "$qemu" -cpu Haswell "$probe" --write "$work/refused.bin" 2>&1)
rc=$?
set -e
echo "$out"
if [[ $rc -ne 1 || "$out" != *"APE_CPU_LEVEL=avx512: this CPU cannot run AVX-512"* ]]; then
  echo "FAIL: expected exit status 1 and the refusal message, got status $rc" >&2
  exit 1
fi
echo "PASS"
