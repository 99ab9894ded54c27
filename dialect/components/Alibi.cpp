//===- Alibi.cpp - ape.alibi ----------------------------------------------===//
//
// ALiBi: B_ij = -m_h·(i - j), slopes m_h fixed (the standard ones) or learned.
//
//===----------------------------------------------------------------------===//
#include "dialect/ComponentSupport.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"

#include <cmath>
#include <string>

using namespace mlir;
using namespace mlir::ape;
using namespace mlir::ape::component;

LogicalResult AlibiOp::verify() { return success(); }

void AlibiOp::expand(OpBuilder &b) {
  AlibiOp op = *this;
  Location loc = op.getLoc();
  ParamOp slopes = createParam(b, loc, "alibi_slopes", {"heads"}, abi::InitKind::AlibiSlopes,
                               op.getLearned());
  // B_ij = -m_h·(i - j)
  buildScoreMod(b, loc, [&](RegionBuilder &rb, Value, Value h, Value i, Value j) {
    Value m = rb.load(slopes, {h});
    return rb.neg(rb.mul(m, rb.toF32(rb.isub(i, j))));
  });
}
