// The float ops of the spec language whose C++ spelling differs from MLIR's meaning, one definition
// for every emitted kernel (CPU, CUDA, the emulator); the reference (runtime/SpecReference.cpp)
// computes the same with ATen. docs/internals.md, "Non-finite values" (§1).
//   maximumf / minimumf   NaN if either operand is NaN (std::max / std::min return whichever
//                         operand their comparison lands on)
//   maxnumf / minnumf     the number when one operand is NaN: std::fmax / std::fmin
//   fptosi / fptoui       truncation toward zero, saturated to int64's range, NaN -> 0 (MLIR leaves
//                         an out-of-range value poison, and C++'s conversion is undefined there:
//                         x86 and the GPU disagree); fptoui converts as fptosi
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define APE_FLOAT_MATH_HD __host__ __device__
#else
#define APE_FLOAT_MATH_HD
#endif

namespace ape::float_math {

template <class T> APE_FLOAT_MATH_HD constexpr T maximum(T a, T b) {
  return a != a ? a : b != b ? b : a > b ? a : b;
}
template <class T> APE_FLOAT_MATH_HD constexpr T minimum(T a, T b) {
  return a != a ? a : b != b ? b : a < b ? a : b;
}
template <class T> APE_FLOAT_MATH_HD constexpr T maxnum(T a, T b) {
  return a != a ? b : b != b ? a : a > b ? a : b;
}
template <class T> APE_FLOAT_MATH_HD constexpr T minnum(T a, T b) {
  return a != a ? b : b != b ? a : a < b ? a : b;
}
// 2^63 is exact in float and double; every value below it converts in range.
template <class T> APE_FLOAT_MATH_HD constexpr int64_t to_int(T x) {
  return x != x ? 0
         : x >= T(9223372036854775808.0) ? INT64_MAX
         : x < T(-9223372036854775808.0) ? INT64_MIN
                                          : static_cast<int64_t>(x);
}

static_assert(maximum(1.0, 2.0) == 2.0 && minimum(1.0, 2.0) == 1.0, "order");
static_assert(maxnum(__builtin_nan(""), -1.0) == -1.0 && minnum(3.0, __builtin_nan("")) == 3.0, "the number");
static_assert(maximum(__builtin_nan(""), 1.0) != maximum(__builtin_nan(""), 1.0), "NaN propagates");
static_assert(to_int(-2.7) == -2 && to_int(1e30) == INT64_MAX && to_int(-1e30) == INT64_MIN &&
                  to_int(__builtin_nan("")) == 0 && to_int(1e30f) == INT64_MAX,
              "saturating truncation");

}  // namespace ape::float_math
