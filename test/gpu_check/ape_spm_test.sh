#!/usr/bin/env bash
# scripts/ape_spm.py (the SentencePiece helper the GPU check's tools use) writes the same bytes as
# the C++ helper ape-spm: three books encoded, the first 3,000 ids of one decoded.
#   ape_spm_test.sh APE-SPM PYTHON SOURCE-DIR WORK-DIR CACHE-DIR APE-TRAIN
set -euo pipefail
spm=$1 py=$2 src=$3 work=$4 cache=$5 train=$6
rm -rf "$work" && mkdir -p "$work"
if ! ls "$cache"/spm_bpe_4096_*.model >/dev/null 2>&1; then  # the corpus cache: one training step
  "$train" -e nope --steps 1 --eval-multiples 1 --eval-tokens 1 --cache-dir "$cache" --out "$work/run" >/dev/null
fi
model=$(ls "$cache"/spm_bpe_4096_*.model | head -1)
books=$(find "$cache/pg30" -name '*.txt' | sort | head -3)
[ -n "$model" ] && [ -n "$books" ] || { echo "no tokenizer or books in $cache"; exit 1; }
"$spm" encode "$model" "$work/cpp.bin" $books
"$py" "$src/scripts/ape_spm.py" encode "$model" "$work/py.bin" $books
cmp "$work/cpp.bin" "$work/py.bin"
"$py" - "$work/cpp.bin" "$work/ids.txt" <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read()
assert d[:8] == b"APESPMI1"
n = struct.unpack("<Q", d[24:32])[0]
ids = struct.unpack(f"<{min(n, 3000)}i", d[32:32 + 4 * min(n, 3000)])
assert len(ids) > 100, len(ids)
open(sys.argv[2], "w").write("\n".join(map(str, ids)) + "\n")
PY
"$spm" decode "$model" "$work/ids.txt" "$work/cpp.txt"
"$py" "$src/scripts/ape_spm.py" decode "$model" "$work/ids.txt" "$work/py.txt"
cmp "$work/cpp.txt" "$work/py.txt"
# A bad id is refused by both.
echo 99999 >"$work/bad.txt"
! "$py" "$src/scripts/ape_spm.py" decode "$model" "$work/bad.txt" "$work/bad.out" 2>"$work/err.txt"
grep -q "outside the vocabulary" "$work/err.txt"
echo "ape_spm.py: the same ids and text as ape-spm ($(wc -c <"$work/cpp.bin") bytes of ids)"
