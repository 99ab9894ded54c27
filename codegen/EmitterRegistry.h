//===- EmitterRegistry.h - what `apec --emit` can write ---------------------===//
//
// Each emitter registers itself with a name (the --emit value), a help text and a function that
// writes its files for one lowered ape.kernel (as mlir-translate's translations do).
// registerAllEmitters() is the one list of them, in the order apec runs them for a kernel;
// apec takes its --emit values, their help, the validation of --emit and the dispatch from the
// registry. Adding an emitter: a registerXEmitter() in its file, declared below and called from
// registerAllEmitters() (EmitterRegistry.cpp).
//
//===----------------------------------------------------------------------===//
#ifndef APE_CODEGEN_EMITTERREGISTRY_H
#define APE_CODEGEN_EMITTERREGISTRY_H

#include "codegen/Emitters.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/STLFunctionalExtras.h"

#include <string>
#include <vector>

namespace mlir::ape {

/// What an emitter gets besides the op it writes.
struct EmitOptions {
  llvm::StringRef source;  // the spec path recorded in generated files
  llvm::StringRef outDir;  // the output folder (exists)
  /// --cuda-dtypes x --cuda-head-dims, checked; set for the emitters that use them.
  llvm::ArrayRef<CudaVariant> cudaVariants;

  /// OUTDIR/`name`.
  std::string path(const llvm::Twine &name) const;
};

enum EmitterFlags : unsigned {
  kEmitByDefault = 1,        // written when --emit is not given
  kEmitUsesCudaVariants = 2, // reads EmitOptions::cudaVariants
};

/// One --emit value. An emitter reads either the lowered kernel (almost all) or the encoding as
/// the spec wrote it, after -ape-expand and -ape-push-override only (the reference data); apec
/// runs the latter on every encoding before it lowers the spec, then the former on every kernel,
/// each in registration order. An emitter writes its files under options.outDir; it reports its
/// errors on the op (or "apec: ..." for a file it cannot write) and fails.
struct Emitter {
  using KernelFn = LogicalResult (*)(KernelOp kernel, const EmitOptions &options);
  using EncodingFn = LogicalResult (*)(EncodingOp encoding, const EmitOptions &options);
  Emitter(const char *name, const char *help, KernelFn fn, unsigned flags = 0)
      : name(name), help(help), emitKernel(fn), flags(flags) {}
  Emitter(const char *name, const char *help, EncodingFn fn, unsigned flags = 0)
      : name(name), help(help), emitEncoding(fn), flags(flags) {}

  const char *name;  // the --emit value
  /// What it writes, for --help: one line, or lines separated by '\n' (NAME is the encoding).
  const char *help;
  KernelFn emitKernel = nullptr;      // exactly one of the two is set
  EncodingFn emitEncoding = nullptr;
  unsigned flags = 0;  // EmitterFlags
};

/// Adds `emitter` to the registry (a second emitter of the same name is a programming error).
void registerEmitter(const Emitter &emitter);

/// Registers every emitter of codegen/, once, in the order apec runs them.
void registerAllEmitters();

/// The registered emitters, in registration order.
llvm::ArrayRef<Emitter> registeredEmitters();

/// The emitter registered as `name`, or null.
const Emitter *lookupEmitter(llvm::StringRef name);

/// Writes the file `path` with what `fn` prints, unless it already holds exactly that (left
/// alone, its time stamp too: re-running apec does not trigger a rebuild); reports "apec: cannot
/// write ..." and fails when it cannot (a write error, a full disk, something at `path` that is
/// not a regular file, the input spec itself), and writes nothing when `fn` fails. Between
/// beginOutput and commitOutput the file is only staged: written at the commit.
LogicalResult writeFile(llvm::StringRef path,
                        llvm::function_ref<LogicalResult(llvm::raw_ostream &)> fn);

/// Removes the file `path` (a file an earlier run wrote that this one does not: a CUDA variant no
/// longer asked for), at the commit when staging.
LogicalResult removeStaleFile(llvm::StringRef path);

/// apec's all-or-nothing output: from beginOutput on, writeFile and removeStaleFile only stage
/// their files; commitOutput writes (and removes) them all, so an emitter that fails part way
/// leaves no file of the run behind. `input` is the spec being compiled, which no output may
/// replace.
void beginOutput(llvm::StringRef input);
LogicalResult commitOutput();

/// Writes the files that `fn` emits into the folder `dir` (created with its subfolders), each by
/// writeFile (a file whose contents did not change is left alone).
LogicalResult writeFolder(llvm::StringRef dir,
                          llvm::function_ref<LogicalResult(std::vector<EmittedFile> &)> fn);

// The emitters of codegen/, each defined in its emitter's file.
void registerCpuEmitter();          // CpuEmitter.cpp
void registerManifestEmitter();     // ManifestEmitter.cpp
void registerReferenceEmitter();    // ReferenceEmitter.cpp
void registerCudaEmitter();         // CudaEmitter.cpp
void registerCudaPackageEmitter();  // CudaPackage.cpp
void registerTorchLibraryEmitter(); // TorchLibraryEmitter.cpp
void registerCAbiEmitter();         // CAbiEmitter.cpp
void registerKernelMlirEmitter();   // KernelMlirEmitter.cpp

} // namespace mlir::ape

#endif // APE_CODEGEN_EMITTERREGISTRY_H
