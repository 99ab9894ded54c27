//===- Absolute.cpp - ape.absolute ----------------------------------------===//
//
// Absolute positions: the sinusoidal table region or a learned table, added to the embeddings
// (ape.position_embedding).
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

// Absolute positions: a sinusoidal table region or a learned table.

LogicalResult AbsoluteOp::verify() {
  if (getKind() == abi::AbsoluteKind::Learned) {
    if (!getMaxLength())
      return emitOpError("kind \"learned\" needs `max_length` (the rows of the table)");
    if (failed(verifyIntRange(*this, "max_length", static_cast<int64_t>(*getMaxLength()), 1,
                              ::ape_rules::kMaxLength)))
      return failure();
    double std = getStd().convertToDouble();
    if (!(std >= 0.0 && isFinite(std)))
      return emitOpError("std must be a non-negative finite number, got ") << std;
  } else {
    if (getMaxLength())
      return emitOpError("max_length applies to kind \"learned\" only (the sinusoidal "
                         "table has no limit)");
    double base = getBase().convertToDouble();
    if (!(base > 1.0 && isFinite(base)))
      return emitOpError("base must be a finite number greater than 1, got ") << base;
  }
  return success();
}

void AbsoluteOp::expand(OpBuilder &b) {
  AbsoluteOp op = *this;
  Location loc = op.getLoc();
  bool learned = op.getKind() == abi::AbsoluteKind::Learned;
  auto pe = b.create<PositionEmbeddingOp>(
      loc, learned ? b.getUnitAttr() : nullptr, op.getMaxLengthAttr(), op.getStdAttr(),
      op.getScaleEmbedding() ? b.getUnitAttr() : nullptr);
  if (learned)
    return;
  // PE[n, 2k] = sin(n / base^(2k/d)), PE[n, 2k+1] = cos(n / base^(2k/d))
  OpBuilder::InsertionGuard guard(b);
  Type idx = b.getIndexType();
  Block *block = createRegionBlock(b, pe.getTable(), {idx, idx, idx}, loc);
  RegionBuilder rb{b, loc};
  Value n = block->getArgument(0), c = block->getArgument(1), d = block->getArgument(2);
  Value odd = rb.irem(c, rb.idx(2));
  Value even = rb.toF32(rb.isub(c, odd));  // 2k
  Value exponent = rb.div(rb.neg(even), rb.toF32(d));
  Value freq = b.create<math::PowFOp>(loc, rb.f32(op.getBase().convertToDouble()), exponent);
  Value angle = rb.mul(rb.toF32(n), freq);
  Value isSin = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, odd, rb.idx(0));
  Value sn = b.create<math::SinOp>(loc, angle);
  Value cs = b.create<math::CosOp>(loc, angle);
  rb.yield(rb.select(isSin, sn, cs));
}
