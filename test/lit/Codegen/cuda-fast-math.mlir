// An encoding marked fast_math (-ape-fast-math): the CUDA functor writes its score mod's log1p and
// the backward's division with the GPU's approximate functions (ape/cuda/platform.cuh, approx),
// the token program's exp and log1p exactly; the CPU kernel is exact throughout. apec --fast-math
// marks every encoding so.
// RUN: rm -rf %t && apec %s -o %t --emit=cpu,cuda --cuda-dtypes=bf16 --cuda-head-dims=64 --source-name=spec
// RUN: FileCheck %s --input-file=%t/kcable_fast_cuda.cuh
// RUN: FileCheck %s --check-prefix=CPU --input-file=%t/kcable_fast_cpu.cpp
// RUN: sed 's/ attributes {fast_math}//' %s > %t/plain.mlir
// RUN: apec %t/plain.mlir -o %t/flag --emit=cuda --cuda-dtypes=bf16 --cuda-head-dims=64 --fast-math --source-name=spec
// RUN: diff %t/kcable_fast_cuda.cuh %t/flag/kcable_fast_cuda.cuh | FileCheck %s --check-prefix=SAME --allow-empty
// RUN: apec %t/plain.mlir -o %t/exact --emit=cuda --cuda-dtypes=bf16 --cuda-head-dims=64
// RUN: FileCheck %s --check-prefix=EXACT --input-file=%t/exact/kcable_fast_cuda.cuh

// CHECK: APE_HD static T map_0(const Ctx &ctx, T x) {
// CHECK: std::exp(
// CHECK: std::log1p(
// CHECK: APE_HD static T score_mod(const Ctx &ctx, int64_t i, int64_t j, T s) {
// CHECK: ::ape::cuda::approx::log1p(
// CHECK: APE_HD static T score_mod_grad(
// CHECK: ::ape::cuda::approx::log1p(
// CHECK: ::ape::cuda::approx::div(
// CHECK: APE_HD static T score_mod_features(
// CHECK: ::ape::cuda::approx::log1p(

// CPU-NOT: approx
// CPU: std::log1p(

// SAME-NOT: {{.}}

// EXACT-NOT: approx
ape.encoding @kcable_fast attributes {fast_math} {
  ape.cable {kernel = "log1p_sq"}
}
