//===- PushOverride.cpp - override through the linear projection ----------===//
//
// ExPE / ExQPE overwrite the first l inputs of the projections by position
// values σ·p_n. Because the projection is linear,
//   W·override(x, σp_n) = W[:, l:]·x[l:] + σ·W[:, :l]·p_n,
// and W[:, :l]·p_n has a closed form in n:
//   ExPE,  p_{n,i} = S + θ(n + i):   a + n·b,
//          a = W[:, :l]·(S + θ·i)_i,  b = θ·W[:, :l]·1;
//   ExQPE, p_{n,j} = S + jθ1 + θ2·(floor(n/l) + [j <= n mod l]):
//          a + floor(n/l)·b + P[n mod l],
//          a = W[:, :l]·(S + jθ1)_j,  b = θ2·W[:, :l]·1,  P[r] = θ2·Σ_{j<=r} W[:, j].
// The override becomes a masked projection (no copy of x), params derived
// every step from W (kinds "projection_term" and "projection_prefix"), the
// fixed scalar σ ("position_scale", 1 unless an evaluation changes it) and an
// additive q_mod / k_mod. With targets "qkv" the value projection reads the
// overridden input itself (the masked projection records how to build it).
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "dialect/RegionBuilder.h"

namespace mlir::ape {
#define GEN_PASS_DEF_APEPUSHOVERRIDE
#include "passes/Passes.h.inc"
} // namespace mlir::ape

using namespace mlir;
using namespace mlir::ape;

namespace {

/// A [heads, head_dim] param computed by the runtime as W[:, :columns]·u,
/// u_i = start + step·i, with W the weight of `projection`.
ParamOp projectionTerm(OpBuilder &b, Location loc, StringRef name, abi::Projection projection,
                       int64_t columns, double start, double step) {
  ParamOp p = createParam(b, loc, name, {"heads", "head_dim"}, abi::InitKind::ProjectionTerm,
                          /*trainable=*/true);
  p.setProjectionAttr(b.getStringAttr(abi::name(projection)));
  p.setColumnsAttr(b.getI64IntegerAttr(columns));
  p.setStartAttr(b.getF64FloatAttr(start));
  p.setStepAttr(b.getF64FloatAttr(step));
  return p;
}

/// A [columns, heads, head_dim] param computed by the runtime as
/// P[r] = scale·Σ_{j<=r} W[:, j] with W the weight of `projection`.
ParamOp projectionPrefix(OpBuilder &b, Location loc, StringRef name, abi::Projection projection,
                         int64_t columns, double scale) {
  std::string rows = std::to_string(columns);
  ParamOp p = createParam(b, loc, name, {rows, "heads", "head_dim"},
                          abi::InitKind::ProjectionPrefix, /*trainable=*/true);
  p.setProjectionAttr(b.getStringAttr(abi::name(projection)));
  p.setColumnsAttr(b.getI64IntegerAttr(columns));
  p.setScaleAttr(b.getF64FloatAttr(scale));
  return p;
}

template <typename ModOp>
void pushInto(OpBuilder &b, OverrideOp op, abi::Projection target, ParamOp sigma) {
  Location loc = op.getLoc();
  int64_t l = op.getL();
  double start = op.getStart().convertToDouble();
  bool counter = op.getKind() == abi::OverrideKind::Exqpe;
  std::string prefix = "override_" + std::string(abi::name(target)) + "_";
  ParamOp a, slope, prefixTable;
  if (!counter) {
    double theta = op.getTheta().convertToDouble();
    // a = W[:, :l]·(S + θ·i)_i ;  b = W[:, :l]·(θ)_i
    a = projectionTerm(b, loc, prefix + "a", target, l, start, theta);
    slope = projectionTerm(b, loc, prefix + "b", target, l, theta, 0.0);
  } else {
    double theta1 = op.getTheta1().convertToDouble(), theta2 = op.getTheta2().convertToDouble();
    // a = W[:, :l]·(S + jθ1)_j ;  b = W[:, :l]·(θ2)_j ;  P[r] = θ2·Σ_{j<=r} W[:, j]
    a = projectionTerm(b, loc, prefix + "a", target, l, start, theta1);
    slope = projectionTerm(b, loc, prefix + "b", target, l, theta2, 0.0);
    prefixTable = projectionPrefix(b, loc, prefix + "p", target, l, theta2);
  }
  auto mod = b.create<ModOp>(loc, b.getStringAttr(abi::name(abi::Pairing::None)),
                             b.getF64FloatAttr(1.0));
  OpBuilder::InsertionGuard guard(b);
  MLIRContext *ctx = b.getContext();
  Type f32 = Float32Type::get(ctx), idx = IndexType::get(ctx);
  Block *block = createRegionBlock(b, mod.getBody(), {f32, f32, idx, idx, idx}, loc);
  RegionBuilder rb{b, loc};
  Value x = block->getArgument(0), c = block->getArgument(2), t = block->getArgument(3),
        h = block->getArgument(4);
  // Statements in evaluation order, so the region reads top to bottom like the formula.
  Value av = rb.load(a, {h, c});
  Value tf = counter ? rb.toF32(rb.idiv(t, rb.idx(l))) : rb.toF32(t);  // floor(t/l) or t
  Value bv = rb.load(slope, {h, c});
  Value term = rb.add(av, rb.mul(tf, bv));  // a[h, c] + (t or floor(t/l))·b[h, c]
  if (counter) {  // + P[t mod l, h, c]
    Value residue = rb.irem(t, rb.idx(l));
    Value pv = rb.load(prefixTable, {residue, h, c});
    term = rb.add(term, pv);
  }
  // x' = x + σ·term
  Value s = rb.load(sigma, {rb.idx(0)});
  rb.yield(rb.add(x, rb.mul(s, term)));
}

struct ApePushOverridePass : public mlir::ape::impl::ApePushOverrideBase<ApePushOverridePass> {
  void runOnOperation() override {
    if (failed(checkTopLevel(getOperation())))
      return signalPassFailure();
    SmallVector<OverrideOp> overrides;
    getOperation().walk([&](OverrideOp op) { overrides.push_back(op); });
    for (OverrideOp op : overrides) {
      // The override acts on the projection input: its terms go first, before any
      // q/k transform (R(q + σ(a + n·b)), not R(q) + σ(a + n·b)).
      OpBuilder b(op->getContext());
      b.setInsertionPointToStart(op->getBlock());
      ParamOp sigma = createParam(b, op.getLoc(), "position_scale", {"1"},
                                  abi::InitKind::Constant, /*trainable=*/false);
      sigma.setValueAttr(b.getF64FloatAttr(1.0));
      setValueRange(sigma, ape_rules::kPositionScale);
      b.create<MaskedProjectionOp>(op.getLoc(), op.getLAttr(), op.getTargetsAttr(),
                                   op.getKindAttr(), op.getStartAttr(), op.getThetaAttr(),
                                   op.getTheta1Attr(), op.getTheta2Attr(),
                                   b.getStringAttr("position_scale"));
      pushInto<QModOp>(b, op, abi::Projection::Q, sigma);
      pushInto<KModOp>(b, op, abi::Projection::K, sigma);
      op->erase();
    }
  }
};

} // namespace
