// Derived params: the params that an override (ExPE, ExQPE; docs/internals.md §3) computes from
// a projection weight every step, written once for every LibTorch caller: APE's runtime
// (runtime/Model.cpp) and the emitted operator libraries (torch/ops_impl.h: the operator
// ape_NAME::derived_params that the Python helper calls).
//
// W is a torch.nn.Linear weight, (out_features, in_features) = (H·D, d); both functions use its
// first `columns` input columns and are plain ATen ops, so autograd carries the gradient to W.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace ape::derived {

// init "projection_term": (W[:, :columns] @ u).view(H, D), u_j = start + step·j.
//   ExPE's a = W[:, :l]·(start + θ·j)_j and b = W[:, :l]·(θ)_j (step 0, start θ).
inline at::Tensor projection_term(const at::Tensor &W, int64_t columns, double start, double step,
                                  int64_t H, int64_t D) {
  // The positions in float32 at least (a bfloat16 arange is exact only to 256 and u would be
  // rounded to 8 bits before the product), then in W's dtype for the product.
  const bool half = W.scalar_type() == at::kHalf || W.scalar_type() == at::kBFloat16;
  at::Tensor u = at::arange(columns, W.options().dtype(half ? at::kFloat : W.scalar_type())) * step + start;
  return at::mv(W.narrow(1, 0, columns), u.to(W.scalar_type())).view({H, D});
}

// init "projection_prefix": P[r] = scale·Σ_{j<=r} W[:, j] for r < columns, as [columns, H, D].
//   ExQPE's table of the partial position sums (r = n mod l).
inline at::Tensor projection_prefix(const at::Tensor &W, int64_t columns, double scale, int64_t H,
                                    int64_t D) {
  return (at::cumsum(W.narrow(1, 0, columns), 1) * scale).t().reshape({columns, H, D});
}

}  // namespace ape::derived
