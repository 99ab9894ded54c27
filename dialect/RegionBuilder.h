//===- RegionBuilder.h - helpers to build ape region bodies ---------------===//
#ifndef APE_DIALECT_REGIONBUILDER_H
#define APE_DIALECT_REGIONBUILDER_H

#include "dialect/ApeOps.h"
#include "mlir/IR/Builders.h"

#include <cstdint>
#include <optional>
#include <utility>

namespace mlir::ape {

/// Small arithmetic vocabulary over f32 and index values, at one location.
struct RegionBuilder {
  OpBuilder &b;
  Location loc;

  Value f32(double v);
  Value idx(int64_t v);
  Value toF32(Value index);                 // index -> f32 (signed)
  Value add(Value x, Value y);
  Value sub(Value x, Value y);
  Value mul(Value x, Value y);
  Value div(Value x, Value y);
  Value neg(Value x);
  Value exp(Value x);
  Value log1p(Value x);
  Value absf(Value x);
  Value maxf(Value x, Value y);
  Value minf(Value x, Value y);
  Value select(Value cond, Value x, Value y);
  /// max(x, 0) as select(x > 0 or unordered, x, 0): its derivative at 0 is 0 (PyTorch's ReLU;
  /// max(x, 0) passes x's there, the differentiator's tie rule) and a NaN stays NaN.
  Value relu(Value x);
  Value ult(Value x, Value y);              // index x < y
  Value iadd(Value x, Value y);
  Value isub(Value x, Value y);
  Value imul(Value x, Value y);
  Value idiv(Value x, Value y);             // unsigned floor division
  Value irem(Value x, Value y);             // unsigned remainder
  Value load(Value src, ValueRange indices);
  Value dim(StringRef which);
  /// r/2 = floor(fraction·head_dim/2) as an index: half the coordinates a q/k pairing rotates
  /// (the IR form of ape_abi::rotated_dims over the run-time head_dim), in integer arithmetic
  /// (exactHalfRatio), so that every precision pairs the same coordinates.
  Value rotatedHalf(double fraction);
  /// softplus(x) = max(x, 0) + log1p(exp(-|x|)), stable for any x.
  Value softplus(Value x);
  void yield(ValueRange values);
};

/// The head dims up to which exactHalfRatio's ratio is exact.
inline constexpr int64_t kMaxExactHeadDim = 65536;

/// (p, q) with (D·p) / q (integer division) = floor(fraction·D/2), as ape_abi::rotated_dims
/// computes it in double, for every head dim D in [1, kMaxExactHeadDim]: the first convergent of
/// fraction/2 that does (1/2 for fraction 1; 21/80 for 0.525). None for a fraction outside (0, 1]
/// or, in principle, one with no such ratio below 2^31.
std::optional<std::pair<int64_t, int64_t>> exactHalfRatio(double fraction);

/// Creates `op`'s body region block with the given argument types and
/// returns it, with `b` positioned at its start.
Block *createRegionBlock(OpBuilder &b, Region &region, TypeRange argTypes, Location loc);

} // namespace mlir::ape

#endif // APE_DIALECT_REGIONBUILDER_H
