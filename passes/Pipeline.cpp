//===- Pipeline.cpp - the whole lowering, spec to scheduled kernel --------===//
#include "passes/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"

void mlir::ape::buildApeLoweringPipeline(OpPassManager &pm) {
  pm.addPass(createApeExpand());
  pm.addPass(createApePushOverride());
  pm.addPass(createApeFastMath());
  pm.addPass(createApeFuse());
  pm.addPass(createApeExactFold());  // before the canonicalizer folds them in f32
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  pm.addPass(createApeDifferentiate());
  pm.addPass(createApeSchedule());
  pm.addPass(createApeClassify());
}
