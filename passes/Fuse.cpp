//===- Fuse.cpp - compose all components into one ape.kernel --------------===//
//
// After expansion an encoding is a token program plus any number of q_mods,
// k_mods and score_mods. The kernel evaluates one of each, so they compose:
//   q_mod:     q' = f_n(... f_2(f_1(x, y)) ...)   (tracking the partner through unpaired mods)
//   score_mod: s' = g_n(... g_2(g_1(s)) ...)
// The token program and the prob site (ape.attention_transition, which marks the kernel
// inference_only) move over unchanged.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "dialect/RegionBuilder.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/IRMapping.h"

#include <cstdio>
#include <string>

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

/// The coordinate paired with c, as IR over the run-time head_dim: (c, c ± r/2) for "half",
/// (c, c ^ 1) for "interleaved", c itself past r = 2·floor(fraction·d_h/2) — the rule of
/// ape_abi::partner, which the kernel templates call.
Value partnerIndex(RegionBuilder &rb, abi::Pairing pairing, double fraction, Value c) {
  OpBuilder &b = rb.b;
  Location loc = rb.loc;
  Value half = rb.rotatedHalf(fraction);
  Value r = rb.imul(half, rb.idx(2));
  Value partner;
  if (pairing == abi::Pairing::Half) {
    Value up = rb.iadd(c, half);
    Value down = rb.isub(c, half);
    partner = rb.select(rb.ult(c, half), up, down);
  } else {
    partner = b.create<arith::XOrIOp>(loc, c, rb.idx(1));
  }
  return rb.select(rb.ult(c, r), partner, c);
}

/// Composes q_mods (or k_mods) in order into one op built at `b`. With a paired
/// mod among them, the composite tracks the coordinate and its partner:
///   unpaired f: (x, y) -> (f(x, x, c), f(y, y, p))
///   paired g:   (x, y) -> (g(x, y, c), g(y, x, p))      p = partner(c)
template <typename ModOp>
LogicalResult composeQK(OpBuilder &b, MutableArrayRef<ModOp> mods) {
  if (mods.empty())
    return success();
  if (mods.size() == 1) {
    mods.front()->moveBefore(b.getInsertionBlock(), b.getInsertionPoint());
    return success();
  }
  ModOp paired;
  for (ModOp m : mods) {
    if (m.getPairing() == abi::Pairing::None)
      continue;
    if (paired && (paired.getPairing() != m.getPairing() ||
                   paired.getFraction() != m.getFraction()))
    {
      auto how = [](ModOp op) {
        char fraction[32];
        std::snprintf(fraction, sizeof fraction, "%g", op.getFraction().convertToDouble());
        return "pairing \"" + std::string(abi::name(op.getPairing())) + "\", fraction " + fraction;
      };
      InFlightDiagnostic d = m.emitOpError("pairs coordinates differently from an earlier ")
                             << m->getName().stripDialect() << " (" << how(m) << " against "
                             << how(paired)
                             << "): the transforms of one encoding share one pairing and fraction";
      d.attachNote(paired.getLoc())
          << "the earlier " << paired->getName().stripDialect()
          << " (an ape.rotary is one: it expands to a q_mod and a k_mod of its pairing)";
      return d;
    }
    if (!paired)
      paired = m;
  }
  ModOp ref = paired ? paired : mods.front();
  Location loc = ref.getLoc();
  auto fused = b.create<ModOp>(loc, ref.getPairingAttr(), ref.getFractionAttr());
  OpBuilder::InsertionGuard guard(b);
  Block *block = createRegionBlock(b, fused.getBody(),
                                   ref.getBody().front().getArgumentTypes(), loc);
  auto args = block->getArguments();
  Value c = args[2], t = args[3], h = args[4];
  Value x = args[0];
  if (!paired) {  // unpaired mods: the partner of x is x itself
    for (ModOp m : mods)
      x = inlineBody(b, m.getBody(), {x, x, c, t, h})[0];
  } else {
    RegionBuilder rb{b, loc};
    Value p = partnerIndex(rb, paired.getPairing(), paired.getFraction().convertToDouble(), c);
    Value y = args[1];
    for (ModOp m : mods) {
      bool unpaired = m.getPairing() == abi::Pairing::None;
      Value nx = inlineBody(b, m.getBody(), {x, unpaired ? x : y, c, t, h})[0];
      Value ny = inlineBody(b, m.getBody(), {y, unpaired ? y : x, p, t, h})[0];
      x = nx, y = ny;
    }
  }
  b.create<YieldOp>(loc, ValueRange{x});
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
  auto fused = b.create<ScoreModOp>(loc, TypeRange{}, ValueRange{});
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
    if (isa<ExpandableComponent, OverrideOp>(op))
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
  // A post-softmax transition has no derivative: the kernel is inference-only (no backward).
  bool inferenceOnly = !enc.getBody().front().getOps<AttentionTransitionOp>().empty();
  auto kernel = b.create<KernelOp>(enc.getLoc(), enc.getSymNameAttr(), enc.getScaleAttr(),
                                   enc.getHeadDimAttr(), enc.getModelDimAttr(),
                                   b.getBoolAttr(true), /*passes=*/nullptr, /*tile_q=*/nullptr,
                                   /*tile_k=*/nullptr, inferenceOnly ? b.getUnitAttr() : nullptr,
                                   // the facts of -ape-classify, recorded after differentiation
                                   nullptr, nullptr, nullptr, nullptr, nullptr);
  Block *body = new Block();
  kernel.getBody().push_back(body);
  // The token program (params, features, maps, scans, masked projection, position
  // embedding) keeps its order.
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
    if (failed(checkTopLevel(getOperation())))
      return signalPassFailure();
    SmallVector<EncodingOp> encodings(getOperation().getOps<EncodingOp>());
    for (EncodingOp enc : encodings)
      if (failed(fuse(enc)))
        return signalPassFailure();
  }
};

} // namespace
