// --emit=cuda: the same functor as the CPU kernel's, declared for host and device and templated
// on the context; one instantiation file per (dtype, head dim); an entry listing them.
// --emit=cuda-package: the same files under kernels/, the templates and a CMakeLists.txt.
// RUN: rm -rf %t && apec %s -o %t --emit=cuda --cuda-dtypes=bf16,f32 --cuda-head-dims=64,128
// RUN: ls %t | FileCheck %s --check-prefix=FILES
// RUN: FileCheck %s --input-file=%t/rope_cuda.cuh
// RUN: FileCheck %s --check-prefix=ENTRY --input-file=%t/rope_cuda.cu
// RUN: FileCheck %s --check-prefix=INST --input-file=%t/rope_cuda_bf16_hd128.cu
// RUN: apec %s -o %t/pkg --emit=cuda-package --cuda-dtypes=bf16 --cuda-head-dims=64
// RUN: (ls %t/pkg %t/pkg/kernels && cd %t/pkg && find include -type f) | FileCheck %s --check-prefix=PKG
// RUN: not apec %s -o %t/bad --emit=cuda --cuda-head-dims=48 2>&1 | FileCheck %s --check-prefix=BAD

// FILES: rope_cuda.cu
// FILES-NEXT: rope_cuda.cuh
// FILES-NEXT: rope_cuda_bf16_hd128.cu
// FILES-NEXT: rope_cuda_bf16_hd64.cu
// FILES-NEXT: rope_cuda_f32_hd128.cu
// FILES-NEXT: rope_cuda_f32_hd64.cu

// CHECK: #include "ape/cuda/attention.cuh"
// CHECK-NOT: #include <limits>
// CHECK: namespace ape_gen_rope {
// CHECK-NEXT: APE_CUDA_ABI_BEGIN
// CHECK: struct Enc {
// CHECK: static constexpr int kQPairing = 1;
// CHECK: template <class T, class Ctx>
// The half pairing at fraction 1: coordinate c < D/2 pairs with c + D/2 (k = c mod D/2) and takes
// x cos - y sin, the second half x cos + y sin; θ_k = 10000^(-2k/D), angle t·θ_k.
// CHECK: APE_HD static T q_mod(const Ctx &ctx, int64_t t, int64_t c, T x, T y) {
// CHECK-NEXT: const T [[N1:v[0-9]+]] = T(-1.00000000000000000e+00);
// CHECK-NEXT: const T [[P1:v[0-9]+]] = T(1.00000000000000000e+00);
// CHECK-NEXT: const T [[BASE:v[0-9]+]] = T(1.00000000000000000e+04);
// CHECK-NEXT: const T [[M2:v[0-9]+]] = T(-2.00000000000000000e+00);
// CHECK-NEXT: const int64_t [[ONE:v[0-9]+]] = int64_t(1);
// CHECK-NEXT: const int64_t [[TWO:v[0-9]+]] = int64_t(2);
// CHECK-NEXT: const int64_t [[D:v[0-9]+]] = ctx.D;
// CHECK-NEXT: const int64_t [[HALF:v[0-9]+]] = ::ape::int_math::udiv([[D]], [[TWO]]);
// CHECK-NEXT: const int64_t [[R:v[0-9]+]] = int64_t(static_cast<uint64_t>([[HALF]]) * static_cast<uint64_t>([[TWO]]));
// CHECK-NEXT: const int64_t [[H1:v[0-9]+]] = int64_t(std::max(static_cast<uint64_t>([[HALF]]), static_cast<uint64_t>([[ONE]])));
// CHECK-NEXT: const bool [[INROT:v[0-9]+]] = (static_cast<uint64_t>(c) < static_cast<uint64_t>([[R]]));
// CHECK-NEXT: const int64_t [[K:v[0-9]+]] = ::ape::int_math::urem(c, [[H1]]);
// CHECK-NEXT: const bool [[FIRST:v[0-9]+]] = (static_cast<uint64_t>(c) < static_cast<uint64_t>([[H1]]));
// CHECK-NEXT: const int64_t [[RI:v[0-9]+]] = int64_t([[R]]);
// CHECK-NEXT: const T [[RF:v[0-9]+]] = T([[RI]]);
// CHECK-NEXT: const int64_t [[KI:v[0-9]+]] = int64_t([[K]]);
// CHECK-NEXT: const T [[KF:v[0-9]+]] = T([[KI]]);
// CHECK-NEXT: const T [[KM:v[0-9]+]] = ([[KF]] * [[M2]]);
// CHECK-NEXT: const T [[EXP:v[0-9]+]] = ([[KM]] / [[RF]]);
// CHECK-NEXT: const T [[TH:v[0-9]+]] = std::pow([[BASE]], [[EXP]]);
// CHECK-NEXT: const int64_t [[TI:v[0-9]+]] = int64_t(t);
// CHECK-NEXT: const T [[TF:v[0-9]+]] = T([[TI]]);
// CHECK-NEXT: const T [[A:v[0-9]+]] = ([[TF]] * [[TH]]);
// CHECK-NEXT: const T [[COS:v[0-9]+]] = std::cos([[A]]);
// CHECK-NEXT: const T [[SIN:v[0-9]+]] = std::sin([[A]]);
// CHECK-NEXT: const T [[SG:v[0-9]+]] = ([[FIRST]] ? [[N1]] : [[P1]]);
// CHECK-NEXT: const T [[SY:v[0-9]+]] = ([[SG]] * y);
// CHECK-NEXT: const T [[YS:v[0-9]+]] = ([[SY]] * [[SIN]]);
// CHECK-NEXT: const T [[XC:v[0-9]+]] = (x * [[COS]]);
// CHECK-NEXT: const T [[ROT:v[0-9]+]] = ([[XC]] + [[YS]]);
// CHECK-NEXT: const T [[OUT:v[0-9]+]] = ([[INROT]] ? [[ROT]] : x);
// CHECK-NEXT: return [[OUT]];
// CHECK: APE_HD static void q_mod_grad(const Ctx &ctx,

// ENTRY: #include "rope_cuda.cuh"
// ENTRY: cudaError_t forward_bf16_hd64(const ::ape::cuda::CudaAttnArgs &);
// ENTRY: const char kManifest[] = R"APE_MANIFEST({
// ENTRY: {::ape::cuda::DType::BF16, 64, &forward_bf16_hd64, &backward_bf16_hd64, &::ape::cuda::detail::args_refusal<Enc>},
// ENTRY: {::ape::cuda::DType::F32, 128, &forward_f32_hd128, &backward_f32_hd128, &::ape::cuda::detail::args_refusal<Enc>},
// ENTRY: extern "C" const ::ape::cuda::CudaKernelEntry *APE_CUDA_ENTRY(rope)() {
// ENTRY: Enc::kNumFeatures, Enc::kNumParams, &Enc::param_numel,
// ENTRY-NEXT: ape_gen_rope::kVariants, 4,
// ENTRY-NEXT: ::ape::cuda::detail::caches_k_mod<Enc>(), ::ape::cuda::detail::key_rel_floats<Enc>(),
// ENTRY-NEXT: ::ape::cuda::detail::tok_seqs<Enc>(), ::ape::traits::KModShared<Enc>::value};

// INST: APE_CUDA_INSTANTIATE(Enc, __nv_bfloat16, 128, forward_bf16_hd128, backward_bf16_hd128)

// PKG-DAG: CMakeLists.txt
// PKG-DAG: README.md
// PKG-DAG: smoke.cpp
// PKG-DAG: cuda/attention.cuh
// PKG-DAG: cuda/kernel_entry.h
// PKG-DAG: cuda/decode.h
// PKG-DAG: cuda/platform.cuh
// PKG-DAG: include/ape/contract/enc_traits.h
// PKG-DAG: include/ape/contract/vocabulary.h
// PKG-DAG: rope.manifest.json
// PKG-DAG: rope_cuda_bf16_hd64.cu

// BAD: apec: --cuda-head-dims 48 is not supported (32, 64 or 128)
ape.encoding @rope {
  ape.rotary {base = 10000.0 : f64, fraction = 1.0 : f64, pairing = "half"}
}
