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

namespace {
// The run's staged output (beginOutput .. commitOutput).
struct Output {
  bool staging = false;
  std::string input;                                // the spec: never written over
  std::vector<std::pair<std::string, std::string>> files;  // path, contents
  std::vector<std::string> removals;
};
Output &output() {
  static Output o;
  return o;
}

// Writes `contents` to `path` (its folder created), or reports why it cannot. A write error (a full
// disk) is reported, and the partial file removed, rather than left to the stream's fatal error.
LogicalResult writeNow(StringRef path, StringRef contents) {
  StringRef parent = llvm::sys::path::parent_path(path);
  if (!parent.empty())
    if (std::error_code ec = llvm::sys::fs::create_directories(parent)) {
      llvm::errs() << "apec: cannot create " << parent << ": " << ec.message() << "\n";
      return failure();
    }
  std::string error;
  auto out = openOutputFile(path, &error);
  if (!out) {
    llvm::errs() << "apec: cannot write " << path << ": " << error << "\n";
    return failure();
  }
  out->os() << contents;
  out->os().flush();
  if (std::error_code ec = out->os().error()) {
    llvm::errs() << "apec: cannot write " << path << ": " << ec.message() << "\n";
    out->os().clear_error();
    return failure();  // not kept: ToolOutputFile removes the partial file
  }
  out->keep();
  return success();
}
} // namespace

void mlir::ape::beginOutput(StringRef input) {
  Output &o = output();
  o.staging = true, o.input = input.str();
  o.files.clear(), o.removals.clear();
}

LogicalResult mlir::ape::commitOutput() {
  Output &o = output();
  o.staging = false;
  for (const std::string &path : o.removals)
    if (std::error_code ec = llvm::sys::fs::remove(path)) {
      llvm::errs() << "apec: cannot remove " << path << ": " << ec.message() << "\n";
      return failure();
    }
  for (const auto &[path, contents] : o.files) {
    if (auto old = llvm::MemoryBuffer::getFile(path); old && (*old)->getBuffer() == contents)
      continue;
    if (failed(writeNow(path, contents)))
      return failure();
  }
  o.files.clear(), o.removals.clear();
  return success();
}

LogicalResult mlir::ape::removeStaleFile(StringRef path) {
  if (output().staging) {
    output().removals.push_back(path.str());
    return success();
  }
  if (std::error_code ec = llvm::sys::fs::remove(path)) {
    llvm::errs() << "apec: cannot remove " << path << ": " << ec.message() << "\n";
    return failure();
  }
  return success();
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
  // What is at `path` now: nothing, or a regular file (a device, a FIFO or a folder there would be
  // read forever or not be replaced), and never the spec apec reads.
  llvm::sys::fs::file_status st;
  if (!llvm::sys::fs::status(path, st) && llvm::sys::fs::exists(st)) {
    if (!llvm::sys::fs::is_regular_file(st)) {
      llvm::errs() << "apec: cannot write " << path << ": something other than a regular file is there\n";
      return failure();
    }
    bool same = false;
    if (!output().input.empty() && !llvm::sys::fs::equivalent(path, output().input, same) && same) {
      llvm::errs() << "apec: " << path << " is the input spec itself: write the outputs elsewhere (-o)\n";
      return failure();
    }
  }
  if (output().staging) {
    output().files.emplace_back(path.str(), std::move(contents));
    return success();
  }
  if (auto old = llvm::MemoryBuffer::getFile(path); old && (*old)->getBuffer() == contents)
    return success();
  return writeNow(path, contents);
}

LogicalResult mlir::ape::writeFolder(
    StringRef dir, llvm::function_ref<LogicalResult(std::vector<EmittedFile> &)> fn) {
  std::vector<EmittedFile> files;
  if (failed(fn(files)))
    return failure();
  for (const EmittedFile &file : files) {
    llvm::SmallString<256> path(dir);
    llvm::sys::path::append(path, file.path);
    if (failed(writeFile(path, [&](raw_ostream &os) {
          os << file.contents;
          return success();
        })))
      return failure();
  }
  return success();
}
