//===- PushOverride.cpp - override through the linear projection ----------===//
//
// ExPE overwrites the first l inputs of the q/k projections by position
// values p_{n,i} = S + θ(n + i). Because the projection is linear,
//   W·override(x, p_n) = W[:, l:]·x[l:] + W[:, :l]·p_n
//                      = W[:, l:]·x[l:] + a + n·b,
//   a = W[:, :l]·(S + θ·i)_i,  b = θ·W[:, :l]·1.
// The override becomes a masked projection (no copy of x), two params per
// target derived every step from W (kind "projection_term"), and an additive
// q_mod / k_mod: x' = x + a[h, c] + t·b[h, c].
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/RegionBuilder.h"

namespace mlir::ape {
#define GEN_PASS_DEF_APEPUSHOVERRIDE
#include "passes/Passes.h.inc"
} // namespace mlir::ape

using namespace mlir;
using namespace mlir::ape;

namespace {

/// A [heads, head_dim] param computed by the runtime as W[:, :columns]·u,
/// u_i = start + step·i, with W the weight of `projection`.
ParamOp projectionTerm(OpBuilder &b, Location loc, StringRef name, StringRef projection,
                       int64_t columns, double start, double step) {
  auto p = b.create<ParamOp>(loc, ParamType::get(b.getContext()), b.getStringAttr(name),
                             b.getStrArrayAttr({"heads", "head_dim"}),
                             b.getStringAttr("projection_term"), b.getUnitAttr());
  p->setAttr("projection", b.getStringAttr(projection));
  p->setAttr("columns", b.getI64IntegerAttr(columns));
  p->setAttr("start", b.getF64FloatAttr(start));
  p->setAttr("step", b.getF64FloatAttr(step));
  return p;
}

template <typename ModOp>
void pushInto(OpBuilder &b, OverrideOp op, StringRef target) {
  Location loc = op.getLoc();
  int64_t l = op.getL();
  double start = op.getStart().convertToDouble(), theta = op.getTheta().convertToDouble();
  std::string prefix = ("override_" + target + "_").str();
  // a = W[:, :l]·(S + θ·i)_i ;  b = W[:, :l]·(θ)_i
  ParamOp a = projectionTerm(b, loc, prefix + "a", target, l, start, theta);
  ParamOp slope = projectionTerm(b, loc, prefix + "b", target, l, theta, 0.0);
  auto mod = b.create<ModOp>(loc, b.getStringAttr("none"), b.getF64FloatAttr(1.0), nullptr);
  OpBuilder::InsertionGuard guard(b);
  MLIRContext *ctx = b.getContext();
  Type f32 = Float32Type::get(ctx), idx = IndexType::get(ctx);
  Block *block = createRegionBlock(b, mod.getBody(), {f32, f32, idx, idx, idx}, loc);
  RegionBuilder rb{b, loc};
  Value x = block->getArgument(0), c = block->getArgument(2), t = block->getArgument(3),
        h = block->getArgument(4);
  // x' = x + a[h, c] + t·b[h, c]
  Value av = rb.load(a, {h, c});
  Value tf = rb.toF32(t);
  Value bv = rb.load(slope, {h, c});
  Value term = rb.add(av, rb.mul(tf, bv));
  rb.yield(rb.add(x, term));
}

struct ApePushOverridePass : public mlir::ape::impl::ApePushOverrideBase<ApePushOverridePass> {
  void runOnOperation() override {
    SmallVector<OverrideOp> overrides;
    getOperation().walk([&](OverrideOp op) { overrides.push_back(op); });
    for (OverrideOp op : overrides) {
      // The override acts on the projection input: its terms go first, before any
      // q/k transform (R(q + a + n·b), not R(q) + a + n·b).
      OpBuilder b(op->getContext());
      b.setInsertionPointToStart(op->getBlock());
      b.create<MaskedProjectionOp>(op.getLoc(), op.getLAttr(), op.getTargetsAttr());
      pushInto<QModOp>(b, op, "q");
      pushInto<KModOp>(b, op, "k");
      op->erase();
    }
  }
};

} // namespace
