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
//   HasTransition<Enc>::value Enc::kTransition, the ape::TransitionAttrs of an
//                             ape.attention_transition (attention_transition.h; false when
//                             absent): an inference-only encoding, forward and prefill only.
// docs/internals.md lists the members they stand for.
#pragma once

#include <type_traits>

namespace ape::traits {

template <class Enc, class = void> struct NumRel {
  static constexpr int value = 0;
};
template <class Enc> struct NumRel<Enc, std::void_t<decltype(Enc::kNumRel)>> {
  static constexpr int value = Enc::kNumRel;
};

template <class Enc, class = void> struct HasValueRows {
  static constexpr bool value = false;
};
template <class Enc> struct HasValueRows<Enc, std::void_t<decltype(Enc::kHasValueRows)>> {
  static constexpr bool value = Enc::kHasValueRows;
};

template <class Enc, class = void> struct DistanceBias {
  static constexpr bool value = false;
};
template <class Enc> struct DistanceBias<Enc, std::void_t<decltype(Enc::kDistanceBias)>> {
  static constexpr bool value = Enc::kDistanceBias;
};

template <class Enc, class = void> struct RowColBias {
  static constexpr bool value = false;
};
template <class Enc> struct RowColBias<Enc, std::void_t<decltype(Enc::kRowColBias)>> {
  static constexpr bool value = Enc::kRowColBias;
};

template <class Enc, class = void> struct HasTransition {
  static constexpr bool value = false;
};
template <class Enc> struct HasTransition<Enc, std::void_t<decltype(Enc::kTransition)>> {
  static constexpr bool value = true;
};

}  // namespace ape::traits
