//===- ape-opt.cpp - the ape optimizer driver -----------------------------===//
//
// MlirOptMain with the ape, arith and math dialects and every ape pass: the
// tool lit tests drive (`ape-opt --ape-expand file.mlir`).
//
//===----------------------------------------------------------------------===//
#include "dialect/ApeDialect.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<mlir::ape::ApeDialect, mlir::arith::ArithDialect, mlir::math::MathDialect>();
  mlir::ape::registerApePasses();
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  mlir::PassPipelineRegistration<>(
      "ape-lower", "The whole lowering: expand, push-override, fuse, differentiate, schedule",
      [](mlir::OpPassManager &pm) { mlir::ape::buildApeLoweringPipeline(pm); });
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "APE optimizer driver\n", registry));
}
