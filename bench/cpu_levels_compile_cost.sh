#!/usr/bin/env bash
# What the instruction-set levels cost in compile time (bench/results/cpu_levels.md): the CPU
# seconds (user + sys; less sensitive than wall time to other jobs on a shared machine) of
# compiling one generated kernel unit of each encoding, per variant, with ape_kernels' flags:
#   native      the single unit of the build before CPU dispatch (-march=native, fp32 + fp64)
#   baseline    the baseline unit now (fp32 + fp64, the dispatcher)
#   avx2        an avx2 unit now (fp32 only: fp64 is compiled at the baseline only)
#   avx512      an avx512 unit now (fp32 only)
#   avx2_f64    an avx2 unit if it also instantiated fp64 (cpu/kernel_entry.h patched in a copy)
#   avx512_f64  the same for avx512
#
#   bench/cpu_levels_compile_cost.sh BUILD [REPEATS [ENCODINGS...]]
#
# BUILD is a build folder whose generated/NAME_cpu.cpp exist (scripts/build.sh ape_kernels).
# Prints one line per compile and the mean per variant; the per-encoding cost of a build is
# baseline + avx2 + avx512 (now), native (before), baseline + avx2_f64 + avx512_f64 (fp64 at
# every level).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: bench/cpu_levels_compile_cost.sh BUILD [REPEATS [ENCODINGS...]]}
repeats=${2:-2}
shift $(( $# > 1 ? 2 : 1 ))
encodings=("$@")
[ ${#encodings[@]} -gt 0 ] || encodings=(rope alibi cable expe t5 fire nope forget_gate)
cxx=${CXX:-c++}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$root/kernels/include" "$work/include_f64"
sed -i -z 's|&attention_backward<Enc, float>,\n *nullptr,\n *nullptr,|\&attention_backward<Enc, float>, \&attention_forward<Enc, double>, \&attention_backward<Enc, double>,|' \
  "$work/include_f64/ape/cpu/kernel_entry.h"
grep -q 'attention_backward<Enc, float>, &attention_forward<Enc, double>' \
  "$work/include_f64/ape/cpu/kernel_entry.h" ||
  { echo "could not patch cpu/kernel_entry.h for the fp64 variants" >&2; exit 1; }
flags=(-O3 -DNDEBUG -fno-math-errno -Wno-unused-parameter -fopenmp -std=gnu++17)
inc=(-I"$root/kernels/include")
echo "# $("$cxx" --version | head -1); load $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq "$repeats"); do
  for enc in "${encodings[@]}"; do
    src="$build/generated/${enc}_cpu.cpp"
    [ -f "$src" ] || { echo "$src is missing: build ape_kernels first" >&2; exit 1; }
    for v in native baseline avx2 avx512 avx2_f64 avx512_f64; do
      case $v in
        native) args=("${inc[@]}" -march=native) ;;
        baseline) args=("${inc[@]}" -DAPE_KERNEL_LEVELS=7) ;;
        avx2) args=("${inc[@]}" -DAPE_KERNEL_LEVELS=7 -DAPE_KERNEL_LEVEL=1) ;;
        avx512) args=("${inc[@]}" -DAPE_KERNEL_LEVELS=7 -DAPE_KERNEL_LEVEL=2) ;;
        avx2_f64) args=(-I"$work/include_f64" -DAPE_KERNEL_LEVELS=7 -DAPE_KERNEL_LEVEL=1) ;;
        avx512_f64) args=(-I"$work/include_f64" -DAPE_KERNEL_LEVELS=7 -DAPE_KERNEL_LEVEL=2) ;;
      esac
      /usr/bin/time -f "$rep $enc $v %U %S" -o "$work/t" "$cxx" "${flags[@]}" "${args[@]}" -c "$src" -o "$work/x.o"
      cat "$work/t" | tee -a "$work/all"
    done
  done
done
echo "# mean CPU seconds per unit:"
awk '{u[$3] += $4 + $5; n[$3]++} END {for (v in u) printf "%-11s %.2f\n", v, u[v] / n[v]}' "$work/all" | sort
