#!/usr/bin/env bash
# ape-cuda-traffic built against the kernel headers of another revision: the "before" columns of
# bench/results/cuda_traffic.md (bench/README.md).
#
#   bench/cuda_traffic_at.sh REV OUT [ENCODING...]      (default encodings: nope rope alibi t5 cable xpos)
#   OUT --T 1024 ...                                    (then run it as ape-cuda-traffic)
#
# Needs a configured build (./build, or $APE_BUILD_DIR) with the emulated kernels built (its
# generated sources and libape_simt.a): the kernels of REV are compiled from the same generated
# variant sources, with REV's kernels/include, the instrumentation flags of ape_simt_kernels, and
# linked with this tree's emulator and bench/cuda_traffic.cpp.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,11p' "$0"; exit 2; }
rev=$1 out=$2
shift 2
encodings=("$@")
[ ${#encodings[@]} -gt 0 ] || encodings=(nope rope alibi t5 cable xpos)
root=$(cd "$(dirname "$0")/.." && pwd)
build=${APE_BUILD_DIR:-$root/build}
gen=$build/generated/simt
[ -d "$gen/cpp" ] && [ -f "$build/kernels/libape_simt.a" ] ||
  { echo "cuda_traffic_at.sh: build the emulated kernels first (scripts/build.sh ape-cuda-traffic)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$root" archive "$rev" kernels/include | tar -x -C "$work"
old=$work/kernels/include
# A revision from before the headers moved into folders (ape/cuda_attention.cuh, ...): the
# generated sources include the new paths, so give them shims that include the old ones.
for pair in cuda/attention.cuh=cuda_attention.cuh cuda/kernel_entry.h=cuda_kernel_entry.h; do
  new=${pair%%=*} was=${pair#*=}
  if [ ! -f "$old/ape/$new" ] && [ -f "$old/ape/$was" ]; then
    mkdir -p "$(dirname "$old/ape/$new")"
    printf '#pragma once\n#include "ape/%s"\n' "$was" > "$old/ape/$new"
  fi
done
flags=(-DAPE_SIMT -DBOOST_ALL_NO_LIB -DBOOST_CONTEXT_DYN_LINK -I"$gen" -I"$old" -O2 -g0
       -fno-sanitize=all -fsanitize=thread --param=tsan-instrument-func-entry-exit=0
       -Wno-unused-parameter -Wno-psabi -std=gnu++17)
objs=() decls="" entries=""
for e in "${encodings[@]}"; do
  [ -f "$gen/cpp/${e}_cuda.cpp" ] || { echo "cuda_traffic_at.sh: no emulated kernels for '$e' in $build" >&2; exit 1; }
  for src in "$gen/cpp/${e}_cuda.cpp" "$gen/cpp/${e}_cuda_"*.cpp; do
    obj=$work/$(basename "$src" .cpp).o
    c++ "${flags[@]}" -c "$src" -o "$obj" &
    objs+=("$obj")
  done
  wait
  decls+="extern \"C\" const ape::cuda::CudaKernelEntry *APE_CUDA_ENTRY($e)();"$'\n'
  entries+="APE_CUDA_ENTRY($e)(), "
done
cat > "$work/registry.cpp" <<EOR
#include "ape/cuda/kernel_entry.h"
$decls
namespace ape::cuda {
APE_CUDA_ABI_BEGIN
const CudaKernelEntry *const *cuda_kernel_registry(size_t *count) {
  static const CudaKernelEntry *const entries[] = {$entries nullptr};
  *count = ${#encodings[@]};
  return entries;
}
APE_CUDA_ABI_END
}  // namespace ape::cuda
EOR
c++ -DAPE_SIMT -I"$old" -std=gnu++17 -O2 -c "$work/registry.cpp" -o "$work/registry.o"
c++ -DAPE_SIMT -I"$root/kernels/include" -std=gnu++17 -O2 -c "$root/bench/cuda_traffic.cpp" -o "$work/bench.o"
c++ -rdynamic "$work/bench.o" "$work/registry.o" "${objs[@]}" "$build/kernels/libape_simt.a" \
  -lboost_context -ldl -lpthread -o "$out"
echo "built $out: ape-cuda-traffic with the kernels of $rev"
