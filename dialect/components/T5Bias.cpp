//===- T5Bias.cpp - ape.t5_bias -------------------------------------------===//
//
// T5's relative bias: a [buckets, heads] table shared by all layers, read at the bucket of
// the distance.
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

// T5: B_ij = T[bucket(i - j), h], one [buckets, heads] table shared by all layers.

LogicalResult T5BiasOp::verify() {
  int64_t buckets = getBuckets(), maxDistance = getMaxDistance();
  if (buckets < 2 || buckets % 2 != 0 || buckets > ::ape_rules::kMaxDim)
    return emitOpError("buckets must be even and in [2, ") << ::ape_rules::kMaxDim << "], got "
                                                          << buckets;
  if (failed(verifyIntRange(*this, "max_distance", maxDistance, 1, ::ape_rules::kMaxLength)))
    return failure();
  if (maxDistance <= buckets / 2)
    return emitOpError("max_distance ") << maxDistance << " must exceed buckets/2 = "
                                        << buckets / 2 << " (the exact buckets)";
  double std = getStd().convertToDouble();
  if (!(std >= 0.0 && isFinite(std)))
    return emitOpError("std must be a non-negative finite number, got ") << num(std);
  return success();
}

void T5BiasOp::expand(OpBuilder &b) {
  T5BiasOp op = *this;
  Location loc = op.getLoc();
  int64_t buckets = op.getBuckets(), exact = buckets / 2;
  double maxDistance = static_cast<double>(op.getMaxDistance());
  std::string rows = std::to_string(buckets);
  ParamOp table = newParam(b, loc, "t5_table", {rows, "heads"}, abi::InitKind::Normal, true,
                           /*shared=*/true);
  table.setStdAttr(op.getStdAttr());
  buildScoreMod(b, loc, [&](RegionBuilder &rb, Value, Value h, Value i, Value j) {
    OpBuilder &ob = rb.b;
    Value n = distance(rb, i, j);
    Value exactIdx = rb.idx(exact);
    Value small = ob.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, n, exactIdx);
    // exact + floor(ln(n/exact) / ln(max_distance/exact) · exact), n >= exact (no log 0)
    Value nF = rb.toF32(ob.create<arith::MaxSIOp>(loc, n, exactIdx));
    Value logRatio = ob.create<math::LogOp>(loc, rb.div(nF, rb.f32(static_cast<double>(exact))));
    Value steps = ob.create<math::FloorOp>(
        loc, rb.mul(logRatio, rb.f32(static_cast<double>(exact) /
                                     std::log(maxDistance / static_cast<double>(exact)))));
    Value stepsIdx = ob.create<arith::IndexCastOp>(
        loc, ob.getIndexType(), ob.create<arith::FPToSIOp>(loc, ob.getI64Type(), steps));
    Value large = ob.create<arith::MinSIOp>(loc, rb.iadd(exactIdx, stepsIdx), rb.idx(buckets - 1));
    Value bucket = ob.create<arith::SelectOp>(loc, small, n, large);
    return rb.load(table, {bucket, h});
  });
}
