//===- ape-opt.cpp - the ape optimizer driver -----------------------------===//
//
// MlirOptMain with the ape, arith and math dialects and every ape pass: the
// tool lit tests drive (`ape-opt --ape-expand file.mlir`). The input first
// passes apec's checks of the text (tools/SpecDriver.h): UTF-8 (a byte-order
// mark dropped), nesting (MLIR's recursive parser would overflow its stack on
// a file nested thousands of levels deep) and forward references (within each
// chunk under -split-input-file, as MLIR then parses them).
//
//===----------------------------------------------------------------------===//
#include "dialect/ApeDialect.h"
#include "passes/Passes.h"
#include "tools/SpecDriver.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"

namespace {
// ape-lower's options: ape-schedule's tile sizes.
struct LowerOptions : public mlir::PassPipelineOptions<LowerOptions> {
  Option<int64_t> tileQ{*this, "tile-q", llvm::cl::desc("query rows per tile (ape-schedule)"),
                        llvm::cl::init(64)};
  Option<int64_t> tileK{*this, "tile-k", llvm::cl::desc("key columns per tile (ape-schedule)"),
                        llvm::cl::init(64)};
};
} // namespace

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<mlir::ape::ApeDialect, mlir::arith::ArithDialect, mlir::math::MathDialect>();
  mlir::ape::registerApePasses();
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  // (With an options struct of its own: MLIR's option-less pipelines fail on `--ape-lower=x`
  // without a word.)
  mlir::PassPipelineRegistration<LowerOptions>(
      "ape-lower", "The whole lowering: expand, push-override, fast-math, fuse, exact-fold, "
      "canonicalize and CSE, differentiate, schedule, classify (passes/Pipeline.cpp)",
      [](mlir::OpPassManager &pm, const LowerOptions &options) {
        mlir::ape::ApeScheduleOptions schedule;
        schedule.tileQ = options.tileQ;
        schedule.tileK = options.tileK;
        mlir::ape::buildApeLoweringPipeline(pm, schedule);
      });
  auto [input, output] =
      mlir::registerAndParseCLIOptions(argc, argv, "APE optimizer driver\n", registry);
  mlir::MlirOptMainConfig config = mlir::MlirOptMainConfig::createFromCLOptions();
  if (config.shouldShowDialects())  // reads no input
    return mlir::asMainReturnCode(mlir::MlirOptMain(argc, argv, input, output, registry));
  std::string error;
  std::unique_ptr<llvm::MemoryBuffer> file = mlir::openInputFile(input, &error);
  if (!file) {
    llvm::errs() << error << "\n";
    return 1;
  }
  // MLIR bytecode (ape-opt --emit-bytecode) is read as it is; text as apec reads a spec.
  const bool bytecode = file->getBuffer().starts_with("ML\xEFR");
  if (!bytecode)
    file = mlir::ape::withoutByteOrderMark(std::move(file));
  {
    llvm::SourceMgr sourceMgr;  // the check reads a copy: the buffer goes on to MlirOptMain
    sourceMgr.AddNewSourceBuffer(
        llvm::MemoryBuffer::getMemBuffer(file->getBuffer(), file->getBufferIdentifier(), false),
        llvm::SMLoc());
    mlir::MLIRContext context;
    mlir::SourceMgrDiagnosticHandler handler(sourceMgr, &context);
    if ((!bytecode && mlir::failed(mlir::ape::checkUtf8(sourceMgr, &context))) ||
        mlir::failed(mlir::ape::checkNesting(sourceMgr, &context)) ||
        (!bytecode && mlir::failed(mlir::ape::checkFloatLiterals(sourceMgr, &context))) ||
        mlir::failed(mlir::ape::checkForwardReferences(sourceMgr, &context, config.inputSplitMarker())))
      return 1;
  }
  std::unique_ptr<llvm::ToolOutputFile> out = mlir::openOutputFile(output, &error);
  if (!out) {
    llvm::errs() << error << "\n";
    return 1;
  }
  if (mlir::failed(mlir::MlirOptMain(out->os(), std::move(file), registry, config)))
    return 1;
  out->keep();
  return 0;
}
