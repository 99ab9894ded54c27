//===- apec_fuzzer.cpp - libFuzzer target: apec's whole path --------------===//
//
// One input is one spec. It takes apec's path (tools/SpecDriver.h): the nesting check, parse
// and verify, the lowering pipeline (expand, push-override, fuse, canonicalize, CSE,
// differentiate, schedule, with the verifier after every pass), then every emitter, into
// memory: CPU C++, the manifest, the kernel IR, the PyTorch operator library, the C ABI
// library and the CUDA header, entry and one instantiation.
//
// Besides crashes and sanitizer reports (ASan, UBSan), four silent failures abort:
//   - a stage fails without an error diagnostic (bad input must get a clear error);
//   - an emitter fails after a successful lowering without one;
//   - the manifest is not valid JSON, or
//   - the runtime's own reader (runtime/Manifest.cpp) refuses it: apec wrote what no runtime loads.
//
// Work per input is bounded (see kMaxHiddenUnits) so that a legitimately large spec is not
// reported as a hang: bench/compile_time.sh measures large specs instead.
//
//===----------------------------------------------------------------------===//
#include "codegen/Emitters.h"
#include "dialect/ApeOps.h"
#include "fuzz/manifest_check.h"
#include "tools/SpecDriver.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>

using namespace mlir;

namespace {

/// FIRE hidden units and named components per input, summed: beyond these a spec only grows
/// the same code (compile time is linear in them), so it is skipped, not lowered.
constexpr int64_t kMaxHiddenUnits = 1024;
constexpr int64_t kMaxComponents = 64;

[[noreturn]] void silentFailure(const char *what) {
  std::fprintf(stderr, "apec_fuzzer: %s without an error diagnostic\n", what);
  std::abort();
}

bool withinBudget(ModuleOp module) {
  int64_t hidden = 0, components = 0;
  module.walk([&](Operation *op) {
    if (auto fire = dyn_cast<ape::FireOp>(op))
      hidden += fire.getHidden();
    if (op->getParentOfType<ape::EncodingOp>() && op->getParentOp() &&
        isa<ape::EncodingOp>(op->getParentOp()))
      ++components;
  });
  return hidden <= kMaxHiddenUnits && components <= kMaxComponents;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  DialectRegistry registry;
  ape::registerSpecDialects(registry);
  MLIRContext context(registry, MLIRContext::Threading::DISABLED);
  context.loadAllAvailableDialects();
  unsigned errors = 0;
  ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
    if (diag.getSeverity() == DiagnosticSeverity::Error)
      ++errors;
    return success();  // swallowed: the fuzzer only counts them
  });

  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(
      llvm::MemoryBuffer::getMemBufferCopy(
          llvm::StringRef(reinterpret_cast<const char *>(data), size), "fuzz.mlir"),
      llvm::SMLoc());
  OwningOpRef<ModuleOp> module = ape::parseSpec(sourceMgr, &context);
  if (!module) {
    if (errors == 0)
      silentFailure("parseSpec failed");
    return 0;
  }
  if (!withinBudget(*module))
    return 0;
  PassManager pm(&context);
  if (failed(ape::lowerSpec(*module, pm))) {
    if (errors == 0)
      silentFailure("the lowering failed");
    return 0;
  }

  for (ape::KernelOp kernel : module->getOps<ape::KernelOp>()) {
    std::string text;
    llvm::raw_string_ostream os(text);
    auto check = [&](LogicalResult result, const char *what) {
      if (failed(result) && errors == 0)
        silentFailure(what);
      return succeeded(result);
    };
    check(ape::emitCpuKernel(kernel, "fuzz.mlir", os), "emitCpuKernel");
    text.clear();
    if (check(ape::emitManifest(kernel, "fuzz.mlir", os), "emitManifest")) {
      llvm::Expected<llvm::json::Value> json = llvm::json::parse(os.str());
      if (!json) {
        llvm::consumeError(json.takeError());
        std::fprintf(stderr, "apec_fuzzer: the manifest is not valid JSON:\n%s\n", text.c_str());
        std::abort();
      }
      std::string why;
      if (!apeFuzzRuntimeAcceptsManifest(text, &why)) {
        std::fprintf(stderr, "apec_fuzzer: the runtime refuses the manifest apec wrote: %s\n%s\n",
                     why.c_str(), text.c_str());
        std::abort();
      }
    }
    text.clear();
    kernel->print(os);
    std::vector<ape::EmittedFile> files;
    const ape::CudaVariant variant{"f32", 64};
    check(ape::emitTorchLibrary(kernel, "fuzz.mlir", {variant}, files), "emitTorchLibrary");
    files.clear();
    check(ape::emitCAbi(kernel, "fuzz.mlir", files), "emitCAbi");
    text.clear();
    check(ape::emitCudaHeader(kernel, "fuzz.mlir", os), "emitCudaHeader");
    text.clear();
    check(ape::emitCudaEntry(kernel, "fuzz.mlir", {variant}, os), "emitCudaEntry");
    text.clear();
    ape::emitCudaInstantiation(kernel, "fuzz.mlir", variant, os);
  }
  return 0;
}
