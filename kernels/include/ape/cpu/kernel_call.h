// One call of a generated CPU kernel (KernelEntry) on plain arrays: the one place that packs
// AttnArgs (cpu/attention.h) and picks the entry's function for the precision. Shared by the
// runtime (runtime/Attention.cpp, SpecCheck), the operator library (torch/ops_impl.h) and the C
// ABI (c/abi_impl.h); no LibTorch.
//
//   AttnArgs<float> a = forward_args<float>({B, H, T, D}, scale, q, k, v, features, params, o, lse);
//   entry_forward<float>(entry)(a);                                  // o, lse written
//   entry_backward<float>(entry)(backward_args(a, dout, dq, dk, dv, dfeatures, dparams));
//
// Every array is contiguous in precision Real: q, k, v, o, dout, dq, dk, dv (B, H, T, D), k, v, dk,
// dv (B, kv_heads, T, D) when grouped (CallShape::kv_heads); lse and each feature (B, H, T); params
// flattened by their manifest shapes.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ape/cpu/attention.h"
#include "ape/cpu/kernel_entry.h"

namespace ape {

// The sizes of one call: B batch, H heads, T tokens, D head dim; kv_heads the heads of k and v
// (AttnArgs::kv_heads: 0 = H).
struct CallShape {
  int64_t B, H, T, D;
  int64_t kv_heads = 0;
};

// The arguments of a forward: reads q, k, v, the features (Enc::kNumFeatures arrays) and the params
// (Enc::kNumParams arrays); writes o and lse. scale is kappa; `layer` of `num_layers` is read only
// by an attention transition (AttnArgs::layer).
template <typename Real>
AttnArgs<Real> forward_args(const CallShape &s, double scale, const Real *q, const Real *k,
                            const Real *v, const Real *const *features, const Real *const *params,
                            Real *o, Real *lse, int64_t layer = 0, int64_t num_layers = 0) {
  AttnArgs<Real> a{};
  a.B = s.B, a.H = s.H, a.T = s.T, a.D = s.D;
  a.kv_heads = s.kv_heads == s.H ? 0 : s.kv_heads;
  a.q = q, a.k = k, a.v = v;
  a.o = o, a.lse = lse;
  a.features = features, a.params = params;
  a.scale = static_cast<Real>(scale);
  a.layer = layer, a.num_layers = num_layers;
  return a;
}

// The arguments of a backward: those of the forward (its o and lse as it wrote them) and dout;
// writes dq, dk, dv, dfeatures and dparams (every array overwritten).
template <typename Real>
AttnArgs<Real> backward_args(AttnArgs<Real> a, const Real *dout, Real *dq, Real *dk, Real *dv,
                             Real *const *dfeatures, Real *const *dparams) {
  a.dout = dout;
  a.dq = dq, a.dk = dk, a.dv = dv;
  a.dfeatures = dfeatures, a.dparams = dparams;
  return a;
}

// `f32` when Real is float, `f64` when it is double.
template <typename Real, class F32, class F64> constexpr auto by_precision(F32 f32, F64 f64) {
  static_assert(std::is_same_v<Real, float> || std::is_same_v<Real, double>);
  if constexpr (std::is_same_v<Real, float>)
    return f32;
  else
    return f64;
}

// The entry's forward / backward in precision Real (float or double): a
// void (*)(const AttnArgs<Real> &), null when the entry lacks it (only a hand-written one can).
template <typename Real> auto entry_forward(const KernelEntry &e) {
  return by_precision<Real>(e.forward_f32, e.forward_f64);
}
template <typename Real> auto entry_backward(const KernelEntry &e) {
  return by_precision<Real>(e.backward_f32, e.backward_f64);
}

}  // namespace ape
