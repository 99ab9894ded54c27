//===- Kerple.cpp - ape.kerple --------------------------------------------===//
//
// KERPLE: -p_h·ln(1 + a_h·Δ) ("log") or -a_h·Δ^(p_h) ("power"), p and a per head, shared
// by all layers, clamped.
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

// KERPLE: -p_h·ln(1 + a_h·Δ) ("log") or -a_h·Δ^(p_h) ("power"), p and a clamped.

LogicalResult KerpleOp::verify() {
  double p = getPInit().convertToDouble(), a = getAInit().convertToDouble();
  if (!(p >= 0.01 && a >= 0.01 && isFinite(p) && isFinite(a)))
    return emitOpError("p_init and a_init must be finite and at least 0.01, got ")
           << num(p) << " and " << num(a);
  if (getKind() == abi::KerpleKind::Power && p > 2.0)
    return emitOpError("p_init of the power kernel must be at most 2, got ") << num(p);
  return success();
}

void KerpleOp::expand(OpBuilder &b) {
  KerpleOp op = *this;
  Location loc = op.getLoc();
  bool power = op.getKind() == abi::KerpleKind::Power;
  ParamOp p =
      newParam(b, loc, "kerple_p", {"heads"}, abi::InitKind::Constant, true, /*shared=*/true);
  p.setValueAttr(op.getPInitAttr());
  ParamOp a =
      newParam(b, loc, "kerple_a", {"heads"}, abi::InitKind::Constant, true, /*shared=*/true);
  a.setValueAttr(op.getAInitAttr());
  buildScoreMod(b, loc, [&](RegionBuilder &rb, Value, Value h, Value i, Value j) {
    Value pv = rb.maxf(rb.load(p, {h}), rb.f32(0.01));
    Value av = rb.maxf(rb.load(a, {h}), rb.f32(0.01));
    Value d = rb.toF32(distance(rb, i, j));
    if (!power)
      return rb.neg(rb.mul(pv, rb.log1p(rb.mul(av, d))));
    pv = rb.minf(pv, rb.f32(2.0));
    // Δ^p at Δ = 0 is 0; the select keeps ln(0) out of the exponent's gradient.
    Value positive = rb.b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, d, rb.f32(0.0));
    Value powered = rb.b.create<math::PowFOp>(loc, d, pv);
    return rb.neg(rb.mul(av, rb.select(positive, powered, rb.f32(0.0))));
  });
}
