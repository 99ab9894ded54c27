#!/usr/bin/env bash
# Call 1: build, the GPU suite, the training smoke, the benchmark at B 2, H 16, T 8192, d_h 128.
export PYTHONUNBUFFERED=1 APE_GPU_CHECK_BENCH_LIMIT=150 APE_GPU_CHECK_FORWARD_LIMIT=0 APE_GPU_CHECK_PROBE_LIMIT=40
export APE_GPU_CHECK_BENCH_SETTINGS="kv-shared:APE_CUDA_KV_SPLIT=0,tile-groups:APE_CUDA_TILE_GROUP=auto,any-order:APE_CUDA_DETERMINISTIC=0"
L=/tmp/gc
timeout ${1:-515} scripts/gpu-check.sh run build/gpu-check --logs $L --stages build,suite,train,bench \
  --bench-configs 2x16x8192x128 --bench-encodings nope,rope,cable,kcable,alibi
nvidia-smi > $L/smi.txt 2>&1
tar czf $OUT/logs.tgz --exclude='*.ckpt' --exclude='*.bin' -C /tmp gc
cp $L/summary.md $L/gpu_bench.md $L/train/verdict.txt $OUT/ 2>/dev/null
true
