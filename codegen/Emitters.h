//===- Emitters.h - translations from ape.kernel ---------------------------===//
#ifndef APE_CODEGEN_EMITTERS_H
#define APE_CODEGEN_EMITTERS_H

#include "dialect/ApeOps.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::ape {

/// Writes the CPU C++ source of `kernel`: an `Enc` functor struct generated from
/// its regions, the instantiations of codegen/templates/ape/cpu_attention.h and
/// `extern "C" const ape::KernelEntry *ape_kernel_entry_<name>()`. `source` names
/// the spec the kernel came from (written into the header comment).
LogicalResult emitCpuKernel(KernelOp kernel, llvm::StringRef source, llvm::raw_ostream &os);

/// Writes the manifest (JSON) of `kernel`: features, params with shapes and
/// initialisers, the masked projection, the logit scale and the schedule.
LogicalResult emitManifest(KernelOp kernel, llvm::StringRef source, llvm::raw_ostream &os);

} // namespace mlir::ape

#endif // APE_CODEGEN_EMITTERS_H
