//===- apec.cpp - the APE compiler ----------------------------------------===//
//
//   apec SPEC.mlir -o OUTDIR [--emit=cpu,manifest,kernel-mlir,reference,torch-library,c-abi,cuda,cuda-package]
//
// Parses and verifies the spec, lowers every ape.encoding in it through the
// whole pipeline (expand, push-override, fuse, differentiate, schedule) and
// writes, per encoding NAME:
//   OUTDIR/NAME_cpu.cpp         the fused CPU kernel (Enc functor + instantiations)
//   OUTDIR/NAME.manifest.json   inputs, params, features, projection, schedule
//   OUTDIR/NAME.kernel.mlir     the lowered ape.kernel (for reading and lit)
// and on request:
//   --emit=reference      OUTDIR/NAME.reference.json: the encoding's regions as data, taken
//                         after expand and push-override, before fuse (ape-check's reference;
//                         docs/ape-check.md)
// and (docs/cuda.md):
//   --emit=cuda           OUTDIR/NAME_cuda.cuh, NAME_cuda.cu and one
//                         NAME_cuda_<dtype>_hd<D>.cu per --cuda-dtypes x --cuda-head-dims
//   --emit=cuda-package   a self-contained CUDA package in OUTDIR (run once per spec
//                         into the same OUTDIR): the same files under OUTDIR/kernels/ with
//                         the manifest, the templates, a CMakeLists.txt (nvcc, no MLIR)
// and folders that build without MLIR or the APE runtime (docs/frameworks.md):
//   --emit=torch-library  OUTDIR/NAME_torch_library/: PyTorch operators ape_NAME::attention
//                         (autograd) + raw forward/backward on the CPU kernel and the CUDA
//                         kernels of --cuda-dtypes x --cuda-head-dims, CMakeLists.txt, ape_NAME.py
//   --emit=c-abi          OUTDIR/NAME_c_abi/: ape_NAME.h (plain-pointer forward/backward,
//                         status codes) and its library, CMakeLists.txt
// MLIR's pass-manager options work too (--mlir-print-ir-after-all, ...).
//
//===----------------------------------------------------------------------===//
#include "codegen/Emitters.h"
#include "dialect/ApeDialect.h"
#include "passes/Passes.h"
#include "tools/SpecDriver.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/Timing.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"

using namespace mlir;
namespace cl = llvm::cl;

static cl::OptionCategory apecCategory("apec options");
static cl::opt<std::string> inputFile(cl::Positional, cl::desc("<spec.mlir>"), cl::Required,
                                      cl::cat(apecCategory));
static cl::opt<std::string> outDir("o", cl::desc("output folder (created if missing)"),
                                   cl::value_desc("dir"), cl::init("."), cl::cat(apecCategory));
static cl::list<std::string> emit("emit",
                                  cl::desc("what to write (default: cpu,manifest,kernel-mlir)"),
                                  cl::value_desc("cpu|manifest|kernel-mlir|reference|cuda|cuda-package|torch-library|c-abi"), cl::CommaSeparated,
                                  cl::cat(apecCategory));
static cl::list<std::string> cudaDTypes(
    "cuda-dtypes",
    cl::desc("input dtypes of the CUDA variants of --emit=cuda, cuda-package and torch-library "
             "(default: bf16,f16,f32)"),
    cl::value_desc("bf16|f16|f32"), cl::CommaSeparated, cl::cat(apecCategory));
static cl::list<int64_t> cudaHeadDims(
    "cuda-head-dims",
    cl::desc("head dims of the CUDA variants of --emit=cuda, cuda-package and torch-library "
             "(default: 32,64,128)"),
    cl::value_desc("32|64|128"), cl::CommaSeparated, cl::cat(apecCategory));
static cl::opt<std::string> expectName(
    "expect-name",
    cl::desc("fail unless the spec holds exactly one ape.encoding, named this (the build "
             "passes the file stem)"),
    cl::value_desc("name"), cl::cat(apecCategory));
static cl::opt<std::string> sourceName(
    "source-name", cl::desc("spec path recorded in generated files (default: the input path)"),
    cl::cat(apecCategory));

static LogicalResult writeFile(StringRef path, llvm::function_ref<LogicalResult(raw_ostream &)> fn) {
  std::string error;
  auto out = openOutputFile(path, &error);
  if (!out) {
    llvm::errs() << "apec: cannot write " << path << ": " << error << "\n";
    return failure();
  }
  if (failed(fn(out->os())))
    return failure();
  out->keep();
  return success();
}

/// Writes the files `fn` emits into the folder `dir` (created with its subfolders). A file whose
/// contents did not change is left alone, so that re-running apec does not trigger a rebuild.
static LogicalResult writeFolder(
    StringRef dir, llvm::function_ref<LogicalResult(std::vector<ape::EmittedFile> &)> fn) {
  std::vector<ape::EmittedFile> files;
  if (failed(fn(files)))
    return failure();
  for (const ape::EmittedFile &file : files) {
    llvm::SmallString<256> path(dir);
    llvm::sys::path::append(path, file.path);
    if (auto old = llvm::MemoryBuffer::getFile(path); old && (*old)->getBuffer() == file.contents)
      continue;
    if (std::error_code ec =
            llvm::sys::fs::create_directories(llvm::sys::path::parent_path(path))) {
      llvm::errs() << "apec: cannot create " << llvm::sys::path::parent_path(path) << ": "
                   << ec.message() << "\n";
      return failure();
    }
    if (failed(writeFile(path, [&](raw_ostream &os) {
          os << file.contents;
          return success();
        })))
      return failure();
  }
  return success();
}

/// The CUDA variants asked for by --cuda-dtypes x --cuda-head-dims.
static FailureOr<SmallVector<ape::CudaVariant>> cudaVariants() {
  SmallVector<std::string> dtypes(cudaDTypes.begin(), cudaDTypes.end());
  SmallVector<int64_t> dims(cudaHeadDims.begin(), cudaHeadDims.end());
  if (dtypes.empty())
    dtypes = {"bf16", "f16", "f32"};
  if (dims.empty())
    dims = {32, 64, 128};
  SmallVector<ape::CudaVariant> variants;
  for (const std::string &t : dtypes) {
    if (t != "bf16" && t != "f16" && t != "f32") {
      llvm::errs() << "apec: unknown --cuda-dtypes value '" << t << "' (expected bf16, f16, f32)\n";
      return failure();
    }
    for (int64_t d : dims) {
      if (d != 32 && d != 64 && d != 128) {
        llvm::errs() << "apec: --cuda-head-dims " << d << " is not supported (32, 64 or 128)\n";
        return failure();
      }
      variants.push_back({t, d});
    }
  }
  return variants;
}

/// DIR/NAME_cuda.cuh, DIR/NAME_cuda.cu and one DIR/NAME_cuda_<dtype>_hd<D>.cu per variant.
static LogicalResult writeCuda(ape::KernelOp kernel, StringRef source, StringRef dir) {
  FailureOr<SmallVector<ape::CudaVariant>> variants = cudaVariants();
  if (failed(variants))
    return failure();
  if (std::error_code ec = llvm::sys::fs::create_directories(dir)) {
    llvm::errs() << "apec: cannot create " << dir << ": " << ec.message() << "\n";
    return failure();
  }
  llvm::SmallString<256> base(dir);
  llvm::sys::path::append(base, kernel.getSymName() + "_cuda");
  if (failed(writeFile((base + ".cuh").str(), [&](raw_ostream &os) {
        return ape::emitCudaHeader(kernel, source, os);
      })) ||
      failed(writeFile((base + ".cu").str(), [&](raw_ostream &os) {
        return ape::emitCudaEntry(kernel, source, *variants, os);
      })))
    return failure();
  for (const ape::CudaVariant &v : *variants) {
    std::string path = (base + "_" + v.dtype + "_hd" + std::to_string(v.headDim) + ".cu").str();
    if (failed(writeFile(path, [&](raw_ostream &os) {
          ape::emitCudaInstantiation(kernel, source, v, os);
          return success();
        })))
      return failure();
  }
  return success();
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  registerAsmPrinterCLOptions();
  registerMLIRContextCLOptions();
  ape::registerApePasses();  // first, so --mlir-print-ir-after=ape-fuse and friends resolve
  registerPassManagerCLOptions();
  registerDefaultTimingManagerCLOptions();  // --mlir-timing: time per pass
  // --help shows apec's options and MLIR's (--mlir-print-ir-after-all, ...), not the
  // hundreds of LLVM backend flags that libLLVM registers.
  for (auto &[name, option] : cl::getRegisteredOptions()) {
    bool ours = llvm::is_contained(option->Categories, &apecCategory);
    if (!ours && !name.starts_with("mlir-") && name != "help" && name != "version")
      option->setHiddenFlag(cl::Hidden);
  }
  cl::ParseCommandLineOptions(
      argc, argv,
      "apec: compile an APE positional-encoding spec into fused attention kernels\n\n"
      "  apec SPEC.mlir -o OUTDIR [--emit=cpu,manifest,kernel-mlir,reference,torch-library,c-abi,\n"
      "                            cuda,cuda-package]\n\n"
      "For every ape.encoding @NAME in SPEC.mlir writes OUTDIR/NAME_cpu.cpp (the fused CPU\n"
      "kernel), OUTDIR/NAME.manifest.json and OUTDIR/NAME.kernel.mlir (the lowered IR).\n"
      "--emit=torch-library / c-abi write OUTDIR/NAME_torch_library/ (PyTorch operators) and\n"
      "OUTDIR/NAME_c_abi/ (a C header and library), folders that build without MLIR.\n"
      "--emit=reference writes OUTDIR/NAME.reference.json, the encoding's regions as data after\n"
      "expand and push-override (unfused, undifferentiated): ape-check's reference.\n"
      "Errors in the spec are reported as file:line:col and apec exits with status 1.\n");

  llvm::StringSet<> wanted;
  for (const std::string &e : emit) {
    if (e != "cpu" && e != "manifest" && e != "kernel-mlir" && e != "reference" && e != "cuda" &&
        e != "cuda-package" && e != "torch-library" && e != "c-abi") {
      llvm::errs() << "apec: unknown --emit value '" << e
                   << "' (expected cpu, manifest, kernel-mlir, reference, cuda, cuda-package, "
                      "torch-library or c-abi)\n";
      return 1;
    }
    wanted.insert(e);
  }
  if (wanted.empty())
    for (StringRef e : {"cpu", "manifest", "kernel-mlir"})
      wanted.insert(e);

  DialectRegistry registry;
  ape::registerSpecDialects(registry);
  MLIRContext context(registry);
  context.loadAllAvailableDialects();
  context.printOpOnDiagnostic(false);  // the location says where; no op dump

  std::string error;
  auto file = openInputFile(inputFile, &error);
  if (!file) {
    llvm::errs() << "apec: cannot read " << inputFile << ": " << error << "\n";
    return 1;
  }
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(std::move(file), llvm::SMLoc());
  SourceMgrDiagnosticHandler diagnostics(sourceMgr, &context);
  OwningOpRef<ModuleOp> module = ape::parseSpec(sourceMgr, &context);  // nesting, parse, verify
  if (!module)
    return 1;
  if (!expectName.empty()) {
    auto encodings = module->getOps<ape::EncodingOp>();
    if (std::distance(encodings.begin(), encodings.end()) != 1 ||
        (*encodings.begin()).getSymName() != expectName) {
      llvm::errs() << inputFile << ": error: expected exactly one encoding, @" << expectName
                   << " (a spec file's stem must equal its encoding's name)\n";
      return 1;
    }
  }

  std::string source = sourceName.empty() ? inputFile.getValue() : sourceName.getValue();
  // The reference data: a copy of the spec after expand and push-override only.
  llvm::StringMap<std::string> referenceJson;  // by encoding name
  if (wanted.contains("reference")) {
    OwningOpRef<ModuleOp> copy = module->clone();
    PassManager early(&context);
    early.addPass(ape::createApeExpand());
    early.addPass(ape::createApePushOverride());
    if (failed(early.run(*copy)))
      return 1;
    for (ape::EncodingOp enc : copy->getOps<ape::EncodingOp>()) {
      llvm::raw_string_ostream os(referenceJson[enc.getSymName()]);
      if (failed(ape::emitReference(enc, source, os)))
        return 1;
    }
  }

  PassManager pm(&context);
  if (failed(applyPassManagerCLOptions(pm)))
    return 1;
  applyDefaultTimingPassManagerCLOptions(pm);
  if (failed(ape::lowerSpec(*module, pm)))
    return 1;

  if (std::error_code ec = llvm::sys::fs::create_directories(outDir)) {
    llvm::errs() << "apec: cannot create " << outDir << ": " << ec.message() << "\n";
    return 1;
  }
  for (ape::KernelOp kernel : module->getOps<ape::KernelOp>()) {
    llvm::SmallString<256> base(outDir);
    llvm::sys::path::append(base, kernel.getSymName());
    if (wanted.contains("cpu") &&
        failed(writeFile((base + "_cpu.cpp").str(), [&](raw_ostream &os) {
          return ape::emitCpuKernel(kernel, source, os);
        })))
      return 1;
    if (wanted.contains("manifest") &&
        failed(writeFile((base + ".manifest.json").str(), [&](raw_ostream &os) {
          return ape::emitManifest(kernel, source, os);
        })))
      return 1;
    if (wanted.contains("reference") &&
        failed(writeFile((base + ".reference.json").str(), [&](raw_ostream &os) {
          os << referenceJson.lookup(kernel.getSymName());
          return success();
        })))
      return 1;
    if (wanted.contains("cuda") && failed(writeCuda(kernel, source, outDir)))
      return 1;
    if (wanted.contains("cuda-package")) {
      llvm::SmallString<256> kernels(outDir);
      llvm::sys::path::append(kernels, "kernels");
      llvm::SmallString<256> manifest(kernels);
      llvm::sys::path::append(manifest, kernel.getSymName() + ".manifest.json");
      if (failed(ape::writeCudaPackageSupport(outDir)) ||
          failed(writeCuda(kernel, source, kernels)) ||
          failed(writeFile(manifest, [&](raw_ostream &os) {
            return ape::emitManifest(kernel, source, os);
          })))
        return 1;
    }
    if (wanted.contains("torch-library") &&
        failed(writeFolder((base + "_torch_library").str(), [&](auto &files) -> LogicalResult {
          FailureOr<SmallVector<ape::CudaVariant>> variants = cudaVariants();
          if (failed(variants))
            return failure();
          return ape::emitTorchLibrary(kernel, source, *variants, files);
        })))
      return 1;
    if (wanted.contains("c-abi") &&
        failed(writeFolder((base + "_c_abi").str(), [&](auto &files) {
          return ape::emitCAbi(kernel, source, files);
        })))
      return 1;
    if (wanted.contains("kernel-mlir") &&
        failed(writeFile((base + ".kernel.mlir").str(), [&](raw_ostream &os) {
          os << "// Generated by apec from " << source << ". Do not edit.\n";
          kernel->print(os);
          os << "\n";
          return success();
        })))
      return 1;
  }
  return 0;
}
