#!/usr/bin/env bash
# scripts/study.sh --quick end to end (docs/study.md): every claim encoding trains and is evaluated
# at 1x..16x, every inference-time variant is evaluated, the report (study.md with a verdict per
# claim, study.csv, study.png) is written; a rerun skips everything; a removed job is redone and
# only it; an interrupted training run is continued from its checkpoint; bad input is refused.
# Usage: study_quick.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
src=$1 build=$2 work=$3
rm -rf "$work"
mkdir -p "$work"
out=$work/out
cd "$src"
study() { APE_STUDY_NO_BUILD=1 APE_BUILD_DIR="$build" scripts/study.sh --quick --out "$out" \
            --cache-dir "$build/cache" "$@"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

start=$(date +%s)
study > "$work/first.log" 2>&1 || { cat "$work/first.log"; fail "the quick study failed"; }
echo "quick study: $(( $(date +%s) - start )) s"

# 11 runs (7 claim encodings, ExPE by its paper's rule (expe_rule: a spec the driver writes, trained
# with ape-train --spec, compiled at run time), rope's second seed, the 4-layer rope of the
# attention transition with both seeds) x 5 lengths, and the variants: rope x 2 seeds x (pi, ntk,
# yarn, dynamic_ntk), expe, exqpe and expe_rule at sigma 0.5, the transition at beta 0.5 (both
# seeds): 24 jobs x 5 lengths; and each rope model fine-tuned at 2L with
# and without PI (4 runs x the 4 lengths from 2L on); and the learning-rate sweep: rope at a hundredth
# of the rate (1 run x 5 lengths) and both first-seed rope models at 1x on the validation books (2
# rows; the preset's rate wins, so nothing more runs).
rows=$(tail -n +2 "$out/results.csv" | wc -l)
[ "$rows" -eq 143 ] || fail "results.csv has $rows rows, expected 143"
grep -q -- "--spec $out/specs/expe_rule.mlir" "$work/first.log" || fail "expe_rule was not trained from its spec (--spec)"
grep -q "^expe_rule-s1234,expe_rule,1234,sigma0.5,expe_rule,.*,16,256,16," "$out/results.csv" ||
  fail "no row of expe_rule (trained from its spec) at sigma 0.5 and 16x"
[ "$(grep -c ',valid,' "$out/results.csv")" -eq 2 ] || fail "expected 2 rows on the validation books"
grep -q -- "--split valid" "$work/first.log" || fail "the sweep did not score the validation books"
grep -q "^| rope | .* | 0.003 |$" "$out/study.md" || fail "no chosen learning rate for rope"
grep -q "^rope_pi_ft-s4321,rope_pi,4321,trained,rope_pi,,32,256,16," "$out/results.csv" ||
  fail "no row of the PI fine-tune at 16x"
grep -q -- "--init-from $out/runs/rope-s4321/rope.ckpt --set rope_factor=2" "$work/first.log" ||
  fail "the PI fine-tune did not start from its RoPE model with rope_factor 2"
for v in trained pi ntk yarn dynamic_ntk sigma0.5 transition_b0p5_i2; do
  grep -q ",$v," "$out/results.csv" || fail "no rows of variant $v"
done
# Every loss is a finite number.
awk -F, 'NR > 1 && !($10 ~ /^[0-9]+\.[0-9]+$/) { bad = 1; print "bad loss: " $0 } END { exit bad }' \
  "$out/results.csv" || fail "a row without a loss"
for f in study.md study.csv study.png table.md train.csv study.json; do
  [ -s "$out/$f" ] || fail "no $out/$f"
done
head -c 8 "$out/study.png" | od -An -tx1 | grep -q "89 50 4e 47" || fail "study.png is not a PNG"
# 38 claims, each with a verdict; those of rope's two seeds are decided (the quick preset takes two).
n=$(grep -c '^| [0-9]* | .* | \*\*\(agrees\|agrees (small)\|disagrees\|disagrees (small)\|negligible\|inconclusive\|not yet run\|too few seeds ([0-9] of 2)\)\*\* |$' "$out/study.md")
[ "$n" -eq 38 ] || fail "study.md has $n claim verdicts, expected 38"
grep -q '^| [0-9]* | RoPE scalings | YaRN .* | 2 | \*\*\(agrees\|agrees (small)\|disagrees\|disagrees (small)\|negligible\|inconclusive\)\*\* |$' "$out/study.md" ||
  fail "the YaRN claim (two seeds of rope) has no verdict"
grep -q '^| β 0.5, 2 intervals | .* | \*\*\(agrees\|agrees (small)\|disagrees\|disagrees (small)\|negligible\|inconclusive\)\*\* |$' "$out/study.md" ||
  fail "the attention transition has no verdict"
# Every trained and evaluated cell carries its per-segment losses (the token intervals).
awk -F, 'NR > 1 && $14 !~ /^[0-9.]+(;[0-9.]+)+$/ { bad = 1; print "no segments: " $0 } END { exit bad }' \
  "$out/results.csv" || fail "a row without segment losses"
grep -q "Status: \*\*complete\*\*" "$out/study.md" || fail "study.md does not say complete"

# A rerun finds everything finished and runs nothing.
study > "$work/rerun.log" 2>&1 || { cat "$work/rerun.log"; fail "the rerun failed"; }
grep -q "0 jobs to do" "$work/rerun.log" || { cat "$work/rerun.log"; fail "the rerun did not skip"; }
grep -q "ape-train\|ape-eval" "$work/rerun.log" && fail "the rerun ran a tool"

# Remove one variant's rows and one run entirely: exactly those are redone.
grep -v "^cable-s1234,\|^rope-s1234,rope,1234,yarn," "$out/results.csv" > "$work/r.csv"
mv "$work/r.csv" "$out/results.csv"
rm -rf "$out/runs/cable-s1234"
study > "$work/redo.log" 2>&1 || { cat "$work/redo.log"; fail "the redo failed"; }
grep -q "2 jobs to do" "$work/redo.log" || { cat "$work/redo.log"; fail "expected 2 jobs to redo"; }
[ "$(grep -c 'ape-train -e cable' "$work/redo.log")" -eq 1 ] || fail "cable was not retrained once"
[ "$(grep -c 'ape-train' "$work/redo.log")" -eq 1 ] || fail "another run was retrained"
rows=$(tail -n +2 "$out/results.csv" | wc -l)
[ "$rows" -eq 143 ] || fail "after the redo results.csv has $rows rows, expected 143"

# An interrupted training run (its checkpoint, no results yet) is continued, not restarted.
grep -v "^t5-s1234," "$out/results.csv" > "$work/r.csv"
mv "$work/r.csv" "$out/results.csv"
rm -f "$out/runs/t5-s1234/results.csv"
study > "$work/resume.log" 2>&1 || { cat "$work/resume.log"; fail "the resume failed"; }
grep -q "ape-train --resume $out/runs/t5-s1234/t5.ckpt" "$work/resume.log" || fail "t5 was not resumed"
rows=$(tail -n +2 "$out/results.csv" | wc -l)
[ "$rows" -eq 143 ] || fail "after the resume results.csv has $rows rows, expected 143"

# --retrain-missing: a run recorded whose folder is gone (an earlier study's) is trained again,
# its rows (trained and evaluated) replaced at once; without the flag nothing runs.
grep -q "^alibi-s1234," "$out/results.csv" || fail "no alibi-s1234 rows"
rm -rf "$out/runs/alibi-s1234"
study > "$work/norerun.log" 2>&1 || { cat "$work/norerun.log"; fail "the run without --retrain-missing failed"; }
grep -q "ape-train" "$work/norerun.log" && fail "a recorded run was retrained without --retrain-missing"
study --retrain-missing > "$work/retrain.log" 2>&1 || { cat "$work/retrain.log"; fail "--retrain-missing failed"; }
[ "$(grep -c 'ape-train' "$work/retrain.log")" -eq 1 ] && grep -q "ape-train -e alibi" "$work/retrain.log" ||
  { cat "$work/retrain.log"; fail "--retrain-missing did not retrain exactly alibi-s1234"; }
[ -s "$out/runs/alibi-s1234/alibi.ckpt" ] || fail "the retrained run has no checkpoint"
rows=$(tail -n +2 "$out/results.csv" | wc -l)
[ "$rows" -eq 143 ] || fail "after the retrain results.csv has $rows rows, expected 143"
[ "$(grep -c '^alibi-s1234,' "$out/results.csv")" -eq 5 ] || fail "alibi-s1234's rows were not replaced"
[ "$(grep -c '^alibi-s1234,' "$out/train.csv")" -eq 1 ] || fail "alibi-s1234's training row was not replaced"

# SIGTERM to the driver mid-training: ape-train is asked to stop (it writes its checkpoint), the
# driver exits 130 without recording the run, and --list shows the run as started.
stop=$work/stop
APE_STUDY_NO_BUILD=1 APE_BUILD_DIR="$build" scripts/study.sh --quick --steps 100000 --encodings rope \
  --out "$stop" --cache-dir "$build/cache" > "$work/stop.log" 2>&1 &
driver=$!
for _ in $(seq 120); do
  grep -q "step " "$stop/runs/rope-s1234/train.log" 2>/dev/null && break
  sleep 0.5
done
kill -TERM "$driver"
rc=0; wait "$driver" || rc=$?
[ "$rc" -eq 130 ] || { cat "$work/stop.log"; fail "the stopped driver exited $rc, expected 130"; }
grep -q "interrupted at step" "$stop/runs/rope-s1234/train.log" || fail "ape-train was not asked to stop"
[ -s "$stop/runs/rope-s1234/rope.ckpt" ] || fail "no checkpoint after the stop"
[ ! -s "$stop/results.csv" ] || fail "the stopped run was recorded"
APE_STUDY_NO_BUILD=1 APE_BUILD_DIR="$build" scripts/study.sh --quick --steps 100000 --encodings rope \
  --out "$stop" --list > "$work/list.log"
grep -q "rope-s1234 *trained: started (checkpoint)" "$work/list.log" || fail "--list does not show it"

# Bad input: a clear error and a non-zero exit.
if study --encodings nosuch > "$work/bad.log" 2>&1; then fail "an unknown encoding was accepted"; fi
grep -q "unknown encoding(s) nosuch" "$work/bad.log" || { cat "$work/bad.log"; fail "no clear error"; }
if study --steps 9 > "$work/bad.log" 2>&1; then fail "another config in the same folder was accepted"; fi
grep -q "holds a study with another config" "$work/bad.log" || { cat "$work/bad.log"; fail "no clear error"; }
echo "study_quick: OK ($(( $(date +%s) - start )) s in all)"
