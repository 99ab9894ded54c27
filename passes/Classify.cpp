//===- Classify.cpp - the facts that choose each kernel's fast paths ------===//
//
// Records on every ape.kernel what analysis/KernelFacts.h finds in its regions, so the
// decisions the emitters make are visible in the IR (ape-opt, apec --print-ir) and tested by lit
// on it. Each attribute is set when the fact holds and removed when it does not, so the pass may
// run again after any change to the kernel.
//
//===----------------------------------------------------------------------===//
#include "analysis/KernelFacts.h"
#include "passes/Passes.h"

namespace mlir::ape {
#define GEN_PASS_DEF_APECLASSIFY
#include "passes/Passes.h.inc"
} // namespace mlir::ape

using namespace mlir;
using namespace mlir::ape;

namespace {
struct ApeClassifyPass : public mlir::ape::impl::ApeClassifyBase<ApeClassifyPass> {
  void runOnOperation() override {
    if (failed(checkTopLevel(getOperation())))
      return signalPassFailure();
    getOperation().walk([&](KernelOp kernel) {
      Builder b(kernel);
      Operation *qmod = nullptr, *kmod = nullptr;
      bool tokensReadLength = false;
      for (Operation &op : kernel.getBody().front()) {
        if (isa<QModOp>(op))
          qmod = &op;
        else if (isa<KModOp>(op))
          kmod = &op;
        else if (isa<TokenFeatureOp, MapOp, ScanOp>(op))
          tokensReadLength |= readsSequenceLength(&op);
      }
      auto flag = [&](StringRef name, bool set) {
        if (set)
          kernel->setAttr(name, b.getUnitAttr());
        else
          kernel->removeAttr(name);
      };
      flag(kernel.getQModLinearAttrName(), isLinearMod(qmod));
      flag(kernel.getKModLinearAttrName(), isLinearMod(kmod));
      flag(kernel.getKModReadsLengthAttrName(), readsSequenceLength(kmod));
      flag(kernel.getTokensReadLengthAttrName(), tokensReadLength);
      if (std::optional<StringRef> bias = scoreBiasKind(kernel))
        kernel.setScoreBiasAttr(b.getStringAttr(*bias));
      else
        kernel.removeScoreBiasAttr();
    });
  }
};
} // namespace
