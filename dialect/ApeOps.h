//===- ApeOps.h - ops of the ape dialect ----------------------------------===//
#ifndef APE_DIALECT_APEOPS_H
#define APE_DIALECT_APEOPS_H

#include "dialect/ApeDialect.h"
#include "ape/contract/value_rules.h"
#include "ape/contract/vocabulary.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialect/ApeInterfaces.h.inc"

#define GET_OP_CLASSES
#include "dialect/ApeOps.h.inc"

namespace mlir::ape {
/// The contract between the stages (closed vocabularies, shape symbols, init arguments).
namespace abi = ::ape_abi;
/// The name of a vocabulary value as a StringRef (for attributes, JSON and diagnostics).
template <class E> llvm::StringRef nameOf(E value) { return llvm::StringRef(abi::name(value)); }

/// The largest tile (query rows or key columns) an ape.kernel may record (ape-schedule).
inline constexpr int64_t kMaxTile = 1024;

/// The dimensions of a param's shape (verified: each is a valid abi::Dim).
llvm::SmallVector<abi::Dim> getDims(ParamOp param);
/// A constant index of `load` (of a param) outside its dimension: an error on the op. Checked on
/// the spec as written (SpecDriver's parseSpec), not by the verifier: an index the passes fold to
/// a constant is a computed one, which the kernels clamp to its dimension.
LogicalResult checkConstantIndices(LoadOp load);
/// A param without init arguments (set them with the typed setters: setStdAttr, ...).
ParamOp createParam(OpBuilder &b, Location loc, llvm::StringRef name,
                    llvm::ArrayRef<llvm::StringRef> shape, abi::InitKind init, bool trainable);
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
