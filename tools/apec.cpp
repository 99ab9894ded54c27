//===- apec.cpp - the APE compiler ----------------------------------------===//
//
//   apec SPEC.mlir -o OUTDIR [--emit=KIND,...]
//
// Parses and verifies the spec, lowers every ape.encoding in it through the
// whole pipeline (expand, push-override, fuse, differentiate, schedule) and
// writes, per encoding NAME, the files of every --emit KIND asked for (default:
// cpu, manifest, kernel-mlir). The kinds are the emitters registered in
// codegen/EmitterRegistry.cpp; `apec --help` lists them with what each writes.
// MLIR's pass-manager options work too (--mlir-print-ir-after-all, ...).
//
//===----------------------------------------------------------------------===//
#include "codegen/EmitterRegistry.h"
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
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/SourceMgr.h"

#include <cstdio>
#include <cstdlib>

using namespace mlir;
namespace cl = llvm::cl;

static cl::OptionCategory apecCategory("apec options");
static cl::opt<std::string> inputFile(cl::Positional, cl::desc("<spec.mlir>"), cl::Required,
                                      cl::cat(apecCategory));
static cl::opt<std::string> outDir("o", cl::desc("output folder (created if missing; default: the current one)"),
                                   cl::value_desc("dir"), cl::init("."), cl::cat(apecCategory));
static cl::list<std::string> emit("emit", cl::CommaSeparated, cl::cat(apecCategory));
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
static cl::opt<bool> fastMath(
    "fast-math",
    cl::desc("mark every encoding fast_math: the CUDA kernels compute its exp, log, log1p and "
             "divisions with the GPU's approximate instructions (the CPU kernels stay exact)"),
    cl::cat(apecCategory));
static cl::opt<std::string> sourceName(
    "source-name", cl::desc("spec path recorded in generated files (default: the input path)"),
    cl::cat(apecCategory));

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
      // (a value given twice names one variant: two would be emitted twice, and their entry
      // points defined twice)
      if (llvm::none_of(variants, [&](const ape::CudaVariant &v) { return v.dtype == t && v.headDim == d; }))
        variants.push_back({t, d});
    }
  }
  return variants;
}

/// The names of the registered emitters, joined: "a, b or c" (an `or` of "|" for "a|b|c"), or
/// only those written by default ("a,b").
static std::string emitterNames(StringRef separator, StringRef last, unsigned flags = 0) {
  SmallVector<StringRef> names;
  for (const ape::Emitter &e : ape::registeredEmitters())
    if ((e.flags & flags) == flags)
      names.push_back(e.name);
  std::string text;
  for (auto [i, name] : llvm::enumerate(names))
    text += (i == 0 ? "" : i + 1 == names.size() ? last : separator).str() + name.str();
  return text;
}

/// apec's overview for --help: the usage and, per emitter, what it writes.
static std::string overview() {
  size_t width = 0;
  for (const ape::Emitter &e : ape::registeredEmitters())
    width = std::max(width, StringRef(e.name).size());
  std::string text;
  llvm::raw_string_ostream os(text);
  os << "apec: compile an APE positional-encoding spec into fused attention kernels\n\n"
     << "  apec SPEC.mlir [-o OUTDIR] [--emit=KIND,...]     (OUTDIR: default the current folder)\n\n"
     << "For every ape.encoding @NAME in SPEC.mlir writes the files of each --emit KIND (default:\n"
     << emitterNames(",", ",", ape::kEmitByDefault) << "):\n";
  for (const ape::Emitter &e : ape::registeredEmitters()) {
    SmallVector<StringRef> lines;
    StringRef(e.help).split(lines, '\n');
    for (auto [i, line] : llvm::enumerate(lines))
      os << "  " << llvm::left_justify(i == 0 ? e.name : "", width) << "  " << line << "\n";
  }
  os << "Errors in the spec are reported as file:line:col and apec exits with status 1.\n";
  return text;
}

/// The CUDA variants of `kernel`: those of --cuda-dtypes x --cuda-head-dims at its head_dim hint,
/// when it pins one (checkHeadDimHints: the hint is among them), else all of them.
static SmallVector<ape::CudaVariant> variantsOf(ape::KernelOp kernel, ArrayRef<ape::CudaVariant> all) {
  std::optional<uint64_t> hint = kernel.getHeadDim();
  SmallVector<ape::CudaVariant> out;
  for (const ape::CudaVariant &v : all)
    if (!hint || static_cast<int64_t>(*hint) == v.headDim)
      out.push_back(v);
  return out;
}

/// An encoding that pins its head_dim gets CUDA kernels at that head dim only (variantsOf): none
/// when the CUDA kernels have no such head dim (a warning; refused when --cuda-head-dims asked for
/// some), and refused when --cuda-head-dims leaves it out.
static LogicalResult checkHeadDimHints(ModuleOp module) {
  for (ape::EncodingOp encoding : module.getOps<ape::EncodingOp>()) {
    std::optional<uint64_t> hint = encoding.getHeadDim();
    if (!hint)
      continue;
    int64_t h = static_cast<int64_t>(*hint);
    if (h != 32 && h != 64 && h != 128) {
      if (!cudaHeadDims.empty())
        return encoding.emitError("@") << encoding.getSymName() << " pins head_dim " << h
                                       << ", and the CUDA kernels have head dims 32, 64 and 128 only "
                                          "(its CPU kernel takes any: leave out --cuda-head-dims)";
      encoding.emitWarning("@") << encoding.getSymName() << " pins head_dim " << h
                                << ": no CUDA kernels (they have head dims 32, 64 and 128), the CPU kernel only";
      continue;
    }
    if (!cudaHeadDims.empty() && !llvm::is_contained(cudaHeadDims, h)) {
      std::string given;
      for (int64_t d : cudaHeadDims)
        given += (given.empty() ? "" : ",") + std::to_string(d);
      return encoding.emitError("@") << encoding.getSymName() << " pins head_dim " << h
                                     << ", which --cuda-head-dims " << given
                                     << " leaves out (no model of it could use those kernels)";
    }
  }
  return success();
}

/// Creates -o's folder (and its parents).
static LogicalResult createOutDir() {
  if (std::error_code ec = llvm::sys::fs::create_directories(outDir)) {
    llvm::errs() << "apec: cannot create " << outDir << ": " << ec.message() << "\n";
    return failure();
  }
  return success();
}

/// Creates -o's folder, then runs `fn` of every emitter in `wanted` that has one (emitKernel or
/// emitEncoding) on every Op of `module`: op by op, emitter by emitter.
template <class Op>
static LogicalResult runEmitters(ModuleOp module, ArrayRef<const ape::Emitter *> wanted,
                                 LogicalResult (*ape::Emitter::*fn)(Op, const ape::EmitOptions &),
                                 const ape::EmitOptions &options) {
  if (failed(createOutDir()))
    return failure();
  for (Op op : module.getOps<Op>()) {
    ape::EmitOptions opOptions = options;
    SmallVector<ape::CudaVariant> variants;
    if constexpr (std::is_same_v<Op, ape::KernelOp>) {
      variants = variantsOf(op, options.cudaVariants);
      opOptions.cudaVariants = variants;
    }
    for (const ape::Emitter *e : wanted)
      if (e->*fn && failed((e->*fn)(op, opOptions)))
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
  // --emit's values, their help, their validation and their dispatch come from the registry.
  ape::registerAllEmitters();
  std::string emitDesc =
      "what to write (default: " + emitterNames(",", ",", ape::kEmitByDefault) + ")";
  std::string emitValues = emitterNames("|", "|");
  emit.setDescription(emitDesc);
  emit.setValueStr(emitValues);
  cl::ParseCommandLineOptions(argc, argv, overview());
  // LLVM lets a later occurrence of an option replace an earlier one: `-o a -o b` would write to b
  // alone. apec's single-valued options are refused when repeated (the lists accumulate).
  for (auto &[name, option] : cl::getRegisteredOptions())
    if (llvm::is_contained(option->Categories, &apecCategory) &&
        option->getNumOccurrencesFlag() != cl::ZeroOrMore && option->getNumOccurrences() > 1) {
      llvm::errs() << "apec: " << (name.size() == 1 ? "-" : "--") << name << " given "
                   << option->getNumOccurrences() << " times; give it once\n";
      return 1;
    }
  // An empty value is refused, as the runtime's tools refuse it (tools/Cli.h): `-o ''` failed
  // later as "cannot create : ...", `--expect-name ''` checked nothing and `--source-name ''`
  // recorded the input path, each with status 0 or a message that did not name the option.
  for (const auto &[empty, what] : {std::pair<bool, const char *>{inputFile.empty(), "<spec.mlir>"},
                                     {outDir.getNumOccurrences() && outDir.empty(), "-o"},
                                     {expectName.getNumOccurrences() && expectName.empty(), "--expect-name"},
                                     {sourceName.getNumOccurrences() && sourceName.empty(), "--source-name"},
                                     {llvm::is_contained(emit, ""), "--emit"},
                                     {llvm::is_contained(cudaDTypes, ""), "--cuda-dtypes"}})
    if (empty) {
      llvm::errs() << "apec: " << what << ": the value is empty\n";
      return 1;
    }

  // The emitters asked for, in registration order (the order their files are written in).
  SmallVector<const ape::Emitter *> wanted;
  bool usesCudaVariants = false;
  for (const std::string &e : emit)
    if (!ape::lookupEmitter(e)) {
      llvm::errs() << "apec: unknown --emit value '" << e << "' (expected "
                   << emitterNames(", ", " or ") << ")\n";
      return 1;
    }
  for (const ape::Emitter &e : ape::registeredEmitters())
    if (emit.empty() ? (e.flags & ape::kEmitByDefault) : llvm::is_contained(emit, e.name)) {
      wanted.push_back(&e);
      usesCudaVariants |= (e.flags & ape::kEmitUsesCudaVariants) != 0;
    }
  // The lists are checked whatever is emitted (a bad value was accepted without a word where no
  // CUDA emitter ran), and said to do nothing where none does.
  FailureOr<SmallVector<ape::CudaVariant>> checkedVariants = cudaVariants();
  if (failed(checkedVariants))
    return 1;
  SmallVector<ape::CudaVariant> variants;
  if (usesCudaVariants)
    variants = std::move(*checkedVariants);
  else if (cudaDTypes.getNumOccurrences() || cudaHeadDims.getNumOccurrences())
    llvm::errs() << "apec: warning: --cuda-dtypes and --cuda-head-dims do nothing without --emit="
                 << emitterNames(", ", " or ", ape::kEmitUsesCudaVariants) << "\n";

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
  sourceMgr.AddNewSourceBuffer(ape::withoutByteOrderMark(std::move(file)), llvm::SMLoc());
  SourceMgrDiagnosticHandler diagnostics(sourceMgr, &context);
  OwningOpRef<ModuleOp> module = ape::parseSpec(sourceMgr, &context);  // nesting, parse, verify
  if (!module) {
    // Out without the context's teardown: MLIR 19's parser can leave a region it freed reachable
    // after a failed parse (SpecDriver.cpp, checkForwardReferences), and destroying the context
    // then aborted in malloc. The diagnostics are written; there is nothing else to release.
    llvm::errs().flush();
    std::fflush(nullptr);
    std::_Exit(1);
  }
  if (usesCudaVariants && failed(checkHeadDimHints(*module)))
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

  if (fastMath)  // as if every encoding were written `attributes {fast_math}`
    for (ape::EncodingOp encoding : module->getOps<ape::EncodingOp>())
      encoding.setFastMath(true);

  std::string source = sourceName.empty() ? inputFile.getValue() : sourceName.getValue();
  // Recorded in comments of the generated sources: a control character (a newline in a file name)
  // would end the comment and put the rest of the name into the code.
  for (char &c : source)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  // The emitters that read the encodings as written (--emit=reference) run on a copy of the
  // spec after expand and push-override only, before the spec is lowered.
  ape::EmitOptions options{source, outDir, variants};
  // All or nothing: the files are staged and written once every emitter has succeeded (a spec
  // that one emitter refuses leaves no file of another behind), and none replaces the input.
  ape::beginOutput(inputFile.getValue());
  if (llvm::any_of(wanted, [](const ape::Emitter *e) { return e->emitEncoding; })) {
    OwningOpRef<ModuleOp> copy = module->clone();
    PassManager early(&context);
    early.addPass(ape::createApeExpand());
    early.addPass(ape::createApePushOverride());
    if (failed(early.run(*copy)))
      return 1;
    if (failed(runEmitters(*copy, wanted, &ape::Emitter::emitEncoding, options)))
      return 1;
  }

  PassManager pm(&context);
  if (failed(applyPassManagerCLOptions(pm)))
    return 1;
  applyDefaultTimingPassManagerCLOptions(pm);
  if (failed(ape::lowerSpec(*module, pm)))
    return 1;

  if (failed(runEmitters(*module, wanted, &ape::Emitter::emitKernel, options)) ||
      failed(ape::commitOutput()))
    return 1;
  return 0;
}
