#!/usr/bin/env bash
# ape-train --init-from / --set (fine-tuning): a run started from a checkpoint's weights with zero
# steps scores exactly what ape-eval gives that checkpoint evaluated the same way (the weights and
# the fixed param arrive intact); a few steps change the weights, the checkpoint records where it
# started and resumes; bad combinations get a clear error.
# Usage: init_from.sh APE_TRAIN APE_EVAL CACHE_DIR WORK_DIR
set -euo pipefail
train=$1 eval=$2 cache=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
small=(--d-model 32 --layers 1 --heads 2 --vocab 4096 --batch 4 --cache-dir "$cache" --threads 1)

# A RoPE model trained at L = 16.
"$train" -e rope --steps 40 --seq-len 16 "${small[@]}" --eval-multiples 1 --eval-tokens 64 --out "$work/base" \
  > "$work/base.log" 2>&1 || { cat "$work/base.log"; fail "training the base model"; }
ckpt=$work/base/rope.ckpt

# One step at lr 1e-9 (the weights move by ~1e-9: a run needs a budget) from it as rope_pi with
# rope_factor 2 at L = 32: the loss at 32 tokens is ape-eval's of the base checkpoint as rope_pi,
# rope_factor 2, at 2 x 16, to the 6 decimals of the CSV (the same windows: both place them by 32
# tokens).
"$train" -e rope_pi --init-from "$ckpt" --set rope_factor=2 --steps 1 --lr 1e-9 --warmup 0 --seq-len 32 --batch 4 \
  --cache-dir "$cache" --threads 1 --eval-multiples 1 --eval-tokens 128 --out "$work/ft0" \
  > "$work/ft0.log" 2>&1 || { cat "$work/ft0.log"; fail "--init-from with 1 step"; }
grep -q "initialised from $ckpt" "$work/ft0.log" || fail "no 'initialised from' line"
grep -q "rope_factor = 2" "$work/ft0.log" || fail "the --set value is not reported"
"$eval" -c "$ckpt" --encoding rope_pi --set rope_factor=2 --eval-multiples 2 --eval-tokens 128 \
  --cache-dir "$cache" --threads 1 --csv "$work/eval.csv" > "$work/eval.log" 2>&1 ||
  { cat "$work/eval.log"; fail "ape-eval of the base model"; }
a=$(awk -F, 'NR == 2 { print $5 }' "$work/ft0/results.csv")
b=$(awk -F, 'NR == 2 { print $5 }' "$work/eval.csv")
[ -n "$a" ] && [ "$a" = "$b" ] || fail "fine-tune with 1 step at lr 1e-9 scores $a, ape-eval of its start $b"
# Without --set the same start scores differently (rope_factor 1): the value is not ignored.
# (--kv-heads 0 is every head of the checkpoint's model, not of the default --heads.)
"$train" -e rope_pi --init-from "$ckpt" --kv-heads 0 --steps 1 --lr 1e-9 --warmup 0 --seq-len 32 --batch 4 --cache-dir "$cache" --threads 1 \
  --eval-multiples 1 --eval-tokens 128 --out "$work/ft0b" > "$work/ft0b.log" 2>&1 || { cat "$work/ft0b.log"; fail "--init-from alone"; }
c=$(awk -F, 'NR == 2 { print $5 }' "$work/ft0b/results.csv")
[ "$c" != "$a" ] || fail "rope_factor 2 and 1 score the same ($a)"
# ape-eval's --csv onto a training run's results.csv keeps that run's rows of other encodings (it
# replaced the file: rope_pi's rows were lost) and adds its own.
cp "$work/ft0b/results.csv" "$work/merged.csv"
"$eval" -c "$ckpt" --eval-multiples 1 --eval-tokens 64 --cache-dir "$cache" --threads 1 --csv "$work/merged.csv" \
  > "$work/merge.log" 2>&1 || { cat "$work/merge.log"; fail "ape-eval --csv onto results.csv"; }
grep -q "^rope_pi," "$work/merged.csv" && grep -q "^rope," "$work/merged.csv" ||
  { cat "$work/merged.csv"; fail "ape-eval --csv dropped the run's rows or wrote none"; }

# A few steps: the loss moves, and the run resumes from its checkpoint like any other.
"$train" -e rope_pi --init-from "$ckpt" --set rope_factor=2 --steps 4 --seq-len 32 --batch 4 \
  --cache-dir "$cache" --threads 1 --eval-multiples 1 --eval-tokens 128 --checkpoint-every 2 \
  --out "$work/ft" > "$work/ft.log" 2>&1 || { cat "$work/ft.log"; fail "--init-from with 4 steps"; }
d=$(awk -F, 'NR == 2 { print $5 }' "$work/ft/results.csv")
[ "$d" != "$a" ] || fail "4 steps of fine-tuning left the loss at $a"
"$train" --resume "$work/ft/rope_pi.ckpt" > "$work/resume.log" 2>&1 || { cat "$work/resume.log"; fail "--resume"; }
grep -q "is a finished run (4 steps" "$work/resume.log" || { cat "$work/resume.log"; fail "the finished run was not named finished"; }
! grep -q "tok/s" "$work/resume.log" || fail "a finished run's resume reported a training speed"
e=$(awk -F, 'NR == 2 { print $5 }' "$work/ft/results.csv")
[ "$e" = "$d" ] || fail "the resumed (finished) run scores $e, it scored $d"

# Bad input: a clear error and status 1.
bad() {  # EXPECTED-TEXT ARGS...
  local want=$1; shift
  if "$train" "$@" > "$work/bad.log" 2>&1; then fail "accepted: $*"; fi
  grep -q -- "$want" "$work/bad.log" || { cat "$work/bad.log"; fail "no clear error for: $*"; }
}
bad "fine-tunes one encoding; 2 were given" -e rope,rope_pi --init-from "$ckpt" --steps 1 --cache-dir "$cache" \
  --out "$work/x"
bad "differs from the model of" -e rope_pi --init-from "$ckpt" --d-model 64 --steps 1 --cache-dir "$cache" --out "$work/x"
bad "--kv-heads 1 differs from the model of .* (2 key/value heads)" -e rope_pi --init-from "$ckpt" --kv-heads 1 --steps 1 \
  --cache-dir "$cache" --out "$work/x"
bad "no_such.ckpt" -e rope_pi --init-from "$work/no_such.ckpt" --steps 1 --cache-dir "$cache" --out "$work/x"
bad "cannot be given with it" --resume "$work/ft/rope_pi.ckpt" --init-from "$ckpt"
bad "--set nosuch" -e rope --init-from "$ckpt" --set nosuch=1 --steps 1 --cache-dir "$cache" --out "$work/x"
bad "is not a finite number" -e rope --set rope_factor=x --steps 1 --cache-dir "$cache" --out "$work/x"
# Every encoding's --set is checked before the first trains (rope has no rope_factor).
bad "encoding 'rope' has no param 'rope_factor'" -e rope_pi,rope --set rope_factor=2 --steps 1 --cache-dir "$cache" \
  --out "$work/late"
[ ! -e "$work/late/rope_pi.ckpt" ] || fail "rope_pi trained before rope's --set was refused"
bad "--seed must be a whole number in \[0," -e rope --seed -1 --steps 1 --cache-dir "$cache" --out "$work/x"
bad "is a folder, not a spec file" --spec "$work" --steps 1 --cache-dir "$cache" --out "$work/x"
# An encoding both defined by --spec and named by --encoding: refused before the spec compiles (no
# library in a fresh kernel cache).
printf 'ape.encoding @twice_named {\n  ape.alibi\n}\n' > "$work/twice.mlir"
(
  export APE_CACHE_DIR=$work/spec-cache
  bad "encoding 'twice_named' is given twice: --spec" --spec "$work/twice.mlir" -e twice_named --steps 1 \
    --cache-dir "$cache" --out "$work/x"
  ! ls "$work/spec-cache/kernels" 2>/dev/null | grep -qv '\.lock$' || fail "the spec compiled before the refusal"
)
bad "is a file, not a folder" -e rope --data "$ckpt" --steps 1 --cache-dir "$cache" --out "$work/x"
# An evaluation longer than every test book is refused before training (it failed after, results lost).
bad "needs a window of 524289 tokens, and the longest test book holds" -e rope --seq-len 512 \
  --eval-multiples 1,1024 --steps 1 --cache-dir "$cache" --out "$work/long"
[ ! -e "$work/long/rope.ckpt" ] || fail "rope trained before its evaluation was refused"
# ape-eval: an unwritable --csv fails before the evaluation.
if "$eval" -c "$ckpt" --cache-dir "$cache" --threads 1 --csv "$ckpt/eval.csv" > "$work/bad.log" 2>&1; then
  fail "ape-eval accepted --csv under a file"
fi
grep -q "cannot be created" "$work/bad.log" || { cat "$work/bad.log"; fail "no clear error for ape-eval --csv under a file"; }
! grep -q "Held-out" "$work/bad.log" || fail "ape-eval evaluated before refusing its --csv"
# ...and so does a --csv that is a checkpoint (the one it reads: it was replaced by the table).
cp "$ckpt" "$work/self.ckpt"
if "$eval" -c "$work/self.ckpt" --cache-dir "$cache" --threads 1 --csv "$work/self.ckpt" > "$work/self.log" 2>&1; then
  fail "ape-eval accepted --csv that is its checkpoint"
fi
grep -q "is a checkpoint: writing the results there would destroy it" "$work/self.log" ||
  { cat "$work/self.log"; fail "no clear error for ape-eval --csv onto a checkpoint"; }
cmp -s "$ckpt" "$work/self.ckpt" || fail "ape-eval --csv changed the checkpoint"
# Two checkpoints of one encoding and length get a row each, named by path (the second hid the first).
mkdir -p "$work/twin" && cp "$ckpt" "$work/twin/a.ckpt" && cp "$ckpt" "$work/twin/b.ckpt"
"$eval" -c "$work/twin/a.ckpt" -c "$work/twin/b.ckpt" --cache-dir "$cache" --threads 1 --eval-multiples 1 \
  --eval-tokens 64 --csv "$work/twin/eval.csv" > "$work/twin.log" 2>&1 || { cat "$work/twin.log"; fail "ape-eval of two checkpoints"; }
[ "$(grep -c "twin/a.ckpt\]" "$work/twin/eval.csv")" = 1 ] && [ "$(grep -c "twin/b.ckpt\]" "$work/twin/eval.csv")" = 1 ] ||
  { cat "$work/twin.log" "$work/twin/eval.csv"; fail "two checkpoints of one encoding share a row"; }
# --csv through a symbolic link writes its target and keeps the link (the rename had replaced the
# link with a file); a FIFO nothing reads is refused (its open had waited forever), and so is
# a FIFO given as the checkpoint.
mkdir -p "$work/links" && : > "$work/links/target.csv" && ln -sf target.csv "$work/links/link.csv"
"$eval" -c "$ckpt" --cache-dir "$cache" --threads 1 --eval-multiples 1 --eval-tokens 64 --csv "$work/links/link.csv" \
  > "$work/link.log" 2>&1 || { cat "$work/link.log"; fail "ape-eval --csv through a link"; }
[ -L "$work/links/link.csv" ] && grep -q "^encoding," "$work/links/target.csv" ||
  { ls -l "$work/links"; fail "ape-eval --csv through a link did not write its target"; }
mkfifo "$work/links/fifo"
rc=0
timeout 60 "$eval" -c "$ckpt" --cache-dir "$cache" --threads 1 --eval-multiples 1 --eval-tokens 64 \
  --csv "$work/links/fifo" > "$work/fifo.log" 2>&1 || rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "a FIFO nothing reads" "$work/fifo.log" ||
  { cat "$work/fifo.log"; fail "ape-eval --csv onto a FIFO without a reader (exit $rc)"; }
rc=0
timeout 60 "$eval" -c "$work/links/fifo" --cache-dir "$cache" --threads 1 > "$work/fifo2.log" 2>&1 || rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "is not a regular file" "$work/fifo2.log" ||
  { cat "$work/fifo2.log"; fail "ape-eval -c a FIFO (exit $rc)"; }
# The checkpoint a fine-tune starts from is never the one it writes (its first save replaced it).
mkdir -p "$work/selfinit" && cp "$ckpt" "$work/selfinit/rope.ckpt"
bad "rope.ckpt is the checkpoint this run writes ($work/selfinit/rope.ckpt)" -e rope --init-from "$work/selfinit/rope.ckpt" \
  --steps 1 --cache-dir "$cache" --out "$work/selfinit"
cmp -s "$ckpt" "$work/selfinit/rope.ckpt" || fail "a refused --init-from changed its checkpoint"
# A file at OUT/NAME.ckpt that this build cannot read (a newer format, damage) is kept aside, not replaced.
mkdir -p "$work/unread" && printf 'not a checkpoint' > "$work/unread/rope.ckpt"
"$train" -e rope --steps 1 --seq-len 16 "${small[@]}" --eval-multiples 1 --eval-tokens 64 --out "$work/unread" \
  > "$work/unread.log" 2>&1 || { cat "$work/unread.log"; fail "a run over an unreadable checkpoint"; }
[ "$(cat "$work/unread/rope.unreadable.ckpt")" = "not a checkpoint" ] ||
  { cat "$work/unread.log"; fail "the unreadable checkpoint was not kept as rope.unreadable.ckpt"; }
grep -q "is not a checkpoint this build reads" "$work/unread.log" || fail "no note of the kept file"
# Encodings trained into one folder keep each other's rows in results.csv; a run stopped in its
# first encoding names those it did not reach.
multi=(--steps 2 --seq-len 16 "${small[@]}" --eval-multiples 1 --eval-tokens 64 --out "$work/multi")
"$train" -e rope,nope "${multi[@]}" > "$work/multi.log" 2>&1 || { cat "$work/multi.log"; fail "rope,nope"; }
"$train" -e nope "${multi[@]}" > "$work/multi2.log" 2>&1 || { cat "$work/multi2.log"; fail "nope again"; }
[ "$(cut -d, -f1 "$work/multi/results.csv" | tail -n +2 | sort | uniq -c | tr -s ' ' | tr '\n' ';')" = " 1 nope; 1 rope;" ] ||
  { cat "$work/multi/results.csv"; fail "results.csv lost rope's row or doubled nope's"; }
set +e
APE_TEST_STOP_AFTER_STEP=1 "$train" -e rope,alibi,nope --steps 3 --seq-len 16 "${small[@]}" --eval-multiples 1 \
  --eval-tokens 64 --out "$work/stopped" > "$work/stopped.log" 2>&1
rc=$?
set -e
[ $rc = 130 ] && grep -q "not trained yet: alibi,nope (then: ape-train -e alibi,nope --out $work/stopped" "$work/stopped.log" ||
  { cat "$work/stopped.log"; fail "a run stopped in rope (exit $rc) did not name alibi and nope"; }
# A reader that closes the output (| head): the run goes on, saves its checkpoint and results,
# and says the output was lost (status 1); SIGPIPE killed it before its final checkpoint.
set +e
"$train" -e rope --steps 30 --seq-len 16 "${small[@]}" --eval-multiples 1 --eval-tokens 64 --out "$work/pipe" \
  2> "$work/pipe.err" | head -n 1 > /dev/null
rc=${PIPESTATUS[0]}
set -e
[ $rc = 1 ] && [ -f "$work/pipe/rope.ckpt" ] && [ -f "$work/pipe/results.csv" ] &&
  grep -q "the standard output could not be written" "$work/pipe.err" ||
  { cat "$work/pipe.err"; ls -la "$work/pipe" || true; fail "a closed stdout (exit $rc) lost the checkpoint or said nothing"; }
# --resume writes the checkpoint it resumes (the startup check looks at that file, not at
# OUT/<encoding>.ckpt: a folder of that name beside it is no matter), through a link into the
# folder the link names, which is the one locked.
mkdir -p "$work/resume/rope.ckpt" "$work/links"
cp "$work/base/rope.ckpt" "$work/resume/mine.ckpt"
"$train" --resume "$work/resume/mine.ckpt" --threads 1 > "$work/resume.log" 2>&1 ||
  { cat "$work/resume.log"; fail "--resume beside a folder named rope.ckpt"; }
ln -s ../resume/mine.ckpt "$work/links/latest.ckpt"
rm "$work/resume/results.csv"
"$train" --resume "$work/links/latest.ckpt" --threads 1 > "$work/link.log" 2>&1 ||
  { cat "$work/link.log"; fail "--resume through a link"; }
[ -L "$work/links/latest.ckpt" ] && [ -f "$work/resume/results.csv" ] && [ ! -e "$work/links/results.csv" ] ||
  { ls -la "$work/links" "$work/resume"; fail "--resume through a link did not write beside its target"; }
# A run that diverges into a folder with a finished run: the checkpoint stays, and so do its rows
# of results.csv (NaN rows had replaced them while the checkpoint they described stayed).
cp -r "$work/base" "$work/div"
before=$(grep '^rope,' "$work/div/results.csv")
set +e
"$train" -e rope --steps 40 --lr 10 --warmup 0 --seq-len 16 "${small[@]}" --eval-multiples 1 --eval-tokens 64 \
  --out "$work/div" > "$work/div.log" 2>&1
rc=$?
set -e
[ $rc = 1 ] && grep -q "stopped training (diverged)" "$work/div.log" || { cat "$work/div.log"; fail "lr 10 did not diverge (exit $rc)"; }
cmp -s "$work/base/rope.ckpt" "$work/div/rope.ckpt" || fail "a diverged run changed the checkpoint"
[ "$(grep '^rope,' "$work/div/results.csv")" = "$before" ] ||
  { cat "$work/div/results.csv"; fail "a diverged run replaced the rows of the checkpoint still on disk"; }
# An encoding the model cannot hold (ExPE's override l = 16 >= d_model 8) is refused before the
# first encoding trains, not after it.
set +e
"$train" -e nope,expe --steps 2 --seq-len 16 --d-model 8 --layers 1 --heads 2 --vocab 4096 --batch 4 \
  --cache-dir "$cache" --threads 1 --eval-multiples 1 --eval-tokens 64 --out "$work/narrow" > "$work/narrow.log" 2>&1
rc=$?
set -e
[ $rc = 1 ] && grep -q "encoding 'expe': override l = 16 must be < d_model = 8" "$work/narrow.log" &&
  [ ! -e "$work/narrow/nope.ckpt" ] || { cat "$work/narrow.log"; fail "a too narrow model for expe was refused late (exit $rc)"; }
# ape-eval of several checkpoints checks that each fits its books before it evaluates any (the
# second failed after the first's whole evaluation, which was lost).
"$train" -e rope --steps 1 --seq-len 1024 "${small[@]}" --eval-multiples 1 --eval-tokens 1024 --out "$work/long" \
  > "$work/long.log" 2>&1 || { cat "$work/long.log"; fail "a 1-step run at L = 1024"; }
set +e
"$eval" -c "$ckpt" -c "$work/long/rope.ckpt" --eval-multiples 1,1024 --eval-tokens 64 --cache-dir "$cache" \
  --threads 1 --csv "$work/two.csv" > "$work/two.log" 2>&1
rc=$?
set -e
[ $rc = 1 ] && grep -q "checkpoint $work/long/rope.ckpt: --eval-multiples 1024 x the training length 1024" "$work/two.log" &&
  ! grep -q "^\[eval\] rope @" "$work/two.log" && [ ! -e "$work/two.csv" ] ||
  { cat "$work/two.log"; fail "ape-eval evaluated a checkpoint before refusing the next (exit $rc)"; }
echo "init_from: OK"
