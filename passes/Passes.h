//===- Passes.h - the ape passes ------------------------------------------===//
#ifndef APE_PASSES_PASSES_H
#define APE_PASSES_PASSES_H

#include "dialect/ApeOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Pass/Pass.h"

namespace mlir::ape {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

/// Adds `flags` to the fast-math flags of `op` (nothing when it has none: not an arith/math op
/// with the fast-math interface).
void addFastMathFlags(Operation *op, arith::FastMathFlags flags);
/// The fast-math flags of `op` (none when it has no such interface).
arith::FastMathFlags fastMathFlags(Operation *op);

/// Folds, in double, every f32 arith/math op under `root` whose operands are all constants
/// (-ape-exact-fold): the result an arith.constant where f32 holds it exactly, else an
/// ape.constant. Returns the number of ops folded.
int foldConstantsExactly(Operation *root);
int foldConstantsExactly(Region &region);

/// Adds the whole lowering, spec to scheduled kernel, to `pm`:
/// expand, push-override, fast-math, fuse, exact-fold, canonicalize and CSE, differentiate,
/// schedule, classify.
/// An ape.encoding or ape.kernel below `module` other than at its top level (in a nested module),
/// as an error on it: the passes and the emitters take the file's top level only, and would
/// otherwise lower such an encoding in part. And an arith or math op of a type outside the region
/// language's (dialect/RegionTypes.h: an i32 or f16 body), as apec refuses it where it reads a
/// spec. Every ape pass checks this first.
LogicalResult checkTopLevel(ModuleOp module);

/// With `schedule`, the tile sizes ape-schedule records (its defaults otherwise).
void buildApeLoweringPipeline(OpPassManager &pm, const ApeScheduleOptions &schedule = {});

} // namespace mlir::ape

#endif // APE_PASSES_PASSES_H
