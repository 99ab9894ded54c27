//===- Schedule.cpp - passes over K/V and tile sizes ----------------------===//
//
// Every component this version knows (q/k mods and score mods) leaves the
// softmax untouched, so one pass over K/V with online softmax suffices; a
// post-softmax prob_mod would need the row log-sum-exp first (two passes).
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

namespace mlir::ape {
#define GEN_PASS_DEF_APESCHEDULE
#include "passes/Passes.h.inc"
} // namespace mlir::ape

using namespace mlir;
using namespace mlir::ape;

namespace {
struct ApeSchedulePass : public mlir::ape::impl::ApeScheduleBase<ApeSchedulePass> {
  using ApeScheduleBase::ApeScheduleBase;
  void runOnOperation() override {
    if (tileQ <= 0 || tileK <= 0) {
      getOperation().emitError("ape-schedule: tile sizes must be positive");
      return signalPassFailure();
    }
    getOperation().walk([&](KernelOp kernel) {
      Builder b(kernel);
      kernel.setPassesAttr(b.getI64IntegerAttr(1));
      kernel.setTileQAttr(b.getI64IntegerAttr(tileQ));
      kernel.setTileKAttr(b.getI64IntegerAttr(tileK));
    });
  }
};
} // namespace
