#!/usr/bin/env bash
# scripts/gpu-check.sh prepare, as CI runs it (docs/cuda.md, "Checking on a GPU"): the folder is
# written, self-contained and within the 64 MiB that travel to a GPU machine; its copy of the
# script and the benchmark parse; and, where nvcc and a CUDA LibTorch are here, the GPU suite's
# standalone project (no MLIR) configures against them, as it will there. The GPU stages
# themselves need a GPU: `run` refuses without one and says so.
#
#   prepare_test.sh REPO APEC PYTHON WORKDIR APE_TRAIN CACHE_DIR
set -euo pipefail
root=$1 apec=$2 python=$3 work=$4 train=$5 cache=$6
rm -rf "$work"
APE_APEC=$apec APE_TRAIN=$train APE_CACHE_DIR=$cache "$root/scripts/gpu-check.sh" prepare "$work/gpu-check" >"$work.prepare.log" 2>&1 ||
  { cat "$work.prepare.log"; exit 1; }
dir=$work/gpu-check
# prepare empties its folder first: a folder it did not write is refused and left as it was.
mkdir -p "$work/mine" && echo kept >"$work/mine/notes.txt"
if "$root/scripts/gpu-check.sh" prepare "$work/mine" >"$work.refuse.log" 2>&1; then
  echo "FAIL: prepare replaced a folder it did not write"; exit 1
fi
grep -q "not a folder that gpu-check.sh prepare wrote" "$work.refuse.log" && [ -f "$work/mine/notes.txt" ] ||
  { cat "$work.refuse.log"; echo "FAIL: the refusal did not say why, or the folder changed"; exit 1; }
for f in PREPARED .gpu-check-prepare src/scripts/gpu-check.sh src/test/cuda/standalone/CMakeLists.txt \
         src/test/cuda/cuda_kernels_test.cpp src/bench/gpu_bench.py src/test/python/test_cuda.py \
         third_party/googletest/CMakeLists.txt third_party/json/nlohmann/json.hpp \
         generated/cpu/rope_cpu.cpp generated/cuda/rope_cuda_bf16_hd128.cu \
         generated/cuda/fire_cuda_bf16_hd128.cu emitted/cable_torch_library/CMakeLists.txt \
         bench-libs/t5_torch_library/CMakeLists.txt src/runtime/CudaAttention.cpp \
         src/tools/ape_train.cpp src/bench/train_peer.py src/test/gpu_check/train_smoke.py \
         src/data/pg30/clean.tar.xz third_party/cli11/CLI/CLI.hpp; do
  [ -e "$dir/$f" ] || { echo "FAIL: $f is missing from the prepared folder"; exit 1; }
done
# Every file that `run` names under its source folder ($src/...) was copied.
for f in $(grep -o '"\$src/[A-Za-z0-9_./-]*\.[a-z]*"' "$root/scripts/gpu-check.sh" | tr -d '"' | sed 's|^\$src/||' | sort -u); do
  [ -e "$dir/src/$f" ] || { echo "FAIL: run uses src/$f, which prepare does not copy"; exit 1; }
done
# Every file a copied CMakeLists.txt includes by a path from its own folder was copied (the
# framework tests' CMakeLists.txt once included cmake/ApeCcache.cmake, which prepare left out, and
# the python stage could not configure on the GPU machine).
for cml in $(find "$dir/src" -name CMakeLists.txt); do
  for inc in $(grep -o 'include(${CMAKE_CURRENT_SOURCE_DIR}/[^)]*)' "$cml" | sed 's|include(${CMAKE_CURRENT_SOURCE_DIR}/||; s|)$||'); do
    [ -e "$(dirname "$cml")/$inc" ] ||
      { echo "FAIL: ${cml#$dir/} includes $inc, which prepare does not copy"; exit 1; }
  done
  for inc in $(grep -o 'include(${APE_SOURCE_DIR}/[^)]*)' "$cml" | sed 's|include(${APE_SOURCE_DIR}/||; s|)$||'); do
    [ -e "$dir/src/$inc" ] || { echo "FAIL: ${cml#$dir/} includes $inc, which prepare does not copy"; exit 1; }
  done
done
# Every quoted #include of the C++ sources the standalone project compiles resolves in the folder:
# beside the file, or under one of the project's include roots (tools/Cli.h, which ape_train.cpp
# includes, was once left out, and the suite and the tools would not have built there).
"$python" - "$dir" <<'PY' || exit 1
import os, re, sys
d = sys.argv[1]
src = os.path.join(d, "src")
roots = [src, os.path.join(src, "kernels", "include"), os.path.join(src, "test", "unit"),
         os.path.join(d, "generated", "cpu"), os.path.join(d, "generated", "cuda"), os.path.join(d, "third_party", "json")]
bad = []
for sub in ("runtime", "tools", "test/cuda", "test/unit", "kernels/include"):
    for base, _, files in os.walk(os.path.join(src, sub)):
        for f in files:
            if not f.endswith((".cpp", ".h", ".cuh", ".cu")):
                continue
            path = os.path.join(base, f)
            for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', open(path, errors="replace").read(), re.M):
                if not any(os.path.exists(os.path.join(r, inc)) for r in [base] + roots):
                    bad.append(f"{os.path.relpath(path, d)} includes \"{inc}\"")
# Headers that only MLIR-side code includes are not the standalone project's.
bad = [b for b in bad if not re.search(r'"(mlir|llvm|dialect|passes|codegen)/', b)]
if bad:
    print("FAIL: includes that do not resolve in the prepared folder:\n  " + "\n  ".join(bad[:20]))
    sys.exit(1)
PY
# Every spec has its CUDA entry and a CPU twin.
for spec in "$root"/examples/encodings/*.mlir; do
  enc=$(basename "$spec" .mlir)
  [ -e "$dir/generated/cpu/${enc}_cpu.cpp" ] || { echo "FAIL: no CPU kernel of $enc"; exit 1; }
  [ -e "$dir/generated/cuda/${enc}_cuda.cu" ] || { echo "FAIL: no CUDA entry of $enc"; exit 1; }
done
# The test specs the GPU suite checks on the hardware (kcable_fast: the approximate instructions).
[ -e "$dir/generated/cpu/kcable_fast_cpu.cpp" ] && [ -e "$dir/generated/cuda/kcable_fast_cuda_bf16_hd128.cu" ] ||
  { echo "FAIL: the test spec kcable_fast is not compiled in"; exit 1; }
# The study-only specs of --preset gpu-small are compiled in (the GPU machine has no apec for
# --spec), and the driver runs them as built-in encodings there; a spec that is not the preset's is
# refused.
for enc in sinusoidal_scaled expe_rule; do
  [ -e "$dir/study-specs/$enc.mlir" ] && [ -e "$dir/generated/cpu/${enc}_cpu.cpp" ] &&
    [ -e "$dir/generated/cuda/${enc}_cuda_bf16_hd64.cu" ] || { echo "FAIL: $enc is not compiled in"; exit 1; }
done
build=$(dirname "$(dirname "$train")")
cmds=$("$python" "$root/scripts/study.py" --preset gpu-small --builtin-specs "$dir/study-specs" --dry-run \
  --build-dir "$build" --out "$work/study-dry" --device cuda)
grep -q -- "ape-train -e expe_rule " <<<"$cmds" && grep -q -- "ape-train -e sinusoidal_scaled " <<<"$cmds" ||
  { echo "FAIL: the study does not run the compiled-in specs as built-in encodings"; exit 1; }
! grep -q -- "--spec" <<<"$cmds" || { echo "FAIL: the study still compiles a spec at run time"; exit 1; }
cp -r "$dir/study-specs" "$work/study-specs-other"
sed -i 's/theta = /theta = 2.0 * /' "$work/study-specs-other/expe_rule.mlir"
if out=$("$python" "$root/scripts/study.py" --preset gpu-small --builtin-specs "$work/study-specs-other" \
    --dry-run --build-dir "$build" --out "$work/study-dry" 2>&1); then
  echo "FAIL: a compiled-in spec that is not the preset's was accepted"; exit 1
fi
grep -q "is not this preset's expe_rule spec" <<<"$out" || { echo "FAIL: unclear refusal: $out"; exit 1; }
# The train stage's corpus cache: the tokenizer and the token ids (no SentencePiece there).
ls "$dir"/cache/spm_bpe_4096_*.model "$dir"/cache/tokens_train_4096_*.bin "$dir"/cache/tokens_test_4096_*.bin \
  >/dev/null || { echo "FAIL: the prepared folder has no tokenized corpus"; exit 1; }
bytes=$(du -sb "$dir" | cut -f1)
[ "$bytes" -le $((64 * 1024 * 1024)) ] || { echo "FAIL: $bytes bytes > 64 MiB"; exit 1; }
bash -n "$dir/src/scripts/gpu-check.sh"
for py in bench/gpu_bench.py bench/gpu_counters.py bench/train_peer.py bench/op_probe.py test/gpu_check/train_smoke.py \
          scripts/ape_spm.py; do
  "$python" -m py_compile "$dir/src/$py"
done
# Without a GPU, run says so and fails (never a silent pass).
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  set +e
  out=$(env -u APE_GPU_ARCH "$dir/src/scripts/gpu-check.sh" run 2>&1)
  rc=$?
  set -e
  [ $rc -ne 0 ] && grep -q "found no GPU" <<<"$out" ||
    { echo "FAIL: run without a GPU: exit $rc: $out"; exit 1; }
fi
# --time-limit: a stage with under 30 s left is recorded as not run (in LOGDIR/summary.md, written
# after every stage), and the limit takes whole seconds.
set +e
out=$(APE_GPU_ARCH=90a APE_PYTHON=$python "$dir/src/scripts/gpu-check.sh" run "$dir" --logs "$work/tl" \
  --stages suite,bench --time-limit 25 2>&1)
set -e
grep -q "| suite | FAIL | 0 | not run: under 30 s of --time-limit left |" "$work/tl/summary.md" &&
  grep -q "| bench | FAIL | 0 | not run" "$work/tl/summary.md" ||
  { echo "FAIL: --time-limit 25 ran a stage: $out"; exit 1; }
if out=$(APE_GPU_ARCH=90a "$dir/src/scripts/gpu-check.sh" run "$dir" --time-limit 5m 2>&1) ||
   ! grep -q "takes whole seconds" <<<"$out"; then
  echo "FAIL: --time-limit 5m: $out"; exit 1
fi
# The standalone suite configures (CUDA, LibTorch, GoogleTest from source) where nvcc is found.
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=$PATH:/usr/local/cuda/bin
  prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
  cmake -S "$dir/src/test/cuda/standalone" -B "$work/suite" -G Ninja -DAPE_SOURCE_DIR="$dir/src" \
    -DAPE_GENERATED_CPU="$dir/generated/cpu" -DAPE_GENERATED_CUDA="$dir/generated/cuda" \
    -DAPE_GTEST_SOURCE="$dir/third_party/googletest" -DAPE_JSON_INCLUDE="$dir/third_party/json" \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DAPE_CLI11_INCLUDE="$dir/third_party/cli11" >"$work/configure.log" 2>&1 ||
    { tail -30 "$work/configure.log"; echo "FAIL: the standalone GPU suite does not configure"; exit 1; }
  # Into a variable first: `ninja ... | grep -q` fails under pipefail whenever grep exits before
  # ninja has written everything (SIGPIPE), which made this check fail at random.
  targets=$(ninja -C "$work/suite" -t targets all)
  grep -q '^ape_cuda_kernels_test:' <<<"$targets" ||
    { echo "FAIL: no ape_cuda_kernels_test target"; exit 1; }
  for t in ape-train ape-eval ape-generate; do
    grep -q "^$t:" <<<"$targets" || { echo "FAIL: no $t target in the standalone project"; exit 1; }
  done
fi
echo "ok: $(grep -E 'cuda variants|size' "$dir/PREPARED" | tr '\n' ' ')"
