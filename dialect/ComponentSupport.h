//===- ComponentSupport.h - what the named components share ---------------===//
//
// Each named component lives in its own file, dialect/components/NAME.cpp: its
// verifier (NAME::verify) and its expansion into generic forms (NAME::expand,
// the ExpandableComponent interface that -ape-expand calls). This header holds
// what several of them use: attribute checks for the verifiers and IR
// builders for the expansions (docs/internals.md, section 5, "A newcomer's
// map": a named component).
//
//===----------------------------------------------------------------------===//
#ifndef APE_DIALECT_COMPONENTSUPPORT_H
#define APE_DIALECT_COMPONENTSUPPORT_H

#include "dialect/ApeOps.h"
#include "dialect/RegionBuilder.h"

#include <optional>
#include <string>

namespace mlir::ape::component {

// ---- verifiers --------------------------------------------------------------------------------
bool isFinite(double v);
/// A number as a diagnostic shows it: shortest form, "0.5" rather than "5.000000e-01".
std::string num(double v);
std::optional<double> toDouble(std::optional<llvm::APFloat> v);
/// An integer attribute within [lo, hi], or a located error naming it.
LogicalResult verifyIntRange(Operation *op, StringRef name, int64_t v, int64_t lo, int64_t hi);

// ---- expansions -------------------------------------------------------------------------------
/// A fixed scalar param (shape ["1"]) holding `value`, which a runtime may change between
/// calls without recompiling (ape-eval --set NAME=VALUE) within `range` (the rule the
/// verifier applied to the spec's attribute).
ParamOp fixedScalar(OpBuilder &b, Location loc, StringRef name, double value,
                    const ape_rules::Range &range);

/// A param of `shape` with initialiser `init`; `shared` params are one tensor for all layers.
ParamOp newParam(OpBuilder &b, Location loc, StringRef name, ArrayRef<StringRef> shape,
                 abi::InitKind init, bool trainable, bool shared = false);

/// n = max(i - j, 0) as an index (rows above the diagonal, which the mask drops, give 0).
Value distance(RegionBuilder &rb, Value i, Value j);

/// The rotation of a pair: x' = x·cos(a) ∓ y·sin(a) (minus for the first of the pair).
Value rotatePair(RegionBuilder &rb, Value x, Value y, Value first, Value angle);

/// Pair bookkeeping shared by rotary and xPos: r = 2·floor(fraction·d_h/2) rotated
/// coordinates, k the pair index of c, `first` whether c is the first of its pair.
struct PairInfo {
  Value r, k, first, inRotation;
};
PairInfo pairInfo(RegionBuilder &rb, Value c, double fraction, bool half);

/// s' = s + g(i, j) in a new score_mod; `bias` builds g from (b, h, i, j).
template <typename Fn>
void buildScoreMod(OpBuilder &b, Location loc, Fn bias) {
  auto mod = b.create<ScoreModOp>(loc, TypeRange{}, ValueRange{});
  OpBuilder::InsertionGuard guard(b);
  MLIRContext *ctx = b.getContext();
  Type f32 = Float32Type::get(ctx), idx = IndexType::get(ctx);
  Block *block = createRegionBlock(b, mod.getBody(), {f32, idx, idx, idx, idx}, loc);
  RegionBuilder rb{b, loc};
  Value s = block->getArgument(0);
  Value g = bias(rb, block->getArgument(1), block->getArgument(2), block->getArgument(3),
                 block->getArgument(4));
  rb.yield(rb.add(s, g));
}

} // namespace mlir::ape::component

#endif // APE_DIALECT_COMPONENTSUPPORT_H
