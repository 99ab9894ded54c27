#!/usr/bin/env bash
# README command 1: install what is missing, build, compile every spec in
# examples/encodings, train a small decoder LM with RoPE and Cable on the shipped
# books, and print the extrapolation table (loss / perplexity at 1x..8x the
# training length). Extra arguments go to ape-train (e.g. --minutes 1, --encoding alibi); RoPE
# and Cable stay the encodings unless they name others (--encoding, --spec, --resume).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/install-deps.sh
scripts/build.sh apec ape-train ape-eval
build=${APE_BUILD_DIR:-build}
echo "[ape] specs compiled: $(ls "$build"/generated/*_cpu.cpp | xargs -n1 basename | sed 's/_cpu.cpp//' | tr '\n' ' ')"
args=("$@")
chosen=0
for a in "${args[@]}"; do
  case $a in
    -e | -e* | --encoding | --encoding=* | --spec | --spec=* | --resume | --resume=* | --list | -h | --help) chosen=1 ;;
  esac
done
if [ $chosen = 0 ]; then
  args=(--encoding rope --encoding cable "${args[@]}")
fi
"$build"/tools/ape-train "${args[@]}" --out "$build/run" --cache-dir "$build/cache" --data data/pg30
echo "[ape] results: $build/run/results.csv; whole run took $(( $(date +%s) - start )) s"
