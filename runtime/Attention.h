// Attention: the autograd glue around one generated kernel (docs/internals.md, section 2).
//
//   o = fused_attention(entry, q, k, v, features, params, scale)
//     q, k, v   (B, H, T, D)  float32 or float64, CPU
//     features  n_features x (B, H, T), same dtype          (manifest "features", in order)
//     params    n_params tensors, shapes per manifest        (manifest "params", in order)
//     o         (B, H, T, D)
// Gradients flow to q, k, v, every feature and every param that requires grad. `layer` says which
// layer of how deep a model calls (read only by an attention transition, which transforms the rows
// of some layers; docs/decoding.md); an inference-only encoding refuses a call that records
// gradients.
#pragma once

#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/Manifest.h"

namespace ape {
struct KernelEntry;

// The layer a call computes: index (0-based) of count layers. count = 0: no layer is transformed.
struct AttnLayer {
  int64_t index = 0, count = 0;
};

// The entry's manifest, parsed once and cached (thread-safe). Throws on a malformed manifest.
const Manifest &manifest_of(const KernelEntry &entry);

// Differentiable fused attention through the entry's forward/backward kernels.
at::Tensor fused_attention(const KernelEntry &entry, const at::Tensor &q, const at::Tensor &k,
                           const at::Tensor &v, const std::vector<at::Tensor> &features,
                           const std::vector<at::Tensor> &params, double scale,
                           AttnLayer layer = {});

// Another implementation of fused_attention for this process (same arguments and contract), e.g.
// the CUDA kernels on the SIMT emulator (runtime/SimtAttention.h); nullptr: the CPU kernels.
using AttentionImpl = at::Tensor (*)(const KernelEntry &entry, const at::Tensor &q,
                                     const at::Tensor &k, const at::Tensor &v,
                                     const std::vector<at::Tensor> &features,
                                     const std::vector<at::Tensor> &params, double scale);
void set_attention_impl(AttentionImpl impl);

// Forward only (no autograd graph): returns {o, lse}; lse is (B, H, T) = log Σ_j exp(l_ij).
std::pair<at::Tensor, at::Tensor> attention_forward(const KernelEntry &entry, const at::Tensor &q,
                                                    const at::Tensor &k, const at::Tensor &v,
                                                    const std::vector<at::Tensor> &features,
                                                    const std::vector<at::Tensor> &params, double scale,
                                                    AttnLayer layer = {});

// Why k and v do not fit q (B, H, T, D) as the kernels take them, or "": each (B, H_kv, T, D) of
// q's dtype and device, H_kv = H or a divisor of it (grouped-query attention), v shaped like k.
// fused_attention's and the decode steps' check (runtime/Decode.h).
std::string keys_problem(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v);

// The initial value of a parameter that is not derived (zeros, ones, normal, constant,
// alibi_slopes, sinusoidal), with its manifest shape resolved for `heads` and `head_dim`. Throws for
// projection_term / projection_prefix (computed from a projection weight by the model every step).
at::Tensor init_param(const ParamSpec &spec, int64_t heads, int64_t head_dim,
                      at::ScalarType dtype = at::kFloat);

}  // namespace ape
