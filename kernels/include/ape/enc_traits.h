// Optional members of a generated `Enc` functor, detected at compile time (plain C++17, usable by
// every kernel template, CPU and CUDA):
//   NumRel<Enc>::value        Enc::kNumRel, the number of ape.rel_rows values (0 when absent);
//   HasValueRows<Enc>::value  Enc::kHasValueRows, an ape.value_rows term (false when absent).
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

}  // namespace ape::traits
