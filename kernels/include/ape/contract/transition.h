// The attention transition (docs/encodings-math.md, "Attention transition (P)"): a
// post-softmax redistribution of attention mass, at inference only, while a prompt is processed.
//
// For a prompt of T tokens and a model of N layers (0-based l = 0 .. N-1):
//   I = floor(T / (N + divisor_offset)) rounded down to a multiple of 5 (the spec: divisor N + 1);
//   layers first_layer .. N-1-skip_last are transformed (the spec: 1 .. N-3);
//   layer l holds `intervals` consecutive intervals [(l+1+k)I, (l+2+k)I), k = 0 .. intervals-1
//   (the spec: two), and an interval [s, e) transforms the query rows r in [s, e) ∩ [0, T).
// I < 5 (a short prompt) is a no-op. On a row r of an interval [s, e) with post-softmax weights
// A[r, .] (alpha = 0.5, beta = 0.1 by default):
//   1. bound = alpha / e;
//   2. A[r, c] = 0 where A[r, c] < bound (c < e); then A[r, 0] /= 2;
//   3. E_r = 1 - Σ_c A[r, c]                       (the mass removed);
//   4. W = keys [s - 2I, s); mask_c = 1 if A[r, c] >= bound else 0.01 (on A after step 2);
//      N_r = Σ_{c ∈ W} mask_c, avg_r = beta·E_r / N_r;
//   5. A[r, s-I .. s) += 7·avg_r·mask, A[r, s-2I .. s-I) += 3·avg_r·mask. No renormalisation.
// The intervals of one layer cover disjoint rows, so applying them "in sequence" is applying each
// to its own rows.
//
// This header holds the contract shared by every stage: the attributes (the dialect's
// ape.attention_transition carries the same names; apec emits them into the functor as
// `static constexpr ape::TransitionAttrs kTransition`), the interval geometry, the per-weight
// formulas of the fused kernels (transition_weight and friends; APE_ABI_HD: host and device) and
// the literal reference (transition_row_reference) that applies steps 1-5 to one materialised
// row. The fused forms, in cpu/attention.h (transition_rows) and cuda/transition.cuh, take three
// passes over the keys of a transformed row and never store a T x T matrix: pass 1 the row's
// log-sum-exp (the ordinary forward), pass 2 the kept mass Σ A' and the mask sum N_r, pass 3 the
// output Σ_c w_c v_c with the modified weights.
// Plain C++17, no MLIR, no LibTorch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstddef>
#include <vector>

#include "ape/contract/vocabulary.h"  // APE_ABI_HD

namespace ape {

struct TransitionAttrs {
  int64_t divisor_offset = 1;  // I = floor(T / (N + divisor_offset)), rounded down to 5
  int64_t first_layer = 1;     // the first transformed layer (0-based, >= 1)
  int64_t skip_last = 2;       // the last skip_last layers are not transformed
  int64_t intervals = 2;       // consecutive intervals per layer
  double alpha = 0.5;          // bound = alpha / e
  double beta = 0.1;           // share of the removed mass given back to the window
};

// The spec's fixed numbers: the width unit, the weights of the near and far halves of the
// window, and the mask of a weight below the bound.
inline constexpr int64_t kTransitionWidthUnit = 5;
inline constexpr double kTransitionNear = 7.0, kTransitionFar = 3.0, kTransitionLowMask = 0.01;

// The interval width I for T tokens and N layers; 0 when I < 5 (the transition is a no-op).
inline int64_t transition_width(const TransitionAttrs &a, int64_t T, int64_t N) {
  if (T <= 0 || N <= 0 || N + a.divisor_offset <= 0) return 0;
  const int64_t q = T / (N + a.divisor_offset);
  const int64_t I = q - q % kTransitionWidthUnit;
  return I >= kTransitionWidthUnit ? I : 0;
}

// The query rows [lo, hi) that layer `layer` of N transforms at length T (lo == hi: none), and I.
struct TransitionRows {
  int64_t lo = 0, hi = 0, I = 0;
  bool empty() const { return hi <= lo; }
  // The interval [s, e) holding row r (lo <= r < hi): s = lo + I·floor((r - lo) / I).
  int64_t start(int64_t r) const { return lo + (r - lo) / I * I; }
};
inline TransitionRows transition_rows_of(const TransitionAttrs &a, int64_t T, int64_t N,
                                         int64_t layer) {
  TransitionRows r;
  // Layer 0 has no window before its first interval (s = I < 2I): never transformed (the
  // verifier asks first_layer >= 1).
  if (layer < std::max<int64_t>(a.first_layer, 1) || layer > N - 1 - a.skip_last || a.intervals <= 0)
    return r;
  r.I = transition_width(a, T, N);
  if (r.I == 0) return r;
  r.lo = std::min(T, (layer + 1) * r.I);
  r.hi = std::min(T, (layer + 1 + a.intervals) * r.I);
  return r;
}

// Step 2 for one weight A = A[r, c] of a row whose interval ends at e: the weight after zeroing
// and halving.
template <typename Real> APE_ABI_HD inline Real transition_kept(Real A, int64_t c, Real bound) {
  const Real kept = A >= bound ? A : Real(0);
  return c == 0 ? kept * Real(0.5) : kept;
}

// Step 4's mask of a kept weight (after step 2).
template <typename Real> APE_ABI_HD inline Real transition_mask(Real kept, Real bound) {
  return kept >= bound ? Real(1) : Real(kTransitionLowMask);
}

// Step 5: the final weight of key c in a row of the interval [s, s + I), given avg_r.
template <typename Real>
APE_ABI_HD inline Real transition_weight(Real A, int64_t c, int64_t s, int64_t I, Real bound,
                                        Real avg) {
  const Real kept = transition_kept(A, c, bound);
  if (c >= s || c < s - 2 * I) return kept;
  const Real share = c >= s - I ? Real(kTransitionNear) : Real(kTransitionFar);
  return kept + share * avg * transition_mask(kept, bound);
}

// The reference: steps 1-5 applied literally to one materialised row A[0 .. e) of the interval
// [s, e) (A[c] = 0 for keys c past the row's query: causal), in place. Needs s >= 2I (every
// interval of transition_rows_of satisfies it).
template <typename Real>
void transition_row_reference(Real *A, int64_t s, int64_t e, double alpha, double beta) {
  const int64_t I = e - s;
  const Real bound = Real(alpha) / Real(e);                          // 1.
  for (int64_t c = 0; c < e; ++c)                                    // 2.
    if (A[c] < bound) A[c] = Real(0);
  A[0] /= Real(2);
  Real sum = 0;                                                      // 3.
  for (int64_t c = 0; c < e; ++c) sum += A[c];
  const Real E = Real(1) - sum;
  std::vector<Real> mask(static_cast<std::size_t>(2 * I));          // 4. W = [s - 2I, s)
  Real N = 0;
  for (int64_t c = s - 2 * I; c < s; ++c)
    N += mask[c - (s - 2 * I)] = A[c] >= bound ? Real(1) : Real(kTransitionLowMask);
  const Real avg = Real(beta) * E / N;
  for (int64_t c = s - 2 * I; c < s; ++c)                            // 5.
    A[c] += (c >= s - I ? Real(kTransitionNear) : Real(kTransitionFar)) * avg * mask[c - (s - 2 * I)];
}

}  // namespace ape
