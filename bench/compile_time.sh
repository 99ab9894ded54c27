#!/usr/bin/env bash
# Compile time against the size of a spec (bench/results/compile_time.md):
#   bench/compile_time.sh [APEC] [N...]
# For each N (default 10 100 400) writes a spec of N `ape.fire {hidden = 32}` components and
# measures, best of 3 runs each:
#   lower    apec --emit=manifest: parse, verify, the whole pass pipeline, the (small) manifest
#   diff     -ape-differentiate alone (apec --mlir-timing)
#   default  apec with its default outputs (CPU kernel, manifest, kernel IR)
#   all      every emitter: cpu, manifest, kernel-mlir, torch-library, c-abi, cuda (3 x 3 variants)
# and the size of the default outputs. APEC defaults to build/tools/apec.
set -euo pipefail
cd "$(dirname "$0")/.."
apec=${1:-build/tools/apec}
shift || true
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(10 100 400)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

best() {  # best wall time in seconds of 3 runs of "$@"
  local b=""
  for _ in 1 2 3; do
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >/dev/null 2>&1
    t1=$(date +%s.%N)
    b=$(echo "$t0 $t1 ${b:-1e9}" | awk '{d = $2 - $1; print (d < $3 ? d : $3)}')
  done
  printf '%.2f' "$b"
}

echo "| FIRE components | lower (s) | -ape-differentiate (s) | default outputs (s) | all emitters (s) | default output size | per component (default) |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for n in "${sizes[@]}"; do
  spec="$work/fire$n.mlir"
  { echo "ape.encoding @fire$n {"; for _ in $(seq "$n"); do echo "  ape.fire {hidden = 32}"; done; echo "}"; } >"$spec"
  lower=$(best "$apec" "$spec" -o "$work/m$n" --emit=manifest)
  diff=$("$apec" "$spec" -o "$work/t$n" --emit=manifest --mlir-timing 2>&1 | awk '/ApeDifferentiate/ {print $1; exit}')
  default=$(best "$apec" "$spec" -o "$work/d$n")
  all=$(best "$apec" "$spec" -o "$work/a$n" --emit=cpu,manifest,kernel-mlir,torch-library,c-abi,cuda)
  size=$(du -sb "$work/d$n" | awk '{printf "%.1f MB", $1 / 1e6}')
  per=$(echo "$default $n" | awk '{printf "%.1f ms", 1000 * $1 / $2}')
  printf '| %d | %s | %.2f | %s | %s | %s | %s |\n' "$n" "$lower" "$diff" "$default" "$all" "$size" "$per"
done
