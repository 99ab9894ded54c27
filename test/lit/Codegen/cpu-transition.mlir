// The attention transition: the CPU functor is forward only and carries its attributes (kTransition, which selects
// the three-pass rows of cpu/attention.h and a refusing backward), the manifest says the kernel is
// inference-only with no gradients, the reference data (ape-check) carries the attributes, the CUDA
// functor carries them too (cuda/transition.cuh's rows after the forward; the backward returns
// cudaErrorNotSupported), and the PyTorch operator library and the C ABI take the layer and the
// model's depth (and say they are inference-only: no backward).
// RUN: rm -rf %t && apec %s -o %t --emit=cpu,manifest
// RUN: FileCheck %s --input-file=%t/rope_transition_cpu.cpp
// RUN: FileCheck %s --check-prefix=MANIFEST --input-file=%t/rope_transition.manifest.json
// RUN: %cxx -std=c++17 -fsyntax-only -fopenmp -I %ape_templates %t/rope_transition_cpu.cpp
// RUN: apec %s -o %t/cuda --emit=cuda --cuda-dtypes=bf16 --cuda-head-dims=64
// RUN: FileCheck %s --check-prefix=CUDA --input-file=%t/cuda/rope_transition_cuda.cuh
// RUN: apec %s -o %t/torch --emit=torch-library --cuda-dtypes=bf16 --cuda-head-dims=64
// RUN: FileCheck %s --check-prefix=TORCH --input-file=%t/torch/rope_transition_torch_library/rope_transition_ops.cpp
// RUN: FileCheck %s --check-prefix=TORCHPY --input-file=%t/torch/rope_transition_torch_library/ape_rope_transition.py
// RUN: apec %s -o %t/cabi --emit=c-abi
// RUN: FileCheck %s --check-prefix=CABI --input-file=%t/cabi/rope_transition_c_abi/ape_rope_transition.h
// RUN: apec %s -o %t/ref --emit=reference
// RUN: FileCheck %s --check-prefix=REF --input-file=%t/ref/rope_transition.reference.json

// CHECK: struct Enc {
// CHECK: static constexpr ::ape::TransitionAttrs kTransition{1, 2, 1, 3, 2.50000000000000000e-01, 1.00000000000000006e-01};
// Forward only: no gradient members (the entry's backward refuses, cpu/kernel_entry.h).
// CHECK: static T q_mod(
// CHECK-NOT: _grad(
// CHECK-NOT: token_backward
// CHECK: APE_DEFINE_KERNEL_ENTRY(rope_transition, Enc, kManifest)

// MANIFEST: "grads": [],
// MANIFEST: "inference_only": true,
// MANIFEST: "passes": 3,
// MANIFEST: "transition": {
// MANIFEST-NEXT: "alpha": 0.25,
// MANIFEST-NEXT: "beta": 0.10000000000000001,
// MANIFEST-NEXT: "divisor_offset": 1,
// MANIFEST-NEXT: "first_layer": 2,
// MANIFEST-NEXT: "intervals": 3,
// MANIFEST-NEXT: "skip_last": 1

// REF: "format": "ape-reference/1",
// REF: "transition": {
// REF-NEXT: "alpha": 0.25,
// REF-NEXT: "beta": 0.10000000000000001,
// REF-NEXT: "divisor_offset": 1,
// REF-NEXT: "first_layer": 2,
// REF-NEXT: "intervals": 3,
// REF-NEXT: "skip_last": 1

// CUDA: struct Enc {
// CUDA: static constexpr ::ape::TransitionAttrs kTransition{1, 2, 1, 3, 2.50000000000000000e-01, 1.00000000000000006e-01};
// CUDA-NOT: _grad(
// TORCH: "attention(Tensor q, Tensor k, Tensor v, float? scale=None, *, int layer, int num_layers) -> Tensor",
// TORCH: ape_cuda_kernel_entry_rope_transition(), nullptr, /*inference_only=*/true};
// TORCH: nullptr, "the library was built without CUDA kernels{{.*}}", /*inference_only=*/true};
// TORCHPY: o = ops.attention(q, k, v, layer=l, num_layers=N)
// TORCHPY: INFERENCE_ONLY = bool(MANIFEST.get("inference_only", False))
// CABI: Inference only (an ape.attention_transition): forward also reads layer and
// CABI: backward returns APE_ERROR_NOT_SUPPORTED.
// CABI: int64_t layer, num_layers;
// CABI-NEXT: layers that forward computes
// (--emit=reference takes it: REF above.)
ape.encoding @rope_transition {
  ape.rotary
  ape.attention_transition {first_layer = 2, skip_last = 1, intervals = 3, alpha = 0.25 : f64}
}
