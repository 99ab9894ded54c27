#!/usr/bin/env bash
# ape-generate end to end (docs/decoding.md): a tiny ape-train checkpoint; seeded sampling is
# reproducible and prints tokens/s; --score reports its buckets (the last one ending with the text); bad input exits 1 with a reason.
#   generate_cli.sh APE_TRAIN APE_GENERATE CACHE_DIR WORK_DIR
set -uo pipefail
train=$1 gen=$2 cache=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

"$train" --encoding cable --steps 20 --d-model 32 --layers 1 --heads 2 --seq-len 32 --batch 4 \
  --eval-multiples 1 --eval-tokens 64 --cache-dir "$cache" --threads 2 --out "$work/run" \
  >"$work/train.log" 2>&1 || { cat "$work/train.log"; fail "ape-train"; }
ckpt=$(ls "$work"/run/*.ckpt | head -1)
[ -f "$ckpt" ] || fail "no checkpoint in $work/run"

args=(-c "$ckpt" --cache-dir "$cache" --threads 2 -n 24 -t 0.9 -k 20 --seed 7 --ids)
"$gen" "${args[@]}" --prompt "It was the best of times" >"$work/a.txt" 2>&1 || { cat "$work/a.txt"; fail "sampling"; }
"$gen" "${args[@]}" --prompt "It was the best of times" >"$work/b.txt" 2>&1 || fail "sampling again"
grep -q "tokens/s" "$work/a.txt" || { cat "$work/a.txt"; fail "no tokens/s line"; }
grep -q "^It was the best of times" "$work/a.txt" || { cat "$work/a.txt"; fail "the prompt is not echoed"; }
diff <(grep '^\[ids\]' "$work/a.txt") <(grep '^\[ids\]' "$work/b.txt") || fail "the same seed gave other tokens"
[ "$(grep '^\[ids\]' "$work/a.txt" | wc -w)" -eq 25 ] || { cat "$work/a.txt"; fail "expected 24 ids"; }

for i in $(seq 1 40); do echo "It was the age of wisdom, it was the age of foolishness, it was the epoch of belief."; done >"$work/book.txt"
"$gen" -c "$ckpt" --cache-dir "$cache" --threads 2 --score "$work/book.txt" --score-tokens 200 >"$work/score.txt" 2>&1 \
  || { cat "$work/score.txt"; fail "--score"; }
grep -q "^  1\.\.32 " "$work/score.txt" && grep -q "^  129\.\.200 " "$work/score.txt" \
  || { cat "$work/score.txt"; fail "--score buckets"; }

expect_error() {  # expect_error PATTERN ARGS...
  local pattern=$1; shift
  "$gen" "$@" >"$work/err.txt" 2>&1
  local rc=$?
  [ $rc -ne 0 ] || { cat "$work/err.txt"; fail "exit 0 for: $*"; }
  [ $rc -lt 128 ] || { cat "$work/err.txt"; fail "crashed ($rc) for: $*"; }
  grep -q -- "$pattern" "$work/err.txt" || { cat "$work/err.txt"; fail "no '$pattern' for: $*"; }
}
expect_error "no checkpoint at" -c "$work/missing.ckpt" --prompt hi
expect_error "prompt is empty" -c "$ckpt" --cache-dir "$cache" --prompt "   "
expect_error "give a --prompt" -c "$ckpt" --cache-dir "$cache"
expect_error "top-k" -c "$ckpt" --cache-dir "$cache" --prompt hi --top-k 100000
expect_error "temperature" -c "$ckpt" --cache-dir "$cache" --prompt hi --temperature -1
expect_error "tokenizer in $work/nowhere" -c "$ckpt" --cache-dir "$work/nowhere" --prompt hi
# A cache whose tokenizers are not the checkpoint's (the cache holds one per corpus, by hash).
mkdir -p "$work/other"
for f in "$cache"/spm_bpe_*.model; do printf 'not this one' >"$work/other/$(basename "$f")"; done
expect_error "is the checkpoint's" -c "$ckpt" --cache-dir "$work/other" --prompt hi
expect_error "cannot read --score" -c "$ckpt" --cache-dir "$cache" --score "$work/missing.txt"
expect_error "excludes" -c "$ckpt" --prompt hi --score "$work/book.txt"
expect_error "max-tokens" -c "$ckpt" --cache-dir "$cache" --prompt hi -n 0
expect_error "seed must be a whole number" -c "$ckpt" --cache-dir "$cache" --prompt hi --seed -1
# Whole numbers are decimal and fit 64 bits on every integer option (CLI11 read 010 as 8 and
# saturated 10^20).
expect_error "starts with 0" -c "$ckpt" --cache-dir "$cache" --prompt hi -n 010
expect_error "does not fit a 64-bit integer" -c "$ckpt" --cache-dir "$cache" --score "$work/book.txt" --score-tokens 99999999999999999999
# (0x10 was 16, and a hex seed past 64 bits ran as 2^63 - 1)
expect_error "is not a whole decimal number" -c "$ckpt" --cache-dir "$cache" --prompt hi -n 0x10
expect_error "is not a whole decimal number" -c "$ckpt" --cache-dir "$cache" --prompt hi --seed 0x1ffffffffffffffffffffffff
# An empty value is refused on every option that takes one, by ape-generate, ape-train, ape-eval and
# ape-check (tools/Cli.h; `--out ''` failed later with an odd message, `--resume ''` trained from
# scratch).
expect_error "checkpoint: the value is empty" -c "" --prompt hi
expect_error "cache-dir: the value is empty" -c "$ckpt" --cache-dir "" --prompt hi
expect_error "prompt: the value is empty" -c "$ckpt" --cache-dir "$cache" --prompt ""
for opt in --out --resume --data --device; do
  "$train" --encoding rope "$opt" "" >"$work/err.txt" 2>&1
  rc=$?
  [ $rc -eq 1 ] && grep -q -- "${opt#--}: the value is empty" "$work/err.txt" \
    || { cat "$work/err.txt"; fail "ape-train $opt '' (status $rc)"; }
done
# Bytes that are not UTF-8 are refused, named by offset (the tokenizer made them <unk>).
printf 'It was \xff\xfe the best' > "$work/latin.txt"
expect_error "byte 7 (0xff) starts no UTF-8 character" -c "$ckpt" --cache-dir "$cache" --prompt-file "$work/latin.txt"
expect_error "is not UTF-8 text" -c "$ckpt" --cache-dir "$cache" --score "$work/latin.txt"
# Sampling options are refused with --score (their values went unchecked there).
expect_error "excludes" -c "$ckpt" --cache-dir "$cache" --score "$work/book.txt" -t -1
expect_error "excludes" -c "$ckpt" --cache-dir "$cache" --score "$work/book.txt" --seed 3
expect_error "excludes" -c "$ckpt" --cache-dir "$cache" --score "$work/book.txt" --ids
# ... and scoring options without --score.
expect_error "requires" -c "$ckpt" --cache-dir "$cache" --prompt hi --chunk 4
APE_CPU_LEVEL=bogus expect_error "APE_CPU_LEVEL" -c "$ckpt" --cache-dir "$cache" --prompt hi
grep -q "\[cpu\] kernels" "$work/err.txt" && { cat "$work/err.txt"; fail "a half-printed [cpu] line before the error"; }

# A checkpoint trained from a spec file (ape-train --spec) decodes from the spec text it holds. The
# spec divides integers by i - j, 0 on the diagonal: total in the kernels (contract/int_math.h), so
# training and decoding run where C++'s division would trap (SIGFPE).
spec=$(cd "$(dirname "$0")/../check/Inputs" && pwd)/int_division.mlir
"$train" --spec "$spec" --steps 5 --d-model 32 --layers 1 --heads 2 --seq-len 32 --batch 4 \
  --eval-multiples 1 --eval-tokens 64 --cache-dir "$cache" --threads 2 --out "$work/spec" \
  >"$work/spec_train.log" 2>&1 || { cat "$work/spec_train.log"; fail "ape-train --spec (integer division by 0)"; }
"$gen" -c "$work/spec/int_division.ckpt" --cache-dir "$cache" --threads 2 -n 8 --seed 3 --prompt "It was" \
  >"$work/spec_gen.txt" 2>&1 || { cat "$work/spec_gen.txt"; fail "ape-generate of a --spec checkpoint"; }
grep -q "^It was" "$work/spec_gen.txt" || { cat "$work/spec_gen.txt"; fail "no text from the --spec checkpoint"; }
echo "ape-generate CLI: OK"
