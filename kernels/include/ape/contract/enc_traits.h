// Optional members of a generated `Enc` functor, detected at compile time (plain C++17, usable by
// every kernel template, CPU and CUDA):
//   NumRel<Enc>::value        Enc::kNumRel, the number of ape.rel_rows values (0 when absent);
//   HasValueRows<Enc>::value  Enc::kHasValueRows, an ape.value_rows term (false when absent);
//   DistanceBias<Enc>::value  Enc::kDistanceBias: the score mod is s + B(i - j), with
//                             distance_bias(ctx, d) = B(d) and distance_bias_grad(ctx, d, g)
//                             (false when absent: the templates call score_mod per element);
//   RowColBias<Enc>::value    Enc::kRowColBias: the score mod is s + R(i) + C(j), with
//                             row_bias / col_bias(ctx, i or j) and row_bias_grad /
//                             col_bias_grad(ctx, i or j, g) (false when absent);
//   Features<Enc>::value      Enc::kFeatures: the score mod reads memory only at features of
//                             the query row, the key column or the slice (kRowFeatures, ...),
//                             with row_features / col_features / slice_features, their _grad
//                             functions, score_mod_features(_grad) and features_same (false
//                             when absent);
//   BiasFixed<Enc>::value     Enc::kBiasFixed: the distance or row/column bias has no gradient
//                             (its _grad functions write nothing): the backward skips the bias
//                             sums (false when absent);
//   QModLinear<Enc>::value    Enc::kQModLinear (KModLinear: kKModLinear): q_mod(x, y) =
//                             a(t, c) x + b(t, c) y with a, b independent of the head, the batch
//                             and the data (cpu/attention.h tabulates them once per call);
//   KModReadsLength<Enc>::value, TokensReadLength<Enc>::value  Enc::kKModReadsLength /
//                             kTokensReadLength: k' / the token sequences read the sequence length
//                             (cpu/decode.h recomputes them every step);
//   KModShared<Enc>::value    one key head's k' serves its group (no k mod, or KModLinear):
//                             grouped-query attention keeps k' per key head;
//   QModParams<Enc>::value    Enc::kQModParams (KModParams: kKModParams): the trainable
//                             parameters the q mod (k mod) reads, a bit each, so its gradient
//                             adds to them (~0u when absent: any);
//   HasTransition<Enc>::value Enc::kTransition, the ape::TransitionAttrs of an
//                             ape.attention_transition (contract/transition.h; false when
//                             absent): an inference-only encoding, forward and prefill only.
// docs/internals.md lists the members they stand for.
#pragma once

#include <type_traits>

#include "ape/contract/float_math.h"  // the regions' NaN-aware max/min and float -> int
#include "ape/contract/int_math.h"    // the regions' integer division (every emitted functor)

namespace ape::traits {

template <class Enc, class = void> struct NumRel {
  static constexpr int value = 0;
};
template <class Enc> struct NumRel<Enc, std::void_t<decltype(Enc::kNumRel)>> {
  static constexpr int value = Enc::kNumRel;
};

// An optional constant member `Enc::kMember` of type Type: Name<Enc>::value, Absent where the
// functor lacks it. One mechanism for the two kinds below.
#define APE_ENC_MEMBER(Name, kMember, Type, Absent)                                          \
  template <class Enc, class = void> struct Name {                                           \
    static constexpr Type value = Absent;                                                    \
  };                                                                                         \
  template <class Enc> struct Name<Enc, std::void_t<decltype(Enc::kMember)>> {              \
    static constexpr Type value = Enc::kMember;                                              \
  };
// A mask of parameters, a bit each (~0u when absent: an Enc written by hand may read any).
#define APE_ENC_PARAM_MASK(Name, kMember) APE_ENC_MEMBER(Name, kMember, unsigned, ~0u)
// A bool member, emitted only when true (false when absent).
#define APE_ENC_FLAG(Name, kMember) APE_ENC_MEMBER(Name, kMember, bool, false)

// The parameters the score mod reads (Enc::kScoreParams, emitted with every score mod).
APE_ENC_PARAM_MASK(ScoreParams, kScoreParams)
// The trainable parameters the q mod / k mod reads (Enc::kQModParams / kKModParams, emitted with
// every mod of the CUDA functor): the CUDA backward sums the gradients of those in registers over
// rows (cuda/side_kernels.cuh, mod_backward_params_kernel).
APE_ENC_PARAM_MASK(QModParams, kQModParams)
APE_ENC_PARAM_MASK(KModParams, kKModParams)
#undef APE_ENC_PARAM_MASK

APE_ENC_FLAG(HasValueRows, kHasValueRows)
APE_ENC_FLAG(DistanceBias, kDistanceBias)
APE_ENC_FLAG(RowColBias, kRowColBias)
APE_ENC_FLAG(Features, kFeatures)
APE_ENC_FLAG(BiasFixed, kBiasFixed)
APE_ENC_FLAG(QModLinear, kQModLinear)
APE_ENC_FLAG(KModLinear, kKModLinear)
APE_ENC_FLAG(KModReadsLength, kKModReadsLength)
APE_ENC_FLAG(TokensReadLength, kTokensReadLength)
#undef APE_ENC_FLAG
#undef APE_ENC_MEMBER

// One key head's k' serves every query head of its group (grouped-query attention): no k mod, or a
// linear one (KModLinear: its coefficients read neither the head nor the data, so every query
// head's k' is the same). The CPU decode cache (cpu/decode.h) and the CUDA kernels (cuda/launch.cuh,
// CudaKernelEntry::shares_k_mod) then keep k' per key head; else per query head.
template <class Enc> struct KModShared {
  static constexpr bool value = !Enc::kHasKMod || KModLinear<Enc>::value;
};

template <class Enc, class = void> struct HasTransition {
  static constexpr bool value = false;
};
template <class Enc> struct HasTransition<Enc, std::void_t<decltype(Enc::kTransition)>> {
  static constexpr bool value = true;
};

}  // namespace ape::traits
