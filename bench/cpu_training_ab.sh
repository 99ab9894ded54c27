#!/usr/bin/env bash
# Tokens per second of ape-train binaries and OpenMP settings, alternated in rounds on the same
# machine (bench/results/cpu_training.md):
#   bench/cpu_training_ab.sh [--rounds N] [--steps N] [--pair] NAME=BINARY[:ENV=VALUE[@ENV=VALUE...]] ...
# Each variant trains RoPE with ape-train's default model for --steps steps (default 150) and
# reports the steady rate ("after step 5"). --pair runs two copies of each variant at once (the
# cores shared by two trainings). A variant's ENV settings are given to its process (e.g.
# GOMP_SPINCOUNT=0); prints one line per run and a median per variant.
set -euo pipefail
rounds=3 steps=150 pair=0
variants=()
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --pair) pair=1; shift ;;
    *) variants+=("$1"); shift ;;
  esac
done
[ ${#variants[@]} -gt 0 ] || { sed -n '2,9p' "$0"; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
one() {  # binary env-list out-dir -> tok/s
  local bin=$1 envs=$2 out=$3
  env ${envs//@/ } "$bin" -e rope --steps "$steps" --out "$out" --eval-multiples 1 --eval-tokens 2048 2>&1 |
    grep -E "after step" | grep -o "[0-9]* tok/s" | cut -d' ' -f1
}
for ((r = 1; r <= rounds; r++)); do
  for v in "${variants[@]}"; do
    name=${v%%=*} rest=${v#*=}
    bin=${rest%%:*} envs=""
    [ "$rest" != "$bin" ] && envs=${rest#*:}
    if [ $pair = 1 ]; then
      one "$bin" "$envs" "$work/a" > "$work/ra" & one "$bin" "$envs" "$work/b" > "$work/rb" & wait
      tps="$(cat "$work/ra") $(cat "$work/rb")"
    else
      tps=$(one "$bin" "$envs" "$work/a")
    fi
    echo "round $r  $name  $tps"
    echo "$name $tps" >> "$work/all"
  done
done
echo "median tokens/s per process:"
for v in "${variants[@]}"; do
  name=${v%%=*}
  grep "^$name " "$work/all" | cut -d' ' -f2- | tr ' ' '\n' | sort -n |
    awk -v n="$name" '{a[NR]=$1} END {printf "  %-24s %d (%d runs)\n", n, (NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2), NR}'
done
