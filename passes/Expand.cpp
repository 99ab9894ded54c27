//===- Expand.cpp - named components to generic forms ---------------------===//
//
// Each named component is sugar: this pass replaces it, in place, by the
// params, token features, maps, scans and mod regions it stands for (its
// ExpandableComponent::expand, in dialect/components/NAME.cpp). After it, only
// generic forms (and ape.override, for -ape-push-override) remain.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::ape {
#define GEN_PASS_DEF_APEEXPAND
#include "passes/Passes.h.inc"
} // namespace mlir::ape

using namespace mlir;
using namespace mlir::ape;

namespace {

/// Components expanded twice (two ape.alibi, say) would declare the same
/// param or feature name; later ones get a numeric suffix: "alibi_slopes_1".
/// The names the spec itself wrote (`written`) stay as they are: a component's
/// param that meets one is the one renamed.
void uniquifyNames(EncodingOp enc, const llvm::DenseSet<Operation *> &written) {
  llvm::StringSet<> seen;
  llvm::StringMap<unsigned> nextSuffix;  // per name: the first suffix not tried yet
  for (Operation &op : enc.getBody().front())
    if (written.contains(&op) && isa<ParamOp>(op))
      seen.insert(op.getAttrOfType<StringAttr>("name").getValue());
  auto unique = [&](Operation *op) {
    if (written.contains(op))
      return;
    auto name = op->getAttrOfType<StringAttr>("name");
    std::string candidate = name.getValue().str();
    unsigned &k = nextSuffix[name.getValue()];
    while (seen.contains(candidate))
      candidate = (name.getValue() + "_" + std::to_string(++k)).str();
    seen.insert(candidate);
    if (candidate != name.getValue())
      op->setAttr("name", StringAttr::get(op->getContext(), candidate));
  };
  for (Operation &op : enc.getBody().front())
    if (isa<ParamOp>(op))
      unique(&op);
  seen.clear();
  nextSuffix.clear();
  for (Operation &op : enc.getBody().front())
    if (written.contains(&op) && isa<TokenFeatureOp>(op))
      seen.insert(op.getAttrOfType<StringAttr>("name").getValue());
  for (Operation &op : enc.getBody().front())
    if (isa<TokenFeatureOp>(op))
      unique(&op);
}

struct ApeExpandPass : public mlir::ape::impl::ApeExpandBase<ApeExpandPass> {
  void runOnOperation() override {
    if (failed(checkTopLevel(getOperation())))
      return signalPassFailure();
    llvm::DenseSet<Operation *> written;  // the spec's own params and features
    for (EncodingOp enc : getOperation().getOps<EncodingOp>())
      for (Operation &op : enc.getBody().front())
        if (isa<ParamOp, TokenFeatureOp>(op))
          written.insert(&op);
    SmallVector<ExpandableComponent> named;
    getOperation().walk([&](ExpandableComponent op) { named.push_back(op); });
    for (ExpandableComponent op : named) {
      OpBuilder b(op);
      op.expand(b);
      op->erase();
    }
    for (EncodingOp enc : getOperation().getOps<EncodingOp>())
      uniquifyNames(enc, written);
  }
};

} // namespace
