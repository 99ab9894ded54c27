// Integer division and remainder of the spec language (a region's arith.divsi, remsi, divui, remui
// and floordivsi), one definition for every emitted kernel (CPU, CUDA, the emulator) and the
// reference (runtime/SpecReference.cpp): total, never a trap. MLIR leaves division by zero
// undefined, and in C++ it is a SIGFPE on x86, while a spec may well divide by an index difference
// that is 0 on the diagonal. So, as in Lean: x / 0 = 0 and x % 0 = x (x = (x / y) y + x % y holds
// for every y), and INT64_MIN / -1 wraps to INT64_MIN (with remainder 0). The unsigned forms read
// their operands as uint64. docs/internals.md, "Integer arithmetic" (§1).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define APE_INT_MATH_HD __host__ __device__
#else
#define APE_INT_MATH_HD
#endif

namespace ape::int_math {

APE_INT_MATH_HD constexpr int64_t div(int64_t a, int64_t b) {
  return b == 0 ? 0 : b == -1 ? static_cast<int64_t>(uint64_t{0} - static_cast<uint64_t>(a)) : a / b;
}
APE_INT_MATH_HD constexpr int64_t rem(int64_t a, int64_t b) { return b == 0 ? a : b == -1 ? 0 : a % b; }
// Rounds toward -inf.
APE_INT_MATH_HD constexpr int64_t floordiv(int64_t a, int64_t b) {
  return div(a, b) - static_cast<int64_t>(rem(a, b) != 0 && ((a < 0) != (b < 0)));
}
APE_INT_MATH_HD constexpr int64_t udiv(int64_t a, int64_t b) {
  return b == 0 ? 0 : static_cast<int64_t>(static_cast<uint64_t>(a) / static_cast<uint64_t>(b));
}
APE_INT_MATH_HD constexpr int64_t urem(int64_t a, int64_t b) {
  return b == 0 ? a : static_cast<int64_t>(static_cast<uint64_t>(a) % static_cast<uint64_t>(b));
}

static_assert(div(7, 0) == 0 && rem(7, 0) == 7 && div(-7, 2) == -3 && rem(-7, 2) == -1, "C++ truncation");
static_assert(floordiv(-7, 2) == -4 && floordiv(7, -2) == -4 && floordiv(6, 3) == 2 && floordiv(5, 0) == 0,
              "toward -inf");
static_assert(div(INT64_MIN, -1) == INT64_MIN && rem(INT64_MIN, -1) == 0, "wraps");
static_assert(udiv(-1, 2) == INT64_MAX && urem(5, 0) == 5, "unsigned");

}  // namespace ape::int_math
