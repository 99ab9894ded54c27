//===- Support.cpp - what the named components share ----------------------===//
#include "dialect/ComponentSupport.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"

using namespace mlir;
using namespace mlir::ape;

namespace mlir::ape::component {

ParamOp fixedScalar(OpBuilder &b, Location loc, StringRef name, double value,
                    const ape_rules::Range &range) {
  ParamOp p = createParam(b, loc, name, {"1"}, abi::InitKind::Constant, /*trainable=*/false);
  p.setValueAttr(b.getF64FloatAttr(value));
  setValueRange(p, range);
  return p;
}

ParamOp newParam(OpBuilder &b, Location loc, StringRef name, ArrayRef<StringRef> shape,
                 abi::InitKind init, bool trainable, bool shared) {
  ParamOp p = createParam(b, loc, name, shape, init, trainable);
  p.setShared(shared);
  return p;
}

Value distance(RegionBuilder &rb, Value i, Value j) {
  return rb.b.create<arith::MaxSIOp>(rb.loc, rb.isub(i, j), rb.idx(0));
}

Value rotatePair(RegionBuilder &rb, Value x, Value y, Value first, Value angle) {
  Value cs = rb.b.create<math::CosOp>(rb.loc, angle);
  Value sn = rb.b.create<math::SinOp>(rb.loc, angle);
  Value sign = rb.select(first, rb.f32(-1.0), rb.f32(1.0));
  return rb.add(rb.mul(x, cs), rb.mul(rb.mul(sign, y), sn));
}

PairInfo pairInfo(RegionBuilder &rb, Value c, double fraction, bool half) {
  OpBuilder &b = rb.b;
  Location loc = rb.loc;
  // r = 0 is the identity, as in the kernel template's pairing; the divisor r/2 is kept >= 1
  // so the index arithmetic stays defined.
  Value halfI = rb.rotatedHalf(fraction);
  PairInfo p;
  p.r = rb.imul(halfI, rb.idx(2));
  Value halfR = b.create<arith::MaxUIOp>(loc, halfI, rb.idx(1));
  p.inRotation = rb.ult(c, p.r);
  p.k = half ? rb.irem(c, halfR) : rb.idiv(c, rb.idx(2));
  p.first = half ? rb.ult(c, halfR)
                 : b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, rb.irem(c, rb.idx(2)),
                                           rb.idx(0));
  return p;
}

} // namespace mlir::ape::component
