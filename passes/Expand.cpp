//===- Expand.cpp - named components to generic forms ---------------------===//
//
// Each named component is sugar: this pass replaces it, in place, by the
// params, token features, maps, scans and mod regions it stands for. After
// it, only generic forms (and ape.override, for -ape-push-override) remain.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/RegionBuilder.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "llvm/ADT/StringSet.h"

#include <cmath>

namespace mlir::ape {
#define GEN_PASS_DEF_APEEXPAND
#include "passes/Passes.h.inc"
} // namespace mlir::ape

using namespace mlir;
using namespace mlir::ape;

namespace {

/// The body of a rotary q_mod / k_mod:
///   x' = x·cos(t·θ_k) ∓ y·sin(t·θ_k) on the first r = 2·floor(fraction·d_h/2)
///   coordinates (minus for the first of a pair), θ_k = base^(-2k/r); x' = x past r.
void buildRotaryBody(OpBuilder &b, Region &region, RotaryOp rot, Location loc) {
  MLIRContext *ctx = b.getContext();
  Type f32 = Float32Type::get(ctx), idx = IndexType::get(ctx);
  Block *block = createRegionBlock(b, region, {f32, f32, idx, idx, idx}, loc);
  RegionBuilder rb{b, loc};
  Value x = block->getArgument(0), y = block->getArgument(1), c = block->getArgument(2),
        t = block->getArgument(3);
  double fraction = rot.getFraction().convertToDouble();
  bool half = rot.getPairing() == "half";

  // r = 2·floor(fraction·d_h/2) rotated coordinates (r = 0: the identity, as in the kernel
  // template's pairing); the divisor r/2 is kept >= 1 so the index arithmetic stays defined.
  Value dh = rb.toF32(rb.dim("head_dim"));
  Value halfF = b.create<math::FloorOp>(loc, rb.mul(dh, rb.f32(fraction / 2.0)));
  Value halfI = b.create<arith::IndexCastOp>(
      loc, idx, b.create<arith::FPToSIOp>(loc, b.getI64Type(), halfF));
  Value r = rb.imul(halfI, rb.idx(2));
  Value halfR = b.create<arith::MaxUIOp>(loc, halfI, rb.idx(1));
  Value inRotation = rb.ult(c, r);
  Value k = half ? rb.irem(c, halfR) : rb.idiv(c, rb.idx(2));
  Value first = half ? rb.ult(c, halfR)
                     : b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq,
                                               rb.irem(c, rb.idx(2)), rb.idx(0));
  // θ_k = base^(-2k/r): base, k and r are exact, so an fp64 kernel gets θ to fp64 precision.
  Value rF = rb.toF32(r);
  Value kF = rb.toF32(k);
  Value exponent = rb.div(rb.mul(kF, rb.f32(-2.0)), rF);
  Value theta = b.create<math::PowFOp>(loc, rb.f32(rot.getBase().convertToDouble()), exponent);
  Value tF = rb.toF32(t);
  Value angle = rb.mul(tF, theta);
  Value cs = b.create<math::CosOp>(loc, angle);
  Value sn = b.create<math::SinOp>(loc, angle);
  Value minusOne = rb.f32(-1.0);
  Value sign = rb.select(first, minusOne, rb.f32(1.0));
  Value xc = rb.mul(x, cs);
  Value ys = rb.mul(rb.mul(sign, y), sn);
  Value rotated = rb.add(xc, ys);
  rb.yield(rb.select(inRotation, rotated, x));
}

template <typename ModOp>
void expandRotaryInto(OpBuilder &b, RotaryOp rot) {
  auto mod = b.create<ModOp>(rot.getLoc(), rot.getPairingAttr(), rot.getFractionAttr(),
                             /*plans=*/nullptr);
  OpBuilder::InsertionGuard guard(b);
  buildRotaryBody(b, mod.getBody(), rot, rot.getLoc());
}

/// s' = s + g(i, j) in a new score_mod; `bias` builds g from (b, h, i, j).
template <typename Fn>
void buildScoreMod(OpBuilder &b, Location loc, Fn bias) {
  auto mod = b.create<ScoreModOp>(loc, /*plans=*/nullptr);
  OpBuilder::InsertionGuard guard(b);
  MLIRContext *ctx = b.getContext();
  Type f32 = Float32Type::get(ctx), idx = IndexType::get(ctx);
  Block *block = createRegionBlock(b, mod.getBody(), {f32, idx, idx, idx, idx}, loc);
  RegionBuilder rb{b, loc};
  Value s = block->getArgument(0);
  Value g = bias(rb, block->getArgument(1), block->getArgument(2), block->getArgument(3),
                 block->getArgument(4));
  rb.yield(rb.add(s, g));
}

void expandAlibi(OpBuilder &b, AlibiOp op) {
  Location loc = op.getLoc();
  auto slopes = b.create<ParamOp>(loc, ParamType::get(b.getContext()),
                                  b.getStringAttr("alibi_slopes"), b.getStrArrayAttr({"heads"}),
                                  b.getStringAttr("alibi_slopes"),
                                  op.getLearned() ? b.getUnitAttr() : nullptr);
  // B_ij = -m_h·(i - j)
  buildScoreMod(b, loc, [&](RegionBuilder &rb, Value, Value h, Value i, Value j) {
    Value m = rb.load(slopes, {h});
    return rb.neg(rb.mul(m, rb.toF32(rb.isub(i, j))));
  });
}

void expandCable(OpBuilder &b, CableOp op) {
  Location loc = op.getLoc();
  MLIRContext *ctx = b.getContext();
  auto tokens = TokensType::get(ctx);
  auto feature = b.create<TokenFeatureOp>(loc, tokens, b.getStringAttr("cable"),
                                          op.getWeightStdAttr(), b.getF64FloatAttr(0.0));
  // b_t = -softplus(f_t)
  auto map = b.create<MapOp>(loc, tokens, feature.getResult());
  {
    OpBuilder::InsertionGuard guard(b);
    Block *block = createRegionBlock(b, map.getBody(), {Float32Type::get(ctx)}, loc);
    RegionBuilder rb{b, loc};
    rb.yield(rb.neg(rb.softplus(block->getArgument(0))));
  }
  // S_t = Σ_{u<=t} b_u
  auto scan = b.create<ScanOp>(loc, tokens, map.getResult());
  bool kernel = op.getKernel() == "log1p_sq";
  buildScoreMod(b, loc, [&](RegionBuilder &rb, Value bb, Value h, Value i, Value j) {
    Value si = rb.load(scan, {bb, h, i});
    Value sj = rb.load(scan, {bb, h, j});
    Value d = rb.sub(si, sj);
    // Cable: B = S_i - S_j;  K-Cable: B = -log(1 + (S_i - S_j)^2)
    return kernel ? rb.neg(rb.log1p(rb.mul(d, d))) : d;
  });
  if (auto kappa = op.getKappaAttr())
    op->getParentOfType<EncodingOp>().setScaleAttr(kappa);
}

/// Components expanded twice (two ape.alibi, say) would declare the same
/// param or feature name; later ones get a numeric suffix: "alibi_slopes_1".
void uniquifyNames(EncodingOp enc) {
  llvm::StringSet<> seen;
  auto unique = [&](Operation *op) {
    auto name = op->getAttrOfType<StringAttr>("name");
    std::string candidate = name.getValue().str();
    for (unsigned k = 1; seen.contains(candidate); ++k)
      candidate = (name.getValue() + "_" + std::to_string(k)).str();
    seen.insert(candidate);
    if (candidate != name.getValue())
      op->setAttr("name", StringAttr::get(op->getContext(), candidate));
  };
  for (Operation &op : enc.getBody().front())
    if (isa<ParamOp>(op))
      unique(&op);
  seen.clear();
  for (Operation &op : enc.getBody().front())
    if (isa<TokenFeatureOp>(op))
      unique(&op);
}

struct ApeExpandPass : public mlir::ape::impl::ApeExpandBase<ApeExpandPass> {
  void runOnOperation() override {
    SmallVector<Operation *> named;
    getOperation().walk([&](Operation *op) {
      if (isa<RotaryOp, AlibiOp, CableOp>(op))
        named.push_back(op);
    });
    for (Operation *op : named) {
      OpBuilder b(op);
      if (auto rot = dyn_cast<RotaryOp>(op)) {
        expandRotaryInto<QModOp>(b, rot);
        expandRotaryInto<KModOp>(b, rot);
      } else if (auto alibi = dyn_cast<AlibiOp>(op)) {
        expandAlibi(b, alibi);
      } else if (auto cable = dyn_cast<CableOp>(op)) {
        expandCable(b, cable);
      }
      op->erase();
    }
    for (EncodingOp enc : getOperation().getOps<EncodingOp>())
      uniquifyNames(enc);
  }
};

} // namespace
