//===- Emitters.h - translations from ape.kernel ---------------------------===//
#ifndef APE_CODEGEN_EMITTERS_H
#define APE_CODEGEN_EMITTERS_H

#include "dialect/ApeOps.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace mlir::ape {

/// Writes the CPU C++ source of `kernel`: an `Enc` functor struct generated from
/// its regions, the instantiations of kernels/include/ape/cpu/attention.h and
/// `extern "C" const ape::KernelEntry *ape_kernel_entry_<name>()`. `source` names
/// the spec the kernel came from (written into the header comment).
LogicalResult emitCpuKernel(KernelOp kernel, llvm::StringRef source, llvm::raw_ostream &os);

/// Which kernel template an `Enc` functor is written for.
enum class FunctorTarget {
  Cpu,  // members on ape::HeadCtx<T> (kernels/include/ape/cpu/attention.h)
  Cuda, // members on any context type, declared APE_HD (kernels/include/ape/cuda/attention.cuh)
};

/// Whether a region of `kernel` holds a non-finite float constant (-inf, +inf, NaN): the functor
/// then spells it with std::numeric_limits<T> and needs <limits>.
bool hasNonFiniteConstant(KernelOp kernel);

/// Writes `struct Enc { ... };`: the functor translated from the regions of `kernel` (token
/// program, q/k mods, score mod and their gradients; docs/internals.md section 2). The CPU and
/// the CUDA emitters share it; only the member declarations differ by `target`.
LogicalResult emitEncFunctor(KernelOp kernel, FunctorTarget target, llvm::raw_ostream &os);

/// One CUDA instantiation: input dtype and head dim.
struct CudaVariant {
  std::string dtype; // "f32", "f16" or "bf16"
  int64_t headDim;   // 32, 64 or 128
};

/// The CUDA sources of `kernel` for the CUDA template (kernels/include/ape/cuda/attention.cuh):
/// emitCudaHeader writes the functor (NAME_cuda.cuh); emitCudaEntry the manifest, the table of
/// the instantiated (dtype, head_dim) pairs and
/// `extern "C" const ape::cuda::CudaKernelEntry *ape_cuda_kernel_entry_<name>()` (NAME_cuda.cu);
/// emitCudaInstantiation one explicit instantiation per pair (NAME_cuda_<dtype>_hd<D>.cu), so
/// that nvcc compiles them in parallel.
LogicalResult emitCudaHeader(KernelOp kernel, llvm::StringRef source, llvm::raw_ostream &os);
LogicalResult emitCudaEntry(KernelOp kernel, llvm::StringRef source,
                            llvm::ArrayRef<CudaVariant> variants, llvm::raw_ostream &os);
void emitCudaInstantiation(KernelOp kernel, llvm::StringRef source, const CudaVariant &variant,
                           llvm::raw_ostream &os);

/// Writes the three kinds of CUDA sources of `kernel` (emitCudaHeader, emitCudaEntry and one
/// emitCudaInstantiation per variant) into the folder `dir` (created): DIR/NAME_cuda.cuh,
/// DIR/NAME_cuda.cu and DIR/NAME_cuda_<dtype>_hd<D>.cu.
LogicalResult writeCudaSources(KernelOp kernel, llvm::StringRef source,
                               llvm::ArrayRef<CudaVariant> variants, llvm::StringRef dir);

/// Writes the files of a self-contained CUDA package into `dir` (docs/cuda.md): the kernel
/// templates (include/ape/), CMakeLists.txt, README.md and smoke.cpp. The encodings' own files
/// go to `dir`/kernels/ (emitCudaHeader, emitCudaEntry, emitCudaInstantiation, emitManifest).
LogicalResult writeCudaPackageSupport(llvm::StringRef dir);

/// Writes the manifest (JSON) of `kernel`: features, params with shapes and
/// initialisers, the masked projection, the logit scale and the schedule.
LogicalResult emitManifest(KernelOp kernel, llvm::StringRef source, llvm::raw_ostream &os);

/// Writes `encoding`, taken after -ape-expand and -ape-push-override (before -ape-fuse), as
/// JSON data: its params, features, token program and every q_mod, k_mod, score_mod,
/// rel_rows, value_rows and position table region as an expression graph, unfused and
/// undifferentiated. `ape-check` evaluates it with LibTorch as the kernel's independent
/// reference (docs/ape-check.md; the schema is at the top of ReferenceEmitter.cpp).
LogicalResult emitReference(EncodingOp encoding, llvm::StringRef source, llvm::raw_ostream &os);

/// One file of a self-contained emitted folder: its path inside the folder and its text.
struct EmittedFile {
  std::string path;
  std::string contents;
};

/// The files of a folder that builds a PyTorch operator library for `kernel` with only a C++
/// compiler and PyTorch (docs/frameworks.md): the operators ape_<name>::* (a differentiable
/// `attention`, the raw forward/backward, derived_params), the CPU kernel, the CUDA kernels
/// of `cudaVariants` (compiled where PyTorch has CUDA and nvcc is found; none when the CUDA
/// template cannot take the encoding), the templates, CMakeLists.txt and a Python helper
/// ape_<name>.py.
LogicalResult emitTorchLibrary(KernelOp kernel, llvm::StringRef source,
                               llvm::ArrayRef<CudaVariant> cudaVariants,
                               std::vector<EmittedFile> &files);

/// The files of a folder that builds a C ABI library for `kernel` with only a C++ compiler
/// (docs/frameworks.md): the header ape_<name>.h (plain-pointer forward/backward in f32 and
/// f64, status codes, no exceptions), its implementation, the CPU kernel and CMakeLists.txt.
LogicalResult emitCAbi(KernelOp kernel, llvm::StringRef source, std::vector<EmittedFile> &files);

} // namespace mlir::ape

#endif // APE_CODEGEN_EMITTERS_H
