#!/usr/bin/env bash
# nvcc compiles a CUDA variant within a bounded footprint (test/cuda/cuda_tests.cmake runs it on
# FIRE, and on ExQPE for the kernels only q/k mods with parameters instantiate). For FIRE, an
# expensive score mod (issue 31):
# FIRE's bf16 head-dim-128 variant (its MLP of the distance and ~100 gradient sinks, the largest
# unit of the example specs; bench/results/cuda_compile_memory.md) under a 4 GiB address-space
# cap and a time limit. Inlined at every element of the unrolled tile loops, the same mod drove
# ptxas past 23 GB; out of line (APE_NOINLINE) it needs about 0.3 GB.
#
#   compile_bounds.sh APEC NVCC KERNELS_INCLUDE ARCH SPEC [CAP_MIB] [LIMIT_S]
set -euo pipefail
apec=$1 nvcc=$2 include=$3 arch=$4 spec=$5 cap_mib=${6:-4096} limit=${7:-600}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
name=$(basename "$spec" .mlir)
"$apec" "$spec" -o "$work" --emit=cuda --cuda-dtypes=bf16 --cuda-head-dims=128 --expect-name "$name"
flags=(-gencode "arch=compute_${arch},code=sm_${arch}")
[ "$arch" = 90a ] && flags+=(-DAPE_CUDA_SM90A)
start=$(date +%s.%N)
set +e
(ulimit -v $((cap_mib * 1024)); timeout "$limit" "$nvcc" -c -O3 -std=c++17 --expt-relaxed-constexpr \
  "${flags[@]}" -I"$include" -I"$work" "$work/${name}_cuda_bf16_hd128.cu" -o "$work/unit.o") \
  >"$work/log" 2>&1
rc=$?
set -e
secs=$(echo "$(date +%s.%N) - $start" | awk '{printf "%.1f", $1 - $3}')
if [ $rc -ne 0 ]; then
  tail -20 "$work/log"
  [ $rc -eq 124 ] && echo "FAIL: ${name} bf16/hd128 sm_${arch} took more than ${limit} s" ||
    echo "FAIL: ${name} bf16/hd128 sm_${arch} did not compile within ${cap_mib} MiB of address space (exit $rc)"
  exit 1
fi
echo "ok: ${name} bf16/hd128 sm_${arch} compiled in ${secs} s under a ${cap_mib} MiB address-space cap"
