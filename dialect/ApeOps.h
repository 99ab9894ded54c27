//===- ApeOps.h - ops of the ape dialect ----------------------------------===//
#ifndef APE_DIALECT_APEOPS_H
#define APE_DIALECT_APEOPS_H

#include "dialect/ApeDialect.h"
#include "dialect/ValueRules.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#define GET_OP_CLASSES
#include "dialect/ApeOps.h.inc"

namespace mlir::ape {
/// Reads a symbolic param shape: "heads", "head_dim" or a positive integer.
bool isValidShapeSymbol(llvm::StringRef dim);
/// True for the ops allowed inside a map / q_mod / k_mod / score_mod region.
bool isAllowedInRegion(Operation *op);
/// The values a fixed param may take (its `min`, `max` and `integer` attributes), when it
/// declares them: the verifier checks its `value`, the manifest carries them as "range", and
/// a runtime checks a new value (ape-eval --set) with the same rule.
std::optional<::ape_rules::Range> getValueRange(ParamOp param);
/// Declares `range` on `param` (the passes that create fixed params).
void setValueRange(ParamOp param, const ::ape_rules::Range &range);
} // namespace mlir::ape

#endif // APE_DIALECT_APEOPS_H
