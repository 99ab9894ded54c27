//===- Fuse.cpp - compose all components into one ape.kernel --------------===//
//
// After expansion an encoding is a token program plus any number of q_mods,
// k_mods and score_mods. The kernel evaluates one of each, so they compose:
//   q_mod:     q' = f_n(... f_2(f_1(x, y)) ...)   (mods after the first are unpaired)
//   score_mod: s' = g_n(... g_2(g_1(s)) ...)
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/RegionBuilder.h"

#include "mlir/IR/IRMapping.h"

namespace mlir::ape {
#define GEN_PASS_DEF_APEFUSE
#include "passes/Passes.h.inc"
} // namespace mlir::ape

using namespace mlir;
using namespace mlir::ape;

namespace {

/// Clones the body of `region` at the builder's point with its block
/// arguments replaced by `args`; returns the values its ape.yield yields.
SmallVector<Value> inlineBody(OpBuilder &b, Region &region, ValueRange args) {
  Block &block = region.front();
  IRMapping map;
  map.map(block.getArguments(), args);
  for (Operation &op : block.without_terminator())
    b.clone(op, map);
  SmallVector<Value> out;
  for (Value v : block.getTerminator()->getOperands())
    out.push_back(map.lookupOrDefault(v));
  return out;
}

/// Composes q_mods (or k_mods) in order into one op built at `b`.
template <typename ModOp>
LogicalResult composeQK(OpBuilder &b, MutableArrayRef<ModOp> mods) {
  if (mods.empty())
    return success();
  for (ModOp m : mods.drop_front())
    if (m.getPairing() != "none")
      return m.emitOpError("cannot follow another ")
             << m->getName().stripDialect()
             << ": a paired transform must come first, since later mods see only their own "
                "coordinate";
  if (mods.size() == 1) {
    mods.front()->moveBefore(b.getInsertionBlock(), b.getInsertionPoint());
    return success();
  }
  ModOp first = mods.front();
  auto fused = b.create<ModOp>(first.getLoc(), first.getPairingAttr(), first.getFractionAttr(),
                               nullptr);
  OpBuilder::InsertionGuard guard(b);
  Block *block = createRegionBlock(b, fused.getBody(),
                                   first.getBody().front().getArgumentTypes(), first.getLoc());
  auto args = block->getArguments();
  Value x = inlineBody(b, first.getBody(), args)[0];
  for (ModOp m : mods.drop_front())  // unpaired: the partner of x is x itself
    x = inlineBody(b, m.getBody(), {x, x, args[2], args[3], args[4]})[0];
  b.create<YieldOp>(first.getLoc(), ValueRange{x});
  for (ModOp m : mods)
    m->erase();
  return success();
}

void composeScore(OpBuilder &b, MutableArrayRef<ScoreModOp> mods) {
  if (mods.empty())
    return;
  if (mods.size() == 1) {
    mods.front()->moveBefore(b.getInsertionBlock(), b.getInsertionPoint());
    return;
  }
  Location loc = mods.front().getLoc();
  auto fused = b.create<ScoreModOp>(loc, nullptr);
  OpBuilder::InsertionGuard guard(b);
  Block *block = createRegionBlock(b, fused.getBody(),
                                   mods.front().getBody().front().getArgumentTypes(), loc);
  auto args = block->getArguments();
  Value s = args[0];
  for (ScoreModOp m : mods)
    s = inlineBody(b, m.getBody(), {s, args[1], args[2], args[3], args[4]})[0];
  b.create<YieldOp>(loc, ValueRange{s});
  for (ScoreModOp m : mods)
    m->erase();
}

LogicalResult fuse(EncodingOp enc) {
  SmallVector<QModOp> qmods;
  SmallVector<KModOp> kmods;
  SmallVector<ScoreModOp> smods;
  for (Operation &op : enc.getBody().front()) {
    if (isa<RotaryOp, AlibiOp, CableOp, OverrideOp>(op))
      return op.emitOpError("is a named component: run -ape-expand and -ape-push-override "
                            "before -ape-fuse");
    if (auto q = dyn_cast<QModOp>(op))
      qmods.push_back(q);
    else if (auto k = dyn_cast<KModOp>(op))
      kmods.push_back(k);
    else if (auto s = dyn_cast<ScoreModOp>(op))
      smods.push_back(s);
  }
  OpBuilder b(enc);
  auto kernel = b.create<KernelOp>(enc.getLoc(), enc.getSymNameAttr(), enc.getScaleAttr(),
                                   b.getBoolAttr(true), nullptr, nullptr, nullptr);
  Block *body = new Block();
  kernel.getBody().push_back(body);
  // The token program (params, features, maps, scans, masked projection) keeps its order.
  for (Operation &op : llvm::make_early_inc_range(enc.getBody().front()))
    if (!isa<QModOp, KModOp, ScoreModOp>(op))
      op.moveBefore(body, body->end());
  b.setInsertionPointToEnd(body);
  if (failed(composeQK<QModOp>(b, qmods)) || failed(composeQK<KModOp>(b, kmods)))
    return failure();
  composeScore(b, smods);
  enc->erase();
  return success();
}

struct ApeFusePass : public mlir::ape::impl::ApeFuseBase<ApeFusePass> {
  void runOnOperation() override {
    SmallVector<EncodingOp> encodings(getOperation().getOps<EncodingOp>());
    for (EncodingOp enc : encodings)
      if (failed(fuse(enc)))
        return signalPassFailure();
  }
};

} // namespace
