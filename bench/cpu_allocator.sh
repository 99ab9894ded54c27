#!/usr/bin/env bash
# The tools' allocator setting (runtime/Util.h, tune_allocator): one small CPU training run of the
# study's model (d 128, 2 layers, L 128, batch 16, vocab 4096, 60 steps, one thread) with glibc's
# default large-block handling (a GLIBC_TUNABLES malloc setting, which turns the tools' setting off)
# and with the tools' own; page faults and CPU time from `perf stat`, the losses to compare.
#   bench/cpu_allocator.sh [BUILD] > bench/results/cpu_allocator.md
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
command -v perf >/dev/null || { echo "needs perf (linux-perf)" >&2; exit 1; }
echo "# CPU training: glibc's default large-block handling against the tools' (tune_allocator)"
echo
echo "Command: \`bench/cpu_allocator.sh\`; machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
echo "(other jobs may run beside it: CPU time, not wall time, is the figure). $(date -u +%Y-%m-%d)."
echo
echo "| allocator | page faults | CPU time (s) | loss first -> last 20 steps |"
echo "| --- | --- | --- | --- |"
for mode in default tools; do
  out=$(mktemp -d)
  tun=""; [ $mode = default ] && tun="glibc.malloc.perturb=0"
  stats=$(GLIBC_TUNABLES=$tun perf stat -x, -e page-faults,task-clock "$build/tools/ape-train" -e rope --seed 1 \
    --steps 60 --seq-len 128 --batch 16 --d-model 128 --layers 2 --heads 4 --vocab 4096 --eval-multiples 1 \
    --eval-tokens 256 --checkpoint-minutes 0 --out "$out" --data data/pg30 --cache-dir "$build/cache" --threads 1 2>&1)
  faults=$(grep ',page-faults,' <<<"$stats" | cut -d, -f1)
  cpu=$(grep ',task-clock,' <<<"$stats" | cut -d, -f1)
  loss=$(grep -o 'loss [0-9.]* -> [0-9.]*' <<<"$stats" | head -1 | sed 's/loss //')
  label="glibc default (GLIBC_TUNABLES set)"; [ $mode = tools ] && label="the tools' (256 MB mmap threshold)"
  printf '| %s | %s | %.1f | %s |\n' "$label" "$faults" "$(echo "$cpu / 1000" | bc -l)" "$loss"
  rm -rf "$out"
done
