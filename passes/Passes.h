//===- Passes.h - the ape passes ------------------------------------------===//
#ifndef APE_PASSES_PASSES_H
#define APE_PASSES_PASSES_H

#include "dialect/ApeOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::ape {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

/// Adds the whole lowering, spec to scheduled kernel, to `pm`:
/// expand, push-override, fuse, canonicalize and CSE, differentiate, schedule, classify.
void buildApeLoweringPipeline(OpPassManager &pm);

} // namespace mlir::ape

#endif // APE_PASSES_PASSES_H
