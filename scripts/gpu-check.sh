#!/usr/bin/env bash
# One command that checks everything GPU on a lent GPU machine (docs/cuda.md, "Checking on a GPU").
#
#   scripts/gpu-check.sh prepare [DIR]      here (MLIR, apec): writes DIR (default build/gpu-check),
#                                           one self-contained folder of at most 64 MiB; an earlier
#                                           prepared DIR is replaced, any other non-empty DIR refused
#   scripts/gpu-check.sh run [DIR] [--logs LOGDIR] [--full-bench] [--stages a,b,...]
#                            [--bench-configs BxHxTxD,...] [--bench-encodings a,b,...] [--time-limit S]
#                                           there (CUDA, CMake, its own PyTorch, no MLIR, no network):
#                                           builds against that machine's PyTorch and CUDA, runs every
#                                           stage under a time limit (all within S seconds, the table
#                                           included), prints one table, writes the logs to LOGDIR
#                                           (default DIR/logs; the table after every stage)
#
# `prepare` emits with apec what the GPU machine cannot make (it has no MLIR): the CPU and CUDA
# sources of every example spec for the GPU suite, the PyTorch operator libraries of the framework
# tests and of the benchmark; and copies the sources, GoogleTest's and nlohmann/json's that they
# build with. `run` stages (--stages picks some; each has its limit in seconds):
#   build      what the other chosen stages need: the GPU suite (test/cuda/standalone),
#              the runtime's tools, the framework tests' and the benchmark's operator
#              libraries, in DIR-build beside DIR (kept when a later device call replaces
#              DIR, so a rerun on the same machine builds only what changed)          300
#   suite      ape_cuda_kernels_test, sharded over the cores                          240
#   sanitizer  compute-sanitizer memcheck, racecheck, synccheck, initcheck on a
#              representative set (in parallel with `python`)                         200
#   python     test/python/test_cuda.py and the cuda cases of the framework tests,
#              then test_cuda.py's encodings with params (alibi, alibi_learned, shaw) 150 + 90
#   bench      bench/gpu_bench.py: APE against cuDNN, FlashAttention-2 (SDPA) and
#              FlexAttention, one configuration (1x16x4096x128) unless --full-bench or
#              --bench-configs; --bench-encodings picks encodings; with APE's
#              settings beside its defaults (the mma.sync backward, dQ' in any order,
#              the Hopper forward without its turns or persistent grid); then NoPE
#              and RoPE per head dim (the forward's and the backward's layouts, the
#              FlashAttention-2-class forward)                                    240 + 150
#   train      ape-train / ape-eval / ape-generate / ape-bench-decode built there; RoPE and Cable trained 200
#              steps on the CPU, on the GPU in f32, bf16 and f16 (loss curves compared,
#              test/gpu_check/train_smoke.py), resumed after a stop on the GPU (bit-exact)
#              and across devices, evaluated and decoded on the other device, cached decoding's
#              tokens/s (a text scored on the GPU and on the CPU, the two losses within 0.05
#              nats: score-match; one-token steps at L 1024
#              and 8192, keys split over blocks and not, and unsplit on the FlashAttention-2-class
#              kernel, at batch 1 and 32: ape-bench-decode), ALiBi (an
#              encoding with params) 20 steps, NCCL with one rank, and tokens/s against a PyTorch SDPA loop (bench/train_peer.py):
#              240 to build, 120 a run (the CPU run 240)
#   counters   (only when named) Nsight Compute's counters of APE's kernels for one
#              forward+backward of nope and rope (bench/gpu_counters.py: time, DRAM and
#              L2 bytes, atomics, registers, occupancy), NoPE's warp stalls, and with
#              time left NoPE with dQ' in any order (nope-anyorder) and on the mma.sync
#              backward (nope-mma), LOGDIR/gpu_counters.md                               180
#   study      (only when named) scripts/study.sh --preset gpu-small --device cuda: every seed
#              encoding trained and evaluated on the GPU, the report in LOGDIR/study/   540
# A short lease narrows the bench stage (run): APE_GPU_CHECK_BENCH_SETTINGS (gpu_bench.py
# --ape-settings, or "none"), APE_GPU_CHECK_BENCH_LIMIT (240 s), APE_GPU_CHECK_FORWARD_LIMIT (150 s;
# 0 leaves the per-head-dim run out), APE_GPU_CHECK_FORWARD_CONFIGS, _ENCODINGS and _SETTINGS (that
# run's), APE_GPU_CHECK_PROBE_LIMIT (120 s, the crash probe of each crashed encoding); the counters
# stage: APE_GPU_CHECK_COUNTERS_RUNS (of nope rope stalls nope-anyorder nope-mma) and
# APE_GPU_CHECK_COUNTERS_LIMIT (180 s). --time-limit S ends every stage in time for the table.
# APE_GPU_CHECK_KERNEL_TIMES=1 adds gpu_bench.py --kernel-times (each cell's time by kernel; off by
# default: its profiler runs between the timed cells).
# APE_GPU_CHECK_BUILD_ALSO=python,train (run) builds what those stages need without running them,
# so that a second call on the warm machine finds it built.
# APE_GPU_CHECK_ENCODINGS=rope,cable,... (prepare) keeps only those example specs (and test specs such as kcable_fast when named) and leaves out the
# study's (a shorter build for a short lease: the train stage needs rope, cable and alibi, the benchmark
# nope, rope, alibi, t5 and cable; the study stage then refuses).
# APE_GPU_CHECK_BENCH_ENCODINGS=kcable,shaw,... (prepare) adds those to the benchmark's operator
# libraries (then `run ... --bench-encodings` picks them); with a score mod over features among
# them (kcable, shaw, transformer_xl, deberta) the bench stage also times
# APE_CUDA_FEATURE_STEPS=0 (features-off). NAME_fast there (kcable_fast) is the example NAME marked
# fast_math (its score mods' exp, log, log1p and divisions by the GPU's approximate instructions;
# docs/cuda.md, "Fast math"), a library of its own beside NAME's.
# Before a lease, the build can be checked here, without a GPU (about 25 minutes on 2 cores):
#   APE_GPU_ARCH=90a APE_PYTHON=.venv/bin/python APE_GPU_CHECK_BUILD_LIMIT=3600 \
#     scripts/gpu-check.sh run build/gpu-check --logs /tmp/gc --stages build,suite,python,train,bench
# (APE_GPU_CHECK_BUILD_LIMIT: the build steps' time limit in seconds; the stages after the build
# then fail for want of a GPU). A runtime source missing from the standalone build's list left the
# tools unlinked there until such a build found it.
# Exit status: 0 when every stage that ran passed. CI runs `prepare` (so it cannot rot).
set -uo pipefail

usage() { sed -n '2,/^# Exit status/p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
mode=${1:-}
[ -n "$mode" ] || usage
shift
case $mode in -h | --help | help) usage 0 ;; esac

# Encodings of the GPU suite's every dtype and head dim (the emulated suite's full set: a plain
# score, row/column, relative-row and distance biases); the others at bf16, head dims 64 and 128
# (the Hopper forward's dims). The benchmark's encodings.
full_encodings="rope cable shaw t5"
bench_extra=${APE_GPU_CHECK_BENCH_ENCODINGS:-}
bench_encodings="nope rope alibi t5 cable ${bench_extra//,/ }"
# Specs whose CUDA kernels are not compiled here, with why (none: every spec compiles within
# the bounds of bench/results/cuda_compile_memory.md).
skip_cuda=""

prepare() {
  set -e
  local root dir apec
  root=$(cd "$(dirname "$0")/.." && pwd)
  dir=${1:-$root/build/gpu-check}
  case $dir in
    -h | --help) usage 0 ;;
    -*) echo "[gpu-check] prepare takes a folder, not '$dir'" >&2; exit 2 ;;
  esac
  # DIR is emptied first: only a folder this command wrote (its .gpu-check-prepare mark, left
  # by a run that stopped half way too) or an empty one, never a tree that happens to be named
  # (`prepare build`, `prepare .`).
  if [ -e "$dir" ] && { [ ! -d "$dir" ] || { [ ! -f "$dir/.gpu-check-prepare" ] && [ ! -f "$dir/PREPARED" ] && [ -n "$(ls -A "$dir")" ]; }; }; then
    echo "[gpu-check] $dir exists and is not a folder that gpu-check.sh prepare wrote: not replacing it" >&2
    exit 2
  fi
  apec=${APE_APEC:-$root/build/tools/apec}
  if [ ! -x "$apec" ]; then
    echo "[gpu-check] building apec" >&2
    "$root/scripts/build.sh" apec >&2
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  : >"$dir/.gpu-check-prepare"
  dir=$(cd "$dir" && pwd)
  local src=$dir/src
  echo "[gpu-check] preparing $dir" >&2

  # The sources the GPU machine builds, at their paths in the repository.
  mkdir -p "$src/kernels" "$src/test/cuda/standalone" "$src/test/unit" "$src/test/python" \
           "$src/examples" "$src/bench" "$src/scripts"
  cp -r "$root/kernels/include" "$src/kernels/"
  mkdir -p "$src/cmake" && cp "$root"/cmake/*.cmake "$src/cmake/"  # what the CMakeLists include
  cp "$root/test/cuda/cuda_kernels_test.cpp" "$src/test/cuda/"
  cp "$root/test/cuda/standalone/CMakeLists.txt" "$src/test/cuda/standalone/"
  cp "$root"/test/unit/kernel_reference.{h,cpp} "$root/test/unit/reference_lse.h" "$src/test/unit/"
  cp "$root"/test/python/*.py "$root/test/python/run.sh" "$root/test/python/CMakeLists.txt" \
     "$src/test/python/"
  cp -r "$root/examples/c" "$root/examples/encodings" "$src/examples/"
  cp "$root/bench/gpu_bench.py" "$root/bench/gpu_counters.py" "$root/bench/train_peer.py" "$root/bench/op_probe.py" \
     "$root/bench/decode_bench.cpp" "$src/bench/"
  # The runtime and its tools (the train stage), CLI11's headers, the corpus and its tokenized
  # cache (the GPU machine has no SentencePiece): made here by a one-step run if missing.
  cp -r "$root/runtime" "$src/"
  mkdir -p "$src/tools" "$src/test/gpu_check" "$src/data"
  cp "$root"/tools/ape_{train,eval,generate}.cpp "$root/tools/Cli.h" "$src/tools/"
  cp "$root/test/gpu_check/train_smoke.py" "$src/test/gpu_check/"
  cp -r "$root/data/pg30" "$src/data/"
  mkdir -p "$dir/third_party/cli11" && cp -r /usr/include/CLI "$dir/third_party/cli11/"
  local cache=${APE_CACHE_DIR:-$root/build/cache}
  if ! ls "$cache"/tokens_test_4096_*.bin >/dev/null 2>&1; then
    echo "[gpu-check] tokenizing the corpus (one training step)" >&2
    if [ -z "${APE_TRAIN:-}" ] && [ ! -x "$root/build/tools/ape-train" ]; then
      echo "[gpu-check] building ape-train" >&2
      "$root/scripts/build.sh" ape-train >&2
    fi
    "${APE_TRAIN:-$root/build/tools/ape-train}" -e nope --steps 1 --eval-multiples 1 --eval-tokens 1 \
      --cache-dir "$cache" --out "$dir/tmp-run" >&2
    rm -rf "$dir/tmp-run"
  fi
  mkdir -p "$dir/cache"
  cp "$cache"/spm_bpe_4096_*.model "$cache"/spm_bpe_4096_*.key "$cache"/tokens_*_4096_*.bin "$dir/cache/"
  cp "$root/scripts/gpu-check.sh" "$root/scripts/study.py" "$root/scripts/ape_spm.py" "$src/scripts/"
  mkdir -p "$src/bench/study" && cp "$root"/bench/study/*.mlir "$src/bench/study/"
  mkdir -p "$dir/third_party/json"
  cp -r /usr/src/googletest "$dir/third_party/googletest"
  cp -r /usr/include/nlohmann "$dir/third_party/json/nlohmann"

  # apec's outputs.
  local spec enc emit only=${APE_GPU_CHECK_ENCODINGS:-}
  for spec in "$root"/examples/encodings/*.mlir; do
    enc=$(basename "$spec" .mlir)
    if [ -n "$only" ] && [[ ",$only," != *",$enc,"* ]]; then continue; fi
    local src_name="examples/encodings/$enc.mlir"
    "$apec" "$spec" -o "$dir/generated/cpu" --emit=cpu --expect-name "$enc" --source-name "$src_name"
    if [[ " $skip_cuda " != *" $enc "* ]]; then
      if [[ " $full_encodings " == *" $enc "* ]]; then
        "$apec" "$spec" -o "$dir/generated/cuda" --emit=cuda --cuda-dtypes=bf16,f16,f32 \
          --cuda-head-dims=32,64,128 --expect-name "$enc" --source-name "$src_name"
      else
        # (alibi also at head dim 32: the train stage trains it on the GPU at the default model's)
        "$apec" "$spec" -o "$dir/generated/cuda" --emit=cuda --cuda-dtypes=bf16 \
          --cuda-head-dims=$([ "$enc" = alibi ] && echo 32,64,128 || echo 64,128) \
          --expect-name "$enc" --source-name "$src_name"
      fi
    fi
    # The framework tests' libraries, as test/python/run.sh emits them (an attention transition's
    # too: inference only, test_transition_ops.py).
    emit=torch-library
    case " rope alibi cable expe rope_transition " in *" $enc "*) emit=torch-library,c-abi ;; esac
    "$apec" "$spec" -o "$dir/emitted" --emit=$emit --cuda-dtypes=bf16,f32 --cuda-head-dims=64 \
      --expect-name "$enc" --source-name "$src_name"
    if [[ " $bench_encodings " == *" $enc "* ]]; then
      "$apec" "$spec" -o "$dir/bench-libs" --emit=torch-library --cuda-dtypes=bf16 \
        --cuda-head-dims=64,128 --expect-name "$enc" --source-name "$src_name"
    fi
    if [[ " $bench_encodings " == *" ${enc}_fast "* ]]; then  # the same spec, renamed and marked
      mkdir -p "$dir/bench-specs"
      sed -e "s/^ape\.encoding @$enc attributes {/ape.encoding @${enc}_fast attributes {fast_math, /" \
        -e "s/^ape\.encoding @$enc {/ape.encoding @${enc}_fast attributes {fast_math} {/" \
        "$spec" > "$dir/bench-specs/${enc}_fast.mlir"
      "$apec" "$dir/bench-specs/${enc}_fast.mlir" -o "$dir/bench-libs" --emit=torch-library \
        --cuda-dtypes=bf16 --cuda-head-dims=64,128 --expect-name "${enc}_fast" \
        --source-name "examples/encodings/$enc.mlir (fast_math)"
    fi
  done

  # Test specs the GPU suite checks on the hardware beside the examples: kcable_fast (K-Cable marked
  # fast_math: the GPU's approximate instructions, which the emulator only models).
  for spec in "$root"/test/unit/Inputs/kcable_fast.mlir; do
    enc=$(basename "$spec" .mlir)
    if [ -n "$only" ] && [[ ",$only," != *",$enc,"* ]]; then continue; fi
    "$apec" "$spec" -o "$dir/generated/cpu" --emit=cpu --expect-name "$enc" --source-name "test/unit/Inputs/$enc.mlir"
    "$apec" "$spec" -o "$dir/generated/cuda" --emit=cuda --cuda-dtypes=bf16 --cuda-head-dims=64,128 \
      --expect-name "$enc" --source-name "test/unit/Inputs/$enc.mlir"
  done

  # The study-only specs of `--preset gpu-small` (bench/study's and the ones the driver makes from
  # the preset, such as ExPE at its own theta), compiled in as built-in encodings: the GPU machine
  # has no apec to compile them at run time. The study stage names the folder (--builtin-specs),
  # and the driver checks that each file is still the spec it would run.
  [ -z "$only" ] && /usr/bin/python3 "$root/scripts/study.py" --preset gpu-small --write-specs "$dir/study-specs" >/dev/null
  for spec in "$dir"/study-specs/*.mlir; do
    [ -f "$spec" ] || continue
    enc=$(basename "$spec" .mlir)
    "$apec" "$spec" -o "$dir/generated/cpu" --emit=cpu --expect-name "$enc" --source-name "study-specs/$enc.mlir"
    "$apec" "$spec" -o "$dir/generated/cuda" --emit=cuda --cuda-dtypes=bf16 --cuda-head-dims=64,128 \
      --expect-name "$enc" --source-name "study-specs/$enc.mlir"
  done

  {
    echo "prepared: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
      git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "cuda variants: $(ls "$dir/generated/cuda" | grep -c '_hd[0-9]*\.cu$')"
    echo "skipped on CUDA: ${skip_cuda:-none}"
    [ -z "$only" ] || echo "encodings: $only only (APE_GPU_CHECK_ENCODINGS; no study specs)"
  } >"$dir/PREPARED"
  local bytes
  bytes=$(du -sb "$dir" | cut -f1)
  echo "size: $bytes bytes" >>"$dir/PREPARED"
  if [ "$bytes" -gt $((64 * 1024 * 1024)) ]; then
    echo "[gpu-check] error: $dir is $bytes bytes, more than the 64 MiB that travel to a GPU machine" >&2
    exit 1
  fi
  cat "$dir/PREPARED"
  echo "[gpu-check] done: copy $dir to the GPU machine and run: scripts/gpu-check.sh run $dir" >&2
  echo "  (with the device tool: carry [\"${dir#$root/}\"], command \"scripts/gpu-check.sh run ${dir#$root/} --logs /tmp/gc;" \
       "rc=\$?; tar -C /tmp -czf \$OUT/gc.tgz --exclude='*.ckpt' --exclude='*.bin' gc; exit \$rc\": the train stage's" \
       "checkpoints stay behind)" >&2
}

# ---- the train stage: the runtime on the GPU (issue 32) ------------------------------------------
train_stage() {  # dir suite_build logs python jobs
  local dir=$1 build=$2 py=$4 jobs=$5
  local out=$3/train
  # A fresh folder: a rerun with the same --logs had judged the last run's checkpoints where a step
  # died before writing its own (and steps.txt grew by appends).
  rm -rf "$out" && mkdir -p "$out"
  timeout "$(lim "${APE_GPU_CHECK_BUILD_LIMIT:-240}")" cmake --build "$build" --target ape-train ape-eval ape-generate \
    -- -j"$jobs" >"$out/build.log" 2>&1 || { echo "the runtime did not build (logs/train/build.log)" >"$out/verdict.txt"; return 1; }
  local bin=$build/tools cache=$dir/cache-run
  rm -rf "$cache" && cp -r "$dir/cache" "$cache"
  # The tools there are built without SentencePiece's C++ library: prompts and generated text go
  # through its Python package (scripts/ape_spm.py, the same bytes as ape-spm).
  export APE_SPM_TOOL=$dir/src/scripts/ape_spm.py
  local common=(--data "$dir/src/data/pg30" --cache-dir "$cache" --steps 200 --eval-multiples 1,2
                --eval-tokens 8192 --checkpoint-every 50 --seed 1234)
  local rc=0
  step() {  # name command...: runs it under $STEP_LIMIT seconds (120), its output in OUT/name.log
    local name=$1; shift
    echo "+ $*" >"$out/$name.log"
    timeout "$(lim "${STEP_LIMIT:-120}")" "$@" >>"$out/$name.log" 2>&1
    local r=$?
    echo "$name: exit $r" | tee -a "$out/steps.txt"
    return $r
  }
  # The CPU reference (the standalone build's CPU kernels are its baseline level: about 3k tokens/s
  # on 2 cores here, so 16 cores take some 30 s for both).
  STEP_LIMIT=240 step cpu "$bin/ape-train" -e rope,cable "${common[@]}" --device cpu --out "$out/cpu" || rc=1
  step gpu-f32 "$bin/ape-train" -e rope,cable "${common[@]}" --device cuda --precision f32 --out "$out/gpu-f32" || rc=1
  # With LibTorch's sync debug mode inside the queued steps (APE_CUDA_SYNC_DEBUG, runtime/
  # CudaAttention.h): every wait for the GPU there prints a warning, which train_smoke.py counts.
  APE_CUDA_SYNC_DEBUG=warn step gpu-bf16 "$bin/ape-train" -e rope,cable "${common[@]}" --device cuda \
    --out "$out/gpu-bf16" || rc=1
  # float16 with dynamic loss scaling (overflowed steps skipped on the device), also without waits.
  APE_CUDA_SYNC_DEBUG=warn step gpu-f16 "$bin/ape-train" -e rope,cable "${common[@]}" --device cuda \
    --precision f16 --out "$out/gpu-f16" || rc=1
  # Stopped at step 120 (as Ctrl-C stops it: exit 130), then resumed: on the GPU, and on the CPU.
  APE_TEST_STOP_AFTER_STEP=120 step stop-gpu "$bin/ape-train" -e rope "${common[@]}" --device cuda \
    --out "$out/resume-gpu"
  step resume-gpu "$bin/ape-train" --resume "$out/resume-gpu/rope.ckpt" --device cuda || rc=1
  APE_TEST_STOP_AFTER_STEP=120 step stop-for-cpu "$bin/ape-train" -e rope "${common[@]}" --device cuda \
    --out "$out/resume-cpu"
  step resume-cpu "$bin/ape-train" --resume "$out/resume-cpu/rope.ckpt" --device cpu || rc=1
  step eval-gpu-ckpt-on-cpu "$bin/ape-eval" -c "$out/gpu-bf16/rope.ckpt" --device cpu --eval-multiples 1,2 \
    --eval-tokens 8192 --data "$dir/src/data/pg30" --cache-dir "$cache" || rc=1
  step eval-cpu-ckpt-on-gpu "$bin/ape-eval" -c "$out/cpu/cable.ckpt" --device cuda --eval-multiples 1,2 \
    --eval-tokens 8192 --data "$dir/src/data/pg30" --cache-dir "$cache" || rc=1
  step generate "$bin/ape-generate" -c "$out/gpu-bf16/rope.ckpt" --device cpu -p "It was a dark night" \
    -n 24 --cache-dir "$cache" || rc=1
  step generate-gpu "$bin/ape-generate" -c "$out/cpu/cable.ckpt" --device cuda -p "It was a dark night" \
    -n 24 --cache-dir "$cache" || rc=1
  # Cached decoding's speed: one text scored token by token through the KV cache on the GPU (RoPE:
  # its k' cached, the cache read in place: CudaAttnArgs::ld, km) and on the CPU; tokens/s in the
  # [score] lines of the two logs.
  cat "$dir"/src/bench/*.py > "$out/score.txt"
  step score-gpu "$bin/ape-generate" -c "$out/gpu-bf16/rope.ckpt" --device cuda --score "$out/score.txt" \
    --score-tokens 4096 --cache-dir "$cache" || rc=1
  step score-cpu "$bin/ape-generate" -c "$out/gpu-bf16/rope.ckpt" --device cpu --score "$out/score.txt" \
    --score-tokens 4096 --cache-dir "$cache" || rc=1
  # The two scores agree: the GPU's cached steps (q read from each step's first row rounded down
  # to 384, CudaAttnArgs::q_row0; k' kept) against the CPU's, the last bucket's cumulative loss (the
  # mean over all 4096 tokens) within 0.05 nats (bf16 against f32; a broken step costs nats). The
  # two values in score-match.log; steps.txt gets the step's status as every step's.
  local sg sc
  sg=$(awk 'NF == 5 && $1 ~ /\.\./ { v = $5 } END { print v }' "$out/score-gpu.log")
  sc=$(awk 'NF == 5 && $1 ~ /\.\./ { v = $5 } END { print v }' "$out/score-cpu.log")
  echo "cumulative loss over the scored text: gpu '$sg', cpu '$sc' (within 0.05 nats)" >"$out/score-match.log"
  if [ -n "$sg" ] && [ -n "$sc" ] && awk -v a="$sg" -v b="$sc" 'BEGIN { d = a - b; exit !(d < 0.05 && d > -0.05) }'; then
    echo "score-match: exit 0" | tee -a "$out/steps.txt"
  else
    echo "score-match: exit 1" | tee -a "$out/steps.txt"
    rc=1
  fi
  # One-token steps at long contexts (B 1, H 16, d_h 64): each slice's keys split over blocks (the
  # default, CudaAttnArgs::num_splits) and unsplit; tokens/s in the CSVs. Cable: a step reruns its
  # token program over all L (one block a slice), what its time against RoPE's shows.
  local dec=(--encodings nope,rope,cable --lengths 1024,8192 --new 64 --d-model 1024 --layers 4 --heads 16 --device cuda)
  STEP_LIMIT=120 step decode-build cmake --build "$build" --target ape-bench-decode -- -j"$jobs" || rc=1
  step decode-split "$bin/ape-bench-decode" "${dec[@]}" --csv "$out/decode-split.csv" || rc=1
  APE_CUDA_NUM_SPLITS=1 step decode-unsplit "$bin/ape-bench-decode" "${dec[@]}" --csv "$out/decode-unsplit.csv" || rc=1
  # Unsplit without the Hopper forward: the FlashAttention-2-class kernel as one share, whose warps
  # without the new row compute nothing (on sm_90 against the Hopper forward's whole 128-row tile).
  APE_CUDA_NUM_SPLITS=1 APE_CUDA_HOPPER_FORWARD=0 step decode-oneshare "$bin/ape-bench-decode" "${dec[@]}" \
    --csv "$out/decode-oneshare.csv" || rc=1
  # A batch of 32 (512 slices: the tiles alone fill the SMs, no split): the default (on sm_90 the
  # Hopper forward's whole tile) against the FlashAttention-2-class kernel as one share.
  local decb=(--encodings rope --lengths 1024,8192 --new 32 --batch 32 --d-model 1024 --layers 4 --heads 16 --device cuda)
  step decode-batch "$bin/ape-bench-decode" "${decb[@]}" --csv "$out/decode-batch.csv" || rc=1
  APE_CUDA_HOPPER_FORWARD=0 step decode-batch-oneshare "$bin/ape-bench-decode" "${decb[@]}" \
    --csv "$out/decode-batch-oneshare.csv" || rc=1
  # Grouped-query decode (16 query heads reading 2 key heads): each group's rows packed into one
  # block, which reads k' and v once for the group (the default), against the flash kernels' rows,
  # a query head a block (APE_CUDA_PACK_GQA=0).
  local decg=(--encodings nope,rope --lengths 1024,8192 --new 64 --batch 4 --d-model 1024 --layers 4 --heads 16
              --kv-heads 2 --device cuda)
  step decode-gqa "$bin/ape-bench-decode" "${decg[@]}" --csv "$out/decode-gqa.csv" || rc=1
  APE_CUDA_PACK_GQA=0 step decode-gqa-unpacked "$bin/ape-bench-decode" "${decg[@]}" \
    --csv "$out/decode-gqa-unpacked.csv" || rc=1
  # An encoding with params (ALiBi's trainable slopes): 20 steps on the GPU, its params' gradients
  # through the CUDA backward.
  step gpu-params "$bin/ape-train" -e alibi --steps 20 --eval-multiples 1 --eval-tokens 2048 \
    --data "$dir/src/data/pg30" --cache-dir "$cache" --device cuda --out "$out/gpu-params" || rc=1
  # Grouped-query attention (--kv-heads: the CUDA kernels read the key heads in place and sum
  # dk, dv per group): 20 steps on the GPU and its evaluation.
  step gpu-kv-heads "$bin/ape-train" -e rope --heads 4 --kv-heads 2 --steps 20 --eval-multiples 1 --eval-tokens 2048 \
    --data "$dir/src/data/pg30" --cache-dir "$cache" --device cuda --out "$out/gpu-kv-heads" || rc=1
  # One rank of data parallel on NCCL: its steps are queued too (the mean loss stays on the GPU).
  APE_CUDA_SYNC_DEBUG=warn step nccl "$bin/ape-train" -e rope --steps 20 --eval-multiples 1 --eval-tokens 2048 --data "$dir/src/data/pg30" \
    --cache-dir "$cache" --device cuda --rank 0 --world-size 1 --master-addr 127.0.0.1 --master-port 29561 \
    --out "$out/nccl" || rc=1
  # Speed: one larger model, APE's kernels against PyTorch SDPA (bf16, the same architecture).
  local speed=(--d-model 1024 --layers 8 --heads 16 --seq-len 2048 --batch 8)
  step speed-ape "$bin/ape-train" -e rope "${speed[@]}" --steps 40 --warmup 5 --eval-multiples 1 \
    --eval-tokens 2048 --checkpoint-every 0 --checkpoint-minutes 0 --data "$dir/src/data/pg30" \
    --cache-dir "$cache" --device cuda --out "$out/speed" || rc=1
  # Its checkpoint (the model and AdamW's state, about 1.2 GB) is not needed and must not travel back.
  rm -f "$out/speed/"*.ckpt
  # The peer with SDPA's own choice of backend (FlashAttention-2 before cuDNN in its priority order)
  # and with cuDNN forced; both rotate q and k by torch.compile (train_peer.py).
  step speed-sdpa "$py" "$dir/src/bench/train_peer.py" "${speed[@]}" --steps 40 --vocab 4096 || rc=1
  step speed-sdpa-cudnn "$py" "$dir/src/bench/train_peer.py" "${speed[@]}" --steps 40 --vocab 4096 \
    --backend cudnn || rc=1
  "$py" "$dir/src/test/gpu_check/train_smoke.py" "$out" | tee "$out/verdict.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  return $rc
}

# ---- run: on the GPU machine ---------------------------------------------------------------------
declare -A stage_status stage_time stage_note
stage_order=()

record() {  # stage status seconds note
  stage_order+=("$1")
  stage_status[$1]=$2 stage_time[$1]=$3 stage_note[$1]=$4
  write_table >/dev/null  # LOGDIR/summary.md after every stage: a run stopped from outside keeps it
}

# The table of the stages so far, on stdout and in LOGDIR/summary.md (run's $logs and $t0).
write_table() {
  local st
  {
    echo
    echo "| stage | result | seconds | notes |"
    echo "| --- | --- | --- | --- |"
    for st in "${stage_order[@]}"; do
      echo "| $st | ${stage_status[$st]} | ${stage_time[$st]} | ${stage_note[$st]} |"
    done
    echo
    echo "total: $(( $(date +%s) - t0 )) s; logs in $logs; card: ${card:-unknown}"
  } | tee "$logs/summary.md"
}

# A stage's time limit: N seconds, or what is left before --time-limit's end less 20 s for the
# table, whichever is less (at least 1). An inner `timeout` runs in a process group of its own,
# which a signal to the caller's group does not reach: the run ends by itself, on time.
deadline=""
lim() {
  local n=$1 secs left
  [ -n "$deadline" ] || { echo "$n"; return; }
  case $n in  # timeout's units
    *d) secs=${n%d}; [[ $secs =~ ^[0-9]+$ ]] && secs=$(( secs * 86400 )) ;;
    *h) secs=${n%h}; [[ $secs =~ ^[0-9]+$ ]] && secs=$(( secs * 3600 )) ;;
    *m) secs=${n%m}; [[ $secs =~ ^[0-9]+$ ]] && secs=$(( secs * 60 )) ;;
    *s) secs=${n%s} ;;
    *) secs=$n ;;
  esac
  [[ $secs =~ ^[0-9]+$ ]] || secs=86400  # a fraction: the deadline decides
  [ "$secs" -gt 0 ] || secs=86400          # 0, timeout's "no limit": the deadline decides
  left=$(( deadline - $(date +%s) - 20 ))
  [ "$left" -ge 1 ] || left=1
  echo $(( secs < left ? secs : left ))
}

run() {
  local dir="" logs="" full_bench=0 stages="build,suite,sanitizer,python,bench,train"
  local bench_configs="" bench_encodings=""
  while [ $# -gt 0 ]; do
    case $1 in
      --logs | --bench-configs | --bench-encodings | --stages | --time-limit)
        [ $# -ge 2 ] || { echo "[gpu-check] $1 takes a value" >&2; exit 2; } ;;&
      --logs) logs=$2; shift 2 ;;
      --full-bench) full_bench=1; shift ;;
      --bench-configs) bench_configs=$2; shift 2 ;;
      --bench-encodings) bench_encodings=$2; shift 2 ;;
      --stages) stages=$2; shift 2 ;;
      --time-limit)
        [[ ${2:-} =~ ^[0-9]+$ ]] || { echo "[gpu-check] --time-limit takes whole seconds, got '${2:-}'" >&2; exit 2; }
        deadline=$(( $(date +%s) + $2 )); shift 2 ;;
      -h|--help) usage 0 ;;
      -*) echo "[gpu-check] unknown option $1" >&2; exit 2 ;;
      *) dir=$1; shift ;;
    esac
  done
  local st
  [[ -n ${stages//[, ]/} ]] || { echo "[gpu-check] --stages names no stage" >&2; exit 2; }
  for st in ${stages//,/ }; do  # a misspelt stage would run nothing and pass
    case $st in
      build | suite | sanitizer | python | bench | train | counters | study) ;;
      *) echo "[gpu-check] unknown stage '$st' (build, suite, sanitizer, python, bench, train, counters, study)" >&2
         exit 2 ;;
    esac
  done
  if [ -z "$dir" ]; then  # the copy inside a prepared folder runs its folder; else build/gpu-check
    dir=$(cd "$(dirname "$0")/../.." && pwd)
    [ -f "$dir/PREPARED" ] || dir=$(cd "$(dirname "$0")/.." && pwd)/build/gpu-check
  fi
  [ -f "$dir/PREPARED" ] || { echo "[gpu-check] $dir is not a prepared folder (no PREPARED): run 'scripts/gpu-check.sh prepare' where apec is" >&2; exit 2; }
  dir=$(cd "$dir" && pwd)
  logs=${logs:-$dir/logs}
  mkdir -p "$logs"
  logs=$(cd "$logs" && pwd)
  local src=$dir/src py=${APE_PYTHON:-python3} jobs
  # A relative interpreter path (APE_PYTHON=.venv/bin/python) would not be found from the stages
  # that change folder (the python stage runs in src/test/python).
  case $py in */*) py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py") ;; esac
  jobs=$(nproc)
  local t0
  t0=$(date +%s)
  want() {  # a chosen stage, with time left for it (--time-limit: 30 s at least)
    [[ ",$stages," == *",$1,"* ]] || return 1
    if [ -n "$deadline" ] && [ $(( deadline - $(date +%s) )) -lt 30 ]; then
      [ -n "${stage_status[$1]+x}" ] || record "$1" FAIL 0 "not run: under 30 s of --time-limit left"
      return 1
    fi
  }

  # The machine.
  {
    echo "prepared folder: $dir"; cat "$dir/PREPARED"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>&1
    nvcc --version 2>&1 | tail -1
    cmake --version | head -1
    "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())' 2>&1
    "$py" -c 'import pytest; print("pytest", pytest.__version__)' 2>&1 | tail -1
  } | tee "$logs/machine.txt"
  local cap arch
  # The card, named in summary.md and the train stage's verdict (files read apart from machine.txt).
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  export APE_GPU_CHECK_CARD=${card:-no GPU}
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
  case $cap in
    9.0) arch=90a ;;
    "") arch=${APE_GPU_ARCH:-}  # no GPU: only a build can be checked (APE_GPU_ARCH=90a --stages build)
        [ -n "$arch" ] || { echo "[gpu-check] error: nvidia-smi found no GPU" >&2; exit 2; } ;;
    *) arch=${cap/./} ;;
  esac
  arch=${APE_GPU_ARCH:-$arch}
  echo "architecture: sm_$arch" | tee -a "$logs/machine.txt"
  local torch_prefix
  torch_prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)') ||
    { echo "[gpu-check] error: $py cannot import torch" >&2; exit 2; }

  # The builds beside the carried folder: a device call replaces the folder, the builds stay.
  local build_root=${APE_GPU_CHECK_BUILD:-$dir-build}
  mkdir -p "$build_root"
  local suite_build=$build_root/suite fw_build=$build_root/python bench_libs=$build_root/bench-libs
  # The framework tests' libraries with CUDA kernels: test/python's rope and cable, an encoding
  # with a fixed param and one with a trainable param, and one of the general path (relative
  # rows and value rows: test_cuda.py checks it against the C++ reference), and the attention
  # transition's (inference only: test_transition_ops.py), where prepared.
  local fw_cuda_encodings="" e
  for e in rope cable alibi alibi_learned shaw rope_transition; do
    [ -d "$dir/emitted/${e}_torch_library" ] && fw_cuda_encodings+="${fw_cuda_encodings:+;}$e"
  done
  local status note s

  # -- build ----------------------------------------------------------------------------------
  if want build; then
    s=$(date +%s)
    # Only what the chosen stages use.
    local suite_targets=()
    { want suite || want sanitizer; } && suite_targets+=(ape_cuda_kernels_test)
    # APE_GPU_CHECK_BUILD_ALSO=train,python,...: also what those stages need, for a later call on the
    # same machine (whose build then finds it done) while this call's stages run.
    also() { [[ ",${APE_GPU_CHECK_BUILD_ALSO:-}," == *",$1,"* ]]; }
    { also suite || also sanitizer; } && suite_targets+=(ape_cuda_kernels_test)
    { want train || want study || also train; } && suite_targets+=(ape-train ape-eval ape-generate)
    local p1="" p2="" p3="" built=""
    if [ ${#suite_targets[@]} -gt 0 ]; then
    built+=" suite(${suite_targets[*]})"
    (
      cmake -S "$src/test/cuda/standalone" -B "$suite_build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DAPE_SOURCE_DIR="$src" -DAPE_GENERATED_CPU="$dir/generated/cpu" \
        -DAPE_GENERATED_CUDA="$dir/generated/cuda" -DAPE_GTEST_SOURCE="$dir/third_party/googletest" \
        -DAPE_JSON_INCLUDE="$dir/third_party/json" -DCMAKE_PREFIX_PATH="$torch_prefix" \
        -DAPE_CLI11_INCLUDE="$dir/third_party/cli11" \
        -DCMAKE_CUDA_ARCHITECTURES="$arch" &&
      timeout "$(lim "${APE_GPU_CHECK_BUILD_LIMIT:-300}")" cmake --build "$suite_build" --target "${suite_targets[@]}" -- -j"$jobs" -k 0
    ) >"$logs/build-suite.log" 2>&1 &
    p1=$!
    fi
    if want python || also python; then
    built+=" python"
    (
      cmake -S "$src/test/python" -B "$fw_build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CXX_FLAGS_RELEASE=-O2 -DCMAKE_C_FLAGS_RELEASE=-O2 -DAPE_EMITTED_DIR="$dir/emitted" \
        -DAPE_PYTHON="$py" -DAPE_CUDA_ARCHS="$arch" -DAPE_CUDA_ENCODINGS="$fw_cuda_encodings" &&
      timeout "$(lim "${APE_GPU_CHECK_BUILD_LIMIT:-300}")" cmake --build "$fw_build" -- -j"$jobs"
    ) >"$logs/build-python.log" 2>&1 &
    p2=$!
    fi
    if want bench || want counters; then
    built+=" bench"
    (
      # The benchmark's libraries, each with its own CMakeLists.txt as a user builds it (the
      # benchmark finds BENCH_LIBS/ENC_torch_library/build/ape_ENC.py). All at once: one library
      # is a configure (find_package(Torch), ~10 s) and a few units, so one after another left
      # most cores idle (8 libraries: about 350 s on 2 cores either way; on 16 cores one after
      # another is the sum of 8 configures and 8 slowest units). g++ on LibTorch's headers takes
      # 1-1.5 GB a unit: cores/libraries + 1 jobs each keeps the three builds' sum in memory.
      local libs=() lib_pids=() lib_jobs lib_failed=0 n lib wanted=""
      # With --bench-encodings: those libraries, and NoPE's and RoPE's where the per-head-dim run or
      # the counters use them (a library is some 40 s of nvcc a unit); else every prepared one.
      if [ -n "$bench_encodings" ]; then
        wanted=",$bench_encodings,"
        { want counters || { want bench && [ "${APE_GPU_CHECK_FORWARD_LIMIT:-150}" != 0 ]; }; } &&
          wanted+="nope,rope,${APE_GPU_CHECK_FORWARD_ENCODINGS:-nope,rope},"
      fi
      for lib in "$dir"/bench-libs/*_torch_library; do
        n=$(basename "$lib" _torch_library)
        [ -z "$wanted" ] || [[ "$wanted" == *",$n,"* ]] && libs+=("$lib")
      done
      [ ${#libs[@]} -gt 0 ] || { echo "[build] no benchmark library prepared for --bench-encodings $bench_encodings"; exit 1; }
      lib_jobs=$(( jobs / ${#libs[@]} + 1 ))  # with the suite's and the python stage's builds beside
      for lib in "${libs[@]}"; do
        n=$(basename "$lib")
        (
          cmake -S "$lib" -B "$bench_libs/$n/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
            -DAPE_PYTHON="$py" -DAPE_CUDA_ARCHS="$arch" &&
          timeout "$(lim "${APE_GPU_CHECK_BUILD_LIMIT:-600}")" cmake --build "$bench_libs/$n/build" -- -j"$lib_jobs"
        ) >"$logs/build-bench-$n.log" 2>&1 &
        lib_pids+=($!)
      done
      for n in "${!libs[@]}"; do
        wait "${lib_pids[$n]}" || { lib_failed=1; echo "[build] FAILED: $(basename "${libs[$n]}")"; }
        echo "== $(basename "${libs[$n]}")"; cat "$logs/build-bench-$(basename "${libs[$n]}").log"
        rm -f "$logs/build-bench-$(basename "${libs[$n]}").log"
      done
      [ "$lib_failed" = 0 ] || exit 1
      # Which CUDA runtime each library uses: the process's shared one (NEEDED libcudart.so.N, no
      # cuda* function of its own), or a private static copy (cuda* functions defined inside).
      for so in "$bench_libs"/*/build/libape_*_ops.so; do
        echo "[runtime] $(basename "$so"): needs $(readelf -d "$so" | grep -o 'libcudart[^]]*' | tr '\n' ' ')" \
          "defines $(nm -D --defined-only "$so" 2>/dev/null | grep -c ' T cuda') cuda* functions"
        # A private copy of libstdc++'s streams and locales inside (the H200's libraries of
        # 2026-12-04 crashed in a stream's number output, in code of their own named as
        # libstdc++'s): how many such functions it defines, and the command that linked it.
        echo "[libstdc++] $(basename "$so"): defines $(nm -C --defined-only "$so" 2>/dev/null |
          grep -cE ' [TtWw] std::(locale|ios_base|__codecvt|codecvt|num_put|basic_ios<char|__cxx11::basic_ostringstream)') of libstdc++'s locale and stream functions"
        ninja -C "$(dirname "$so")" -t commands "$(basename "$so")" 2>/dev/null | tail -1 | sed 's/^/[link] /'
      done
    ) >"$logs/build-bench.log" 2>&1 &
    p3=$!
    fi
    local ok=1 failed_parts=""
    [ -z "$p1" ] || wait $p1 || { ok=0; failed_parts+=" suite"; }
    [ -z "$p2" ] || wait $p2 || { ok=0; failed_parts+=" python"; }
    [ -z "$p3" ] || wait $p3 || { ok=0; failed_parts+=" bench"; }
    if [ $ok = 1 ]; then
      record build pass $(( $(date +%s) - s )) "sm_$arch,${built:- nothing}; $(ls "$dir/generated/cuda" | grep -c '_hd[0-9]*\.cu$') CUDA variants"
    else
      record build FAIL $(( $(date +%s) - s )) "failed:$failed_parts (logs/build-*.log)"
      tail -n 30 "$logs"/build-*.log
    fi
  fi

  local exe=$suite_build/ape_cuda_kernels_test
  # -- suite ----------------------------------------------------------------------------------
  if want suite; then
    s=$(date +%s)
    if [ -x "$exe" ]; then
      local shards=$(( jobs / 2 > 8 ? 8 : (jobs / 2 < 1 ? 1 : jobs / 2) )) i pids=()
      for ((i = 0; i < shards; i++)); do
        GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "$(lim 240)" "$exe" --gtest_brief=1 \
          >"$logs/suite.$i.log" 2>&1 & pids+=($!)
      done
      local bad=0
      for p in "${pids[@]}"; do wait "$p" || bad=1; done
      local passed failed
      passed=$(cat "$logs"/suite.*.log | grep -oE '\[  PASSED  \] [0-9]+' | awk '{n += $NF} END {print n + 0}')
      failed=$(cat "$logs"/suite.*.log | grep -oE '\[  FAILED  \] [0-9]+ tests?[,.]' | awk '{n += $4} END {print n + 0}')
      local skipped
      skipped=$(cat "$logs"/suite.*.log | grep -oE '\[  SKIPPED \] [0-9]+ tests?[,.]' | awk '{n += $4} END {print n + 0}')
      cat "$logs"/suite.*.log >"$logs/suite.log"; rm -f "$logs"/suite.*.log
      # On a GPU a test skips only where it does not apply: a variant outside a check's dtypes or
      # head dims, and, in a folder prepared with APE_GPU_CHECK_ENCODINGS, an encoding left out.
      local allowed='16-bit inputs at D 64 and 128 only' unexpected
      grep -q '^encodings: .* only' "$dir/PREPARED" && allowed+='|(is|are) not in this build'
      unexpected=$(grep -A1 ': Skipped$' "$logs/suite.log" | grep -v ': Skipped$' | grep -v '^--$' |
        grep -vcE "$allowed")
      note="${passed:-0} passed, $failed failed, $skipped skipped ($shards shards$(
        [ "$skipped" -gt 0 ] && echo "; $((skipped - unexpected)) where a check does not apply or an encoding is left out"))"
      if [ $bad = 0 ] && [ "$failed" = 0 ] && [ "${passed:-0}" -gt 0 ] &&
         { [ "$unexpected" = 0 ] || [ -z "$cap" ]; }; then status=pass; else status=FAIL; fi
      record suite $status $(( $(date +%s) - s )) "$note"
    else
      record suite FAIL 0 "not built"
    fi
  fi

  # -- sanitizer (in the background) and python --------------------------------------------------
  local san_pid=""
  local san_filter='All/CudaKernel.MatchesReferencesForwardAndGradients/rope_bf16_hd128:All/CudaKernel.MatchesReferencesForwardAndGradients/cable_bf16_hd64:All/CudaKernel.MatchesReferencesForwardAndGradients/t5_bf16_hd128:All/CudaKernel.MatchesReferencesForwardAndGradients/rope_f32_hd64:All/CudaKernel.DecodeStepsEqualTheFullForward/cable_bf16_hd128:All/CudaKernel.WgmmaBackwardMatchesReferences/rope_bf16_hd128:All/CudaKernel.WgmmaBackwardMatchesReferences/t5_bf16_hd64:CudaLaunch.DqByTmaReductions:CudaLaunch.SubTileBackwardIsDeterministic:CudaStatus.*'
  local san_start
  if want sanitizer; then
    san_start=$(date +%s)
    if [ -x "$exe" ] && command -v compute-sanitizer >/dev/null; then
      (
        for tool in memcheck racecheck synccheck initcheck; do
          timeout "$(lim 200)" compute-sanitizer --tool "$tool" --error-exitcode 99 "$exe" \
            --gtest_filter="$san_filter" --gtest_brief=1 >"$logs/sanitizer-$tool.log" 2>&1 &
        done
        wait
      ) & san_pid=$!
    fi
  fi

  if want python; then
    s=$(date +%s)
    if ! "$py" -c 'import pytest' 2>/dev/null; then
      record python FAIL 0 "$py has no pytest here"
    elif [ -f "$fw_build/CMakeCache.txt" ]; then
      (
        export APE_TEST_ARTIFACTS=$fw_build OMP_NUM_THREADS=1
        # A folder prepared for some encodings (APE_GPU_CHECK_ENCODINGS) has only their libraries:
        # the tests skip the others, naming this (test/python/support.py).
        local only
        only=$(sed -n 's/^encodings: \([^ ]*\) only.*/\1/p' "$dir/PREPARED")
        [ -n "$only" ] && export APE_TEST_ENCODINGS=$only
        export TORCHINDUCTOR_CACHE_DIR=$dir/inductor-cache
        cd "$src/test/python" &&
        # The cases of the encodings with params (alibi, alibi_learned, rope_alibi, shaw) in a pytest of
        # their own, after the rest: a crash there (the operator library's params on CUDA once ended the benchmark
        # with a host SIGSEGV) costs only their cases, and -v names the case it ended in.
        timeout "$(lim 150)" "$py" -m pytest -p no:cacheprovider -v -rs test_cuda.py test_torch_ops.py \
          test_c_abi.py test_pytorch2.py test_examples.py test_transition_ops.py \
          -k "(cuda or CUDA) and not (alibi or shaw)"
        rc1=$?
        timeout "$(lim 90)" "$py" -m pytest -p no:cacheprovider -v -rs test_cuda.py test_torch_ops.py \
          test_pytorch2.py -k "(cuda or CUDA) and (alibi or shaw)"
        rc2=$?
        [ $rc2 = 5 ] && rc2=0  # no such cases: a folder prepared without alibi's or shaw's libraries
        [ $rc1 = 124 ] || [ $rc2 = 124 ] && exit 124
        [ $rc1 = 0 ] && [ $rc2 = 0 ]
      ) >"$logs/python.log" 2>&1
      local rc=$?
      note=$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed|error)' "$logs/python.log" | sed 's/=//g; s/^ *//; s/ *$//' | paste -sd ';' -)
      grep -q "Segmentation fault\|Fatal Python error" "$logs/python.log" && note="a crash (see python.log); $note"
      [ $rc = 0 ] && status=pass || status=FAIL
      [ $rc = 124 ] && note="timed out; $note"
      record python $status $(( $(date +%s) - s )) "${note:-see logs/python.log}"
    else
      record python FAIL 0 "libraries not built"
    fi
  fi

  if want sanitizer; then
    if [ -n "$san_pid" ]; then
      wait "$san_pid"
      local tool summary all=pass notes=""
      for tool in memcheck racecheck synccheck initcheck; do
        summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/sanitizer-$tool.log" | tail -1)
        if ! grep -qE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards' "$logs/sanitizer-$tool.log" ||
           ! grep -qE '\[  PASSED  \] [1-9]' "$logs/sanitizer-$tool.log"; then  # a filter that ran none: no pass
          all=FAIL; notes+=" $tool: ${summary:-no summary (timed out?)};"
        fi
      done
      record sanitizer $all $(( $(date +%s) - san_start )) "${notes:- 4 tools, 0 errors on $(echo "$san_filter" | tr ':' '\n' | wc -l) tests}"
    else
      record sanitizer FAIL 0 "no compute-sanitizer or no suite binary"
    fi
  fi

  # -- train (before the timings: the runtime on the GPU is the larger unknown) ----------------------
  if want train; then
    s=$(date +%s)
    train_stage "$dir" "$suite_build" "$logs" "$py" "$jobs"
    local rc=$?
    note=$(tail -1 "$logs/train/verdict.txt" 2>/dev/null)
    [ $rc = 0 ] && status=pass || status=FAIL
    record train $status $(( $(date +%s) - s )) "${note:-see logs/train/}"
  fi

  # -- bench ------------------------------------------------------------------------------------
  if want bench; then
    s=$(date +%s)
    # Quick: one configuration (B 1, H 16, T 4096, d_h 128): each FlexAttention compiles once.
    local quick=(--quick --configs "${bench_configs:-1x16x4096x128}")
    [ $full_bench = 1 ] && quick=()
    [ -n "$bench_encodings" ] && quick+=(--encodings "$bench_encodings")
    # APE's settings beside its defaults (bench/results/gpu_h200.md: on sm_90 the wgmma backward at
    # d_h 64 and 128, the Hopper forward's turns, persistent grid, separate K' and V pipelines and
    # tile order in groups of slices whose K' and V fit 32 MiB of L2), each timed in the same
    # process (the kernels read the variables at every call; gpu_bench.py --ape-settings): the
    # mma.sync backward (the wide layout) and its fastest form there (FlashAttention-2's square
    # tiling with dQ' by TMA reductions), dQ' in any order (what determinism costs), key tile 0
    # writing dq itself (the default until 2026-12-05: docs/cuda.md, "What the order costs";
    # where dq = dQ', NoPE and Cable; elsewhere the same kernels as ape), the forward
    # without its turns and persistent grid (each alone was timed on the H200: 1.05-1.08x and
    # 1.02x), with K' released together with V (as before the separate K and V pipelines), in one
    # group of every slice (the tile order before the grouping); and the defaults replayed as CUDA
    # graphs (the bench's APE_BENCH_GRAPH: the launches' host time left out, so the difference to
    # `ape` is the host's share: RoPE's forward ran 0.25 ms behind NoPE's with its mods at memory
    # speed by the side-kernel proxy).
    local settings="graph:APE_BENCH_GRAPH=1,mma:APE_CUDA_WGMMA_BACKWARD=0"
    settings+=",mma-square-tma:APE_CUDA_WGMMA_BACKWARD=0+APE_CUDA_BWD_SQUARE=1+APE_CUDA_DQ_TMA=1"
    settings+=",any-order:APE_CUDA_DETERMINISTIC=0,dq-direct:APE_CUDA_DQ_DIRECT=1"
    settings+=",no-fa3:APE_CUDA_PINGPONG=0+APE_CUDA_PERSISTENT=0,kv-shared:APE_CUDA_KV_SPLIT=0"
    settings+=",one-group:APE_CUDA_TILE_GROUP=0"
    local fe
    for fe in kcable shaw transformer_xl deberta; do
      if [ -d "$bench_libs/${fe}_torch_library" ]; then
        settings+=",features-off:APE_CUDA_FEATURE_STEPS=0"
        break
      fi
    done
    # A mod whose gradient adds to parameters (ExPE, ExQPE) with one pair of atomics per term, as
    # before mod_backward_params_kernel summed them over rows in registers.
    for fe in expe exqpe; do
      if [ -d "$bench_libs/${fe}_torch_library" ]; then
        settings+=",mod-terms:APE_CUDA_MOD_PARAM_SUMS=0"
        break
      fi
    done
    # A short lease picks its own (APE_GPU_CHECK_BENCH_SETTINGS, as gpu_bench.py --ape-settings;
    # "none": APE's defaults alone) and its limits (APE_GPU_CHECK_BENCH_LIMIT, 240 s;
    # APE_GPU_CHECK_FORWARD_LIMIT, 150 s, 0 leaves the per-head-dim run out).
    settings=${APE_GPU_CHECK_BENCH_SETTINGS:-$settings}
    [ "$settings" = none ] && settings=""
    # Each encoding runs in a process of its own: a crash (a segfault in a library, a lost CUDA
    # context) costs that process's unfinished cells, which say so (exit 3), and the report is
    # rewritten after every process, so a time limit keeps the finished rows. --kernel-times (with
    # APE_GPU_CHECK_KERNEL_TIMES=1): each cell's GPU time by kernel (where RoPE's forward spends its
    # 0.25 ms over NoPE's, say); off by default: its profiler sessions run between the timed cells
    # of a process (their times then may carry the profiler's after-effects) and cost a short lease.
    local kt=()
    [ "${APE_GPU_CHECK_KERNEL_TIMES:-0}" = 1 ] && kt=(--kernel-times)
    PYTHONFAULTHANDLER=1 timeout "$(lim "${APE_GPU_CHECK_BENCH_LIMIT:-240}")" "$py" "$src/bench/gpu_bench.py" --libs "$bench_libs" "${quick[@]}" \
      ${settings:+--ape-settings "$settings"} "${kt[@]}" --md "$logs/gpu_bench.md" --csv "$logs/gpu_bench.csv" >"$logs/bench.log" 2>&1
    local rc=$?
    [ $rc = 0 ] && status=pass || status=FAIL
    case $rc in
      0) note="logs/gpu_bench.md" ;;
      3) note="crashed: $(sed -n 's/^\[gpu_bench\] crashed: \([a-z0-9_]*\): .*/\1/p' "$logs/bench.log" |
           awk '!seen[$0]++' | paste -sd, -); the other cells in logs/gpu_bench.md (logs/bench.log)" ;;
      124) note="timed out; the finished rows in logs/gpu_bench.md (logs/bench.log)" ;;
      *) note="exit $rc (logs/bench.log)" ;;
    esac
    # Per head dim on sm_90: APE's NoPE and RoPE at d_h 64 and 128 (T 4096) and at d_h 128, T 2048,
    # B 8 (short sequences, where a block's start and end weigh most): the forward's settings and
    # the FlashAttention-2-class forward (APE_CUDA_HOPPER_FORWARD=0: hopper0), the Hopper forward
    # with three consumer warpgroups (query tiles of 192 rows, d_h 64 only: consumers3; the same
    # kernel as ape at d_h 128), the backward on mma.sync at each head dim (wgmma is the default at
    # both since the H200's timing of 2026-12-04) and with dQ' by TMA reductions, so that each
    # default per head dim follows a measurement.
    # APE_GPU_CHECK_FORWARD_CONFIGS, _ENCODINGS and _SETTINGS narrow it for a short lease.
    local fwd_limit=${APE_GPU_CHECK_FORWARD_LIMIT:-150}
    if [ "$fwd_limit" != 0 ]; then
    PYTHONFAULTHANDLER=1 timeout "$(lim "$fwd_limit")" "$py" "$src/bench/gpu_bench.py" --libs "$bench_libs" \
      --configs "${APE_GPU_CHECK_FORWARD_CONFIGS:-1x32x4096x64,1x16x4096x128,8x16x2048x128}" --methods ape \
      --encodings "${APE_GPU_CHECK_FORWARD_ENCODINGS:-nope,rope}" \
      --ape-settings "${APE_GPU_CHECK_FORWARD_SETTINGS:-no-fa3:APE_CUDA_PINGPONG=0+APE_CUDA_PERSISTENT=0,kv-shared:APE_CUDA_KV_SPLIT=0,hopper0:APE_CUDA_HOPPER_FORWARD=0,consumers3:APE_CUDA_HOPPER_CONSUMERS=3,one-group:APE_CUDA_TILE_GROUP=0,mma:APE_CUDA_WGMMA_BACKWARD=0,mma-dq-tma:APE_CUDA_WGMMA_BACKWARD=0+APE_CUDA_DQ_TMA=1}" \
      --md "$logs/gpu_bench_forward.md" --csv "$logs/gpu_bench_forward.csv" >"$logs/bench-forward.log" 2>&1 ||
      note+=" (the forward run failed: logs/bench-forward.log)"
    fi
    # A crashed encoding: which step of its operator call fails (bench/op_probe.py: on CPU tensors,
    # on CUDA tensors without autograd, without grad mode, with autograd; each in a process of its
    # own, with a preloaded handler that prints a crashed one's native stack, named by addr2line)
    # in logs/bench-crash-ENC-probe.log. (cuda-gdb, this machine's only debugger, printed no stack
    # within two minutes on 2026-11-30.)
    if [ $rc = 3 ]; then
      local crashed
      for crashed in $(sed -n 's/^\[gpu_bench\] crashed: \([a-z0-9_]*\): .*/\1/p' "$logs/bench.log" | sort -u); do
        timeout "$(lim "${APE_GPU_CHECK_PROBE_LIMIT:-120}")" "$py" "$src/bench/op_probe.py" --helper "$bench_libs/${crashed}_torch_library/build/ape_$crashed.py" \
          --steps cpu,bad,raw,nograd,grad >"$logs/bench-crash-$crashed-probe.log" 2>&1
      done
    fi
    record bench $status $(( $(date +%s) - s )) "$note"
  fi

  # -- counters (only when named) -----------------------------------------------------------------
  if want counters; then
    s=$(date +%s)
    # One ncu run per encoding, one CSV each (a kernel's name does not say its encoding: the file
    # does), within the stage's 180 s; the summary labels each file's rows and totals them.
    local run enc csv left metrics rc failed="" ncu_units=() summary_args=() run_env stalls_md
    metrics=$("$py" "$src/bench/gpu_counters.py" --metrics)
    # Base units (ns, bytes) where this ncu can print them; the summary converts either way.
    grep -q -- '--print-units' <<<"$(ncu --help 2>&1)" && ncu_units=(--print-units base)
    rm -f "$logs"/gpu_counters.*.ncu.csv
    : >"$logs/counters.log"
    stalls_md=$logs/gpu_counters.stalls.md
    rm -f "$stalls_md"
    # nope, rope (on sm_90 at d_h 128 the wgmma backward), the stall reasons, then (time left)
    # nope with dQ' in any order (APE_CUDA_DETERMINISTIC=0) and on the mma.sync backward
    # (APE_CUDA_WGMMA_BACKWARD=0: the wide layout, per-thread dQ' adds).
    # A short lease picks its runs (APE_GPU_CHECK_COUNTERS_RUNS, "nope rope" say) and the stage's
    # limit (APE_GPU_CHECK_COUNTERS_LIMIT, 180 s).
    for run in ${APE_GPU_CHECK_COUNTERS_RUNS:-nope rope stalls nope-anyorder nope-mma}; do
      left=$(( ${APE_GPU_CHECK_COUNTERS_LIMIT:-180} - ($(date +%s) - s) ))
      if [ "$run" = stalls ]; then
        # Where the attention kernels' warps wait (NoPE: the kernels alone): the stall reasons.
        [ $left -ge 20 ] || continue
        csv=$logs/gpu_counters.stalls.ncu.csv
        timeout "$(lim "$left")" ncu --profile-from-start off --csv --page raw --print-kernel-base demangled \
          --kernel-name regex:'flash_backward|hopper_forward|flash_forward' --section WarpStateStats \
          --log-file "$csv" "$py" "$src/bench/gpu_counters.py" --libs "$bench_libs" --encodings nope \
          --config 1x16x8192x128 >>"$logs/counters.log" 2>&1 &&
          { echo; echo "## Warp stalls (NoPE)"; echo; "$py" "$src/bench/gpu_counters.py" --stalls "$csv"; } \
            >"$stalls_md" 2>>"$logs/counters.log" || failed+="; stalls: exit $?"
        continue
      fi
      enc=${run%%-*}
      run_env=()
      [ "$run" = nope-anyorder ] && run_env=(APE_CUDA_DETERMINISTIC=0)
      [ "$run" = nope-mma ] && run_env=(APE_CUDA_WGMMA_BACKWARD=0)
      csv=$logs/gpu_counters.$run.ncu.csv
      if [ $left -lt 10 ] || { [ "$run" != nope ] && [ "$run" != rope ] && [ $left -lt 30 ]; }; then
        failed+="; $run: no time left"; continue
      fi
      echo "[gpu-check] counters: $run (at most ${left} s)" >>"$logs/counters.log"
      timeout "$(lim "$left")" env "${run_env[@]}" ncu --profile-from-start off --csv --page raw --print-kernel-base demangled "${ncu_units[@]}" \
        --metrics "$metrics" --log-file "$csv" \
        "$py" "$src/bench/gpu_counters.py" --libs "$bench_libs" --encodings "$enc" --config 1x16x8192x128 \
        >>"$logs/counters.log" 2>&1
      rc=$?
      [ $rc = 0 ] || failed+="; $run: exit $rc"
      [ -s "$csv" ] && summary_args+=("$run=$csv")
    done
    if [ ${#summary_args[@]} -gt 0 ]; then
      "$py" "$src/bench/gpu_counters.py" --summarize "${summary_args[@]}" --config 1x16x8192x128 \
        >"$logs/gpu_counters.md" 2>>"$logs/counters.log" || failed+="; summary: exit $?"
    fi
    [ -s "$stalls_md" ] && cat "$stalls_md" >>"$logs/gpu_counters.md"
    if [ -z "$failed" ]; then
      record counters pass $(( $(date +%s) - s )) "logs/gpu_counters.md"
    else
      record counters FAIL $(( $(date +%s) - s )) "${failed#; } (logs/counters.log)"
    fi
  fi

  # -- study (only when named: --stages build,study) -----------------------------------------------
  if want study; then
    s=$(date +%s)
    if timeout "$(lim "${APE_GPU_CHECK_BUILD_LIMIT:-240}")" cmake --build "$suite_build" --target ape-train ape-eval -- -j"$jobs" >"$logs/study-build.log" 2>&1; then
      # The study's folder beside the carried one (which each device call replaces): a rerun on the
      # same machine continues it (its runs resume); the report is published into the logs.
      local study_out=${APE_GPU_STUDY_DIR:-$(dirname "$dir")/gpu-study}
      mkdir -p "$study_out"
      [ -d "$study_out/cache" ] || cp -r "$dir/cache" "$study_out/cache"
      (cd "$src" && timeout "$(lim 540)" "$py" scripts/study.py --preset gpu-small --device cuda --threads 0 \
        --builtin-specs "$dir/study-specs" --build-dir "$suite_build" --data "$src/data/pg30" \
        --cache-dir "$study_out/cache" --out "$study_out" --publish "$logs/study") >"$logs/study.log" 2>&1
      local rc=$?
      [ $rc = 0 ] && status=pass || status=FAIL
      note="logs/study/study.md"; [ $rc = 124 ] && note="timed out: rerun the stage on this machine to continue ($study_out)"
    else
      status=FAIL note="ape-train did not build (logs/study-build.log)"
    fi
    record study $status $(( $(date +%s) - s )) "$note"
  fi

  # -- the table ----------------------------------------------------------------------------------
  local st any_fail=0
  for st in "${stage_order[@]}"; do
    [ "${stage_status[$st]}" = FAIL ] && any_fail=1
  done
  write_table
  [ -f "$logs/gpu_bench.md" ] && { echo; cat "$logs/gpu_bench.md"; }
  [ -f "$logs/gpu_counters.md" ] && { echo; cat "$logs/gpu_counters.md"; }
  return $any_fail
}

case $mode in
  prepare) prepare "$@" ;;
  run) run "$@" ;;
  -h|--help|help) usage ;;
  *) echo "[gpu-check] unknown mode '$mode' (prepare or run)" >&2; usage ;;
esac
