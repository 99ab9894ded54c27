//===- Pipeline.cpp - the whole lowering, spec to scheduled kernel --------===//
#include "passes/Passes.h"

#include "dialect/RegionTypes.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;
using namespace mlir::ape;

mlir::LogicalResult mlir::ape::checkTopLevel(ModuleOp module) {
  WalkResult nested = module.walk([&](Operation *op) {
    if (!isa<EncodingOp, KernelOp>(op) || op->getParentOp() == module.getOperation())
      return WalkResult::advance();
    op->emitOpError("is not at the top level of the file (it is inside a nested module): the ape "
                    "passes and apec take the file's top-level encodings only");
    return WalkResult::interrupt();
  });
  if (nested.wasInterrupted())
    return failure();
  WalkResult types = module.walk([&](Operation *op) {
    if (isa_and_nonnull<arith::ArithDialect, math::MathDialect>(op->getDialect()) && failed(checkRegionTypes(op)))
      return WalkResult::interrupt();
    return WalkResult::advance();
  });
  return failure(types.wasInterrupted());
}

void mlir::ape::buildApeLoweringPipeline(OpPassManager &pm, const ApeScheduleOptions &schedule) {
  pm.addPass(createApeExpand());
  pm.addPass(createApePushOverride());
  pm.addPass(createApeFastMath());
  pm.addPass(createApeFuse());
  pm.addPass(createApeExactFold());  // before the canonicalizer folds them in f32
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  pm.addPass(createApeDifferentiate());
  pm.addPass(createApeSchedule(schedule));
  pm.addPass(createApeClassify());
}
