#!/usr/bin/env bash
# SIGKILL-and-resume is bit-exact (runtime/Train.h): a small training run is killed with SIGKILL at
# random moments, and once on purpose in the middle of a checkpoint write, each time resumed from its
# last checkpoint with `ape-train --resume`; its final checkpoint must equal, bit for bit, the one of
# the same run never interrupted (model, AdamW moments and steps, random state, losses, data
# position), and no stale temporary may remain.
#
#   kill_loop.sh APE_TRAIN CACHE_DIR WORK_DIR [KILLS]
# The kill times come from $RANDOM seeded by APE_KILL_SEED (default 16): reproducible.
set -uo pipefail
train=$1 cache=$2 work=$3 kills=${4:-8}
here=$(cd "$(dirname "$0")" && pwd)
steps=80
args=(--encoding t5 --steps $steps --d-model 32 --layers 1 --heads 2 --seq-len 32 --batch 4
      --checkpoint-every 1 --eval-multiples 1 --eval-tokens 256 --cache-dir "$cache" --threads 2)
rm -rf "$work"
mkdir -p "$work"
# Every step logs a digest of its batch, gradients and parameters: a difference names its tensor.
export APE_TEST_STEP_DIGEST=1
fail() { echo "kill_loop: FAIL: $*"; exit 1; }

# 1. The reference: the same run, never interrupted (it also warms the corpus cache).
"$train" "${args[@]}" --out "$work/ref" >"$work/ref.log" 2>&1 || { cat "$work/ref.log"; fail "reference run"; }
ckpt="$work/run/t5.ckpt"

# 2. The run, killed and resumed until it finishes.
RANDOM=${APE_KILL_SEED:-16}
mid_write_round=2
killed=0 round=0
while :; do
  round=$(( round + 1 ))
  [ "$round" -le $(( kills + 5 )) ] || fail "the run did not finish after $round rounds"
  if [ -f "$ckpt" ]; then
    # Kept for diagnose(): the checkpoint this round resumes from.
    mkdir -p "$work/start" && cp "$ckpt" "$work/start/$round.ckpt"
    cmd=("$train" --resume "$ckpt" --cache-dir "$cache")
  else
    cmd=("$train" "${args[@]}" --out "$work/run")
  fi
  if [ "$round" -eq "$mid_write_round" ]; then
    # The process kills itself half-way through writing its 3rd checkpoint of this round.
    ( APE_TEST_KILL_DURING_CHECKPOINT=3 "${cmd[@]}" >"$work/round$round.log" 2>&1; exit $? ) 2>/dev/null
    rc=$?
    [ "$rc" -eq 137 ] || fail "round $round: expected a kill during a checkpoint write, got status $rc"
    ls "$ckpt".tmp.* >/dev/null 2>&1 || fail "round $round: no half-written temporary was left"
    echo "round $round: killed during a checkpoint write (a half-written temporary is left)"
    killed=$(( killed + 1 ))
    continue
  fi
  if [ "$killed" -lt "$kills" ]; then
    # Kills follow the run's progress, not the clock (which a loaded or sanitized machine
    # stretches): once the checkpoint reaches a random step ahead (leaving room for the kills
    # still to come), SIGKILL after a random 0-9 ms, which lands in a step or in a write.
    done_steps=$(grep -ao '"step":[0-9]*' "$ckpt" 2>/dev/null | head -1 | cut -d: -f2)
    room=$(( (steps - 10 - ${done_steps:-0}) / (kills - killed + 1) ))
    target=$(( ${done_steps:-0} + 1 + RANDOM % (room > 1 ? room : 1) ))
    ms=$(( RANDOM % 10 ))
    "${cmd[@]}" >"$work/round$round.log" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
      s=$(grep -ao '"step":[0-9]*' "$ckpt" 2>/dev/null | head -1 | cut -d: -f2)
      [ "${s:-0}" -lt "$target" ] || break
      sleep 0.005
    done
    sleep "0.00$ms"
    kill -KILL "$pid" 2>/dev/null
    { wait "$pid"; } 2>/dev/null
  else
    "${cmd[@]}" >"$work/round$round.log" 2>&1
  fi
  rc=$?
  step=$(grep -ao '"step":[0-9]*' "$ckpt" 2>/dev/null | head -1 | cut -d: -f2)
  if [ "$rc" -eq 137 ]; then
    killed=$(( killed + 1 ))
    echo "round $round: SIGKILL ${ms} ms after step $target's checkpoint; checkpoint at step ${step:-none}"
    continue
  fi
  [ "$rc" -eq 0 ] || { cat "$work/round$round.log"; fail "round $round: ape-train exited with status $rc"; }
  echo "round $round: finished (step ${step})"
  # A round meant to be killed that finished first would leave the test checking less.
  [ "$killed" -ge "$kills" ] || fail "the run finished after only $killed of $kills kills"
  break
done

# After a difference: where it starts, and whether resuming from the checkpoint before it does it
# again. The resume that preceded the first differing step runs twice more from a copy of its
# checkpoint: the two agree with the uninterrupted run (the difference came and went: a
# nondeterminism of that process), agree with each other only (the checkpoint itself differs, or
# resuming from it is deterministically different: a restore bug), or disagree (a nondeterminism
# that resuming reproduces).
diagnose() {
  local cmp="$here/compare_checkpoints.py" first loss pick="" pick_step="" f s k logs=() r
  for r in $(seq 1 "$round"); do [ -f "$work/round$r.log" ] && logs+=("$work/round$r.log"); done
  loss=$(/usr/bin/python3 "$cmp" --first-loss-difference "$work/ref/t5.ckpt" "$ckpt")
  # The step digests find a difference that leaves the next losses equal (a parameter's last bits).
  first=$(/usr/bin/python3 "$cmp" --first-digest-difference "$work/ref.log" "${logs[@]}")
  [ "$first" -gt 0 ] || first=$loss
  echo "kill_loop: the first differing loss is step $loss's; the first differing step digest is step $first's"
  if [ "$first" -gt 0 ]; then
    /usr/bin/python3 "$cmp" --digests "$first" "$work/ref.log" "${logs[@]}" | sed 's/^/kill_loop: /'
  fi
  for f in "$work"/start/*.ckpt; do
    [ -f "$f" ] || continue
    s=$(/usr/bin/python3 "$cmp" --step "$f")
    if [ "$first" -gt 0 ] && [ "$s" -lt "$first" ] && { [ -z "$pick_step" ] || [ "$s" -gt "$pick_step" ]; }; then
      pick=$f pick_step=$s
    fi
  done
  [ -n "$pick" ] || { echo "kill_loop: no resume precedes it (the first process's own steps differ)"; return; }
  echo "kill_loop: the last resume before it started from step $pick_step (round $(basename "$pick" .ckpt)); resuming from it twice more:"
  for k in 1 2; do
    rm -rf "$work/diag$k" && mkdir -p "$work/diag$k" && cp "$pick" "$work/diag$k/t5.ckpt"
    "$train" --resume "$work/diag$k/t5.ckpt" --cache-dir "$cache" >"$work/diag$k.log" 2>&1 ||
      { echo "kill_loop: the resume failed:"; tail -5 "$work/diag$k.log"; return; }
  done
  local same12=no same1ref=no
  /usr/bin/python3 "$cmp" "$work/diag1/t5.ckpt" "$work/diag2/t5.ckpt" >/dev/null && same12=yes
  /usr/bin/python3 "$cmp" "$work/ref/t5.ckpt" "$work/diag1/t5.ckpt" >/dev/null && same1ref=yes
  echo "kill_loop: the two resumes agree with each other: $same12; the first agrees with the uninterrupted run: $same1ref"
  echo "kill_loop: first differing loss of the first resume against the uninterrupted run: step" \
       "$(/usr/bin/python3 "$cmp" --first-loss-difference "$work/ref/t5.ckpt" "$work/diag1/t5.ckpt")"
}

# 3. Bit-identical to the uninterrupted run; the stale temporary was cleaned up.
/usr/bin/python3 "$here/compare_checkpoints.py" "$work/ref/t5.ckpt" "$ckpt" || { diagnose; fail "the resumed run differs"; }
if ls "$ckpt".tmp.* >/dev/null 2>&1; then fail "stale temporaries remain: $(ls "$ckpt".tmp.*)"; fi
cmp -s <(grep -v '^\[eval\]' "$work/ref/results.csv") <(grep -v '^\[eval\]' "$work/run/results.csv") ||
  fail "results.csv differs"

# 4. A new run (no --resume) over an unfinished one keeps it: renamed beside it, not replaced.
mkdir -p "$work/keep"
( APE_TEST_KILL_DURING_CHECKPOINT=3 "$train" "${args[@]}" --out "$work/keep" >"$work/keep1.log" 2>&1; exit $? ) 2>/dev/null
old_step=$(grep -ao '"step":[0-9]*' "$work/keep/t5.ckpt" 2>/dev/null | head -1 | cut -d: -f2)
[ -n "$old_step" ] || fail "no unfinished checkpoint to keep"
short=()  # the same run of 2 steps
for a in "${args[@]}"; do [ "$a" = "$steps" ] && short+=(2) || short+=("$a"); done
"$train" "${short[@]}" --out "$work/keep" >"$work/keep2.log" 2>&1 || { cat "$work/keep2.log"; fail "the new run"; }
kept="$work/keep/t5.unfinished-step$old_step.ckpt"
[ -f "$kept" ] || { cat "$work/keep2.log"; fail "the unfinished run (step $old_step) was not kept as $kept"; }
grep -q "kept as $kept" "$work/keep2.log" || fail "no note names $kept"
kept_step=$(grep -ao '"step":[0-9]*' "$kept" | head -1 | cut -d: -f2)
[ "$kept_step" = "$old_step" ] || fail "the kept checkpoint is at step $kept_step, not $old_step"
# ...and over a finished one (the 2-step run's) keeps it until the new run finishes. A new run
# killed during its first checkpoint leaves it aside (Ctrl-C at a new run's start had replaced a
# finished model with one of a single step); one that ends having saved nothing (it diverged) puts
# it back; one stopped after a save leaves it, and the resumed run removes it when it finishes.
finished="$work/keep/t5.finished-step2.ckpt"
( APE_TEST_KILL_DURING_CHECKPOINT=1 "$train" "${short[@]}" --out "$work/keep" >"$work/keep3.log" 2>&1; exit $? ) 2>/dev/null
rc=$?
[ "$rc" -eq 137 ] || { cat "$work/keep3.log"; fail "the run killed during its first checkpoint exited $rc, not 137"; }
[ -f "$finished" ] || { cat "$work/keep3.log"; fail "the finished run was not kept as $finished"; }
grep -q "kept as $finished until this run finishes" "$work/keep3.log" || { cat "$work/keep3.log"; fail "no note names $finished"; }
mv "$finished" "$work/keep/t5.ckpt"
rm -f "$work/keep/t5.ckpt.tmp."*
hot=(--encoding t5 --steps 20 --d-model 32 --layers 1 --heads 2 --seq-len 32 --batch 4 --eval-multiples 1
     --eval-tokens 256 --cache-dir "$cache" --threads 2 --lr 10 --warmup 0 --divergence-factor 1.01)
"$train" "${hot[@]}" --out "$work/keep" >"$work/keep4.log" 2>&1 && { cat "$work/keep4.log"; fail "the hot run did not diverge"; }
grep -q "is the finished run again" "$work/keep4.log" || { cat "$work/keep4.log"; fail "no note of the finished run put back"; }
[ -f "$work/keep/t5.ckpt" ] && [ ! -e "$finished" ] || { ls "$work/keep"; fail "a run that saved nothing left no t5.ckpt"; }
back_step=$(grep -ao '"step":[0-9]*' "$work/keep/t5.ckpt" | head -1 | cut -d: -f2)
[ "$back_step" = 2 ] || fail "the checkpoint put back is at step $back_step, not the finished run's 2"
# (started with a relative --out, resumed from another folder that has a file at that relative
# path: the resumed run removes the finished run beside its checkpoint, never the other file; the
# path as typed had been recorded, and the other file removed)
(cd "$work" && APE_TEST_STOP_AFTER_STEP=1 "$train" "${short[@]}" --out keep >"$work/keep5.log" 2>&1)
rc=$?
[ "$rc" -eq 130 ] && [ -f "$finished" ] || { cat "$work/keep5.log"; fail "a run stopped after its first save: status $rc, or the finished run not kept"; }
grep -q "stays kept as keep/t5.finished-step2.ckpt" "$work/keep5.log" || { cat "$work/keep5.log"; fail "no note that the finished run stays kept"; }
mkdir -p "$work/elsewhere/keep" && echo "a file of the user's" >"$work/elsewhere/keep/t5.finished-step2.ckpt"
(cd "$work/elsewhere" && "$train" --resume "$work/keep/t5.ckpt" >"$work/keep6.log" 2>&1) || { cat "$work/keep6.log"; fail "resuming the stopped run"; }
[ ! -e "$finished" ] || { cat "$work/keep6.log"; fail "the resumed run finished and left $finished"; }
grep -q "removed $finished" "$work/keep6.log" || { cat "$work/keep6.log"; fail "no note of the removal"; }
[ -f "$work/elsewhere/keep/t5.finished-step2.ckpt" ] || fail "the resumed run removed a file at the path as typed in another folder"

# 5. A second run into the folder of a running one is refused (it would replace its checkpoints).
long=()  # the same run, long enough to be running still when the second starts (then stopped)
for a in "${args[@]}"; do [ "$a" = "$steps" ] && long+=(100000) || long+=("$a"); done
"$train" "${long[@]}" --out "$work/lock" >"$work/lock1.log" 2>&1 &
first=$!
for _ in $(seq 1 500); do [ -f "$work/lock/t5.ckpt" ] && break; sleep 0.02; done
[ -f "$work/lock/t5.ckpt" ] || { kill "$first" 2>/dev/null; fail "the first run wrote no checkpoint"; }
"$train" "${short[@]}" --out "$work/lock" >"$work/lock2.log" 2>&1
rc=$?
kill -TERM "$first" 2>/dev/null; wait "$first" 2>/dev/null
[ "$rc" -eq 1 ] || { cat "$work/lock2.log"; fail "a second run into a busy --out exited $rc, not 1"; }
grep -q "is in use by another process" "$work/lock2.log" || { cat "$work/lock2.log"; fail "no reason given"; }

# 6. Ctrl-C during an encoding's evaluation: the next encoding does not start (it would stop at its
# first step and replace its checkpoint); status 130.
sig=()  # 2 steps of t5, then nope, each evaluated on 200000 tokens (seconds: room for the signal)
for a in "${short[@]}"; do [ "$a" = 256 ] && sig+=(200000) || sig+=("$a"); done
set -m  # the background run gets SIGINT as a terminal's Ctrl-C would give it
"$train" "${sig[@]}" --encoding nope --out "$work/sig" >"$work/sig.log" 2>&1 &
run=$!
for _ in $(seq 1 1000); do grep -q "^\[t5\] checkpoint" "$work/sig.log" 2>/dev/null && break; sleep 0.02; done
sleep 0.2
kill -INT "$run"; wait "$run"; rc=$?
set +m
[ "$rc" -eq 130 ] || { cat "$work/sig.log"; fail "Ctrl-C during the evaluation: status $rc, not 130"; }
grep -q "not trained: nope" "$work/sig.log" || { cat "$work/sig.log"; fail "no word of the encoding not trained"; }
[ ! -e "$work/sig/nope.ckpt" ] || fail "the next encoding started after Ctrl-C"
echo "kill_loop: PASS: $killed kills in $round rounds; the resumed run is bit-identical to the uninterrupted one;"
echo "  a new run over an unfinished one kept it ($kept), over a finished one until it finished;"
echo "  a second run into a busy --out was refused;"
echo "  Ctrl-C during an evaluation started no further encoding"
