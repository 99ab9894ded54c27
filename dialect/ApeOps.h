//===- ApeOps.h - ops of the ape dialect ----------------------------------===//
#ifndef APE_DIALECT_APEOPS_H
#define APE_DIALECT_APEOPS_H

#include "dialect/ApeDialect.h"
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
} // namespace mlir::ape

#endif // APE_DIALECT_APEOPS_H
