// Derived params: the params that an override (ExPE, ExQPE; docs/internals.md §3) computes from
// a projection weight every step, written once for every LibTorch caller: APE's runtime
// (runtime/Model.cpp) and the emitted operator libraries (torch/ops_impl.h: the operator
// ape_NAME::derived_params that the Python helper calls).
//
// W is a torch.nn.Linear weight, (out_features, in_features) = (H·D, d); both functions use its
// first `columns` input columns and are plain ATen ops, so autograd carries the gradient to W.
// Grouped-query attention: a k or v projection W of H_kv·D rows (H a multiple of H_kv) gives the
// param of each key head, repeated to the H / H_kv query heads of its group (the encoding is per
// query head: as if W held each key head's rows once per query head reading it).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace ape::derived {

// The heads of W's rows: (rows of W) / D, H or a divisor of it (the caller checked).
inline int64_t weight_heads(const at::Tensor &W, int64_t D) {
  return W.sym_size(0).guard_int(__FILE__, __LINE__) / D;
}
// x with its `dim` of Hw heads repeated to H, each H / Hw times in a row (query head h reads
// head h / (H / Hw)): an expand and a copy, never a host sync (repeat_interleave may size its
// output from the device). (k and v themselves are never repeated: every kernel reads the key
// heads in place, AttnArgs::kv_heads, CudaAttnArgs::kv_heads.)
inline at::Tensor to_query_heads(const at::Tensor &x, int64_t Hw, int64_t H, int64_t dim) {
  if (Hw == H) return x;
  std::vector<int64_t> grouped = x.sizes().vec(), out = x.sizes().vec();
  grouped.insert(grouped.begin() + dim + 1, H / Hw);
  out[static_cast<size_t>(dim)] = H;
  return x.unsqueeze(dim + 1).expand(grouped).reshape(out);
}

// init "projection_term": (W[:, :columns] @ u).view(H, D), u_j = start + step·j.
//   ExPE's a = W[:, :l]·(start + θ·j)_j and b = W[:, :l]·(θ)_j (step 0, start θ).
inline at::Tensor projection_term(const at::Tensor &W, int64_t columns, double start, double step,
                                  int64_t H, int64_t D) {
  // The positions in float32 at least (a bfloat16 arange is exact only to 256 and u would be
  // rounded to 8 bits before the product), then in W's dtype for the product.
  const bool half = W.scalar_type() == at::kHalf || W.scalar_type() == at::kBFloat16;
  at::Tensor u = at::arange(columns, W.options().dtype(half ? at::kFloat : W.scalar_type())) * step + start;
  const int64_t Hw = weight_heads(W, D);
  return to_query_heads(at::mv(W.narrow(1, 0, columns), u.to(W.scalar_type())).view({Hw, D}), Hw, H, 0);
}

// init "projection_prefix": P[r] = scale·Σ_{j<=r} W[:, j] for r < columns, as [columns, H, D].
//   ExQPE's table of the partial position sums (r = n mod l).
inline at::Tensor projection_prefix(const at::Tensor &W, int64_t columns, double scale, int64_t H,
                                    int64_t D) {
  const int64_t Hw = weight_heads(W, D);
  return to_query_heads((at::cumsum(W.narrow(1, 0, columns), 1) * scale).t().reshape({columns, Hw, D}), Hw, H, 1);
}

}  // namespace ape::derived
