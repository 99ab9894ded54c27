// CudaKernelEntry: what one generated encoding exports for the GPU (docs/cuda.md).
//
// Plain C++17 (no nvcc needed to include it): a runtime or a test compiled by the host compiler
// calls the kernels through this header and links the objects that nvcc built from the generated
// NAME_cuda*.cu files. Tensors are raw device pointers; per-call scratch memory is taken from
// the stream-ordered allocator (cudaMallocAsync) on `stream`.
//
//   q, k, v, o, dout, dq, dk, dv   (B, H, T, D) contiguous, dtype f32 | f16 | bf16
//   lse                            (B, H, T) float32: log sum_j exp(l_ij) of the final logits
//   features, dfeatures            Enc::kNumFeatures x (B, H, T) float32
//   params, dparams                Enc::kNumParams tensors, float32, shapes per manifest
// `features`, `params`, `dfeatures` and `dparams` are HOST arrays of DEVICE pointers.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace ape::cuda {

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2 };

inline const char *dtype_name(DType t) {
  return t == DType::F32 ? "f32" : t == DType::F16 ? "f16" : "bf16";
}

struct CudaAttnArgs {
  int64_t B = 0, H = 0, T = 0, D = 0;
  DType dtype = DType::BF16;
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  void *o = nullptr;
  float *lse = nullptr;
  const float *const *features = nullptr;
  const float *const *params = nullptr;
  float scale = 0;  // kappa
  // backward only (reads q, k, v, o, lse, dout)
  const void *dout = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;  // overwritten
  float *const *dfeatures = nullptr;                  // overwritten
  float *const *dparams = nullptr;                    // overwritten (zero where not trainable)
  cudaStream_t stream = nullptr;
};

using CudaAttnFn = cudaError_t (*)(const CudaAttnArgs &);

// One explicit instantiation of the CUDA template: input dtype x head dim.
struct CudaVariant {
  DType dtype;
  int64_t head_dim;
  CudaAttnFn forward;
  CudaAttnFn backward;
};

struct CudaKernelEntry {
  const char *name;
  const char *manifest_json;
  int num_features;                                  // Enc::kNumFeatures
  int num_params;                                    // Enc::kNumParams
  int64_t (*param_numel)(int n, int64_t H, int64_t D);  // elements of param n
  const CudaVariant *variants;  // only the (dtype, head_dim) pairs this build instantiated
  size_t num_variants;
};

// The variant for (dtype, D), or nullptr when it was not instantiated.
inline const CudaVariant *find_variant(const CudaKernelEntry &e, DType dtype, int64_t D) {
  for (size_t n = 0; n < e.num_variants; ++n)
    if (e.variants[n].dtype == dtype && e.variants[n].head_dim == D) return &e.variants[n];
  return nullptr;
}

// Dispatch on (a.dtype, a.D); cudaErrorInvalidValue when the pair was not instantiated.
inline cudaError_t forward(const CudaKernelEntry &e, const CudaAttnArgs &a) {
  const CudaVariant *v = find_variant(e, a.dtype, a.D);
  return v ? v->forward(a) : cudaErrorInvalidValue;
}
inline cudaError_t backward(const CudaKernelEntry &e, const CudaAttnArgs &a) {
  const CudaVariant *v = find_variant(e, a.dtype, a.D);
  return v ? v->backward(a) : cudaErrorInvalidValue;
}

}  // namespace ape::cuda
