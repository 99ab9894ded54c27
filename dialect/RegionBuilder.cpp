//===- RegionBuilder.cpp - helpers to build ape region bodies -------------===//
#include "dialect/RegionBuilder.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

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
Value RegionBuilder::relu(Value x) {
  Value positive = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::UGT, x, f32(0.0));
  return select(positive, x, f32(0.0));
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
std::optional<std::pair<int64_t, int64_t>> mlir::ape::exactHalfRatio(double fraction) {
  // floor(fraction·D/2) as ape_abi::rotated_dims computes it (in double, before its clamp).
  auto want = [fraction](int64_t D) {
    return static_cast<int64_t>(fraction * static_cast<double>(D) / 2);
  };
  // A head dim where fraction·D/2 in double falls within rounding below a whole number that
  // the fraction means (0.7·180/2 is 62.99999999999999): no rotation runs there (fraction·D is
  // not an even whole number: ape_rules::checkRotation refuses it), and no ratio follows the
  // double's rounding there and everywhere else.
  auto ambiguous = [fraction](int64_t D) {
    const double y = fraction * static_cast<double>(D) / 2, n = std::nearbyint(y);
    const double r = fraction * static_cast<double>(D);
    const bool even_whole = r == std::floor(r) && static_cast<int64_t>(r) % 2 == 0;
    return !even_whole && n != y && std::abs(y - n) <= 1e-9 * std::max(1.0, y);
  };
  auto matches = [&](int64_t p, int64_t q) {
    for (int64_t D = 1; D <= kMaxExactHeadDim; ++D)
      if (D * p / q != want(D) && !ambiguous(D)) return false;
    return true;
  };
  if (!(fraction > 0.0 && fraction <= 1.0)) return std::nullopt;  // (the verifiers refuse it)
  // The convergents h/k of the continued fraction of fraction/2, smallest denominators first.
  const double x = fraction / 2.0;
  int64_t h1 = 1, h2 = 0, k1 = 0, k2 = 1;
  double y = x;
  for (int step = 0; step < 64; ++step) {
    const double a = std::floor(y);
    constexpr int64_t kMaxDen = int64_t(1) << 31;
    if (k1 > 0 ? a > static_cast<double>(kMaxDen - k2) / static_cast<double>(k1) : a > 1.0)
      break;  // the next denominator would pass 2^31 (h <= k: fraction/2 <= 1/2)
    const int64_t ai = static_cast<int64_t>(a);
    const int64_t h = ai * h1 + h2, k = ai * k1 + k2;
    if (k > 0 && matches(h, k)) return std::make_pair(h, k);
    h2 = h1, h1 = h, k2 = k1, k1 = k;
    const double rest = y - a;
    if (rest <= 0.0) break;
    y = 1.0 / rest;
  }
  return std::nullopt;
}

Value RegionBuilder::rotatedHalf(double fraction) {
  // In integers: (d_h·p) / q. In the kernel's precision, floor(d_h·fraction/2) is not the count
  // the partners follow: 240·0.2625f is 62.999996 in float, which paired coordinates 63 apart
  // while the frequencies' index ran modulo 62.
  Value dh = dim("head_dim");
  if (auto ratio = exactHalfRatio(fraction)) {
    auto [p, q] = *ratio;
    Value scaled = p == 1 ? dh : imul(dh, idx(p));
    return q == 1 ? scaled : idiv(scaled, idx(q));
  }
  // No ratio of the fraction's (the verifiers keep fractions in (0, 1]; every one tried has one):
  // the float form, exact in fp64 kernels.
  Value halfF = b.create<math::FloorOp>(loc, mul(toF32(dh), f32(fraction / 2.0)));
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
