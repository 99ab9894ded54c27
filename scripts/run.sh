#!/usr/bin/env bash
# README command 1: install what is missing, build, compile every spec in
# examples/encodings, train a small decoder LM with RoPE and Cable on the shipped
# books, and print the extrapolation table (loss / perplexity at 1x..8x the
# training length). Extra arguments go to ape-train (e.g. --minutes 1, --encoding alibi); RoPE
# and Cable stay the encodings unless they name others (--encoding, --spec, --resume: a stopped
# run continues with scripts/run.sh --resume build/run/NAME.ckpt, into its own folder).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/install-deps.sh
# (and the tools the README uses next: ape-generate, ape-check, ape-opt)
scripts/build.sh apec ape-train ape-eval ape-generate ape-check ape-opt
build=${APE_BUILD_DIR:-build}
echo "[ape] specs compiled: $(ls "$build"/generated/*_cpu.cpp | xargs -n1 basename | sed 's/_cpu.cpp//' | tr '\n' ' ')"
args=("$@")
chosen=0
out=(--out "$build/run")
cache=(--cache-dir "$build/cache")
data=(--data data/pg30)
where="$build/run/results.csv"
prev=
for a in "${args[@]}"; do
  case $a in
    # its own folders: the ones the checkpoint recorded
    --resume | --resume=*) chosen=1; out=(); cache=(); data=(); where="results.csv beside the checkpoint" ;;
    -e | -e* | --encoding | --encoding=* | --spec | --spec=* | --list | -h | --help) chosen=1 ;;
    # The caller's folders replace these defaults.
    --out) out=() ;;
    --out=*) out=(); where="${a#--out=}/results.csv" ;;
    --cache-dir | --cache-dir=*) cache=() ;;
    --data | --data=*) data=() ;;
  esac
  case $prev in --out) where="$a/results.csv" ;; esac
  prev=$a
done
if [ $chosen = 0 ]; then
  args=(--encoding rope --encoding cable "${args[@]}")
fi
"$build"/tools/ape-train "${args[@]}" "${out[@]}" "${cache[@]}" "${data[@]}"
echo "[ape] results: $where; whole run took $(( $(date +%s) - start )) s"
