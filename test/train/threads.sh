#!/usr/bin/env bash
# Training is bitwise the same on any thread count (docs/reliability.md) at ape-train's default
# shape (d 128, 2 layers, vocabulary 4,096, batch 16, L 128), where MKL's matrix products split
# their sums by the thread count unless the tools set MKL_CBWR=AUTO,STRICT (runtime/Threads.h,
# prepare_threads): three steps of RoPE on 1, 2 and 3 threads log the same digest of every
# gradient and parameter after every step (APE_TEST_STEP_DIGEST=1). The 2-thread run starts
# without OMP_WAIT_POLICY (the tools' re-exec sets it and MKL_CBWR), the others with it (MKL_CBWR
# set without a re-exec). A run on 2 threads with MKL_CBWR=AUTO (MKL without its strict mode) is
# reported, not required to differ: on the 2-core Xeon it does, from the first step.
# Usage: threads.sh APE_TRAIN CACHE_DIR WORK_DIR
set -euo pipefail
train=$1 cache=$2 work=$3
rm -rf "$work"
mkdir -p "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
run() {  # name threads [env...]
  local name=$1 threads=$2
  shift 2
  env "$@" APE_TEST_STEP_DIGEST=1 "$train" -e rope --steps 3 --threads "$threads" --cache-dir "$cache" \
    --eval-multiples 1 --eval-tokens 128 --out "$work/$name" > "$work/$name.log" 2>&1 ||
    { cat "$work/$name.log"; fail "training on $threads thread(s)"; }
  grep '^\[digest\]' "$work/$name.log" > "$work/$name.digest"
  [ "$(wc -l < "$work/$name.digest")" = 3 ] || fail "$name: no step digests"
}
run t1 1 -u MKL_CBWR OMP_WAIT_POLICY=passive
run t2 2 -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u MKL_CBWR -u APE_NO_REEXEC
run t3 3 -u MKL_CBWR OMP_WAIT_POLICY=passive
for n in t2 t3; do
  cmp -s "$work/t1.digest" "$work/$n.digest" || {
    diff "$work/t1.digest" "$work/$n.digest" | head -c 600
    fail "1 and ${n#t} threads trained differently"
  }
done
run c2 2 OMP_WAIT_POLICY=passive MKL_CBWR=AUTO
if cmp -s "$work/t1.digest" "$work/c2.digest"; then same="the same"; else same="other"; fi
echo "PASS: 1, 2 and 3 threads gave the same bits for 3 steps; MKL_CBWR=AUTO on 2 threads: $same bits"
