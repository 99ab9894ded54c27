//===- RegionBuilder.cpp - helpers to build ape region bodies -------------===//
#include "dialect/RegionBuilder.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"

using namespace mlir;
using namespace mlir::ape;

Value RegionBuilder::f32(double v) {
  // Values single precision cannot hold exactly (0.1, 2π) stay exact for fp64 kernels.
  if (static_cast<double>(static_cast<float>(v)) != v)
    return b.create<ConstantOp>(loc, b.getF32Type(), b.getF64FloatAttr(v));
  return b.create<arith::ConstantOp>(loc, b.getF32FloatAttr(static_cast<float>(v)));
}
Value RegionBuilder::idx(int64_t v) { return b.create<arith::ConstantIndexOp>(loc, v); }
Value RegionBuilder::toF32(Value index) {
  Value i64 = b.create<arith::IndexCastOp>(loc, b.getI64Type(), index);
  return b.create<arith::SIToFPOp>(loc, b.getF32Type(), i64);
}
Value RegionBuilder::add(Value x, Value y) { return b.create<arith::AddFOp>(loc, x, y); }
Value RegionBuilder::sub(Value x, Value y) { return b.create<arith::SubFOp>(loc, x, y); }
Value RegionBuilder::mul(Value x, Value y) { return b.create<arith::MulFOp>(loc, x, y); }
Value RegionBuilder::div(Value x, Value y) { return b.create<arith::DivFOp>(loc, x, y); }
Value RegionBuilder::neg(Value x) { return b.create<arith::NegFOp>(loc, x); }
Value RegionBuilder::exp(Value x) { return b.create<math::ExpOp>(loc, x); }
Value RegionBuilder::log1p(Value x) { return b.create<math::Log1pOp>(loc, x); }
Value RegionBuilder::absf(Value x) { return b.create<math::AbsFOp>(loc, x); }
Value RegionBuilder::maxf(Value x, Value y) { return b.create<arith::MaximumFOp>(loc, x, y); }
Value RegionBuilder::minf(Value x, Value y) { return b.create<arith::MinimumFOp>(loc, x, y); }
Value RegionBuilder::select(Value c, Value x, Value y) {
  return b.create<arith::SelectOp>(loc, c, x, y);
}
Value RegionBuilder::ult(Value x, Value y) {
  return b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult, x, y);
}
Value RegionBuilder::iadd(Value x, Value y) { return b.create<arith::AddIOp>(loc, x, y); }
Value RegionBuilder::isub(Value x, Value y) { return b.create<arith::SubIOp>(loc, x, y); }
Value RegionBuilder::imul(Value x, Value y) { return b.create<arith::MulIOp>(loc, x, y); }
Value RegionBuilder::idiv(Value x, Value y) { return b.create<arith::DivUIOp>(loc, x, y); }
Value RegionBuilder::irem(Value x, Value y) { return b.create<arith::RemUIOp>(loc, x, y); }
Value RegionBuilder::load(Value src, ValueRange indices) {
  return b.create<LoadOp>(loc, b.getF32Type(), src, indices);
}
Value RegionBuilder::dim(StringRef which) {
  return b.create<DimOp>(loc, b.getIndexType(), b.getStringAttr(which));
}
Value RegionBuilder::rotatedHalf(double fraction) {
  Value dh = toF32(dim("head_dim"));  // before the constant: the ops in reading order
  Value halfF = b.create<math::FloorOp>(loc, mul(dh, f32(fraction / 2.0)));
  return b.create<arith::IndexCastOp>(loc, b.getIndexType(),
                                      b.create<arith::FPToSIOp>(loc, b.getI64Type(), halfF));
}
Value RegionBuilder::softplus(Value x) {
  // softplus(x) = max(x, 0) + log1p(exp(-|x|)); locals fix the op order.
  Value positive = maxf(x, f32(0.0));
  Value tail = log1p(exp(neg(absf(x))));
  return add(positive, tail);
}
void RegionBuilder::yield(ValueRange values) { b.create<YieldOp>(loc, values); }

Block *mlir::ape::createRegionBlock(OpBuilder &b, Region &region, TypeRange argTypes,
                                    Location loc) {
  SmallVector<Location> locs(argTypes.size(), loc);
  Block *block = b.createBlock(&region, region.end(), argTypes, locs);
  b.setInsertionPointToStart(block);
  return block;
}
