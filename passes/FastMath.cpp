//===- FastMath.cpp - approximable arithmetic of fast_math encodings ------===//
//
// An encoding marked `fast_math` lets the CUDA kernels compute the exponentials, logarithms and
// divisions of its score mods with the GPU's approximate instructions. Only the score mods: they
// run at every element of the T x T scores (and again in the backward), each result lands in one
// logit, and an error there of ~1e-7 absolute is far below the bf16 rounding of q·k. The token
// program and the q/k mods run T or T·D times, cost little, and feed scans where errors would add
// up: they stay exact. So do the ops whose value reaches a comparison or a rounding to an integer.
// The mark becomes the standard fast-math flags on the ops themselves (afn, arcp), so that it
// survives fusion (ops are cloned with their attributes) and differentiation (-ape-differentiate
// copies a primal op's flags to the ops of its derivative), and the emitters decide per op.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"

namespace mlir::ape {
#define GEN_PASS_DEF_APEFASTMATH
#include "passes/Passes.h.inc"
} // namespace mlir::ape

using namespace mlir;
using namespace mlir::ape;

void mlir::ape::addFastMathFlags(Operation *op, arith::FastMathFlags flags) {
  auto fm = dyn_cast<arith::ArithFastMathInterface>(op);
  if (!fm || flags == arith::FastMathFlags::none)
    return;
  arith::FastMathFlagsAttr have = fm.getFastMathFlagsAttr();
  arith::FastMathFlags merged = (have ? have.getValue() : arith::FastMathFlags::none) | flags;
  op->setAttr(fm.getFastMathAttrName(), arith::FastMathFlagsAttr::get(op->getContext(), merged));
}

arith::FastMathFlags mlir::ape::fastMathFlags(Operation *op) {
  auto fm = dyn_cast<arith::ArithFastMathInterface>(op);
  arith::FastMathFlagsAttr attr = fm ? fm.getFastMathFlagsAttr() : arith::FastMathFlagsAttr();
  return attr ? attr.getValue() : arith::FastMathFlags::none;
}

namespace {

/// The ops of a score mod's body that may be approximated: all but those whose value reaches a
/// discrete decision (a comparison, a rounding to an integer: T5's bucket floor(log(n/16)·...)),
/// where an approximation could move a boundary and change the result by a whole step, and, with
/// `exactYield`, those the yielded value depends on (a later score mod decides on it: its `%s`).
/// `sDecides` says whether this mod's own `%s` (the value an earlier mod yielded) reaches a
/// decision or, with `exactYield`, the yield.
SmallVector<Operation *> approximable(Block &body, bool exactYield, bool &sDecides) {
  DenseSet<Operation *> exact;
  SmallVector<Value> work;
  for (Operation &op : body)
    if (isa<arith::CmpFOp, arith::FPToSIOp, arith::FPToUIOp, math::FloorOp, math::CeilOp,
            math::RoundOp, math::RoundEvenOp, math::TruncOp>(op))
      work.append(op.operand_begin(), op.operand_end());
  if (exactYield)
    work.append(body.getTerminator()->operand_begin(), body.getTerminator()->operand_end());
  sDecides = false;
  while (!work.empty()) {
    Value v = work.pop_back_val();
    if (v == body.getArgument(0)) sDecides = true;
    Operation *def = v.getDefiningOp();
    if (def && def->getBlock() == &body && exact.insert(def).second)
      work.append(def->operand_begin(), def->operand_end());
  }
  SmallVector<Operation *> out;
  for (Operation &op : body)
    if (!exact.contains(&op))
      out.push_back(&op);
  return out;
}

struct ApeFastMathPass : public mlir::ape::impl::ApeFastMathBase<ApeFastMathPass> {
  void runOnOperation() override {
    if (failed(checkTopLevel(getOperation())))
      return signalPassFailure();
    auto walked = getOperation().walk([&](EncodingOp encoding) -> WalkResult {
      if (!encoding.getFastMath())
        return WalkResult::advance();
      // A named component's score mod does not exist yet: it would stay exact without a word.
      for (Operation &op : encoding.getBody().front())
        if (isa<ExpandableComponent, OverrideOp>(op)) {
          op.emitOpError("is a named component: run -ape-expand and -ape-push-override before "
                         "-ape-fast-math");
          return WalkResult::interrupt();
        }
      // Last to first: a mod whose %s reaches a decision needs the value the mods before it
      // yield exact (fused, a later mod's comparison reads an earlier mod's approximate exp).
      SmallVector<ScoreModOp> mods;
      encoding.getBody().walk([&](ScoreModOp score) { mods.push_back(score); });
      bool exactYield = false;
      for (ScoreModOp score : llvm::reverse(mods)) {
        bool sDecides = false;
        for (Operation *op : approximable(score.getBody().front(), exactYield, sDecides))
          addFastMathFlags(op, arith::FastMathFlags::afn | arith::FastMathFlags::arcp);
        exactYield = sDecides;
      }
      return WalkResult::advance();
    });
    if (walked.wasInterrupted())
      signalPassFailure();
  }
};
} // namespace
