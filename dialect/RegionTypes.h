//===- RegionTypes.h - the types a region body computes on ------------------===//
//
// The region language's types (docs/internals.md): f32, i1, i64 and index. apec refuses another
// (i32, f16, ...) where it parses a spec (tools/SpecDriver.cpp, with the op's place in the file)
// and where it emits a region (codegen/RegionWriter.cpp): the emitters would compute it as f32 or
// int64, dropping its wrap-around or rounding.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "mlir/IR/Operation.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace mlir::ape {

inline bool isRegionType(Type t) { return t.isF32() || t.isInteger(1) || t.isInteger(64) || t.isIndex(); }

/// Reports (on `op`) and fails for an operand or result of a type outside the region language's.
inline LogicalResult checkRegionTypes(Operation *op) {
  SmallVector<Type> types(op->getOperandTypes());
  llvm::append_range(types, op->getResultTypes());
  for (Type t : types)
    if (!isRegionType(t)) {
      std::string name;
      llvm::raw_string_ostream(name) << t;
      return op->emitOpError("uses type ") << name << ": region bodies compute on f32, i1, i64 and index only";
    }
  return success();
}

} // namespace mlir::ape
