//===- RegionWriter.h - ape.kernel regions as C++ statements -------------===//
//
// What the functor writer (FunctorWriter.cpp: the `Enc` struct of the CPU and CUDA emitters)
// builds on: KernelLayout, where every container-level value of a kernel lives at run time, and
// RegionWriter, which writes the ops of one region as C++ statements over it.
//
// Values inside regions become `const` locals: f32 → T, index/i64 → int64_t, i1 → bool. Token
// sequences (features, maps, scans) live in per-(batch, head) slots
// `ctx.tok[slot·ctx.tok_stride() + t]` (the stride: T, or a CUDA decode cache's capacity);
// params in `ctx.params[n][flat index]`.
//
//===----------------------------------------------------------------------===//
#ifndef APE_CODEGEN_REGIONWRITER_H
#define APE_CODEGEN_REGIONWRITER_H

#include "dialect/ApeOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace mlir::ape::codegen {

/// Where every container-level value of the kernel lives at run time.
struct KernelLayout {
  SmallVector<TokenFeatureOp> features;
  SmallVector<ParamOp> params;
  SmallVector<Operation *> tokenProgram;  // token_feature / map / scan, in order
  DenseMap<Value, unsigned> tokSlot, paramIndex, featureIndex;
  QModOp qmod;
  KModOp kmod;
  ScoreModOp score;
  PositionEmbeddingOp embedding;  // site E; only its table region is code
  SmallVector<RelRowsOp> rels;    // relative rows, in order: ctx.rel[n] is (T, rows_n)
  ValueRowsOp valueRows;          // the value-side relative term, if any
  AttentionTransitionOp transition;  // the prob site, if any (inference only)
  bool inferenceOnly = false;     // no backward: the functor gets no gradient members
  /// The target has approximate functions for ops with fast-math flags (-ape-fast-math): the
  /// CUDA functor writes a flagged exp, exp2, log, log2, log1p (afn) or divf (arcp) as
  /// ::ape::cuda::approx::* (ape/cuda/platform.cuh). The CPU functor (false) ignores the flags.
  bool approxMath = false;
  DenseMap<Value, unsigned> relIndex;

  /// The number of rows of a rel_rows table (its verified integer first dimension).
  int64_t rowCount(RelRowsOp r) const {
    return getDims(r.getTable().getDefiningOp<ParamOp>())[0].value;
  }

  /// Fills the layout from `kernel`; fails (with a diagnostic) on a kernel the emitters cannot
  /// translate: a second value_rows, a region without its gradient in a kernel with a backward.
  LogicalResult build(KernelOp kernel);

  /// The facts -ape-classify recorded on `kernel` hold for its regions (a kernel written or
  /// edited by hand may claim one that does not; a fact it lacks only costs a fast path).
  LogicalResult checkFacts(KernelOp kernel) const;
};

/// A floating-point constant of the region's precision T. A spec may hold non-finite constants
/// (`arith.constant 0xFF800000 : f32` is -inf, the natural way to mask a key in a score_mod):
/// they are spelled std::numeric_limits<T> (<limits>: cpu/attention.h includes it; the CUDA header
/// includes it when hasNonFiniteConstant), valid C++ in every backend; finite values print with
/// 17 digits (exact for f64).
std::string floatLiteral(double v);

/// A param dimension as generated code: the symbols as `heads` and `headDim`, a size as itself.
std::string dimExpr(const abi::Dim &d, StringRef heads, StringRef headDim);

/// The C++ type of a region value: T for floats, bool for i1, int64_t for index and integers.
std::string cType(Type t);

/// Emits the ops of one region body as C++ statements.
class RegionWriter {
public:
  RegionWriter(raw_ostream &os, KernelLayout &layout, StringRef prefix, StringRef indent)
      : os(os), layout(layout), prefix(prefix.str()), indent(indent.str()) {}

  void bind(Value v, StringRef expr) { names[v] = expr.str(); }
  std::string get(Value v) { return names.lookup(v); }

  /// Emits all ops but the terminator; returns the yielded values' names.
  /// An op whose result was bound beforehand (a distance `i - j` bound to `d`) is not emitted.
  FailureOr<SmallVector<std::string>> emitBody(Block &block);

  /// Emits only the ops that `roots` depend on (in block order); returns the roots' names.
  /// Values bound beforehand (block arguments) are leaves.
  FailureOr<SmallVector<std::string>> emitSlice(Block &block, ArrayRef<Value> roots);

  /// The C++ lvalue expression of a load's element (in tok or params) with
  /// `base` = "ctx.tok" / "ctx.dtok" or "ctx.params" / "ctx.dparams".
  FailureOr<std::string> element(LoadOp load, StringRef tokBase, StringRef paramBase);

private:
  std::string fresh() { return prefix + std::to_string(counter++); }

  void define(Operation &op, const std::string &expr);

  LogicalResult emitOp(Operation &op);

  raw_ostream &os;
  KernelLayout &layout;
  std::string prefix, indent;
  DenseMap<Value, std::string> names;
  unsigned counter = 0;
};

} // namespace mlir::ape::codegen

#endif // APE_CODEGEN_REGIONWRITER_H
