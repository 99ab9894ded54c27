//===- Schedule.cpp - passes over K/V and tile sizes ----------------------===//
//
// q/k mods and score mods leave the softmax untouched, so one pass over K/V
// with online softmax suffices. The attention transition (the prob site)
// reads the final weights of a row, so its rows take three: the row
// log-sum-exp, then the kept mass and the mask sum, then the output with the
// modified weights (cpu/attention.h, transition_rows).
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
    if (failed(checkTopLevel(getOperation())))
      return signalPassFailure();
    if (tileQ <= 0 || tileK <= 0 || tileQ > kMaxTile || tileK > kMaxTile) {
      getOperation().emitError("ape-schedule: tile sizes must be in [1, ")
          << kMaxTile << "], got tile-q=" << static_cast<int64_t>(tileQ)
          << ", tile-k=" << static_cast<int64_t>(tileK);
      return signalPassFailure();
    }
    getOperation().walk([&](KernelOp kernel) {
      Builder b(kernel);
      bool prob = !kernel.getBody().front().getOps<AttentionTransitionOp>().empty();
      kernel.setPassesAttr(b.getI64IntegerAttr(prob ? 3 : 1));
      kernel.setTileQAttr(b.getI64IntegerAttr(tileQ));
      kernel.setTileKAttr(b.getI64IntegerAttr(tileK));
    });
  }
};
} // namespace
