//===- EmitterRegistry.cpp - what `apec --emit` can write -------------------===//
#include "codegen/EmitterRegistry.h"

#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/ToolOutputFile.h"

using namespace mlir;
using namespace mlir::ape;

static std::vector<Emitter> &registry() {
  static std::vector<Emitter> emitters;
  return emitters;
}

void mlir::ape::registerEmitter(const Emitter &emitter) {
  if (lookupEmitter(emitter.name))
    llvm::report_fatal_error(llvm::Twine("apec: the emitter '") + emitter.name +
                             "' is registered twice");
  registry().push_back(emitter);
}

void mlir::ape::registerAllEmitters() {
  // The one list of what --emit accepts. The order is the order of --help and the order in which
  // apec writes a kernel's files.
  static const bool once = [] {
    registerCpuEmitter();
    registerManifestEmitter();
    registerReferenceEmitter();
    registerCudaEmitter();
    registerCudaPackageEmitter();
    registerTorchLibraryEmitter();
    registerCAbiEmitter();
    registerKernelMlirEmitter();
    return true;
  }();
  (void)once;
}

ArrayRef<Emitter> mlir::ape::registeredEmitters() { return registry(); }

const Emitter *mlir::ape::lookupEmitter(StringRef name) {
  for (const Emitter &e : registry())
    if (name == e.name)
      return &e;
  return nullptr;
}

std::string EmitOptions::path(const Twine &name) const {
  llvm::SmallString<256> p(outDir);
  llvm::sys::path::append(p, name);
  return p.str().str();
}

LogicalResult mlir::ape::writeFile(StringRef path,
                                   llvm::function_ref<LogicalResult(raw_ostream &)> fn) {
  // The contents first: a file that already holds them is left untouched (its time stamp too),
  // so a build that depends on it recompiles only what changed; nothing is written on failure.
  std::string contents;
  {
    llvm::raw_string_ostream os(contents);
    if (failed(fn(os)))
      return failure();
  }
  if (auto old = llvm::MemoryBuffer::getFile(path); old && (*old)->getBuffer() == contents)
    return success();
  std::string error;
  auto out = openOutputFile(path, &error);
  if (!out) {
    llvm::errs() << "apec: cannot write " << path << ": " << error << "\n";
    return failure();
  }
  out->os() << contents;
  out->keep();
  return success();
}

LogicalResult mlir::ape::writeFolder(
    StringRef dir, llvm::function_ref<LogicalResult(std::vector<EmittedFile> &)> fn) {
  std::vector<EmittedFile> files;
  if (failed(fn(files)))
    return failure();
  for (const EmittedFile &file : files) {
    llvm::SmallString<256> path(dir);
    llvm::sys::path::append(path, file.path);
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
