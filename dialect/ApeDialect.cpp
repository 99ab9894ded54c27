//===- ApeDialect.cpp - the ape dialect and its types ---------------------===//
#include "dialect/ApeDialect.h"
#include "dialect/ApeOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/Interfaces/FoldInterfaces.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::ape;

#include "dialect/ApeDialect.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "dialect/ApeTypes.cpp.inc"

namespace {
/// Constants folded inside a map / q_mod / k_mod / score_mod stay in that
/// region: its body is a scalar function, emitted as one, and the container
/// level holds only the token program.
struct ApeFoldInterface : public DialectFoldInterface {
  using DialectFoldInterface::DialectFoldInterface;
  bool shouldMaterializeInto(Region *region) const final {
    return isa<MapOp, QModOp, KModOp, ScoreModOp, PositionEmbeddingOp, ValueRowsOp>(
        region->getParentOp());
  }
};
} // namespace

void ApeDialect::initialize() {
  addInterfaces<ApeFoldInterface>();
  addTypes<
#define GET_TYPEDEF_LIST
#include "dialect/ApeTypes.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "dialect/ApeOps.cpp.inc"
      >();
}
