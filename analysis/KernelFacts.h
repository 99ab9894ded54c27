//===- KernelFacts.h - what an ape.kernel's regions allow the kernels to do ===//
//
// The analyses behind the kernels' fast paths. `-ape-classify` (passes/Classify.cpp) records
// their answers as attributes of `ape.kernel`, visible in `ape-opt` output and tested by lit on
// the IR; the emitters take a fast path only where its attribute is present, and check with these
// functions that a recorded fact holds (a kernel written or edited by hand may claim one that
// does not). docs/internals.md, section 1 ("ape.kernel"), lists the attributes.
//
//===----------------------------------------------------------------------===//
#ifndef APE_ANALYSIS_KERNELFACTS_H
#define APE_ANALYSIS_KERNELFACTS_H

#include "dialect/ApeOps.h"

#include <optional>

namespace mlir::ape {

/// A q/k mod linear in its data: mod(x, y) = a(t, c) x + b(t, c) y with coefficients that read
/// only the position, the column, constants, the call's dims and params at indices that do not
/// read the head (not token sequences): RoPE and all its scalings, xPos. The CPU template then
/// evaluates a = mod(1, 0) and b = mod(0, 1) once per call into a table that every (b, h) slice
/// reads, instead of calling the mod (its pow, sin, cos) B H T D times. Attribute: `q_mod_linear`,
/// `k_mod_linear`. False for a null `mod`.
bool isLinearMod(Operation *mod);

/// A score mod of the form `s + B(i - j)` (B may be a sum and difference of terms: `s - X`
/// counts as s + (-X)): the bias reads the query
/// and key positions only through their difference and does not depend on the logit. The
/// templates then evaluate B once per distance and, in the backward, call its gradient once per
/// distance with the sum of dS along that diagonal. Attribute: `score_bias = "distance"`.
bool isDistanceBias(ScoreModOp mod);

/// A score mod of the form `s + R(i) + C(j)` (Cable, forget gates: S_i - S_j of cumulative
/// sums): the bias splits into a term of the query row and a term of the key column. The CUDA
/// flash kernels then evaluate R once per query and C once per key of a tile and, in the
/// backward, call the gradients once per row and column with the sums of dS. Only kernels with a
/// backward have the split (the forward does not use it), and a distance bias is not one.
/// Attribute: `score_bias = "row_col"`.
struct RowColBias {
  SmallVector<std::pair<Value, bool>> rowTerms, colTerms; // (term of the body, negated)
  SmallVector<Value> rowGrads, colGrads;                  // grad-region values of those loads
  SmallVector<bool> loadIsRow;                            // per load of the body, walk order
};
std::optional<RowColBias> rowColBias(ScoreModOp mod);

/// A score mod whose memory reads are features (CUDA flash kernels: kFeatures): every load (of the
/// body and of the grad region) reads at an index of the query row i, of the key column j, or of
/// the slice (neither), where an index component may also read the distance d = i - j
/// (`arith.subi %i, %j`) if it then reads nothing but d, constants and dims. Shaw's,
/// Transformer-XL's and DeBERTa's relative rows (row i, row r(d)), K-Cable's token sums (S_i,
/// S_j). Past the distance from which every such component is constant (found at run time), a
/// tile reads one value per feature and query, key or slice: the flash backward then calls the
/// score mod on values in registers and sums each feature's gradient per query, key and block
/// before it reaches memory. The value-rows index, if any, must read only d and constants. Not
/// for a distance or row/column bias (their own fast paths), nor past kMaxFeatures per side.
/// Attribute: `score_bias = "features"`.
struct ScoreFeatures {
  enum Side : unsigned { kRow, kCol, kSlice };
  static constexpr unsigned kMaxFeatures = 4;
  struct Feature {
    LoadOp load;         // its first load (the body's where the body has one)
    Side side;
    unsigned slot;       // its index among the features of its side
    bool readsDistance;  // some index component reads d
  };
  SmallVector<Feature> features;
  DenseMap<Operation *, unsigned> featureOf;  // every load of the body and grad region
  unsigned count(Side s) const {
    return static_cast<unsigned>(llvm::count_if(features, [&](const Feature &f) { return f.side == s; }));
  }
};
std::optional<ScoreFeatures> scoreFeatures(ScoreModOp mod, ValueRowsOp valueRows);

/// Whether `op` (a region holder of the kernel) reads the sequence length (ape.dim "seq_len"):
/// decoding (cpu/decode.h) must then recompute what it caches at every step. Attributes:
/// `k_mod_reads_length` (the k mod), `tokens_read_length` (any op of the token program).
bool readsSequenceLength(Operation *op);

/// The value of `score_bias` for `kernel`'s score mod: "distance", "row_col", "features" or none.
std::optional<llvm::StringRef> scoreBiasKind(KernelOp kernel);

} // namespace mlir::ape

#endif // APE_ANALYSIS_KERNELFACTS_H
