// Decode: cached attention through the kernel entry's decode steps (ape/cpu/decode.h,
// docs/decoding.md).
//
//   o = decode_attention(entry, cache, q, k, v, features, params, scale)
//     q         (B, H, n, D)  float32 or float64 on the CPU (the entry's decode steps), or
//                             float32 / bfloat16 / float16 on a GPU (the generated CUDA
//                             kernels' forward over every token so far, from the first new row:
//                             the rows of the full forward, bit for bit where the step runs
//                             unsplit, within 16-bit rounding where it splits its keys over
//                             blocks, as ape/cuda/decode.h)
//     k, v      (B, H_kv, n, D), q's dtype: H_kv = H, or a divisor of H (grouped-query attention:
//               query head h reads key head h / (H / H_kv)); the CPU cache keeps them per key head
//               (and k' too where the k mod reads neither the head nor the data: ape/cpu/decode.h),
//               and so does the GPU cache (the CUDA kernels read them in place: CudaAttnArgs::kv_heads)
//     features  n_features x (B, H, n), same dtype     (manifest "features", in order)
//     params    n_params tensors, shapes per manifest  (as fused_attention)
//     o         (B, H, n, D): the new queries' attention over every cached token and themselves
// The cache takes the new tokens; its first step fixes B, H, D and the dtype. `layer` as in
// fused_attention: an attention transition transforms the first step (the prompt) of some layers.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ape/cpu/decode.h"
#include "runtime/Attention.h"
#include "runtime/CudaAttention.h"  // CudaKeptRows

namespace ape {
struct KernelEntry;

// One attention layer's cache, in the precision and on the device of its first step.
struct LayerCache {
  DecodeCache<float> f32;
  DecodeCache<double> f64;
  // On a GPU: every token's raw k, v in (B, H_kv, capacity, D) buffers, rows [0, gpu_len), read in
  // place by the CUDA forward (no q: a step reads its own, cuda_decode_forward), and what else the
  // kernels keep of them (kept: k', the key side's relative rows, the token program's sequences
  // and scan sums; runtime/CudaAttention.h, cuda_decode_keeps), rows [0, kept.rows); the features
  // (B, H, capacity) float32, rows [0, gpu_len).
  at::Tensor k, v;
  CudaKeptRows kept;
  int64_t gpu_len = 0;
  int64_t gpu_heads = 0;  // q's heads (k and v may have fewer: grouped-query attention)
  std::vector<at::Tensor> features;
  int64_t len() const { return k.defined() ? gpu_len : f32.started() ? f32.len : f64.len; }
};

// A model's caches: one per block, all with the same capacity (tokens).
struct KvCache {
  explicit KvCache(int64_t capacity = 0) : capacity(capacity) {}
  int64_t capacity;
  int64_t len = 0;  // tokens the model has seen (= every layer's len)
  std::vector<LayerCache> layers;
};

at::Tensor decode_attention(const KernelEntry &entry, LayerCache &cache, int64_t capacity,
                            const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                            const std::vector<at::Tensor> &features,
                            const std::vector<at::Tensor> &params, double scale,
                            AttnLayer layer = {});

}  // namespace ape
