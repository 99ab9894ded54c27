//===- CudaPackage.cpp - the support files of a CUDA package ---------------===//
//
// `apec --emit=cuda-package -o DIR` writes, besides each encoding's kernels
// (DIR/kernels/), what makes DIR build on a machine that has only CUDA and a
// C++ compiler: the kernel templates (DIR/include/ape/), a CMakeLists.txt, a
// README and a smoke program. Their text is embedded into apec at build time
// from kernels/include and codegen/templates (EmbedFiles.cmake), so an installed apec needs no
// source tree.
//
//===----------------------------------------------------------------------===//
#include "codegen/EmitterRegistry.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

using namespace mlir;

namespace {
struct EmbeddedFile {
  const char *path;  // relative to the package root
  const char *text;
};
const EmbeddedFile kFiles[] = {
#include "CudaPackageFiles.inc"
};
} // namespace

LogicalResult mlir::ape::writeCudaPackageSupport(StringRef dir) {
  for (const EmbeddedFile &f : kFiles) {
    llvm::SmallString<256> path(dir);
    llvm::sys::path::append(path, f.path);
    if (failed(writeFile(path, [&](raw_ostream &os) {
          os << f.text;
          return success();
        })))
      return failure();
  }
  return success();
}

void mlir::ape::registerCudaPackageEmitter() {
  registerEmitter(
      {"cuda-package",
       "a self-contained CUDA package in OUTDIR (run once per spec into the same\n"
       "OUTDIR): the files of --emit=cuda under OUTDIR/kernels/ with the manifest,\n"
       "the templates and a CMakeLists.txt (nvcc, no MLIR; docs/cuda.md)",
       [](KernelOp kernel, const EmitOptions &o) -> LogicalResult {
         std::string kernels = o.path("kernels");
         llvm::SmallString<256> manifest(kernels);
         llvm::sys::path::append(manifest, kernel.getSymName() + ".manifest.json");
         if (failed(writeCudaPackageSupport(o.outDir)) ||
             failed(writeCudaSources(kernel, o.source, o.cudaVariants, kernels)))
           return failure();
         return writeFile(manifest, [&](raw_ostream &os) {
           return emitManifest(kernel, o.source, os);
         });
       },
       kEmitUsesCudaVariants});
}
