//===- RegionBuilder.h - helpers to build ape region bodies ---------------===//
#ifndef APE_DIALECT_REGIONBUILDER_H
#define APE_DIALECT_REGIONBUILDER_H

#include "dialect/ApeOps.h"
#include "mlir/IR/Builders.h"

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
  Value ult(Value x, Value y);              // index x < y
  Value iadd(Value x, Value y);
  Value isub(Value x, Value y);
  Value imul(Value x, Value y);
  Value idiv(Value x, Value y);             // unsigned floor division
  Value irem(Value x, Value y);             // unsigned remainder
  Value load(Value src, ValueRange indices);
  Value dim(StringRef which);
  /// r/2 = floor(fraction·head_dim/2) as an index: half the coordinates a q/k pairing rotates
  /// (the IR form of ape_abi::rotated_dims over the run-time head_dim).
  Value rotatedHalf(double fraction);
  /// softplus(x) = max(x, 0) + log1p(exp(-|x|)), stable for any x.
  Value softplus(Value x);
  void yield(ValueRange values);
};

/// Creates `op`'s body region block with the given argument types and
/// returns it, with `b` positioned at its start.
Block *createRegionBlock(OpBuilder &b, Region &region, TypeRange argTypes, Location loc);

} // namespace mlir::ape

#endif // APE_DIALECT_REGIONBUILDER_H
