#!/usr/bin/env bash
# Data-parallel throughput on this machine (runtime/Distributed.h, docs/distributed.md): the same
# training (global batch 2B, ape-train's default model) three ways, and what the all-reduce costs.
#
#   bench/distributed_bench.sh [BUILD] [OUT.md]      (default: build, bench/results/distributed.md)
#
#   one      1 process, 2 threads, --batch 2B              the single-process baseline
#   two      torchrun --nproc-per-node 2, 1 thread each, --batch B each (Gloo on 127.0.0.1)
#   shard    1 process, 1 thread, --batch B                what each rank of `two` computes alone
# two's step time minus shard's is the price of data parallelism: the bucketed gradient all-reduce,
# the per-step agreement and the wait for the slower rank. Each configuration runs REPEATS times;
# the table reports the median tokens/s of ape-train's own summary line (training only).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${1:-$root/build}
out=${2:-$root/bench/results/distributed.md}
train=$build/tools/ape-train
venv=${APE_VENV:-$root/.venv}
torchrun=$venv/bin/torchrun
enc=${APE_BENCH_ENCODING:-rope}
steps=${APE_BENCH_STEPS:-40}
B=${APE_BENCH_BATCH:-8}
repeats=${APE_BENCH_REPEATS:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--encoding "$enc" --steps "$steps" --eval-multiples 1 --eval-tokens 128 --checkpoint-minutes 0
        --cache-dir "$build/cache")

rate() { grep -aoE "\] $steps steps in [0-9.]+ s, [0-9]+ tok/s" "$1" | grep -oE '[0-9]+ tok/s' | cut -d' ' -f1; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
declare -A tps vals
for r in $(seq "$repeats"); do  # interleaved, so that the machine's other load falls on all three
  for what in one two shard; do
    log=$work/$what.$r.log
    case $what in
      one)   "$train" "${common[@]}" --batch $((2 * B)) --threads 2 --out "$work/one" >"$log" 2>&1 ;;
      two)   "$torchrun" --standalone --nproc-per-node 2 --no-python "$train" "${common[@]}" --batch "$B" \
               --threads 1 --out "$work/two" >"$log" 2>&1 ;;
      shard) "$train" "${common[@]}" --batch "$B" --threads 1 --out "$work/shard" >"$log" 2>&1 ;;
    esac
    v=$(rate "$log") || { cat "$log"; echo "distributed_bench: no rate in $what run $r" >&2; exit 1; }
    vals[$what]="${vals[$what]:-} $v"
    if [ "$what" = two ]; then  # rank 0's own measure of the all-reduce (ape-train prints it)
      a=$(grep -aoE 'all-reduce of [0-9]+ KiB: [0-9.]+ ms/step' "$log" | grep -oE '[0-9.]+ ms' | cut -d' ' -f1)
      [ -n "$a" ] || { cat "$log"; echo "distributed_bench: no all-reduce time in run $r" >&2; exit 1; }
      reduce_ms="${reduce_ms:-} $a"
    fi
  done
done
reduce_med=$(printf '%s\n' $reduce_ms | median)
echo "all-reduce:$reduce_ms ms/step (median $reduce_med)"
for what in one two shard; do
  tps[$what]=$(printf '%s\n' ${vals[$what]} | median)
  echo "$what:${vals[$what]} tok/s (median ${tps[$what]})"
done
params=$(grep -aoE "\[$enc\] [0-9]+ parameters; [^,]+, [^,]+, [^,]+, L [0-9]+" "$work/one.1.log" | head -1)
L=$(echo "$params" | grep -oE 'L [0-9]+' | cut -d' ' -f2)
n=$(echo "$params" | grep -oE '[0-9]+ parameters' | cut -d' ' -f1)
global=$((2 * B * L))
# ms per step from tokens/s: global tokens per step / rate (shard: its own B·L tokens).
ms() { awk -v t="$1" -v r="$2" 'BEGIN {printf "%.1f", 1000 * t / r}'; }
step_one=$(ms $global "${tps[one]}") step_two=$(ms $global "${tps[two]}") step_shard=$(ms $((B * L)) "${tps[shard]}")
overhead=$(awk -v a="$step_two" -v b="$step_shard" 'BEGIN {printf "%.1f", a - b}')
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')

cat >"$out" <<EOF
# Data-parallel throughput: 1 process vs 2 (torchrun, Gloo on 127.0.0.1)

Produced by \`bench/distributed_bench.sh\` ($(date -u +%Y-%m-%d), $(nproc) cores: $cpu; the
machine is shared: load average $load_before before, $load_after after; with a load above the
core count every figure here is noisy; the repeats of the three configurations are interleaved). Model: ape-train's default with \`--encoding $enc\`
(${params#*parameters; }, $n parameters, so each step all-reduces $((n * 4 / 1024)) KiB of fp32 gradients),
$steps steps, global batch $((2 * B)) windows of $L tokens. Median of $repeats runs; tokens/s of all
ranks together, from ape-train's summary line (training only, not start-up or evaluation).

Runs (tokens/s): one:${vals[one]}; two:${vals[two]}; shard:${vals[shard]}.

| configuration | command | tokens/s | ms/step |
|---|---|---:|---:|
| one | \`ape-train ${common[*]:0:4} --batch $((2 * B)) --threads 2\` | ${tps[one]} | $step_one |
| two | \`torchrun --standalone --nproc-per-node 2 --no-python ape-train ... --batch $B --threads 1\` | ${tps[two]} | $step_two |
| shard | \`ape-train ... --batch $B --threads 1\` (one rank's share, alone) | ${tps[shard]} | $step_shard |

- two / one: $(awk -v a="${tps[two]}" -v b="${tps[one]}" 'BEGIN {printf "%.2f", a / b}')x. Both use both
  cores: on 2 cores data parallelism adds no compute, it moves the work from threads to processes.
  one's 2 threads meet at every parallel region of every op, two's ranks once a step (the
  all-reduce); on a loaded machine a thread that waits for a descheduled partner loses more than a
  rank does, so this ratio says more about the load than about Gloo (one's step vs shard's, half
  the work on 1 thread: $(awk -v a="$step_one" -v b="$step_shard" 'BEGIN {printf "%.2f", a / b}')x).
- The gradient all-reduce ($((n * 4 / 1024)) KiB, one bucket, loopback TCP), as rank 0 of \`two\`
  measures it (ape-train's "data parallel" line; the wait for the slower rank included): median
  $reduce_med ms/step (runs:$reduce_ms), of a $step_two ms step.
- two's step minus shard's (one rank's work alone): $overhead ms: the all-reduce above plus the two
  ranks competing for the two cores with each other and with whatever else the machine runs.
- Exact command: \`bench/distributed_bench.sh\` (APE_BENCH_ENCODING=$enc APE_BENCH_STEPS=$steps
  APE_BENCH_BATCH=$B APE_BENCH_REPEATS=$repeats).
EOF
echo "-> $out"
