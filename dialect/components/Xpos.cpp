//===- Xpos.cpp - ape.xpos ------------------------------------------------===//
//
// xPos: the interleaved rotation with a per-pair decay ζ_k^(±t_c/B) (+ for q, - for k).
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

// xPos: interleaved rotation times ζ_k^(±t_c/B), ζ_k = (k/(d_h/2) + γ)/(1 + γ),
// t_c = t - floor(T/2); + for q, - for k.

LogicalResult XposOp::verify() {
  double gamma = getGamma().convertToDouble(), scaleBase = getScaleBase().convertToDouble(),
         base = getBase().convertToDouble();
  if (!(gamma > 0.0 && isFinite(gamma)))
    return emitOpError("gamma must be a positive finite number, got ") << gamma;
  if (!(scaleBase > 0.0 && isFinite(scaleBase)))
    return emitOpError("scale_base must be a positive finite number, got ") << scaleBase;
  if (!(base > 1.0 && isFinite(base)))
    return emitOpError("base must be a finite number greater than 1, got ") << base;
  return success();
}

void XposOp::expand(OpBuilder &b) {
  XposOp op = *this;
  Location loc = op.getLoc();
  MLIRContext *ctx = b.getContext();
  Type f32 = Float32Type::get(ctx), idx = IndexType::get(ctx);
  double gamma = op.getGamma().convertToDouble(), scaleBase = op.getScaleBase().convertToDouble(),
         base = op.getBase().convertToDouble();
  auto build = [&](Region &region, double sign) {
    OpBuilder::InsertionGuard guard(b);
    Block *block = createRegionBlock(b, region, {f32, f32, idx, idx, idx}, loc);
    RegionBuilder rb{b, loc};
    Value x = block->getArgument(0), y = block->getArgument(1), c = block->getArgument(2),
          t = block->getArgument(3);
    PairInfo p = pairInfo(rb, c, 1.0, /*half=*/false);
    Value kF = rb.toF32(p.k);
    Value exponent = rb.div(rb.mul(kF, rb.f32(-2.0)), rb.toF32(p.r));
    Value theta = b.create<math::PowFOp>(loc, rb.f32(base), exponent);
    Value rotated = rotatePair(rb, x, y, p.first, rb.mul(rb.toF32(t), theta));
    Value halfHead = rb.mul(rb.toF32(rb.dim("head_dim")), rb.f32(0.5));
    Value zeta = rb.div(rb.add(rb.div(kF, halfHead), rb.f32(gamma)), rb.f32(1.0 + gamma));
    Value centred = rb.toF32(rb.isub(t, rb.idiv(rb.dim("seq_len"), rb.idx(2))));
    Value power = rb.mul(centred, rb.f32(sign / scaleBase));
    Value decay = b.create<math::PowFOp>(loc, zeta, power);
    rb.yield(rb.select(p.inRotation, rb.mul(rotated, decay), x));
  };
  StringAttr interleaved = b.getStringAttr(abi::name(abi::Pairing::Interleaved));
  auto q = b.create<QModOp>(loc, interleaved, b.getF64FloatAttr(1.0));
  build(q.getBody(), 1.0);
  auto k = b.create<KModOp>(loc, interleaved, b.getF64FloatAttr(1.0));
  build(k.getBody(), -1.0);
}
