#!/usr/bin/env bash
# Call 2 (warm, the builds of call 1 beside the folder): per head dim (three consumers and the
# wgmma backward at d_h 64), the crash probe of an encoding with params, the sanitizer on the
# kernels changed since the last GPU suite (K' pipeline, dQ' order, token program, rope mods).
export PYTHONUNBUFFERED=1
L=/tmp/gc2; mkdir -p $L
D=$(pwd)/build/gpu-check; B=$D-build; py=python3
exe=$B/suite/ape_cuda_kernels_test
F='All/CudaKernel.Sm90PathMatchesReferences/rope_bf16_hd128:All/CudaKernel.WgmmaBackwardMatchesReferences/rope_bf16_hd128:All/CudaKernel.MatchesReferencesForwardAndGradients/cable_bf16_hd64:CudaLaunch.PersistentHopperForwardMatchesReferences:CudaLaunch.HopperThreeConsumersMatchReferences'
( for tool in memcheck racecheck synccheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 99 $exe --gtest_filter="$F" --gtest_brief=1 > $L/sanitizer-$tool.log 2>&1 &
  done; wait ) &
sp=$!
timeout 50 $py $D/src/bench/op_probe.py --helper $B/bench-libs/alibi_torch_library/build/ape_alibi.py --steps cpu,raw,nograd,grad > $L/probe-alibi.log 2>&1
cat $L/probe-alibi.log | tail -40
wait $sp
PYTHONFAULTHANDLER=1 timeout 80 $py $D/src/bench/gpu_bench.py --libs $B/bench-libs --configs 1x32x4096x64,8x16x2048x128 --methods ape --encodings nope,rope \
  --ape-settings "consumers3:APE_CUDA_HOPPER_CONSUMERS=3,wgmma:APE_CUDA_WGMMA_BACKWARD=1,mma:APE_CUDA_WGMMA_BACKWARD=0,hopper0:APE_CUDA_HOPPER_FORWARD=0,tile-groups:APE_CUDA_TILE_GROUP=auto" \
  --md $L/gpu_bench_forward.md --csv $L/gpu_bench_forward.csv > $L/bench-forward.log 2>&1
grep -h "SUMMARY\|PASSED\|FAILED" $L/sanitizer-*.log
cat $L/gpu_bench_forward.md
tar czf $OUT/logs2.tgz -C /tmp gc2
true
