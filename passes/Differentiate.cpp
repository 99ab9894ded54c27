//===- Differentiate.cpp - backward regions -------------------------------===//
//
// Users write forward regions only. For every map, q_mod, k_mod and
// score_mod of an ape.kernel this pass adds a `grad` region: the body is
// cloned (to recompute primal values) and, for each differentiable input u
// (the region's value arguments and every ape.load), forward-mode tangents
// are propagated through the arith/math ops (up to a sign carried as a flag,
// so that inputs whose tangents differ by one share their ops: Tan); the
// region yields g·∂f/∂u. The ops of an op's derivative carry that op's fast-math flags
// (-ape-fast-math).
// Loads of fixed (non-trainable) params get a zero gradient. The code
// generators read from each load's indices which reduction its gradient
// needs (a row or column sum, a scatter, ...).
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "dialect/RegionBuilder.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/OperationSupport.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "llvm/ADT/DenseSet.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

namespace mlir::ape {
#define GEN_PASS_DEF_APEDIFFERENTIATE
#include "passes/Passes.h.inc"
} // namespace mlir::ape

using namespace mlir;
using namespace mlir::ape;

namespace {

/// A tangent: a value (null: an exact zero) and a sign. Tangents are linear in the input's, so a
/// negation moves through them exactly (IEEE rounding is symmetric: (-a)·f = -(a·f),
/// (-a)/f = -(a/f), (-a) + (-b) = -(a + b), a + (-b) = a - b) and is carried as a flag, applied
/// where a tangent meets a select or leaves as a gradient. Inputs whose tangents agree up to sign
/// (the two sides of a difference: K-Cable's S_i - S_j, ∂/∂S_j = -∂/∂S_i) then build the same
/// ops, which mergeCommonOps merges: one chain, one division per element instead of two, with the
/// values the materialised negations gave (the same bits where no multiply-add is fused otherwise).
struct Tan {
  Value v;
  bool neg = false;
  explicit operator bool() const { return static_cast<bool>(v); }
};

/// A float constant's value, if x is one.
std::optional<double> constantOf(Value x) {
  if (auto c = x.getDefiningOp<arith::ConstantOp>())
    if (auto f = dyn_cast<FloatAttr>(c.getValue()))
      return f.getValueAsDouble();
  if (auto c = x.getDefiningOp<ConstantOp>())
    return c.getValue().convertToDouble();
  return std::nullopt;
}
bool positive(Value x, int depth = 0);
/// Whether x >= 0 (or NaN) for every input, in the kernels' floating point: a constant >= 0, a
/// square y·y, |y|, e^y, and sums and products of such.
bool nonNegative(Value x, int depth = 0) {
  if (depth > 8)
    return false;
  if (std::optional<double> c = constantOf(x))
    return *c >= 0;
  Operation *op = x.getDefiningOp();
  if (!op)
    return false;
  if (isa<math::AbsFOp, math::ExpOp>(op))
    return true;
  if (isa<arith::MulFOp>(op))
    return op->getOperand(0) == op->getOperand(1) ||
           (nonNegative(op->getOperand(0), depth + 1) && nonNegative(op->getOperand(1), depth + 1));
  if (isa<arith::AddFOp>(op))
    return nonNegative(op->getOperand(0), depth + 1) && nonNegative(op->getOperand(1), depth + 1);
  return positive(x, depth + 1);
}
/// Whether x > 0 (or NaN) for every input: a constant that is a normal positive f32 (1e-50 rounds
/// to 0 there, a subnormal flushes to 0 on some targets), or c + y with c such and y >= 0 (>= c
/// in round-to-nearest). (Not a product or e^y: they underflow to 0.)
bool positive(Value x, int depth) {
  if (depth > 8)
    return false;
  if (std::optional<double> c = constantOf(x))
    return static_cast<float>(*c) >= std::numeric_limits<float>::min();
  auto add = x.getDefiningOp<arith::AddFOp>();
  if (!add)
    return false;
  Value a = add.getLhs(), b = add.getRhs();
  return (positive(a, depth + 1) && nonNegative(b, depth + 1)) ||
         (nonNegative(a, depth + 1) && positive(b, depth + 1));
}

/// Whether x may be +-inf because a non-finite float constant reaches it through the float
/// operands of the ops that compute it: an -inf mask, select(c, -inf, s), and what is computed
/// from the masked logit. Where the mask holds, the tangent a product multiplies by such a value is
/// exactly 0 (the select's untaken branch; the masked logit's gradient g = P (dP - delta) with P = 0)
/// and must stay 0 (0 inf = 0, as the reference's autograd: runtime/SpecReference.cpp), where the
/// product was NaN and made the row's dq, dk and every param gradient NaN (-inf then a learned
/// temperature, s * w; or a later score_mod's s * s). Finite values that overflow are not traced
/// (the rules of exp, log and division guard their own factors).
bool reachedByInfinity(Value x, DenseMap<Value, bool> &memo) {
  // Depth first without recursion (a chain of thousands of ops: apec-long-chains.test), each
  // value once: (value, its next operand to look at).
  SmallVector<std::pair<Value, unsigned>> stack{{x, 0u}};
  while (!stack.empty()) {
    Value v = stack.back().first;
    unsigned next = stack.back().second;
    if (next == 0 && memo.count(v)) {
      stack.pop_back();
      continue;
    }
    if (next == 0) {
      if (std::optional<double> c = constantOf(v)) {
        memo[v] = !std::isfinite(*c);
        stack.pop_back();
        continue;
      }
    }
    Operation *op = v.getDefiningOp();
    bool inf = false, descended = false;
    for (; op && next < op->getNumOperands() && !inf; ++next) {
      Value o = op->getOperand(next);
      if (!isa<FloatType>(o.getType()))
        continue;
      auto it = memo.find(o);
      if (it == memo.end()) {  // its answer first; this value resumes at the same operand
        stack.back().second = next;
        stack.push_back({o, 0u});
        descended = true;
        break;
      }
      inf = it->second;
    }
    if (descended)
      continue;
    memo[v] = inf;
    stack.pop_back();
  }
  return memo.lookup(x);
}

/// Tangent arithmetic on Tan.
struct Tangents {
  RegionBuilder &rb;
  Tan add(Tan a, Tan b) {
    if (!a || !b)
      return a ? a : b;
    if (a.neg == b.neg)
      return {rb.add(a.v, b.v), a.neg};
    return a.neg ? Tan{rb.sub(b.v, a.v)} : Tan{rb.sub(a.v, b.v)};
  }
  Tan sub(Tan a, Tan b) { return add(a, neg(b)); }
  Tan mul(Tan t, Value f) { return t ? Tan{rb.mul(t.v, f), t.neg} : Tan{}; }
  Tan div(Tan t, Value f) { return t ? Tan{rb.div(t.v, f), t.neg} : Tan{}; }
  /// t·f and t/f with 0·inf = 0 and 0/0 = 0: 0 where t is exactly 0 (and, zmul's `zeroF`, where f
  /// is). For the rules whose factor can be infinite, or whose divisor 0, at finite inputs (ln,
  /// √, 1/x, e^x past its range, a^(p-1) at a = 0): a tangent that is exactly 0 there (the
  /// branch a max or min did not take, a term times a distance that is 0) stays 0, as the
  /// reference's autograd with 0·inf = 0 gives it (runtime/SpecReference.cpp), where the product
  /// was NaN and made the gradient NaN: log(max(x, 0)) wherever x <= 0, √(a n) at n = 0,
  /// 4 / (1 + e^(a n)) where e^(a n) overflows (r·db = 0·inf in the quotient rule).
  Value isZero(Value x) {
    return rb.b.create<arith::CmpFOp>(rb.loc, arith::CmpFPredicate::OEQ, x, rb.f32(0.0));
  }
  Tan zmul(Tan t, Value f, bool zeroF = false) {
    if (!t)
      return Tan{};
    Value z = isZero(t.v);
    if (zeroF)
      z = rb.b.create<arith::OrIOp>(rb.loc, z, isZero(f));
    return {rb.select(z, rb.f32(0.0), rb.mul(t.v, f)), t.neg};
  }
  Tan zdiv(Tan t, Value f) {
    if (!t || positive(f))  // (t/f with f > 0 is 0 where t is: no guard, as K-Cable's 1 + d²)
      return div(t, f);
    return {rb.select(isZero(t.v), rb.f32(0.0), rb.div(t.v, f)), t.neg};
  }
  Tan neg(Tan t) { return t ? Tan{t.v, !t.neg} : Tan{}; }
  /// The tangent as a value (its negation emitted where it carries one).
  Value value(Tan t) { return !t ? Value() : t.neg ? rb.neg(t.v) : t.v; }
  Tan select(Value c, Tan a, Tan b) {
    if (!a && !b)
      return {};
    return {rb.select(c, a ? value(a) : rb.f32(0.0), b ? value(b) : rb.f32(0.0))};
  }
};

/// The tangent of `op`'s result given its operands' tangents (`tan`), or
/// failure if the op has no derivative rule.
FailureOr<Tan> tangentOf(Operation *op, DenseMap<Value, Tan> &tan, RegionBuilder &rb,
                         DenseMap<Value, bool> &infinite) {
  Tangents t{rb};
  auto T = [&](unsigned i) { return tan.lookup(op->getOperand(i)); };
  auto X = [&](unsigned i) { return op->getOperand(i); };
  OpBuilder &b = rb.b;
  Location loc = rb.loc;
  Value r = op->getNumResults() == 1 ? op->getResult(0) : Value();
  if (!r || !r.getType().isF32())
    return Tan{};  // index / integer / i1 values carry no tangent
  if (isa<arith::ConstantOp, ConstantOp, math::FloorOp, math::CeilOp, math::RoundOp, math::TruncOp,
          arith::SIToFPOp, arith::UIToFPOp, LoadOp>(op))
    return Tan{};  // constants, steps, integer conversions; loads are seeded by the caller
  if (isa<arith::AddFOp>(op))  // d(a+b) = da + db
    return t.add(T(0), T(1));
  if (isa<arith::SubFOp>(op))  // d(a-b) = da - db
    return t.sub(T(0), T(1));
  if (isa<arith::MulFOp>(op)) {  // d(ab) = da·b + a·db
    // (0·inf = 0 where a factor may be infinite: reachedByInfinity)
    auto times = [&](Tan d, Value f) { return reachedByInfinity(f, infinite) ? t.zmul(d, f) : t.mul(d, f); };
    return t.add(times(T(0), X(1)), times(T(1), X(0)));
  }
  if (isa<arith::DivFOp>(op)) {  // d(a/b) = da/b - r·(db/b)
    // db/b before the product: where b is large, db often is too (b = 1 + e^x: db = e^x dx), and
    // r·db overflowed first ((da - r·db)/b: 4/(1 + e^86) in f32 gave -inf for about -1e-35).
    Tan rq = t.zmul(t.zdiv(T(1), X(1)), r, /*zeroF=*/true);
    return t.sub(t.zdiv(T(0), X(1)), rq);
  }
  if (isa<arith::NegFOp>(op))
    return t.neg(T(0));
  if (isa<arith::MaximumFOp, arith::MaxNumFOp, arith::MinimumFOp, arith::MinNumFOp>(op) &&
      !T(0) && !T(1))
    return Tan{};
  // maxnumf / minnumf take the number where one operand is NaN, so the derivative is that
  // operand's: a's where b is NaN (the comparison alone, false on NaN, took b's).
  auto numberA = [&](Value c) {
    if (!isa<arith::MaxNumFOp, arith::MinNumFOp>(op))
      return c;
    Value bNaN = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::UNO, X(1), X(1));
    return b.create<arith::OrIOp>(loc, c, bNaN).getResult();
  };
  if (isa<arith::MaximumFOp, arith::MaxNumFOp>(op)) {  // d max(a,b) = a >= b ? da : db
    Value c = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGE, X(0), X(1));
    return t.select(numberA(c), T(0), T(1));
  }
  // Ties follow one convention: a == b is treated as a slightly larger, as for
  // |x| at 0 (sign +1). Then kinks that cancel in a smooth function (log σ(x) =
  // min(x, 0) - log1p(exp(-|x|))) also cancel in its derivative.
  if (isa<arith::MinimumFOp, arith::MinNumFOp>(op)) {  // d min(a,b) = a < b ? da : db
    Value c = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OLT, X(0), X(1));
    return t.select(numberA(c), T(0), T(1));
  }
  if (isa<arith::SelectOp>(op))
    return t.select(X(0), T(1), T(2));
  if (isa<math::ExpOp>(op))  // d e^a = e^a·da
    return t.zmul(T(0), r);
  if (isa<math::LogOp>(op))  // d ln a = da/a
    return t.zdiv(T(0), X(0));
  if (isa<math::Exp2Op>(op))  // d 2^a = 2^a·ln 2·da
    return T(0) ? t.mul(t.zmul(T(0), r), rb.f32(M_LN2)) : Tan{};
  if (isa<math::Log2Op>(op))  // d log2 a = da/(a·ln 2)
    return T(0) ? t.zdiv(T(0), rb.mul(X(0), rb.f32(M_LN2))) : Tan{};
  if (isa<math::Log1pOp>(op)) {  // d ln(1+a) = da/(1+a)
    if (!T(0))
      return Tan{};
    Value one = rb.f32(1.0);
    return t.zdiv(T(0), rb.add(one, X(0)));
  }
  if (isa<math::SqrtOp>(op)) {  // d √a = da/(2√a)
    if (!T(0))
      return Tan{};
    Value two = rb.f32(2.0);
    return t.zdiv(T(0), rb.mul(two, r));
  }
  if (!T(0) && isa<math::SinOp, math::CosOp, math::TanhOp, math::AbsFOp>(op))
    return Tan{};
  if (isa<math::SinOp>(op))  // d sin a = cos a·da
    return t.mul(T(0), b.create<math::CosOp>(loc, X(0)));
  if (isa<math::CosOp>(op))  // d cos a = -sin a·da
    return t.neg(t.mul(T(0), b.create<math::SinOp>(loc, X(0))));
  if (isa<math::TanhOp>(op)) {  // d tanh a = (1 - r²)·da
    Value one = rb.f32(1.0);
    return t.mul(T(0), rb.sub(one, rb.mul(r, r)));
  }
  if (isa<math::AbsFOp>(op)) {  // d|a| = sign(a)·da
    Value zero = rb.f32(0.0);
    Value c = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGE, X(0), zero);
    return t.select(c, T(0), t.neg(T(0)));
  }
  if (isa<math::PowFOp>(op)) {
    // d a^p = p·a^(p-1)·da + a^p·ln a·dp, as torch.pow's gradients: the first 0 where p = 0, the
    // second 0 where a = 0 and p >= 0 (r·(p·da/a + ln a·dp) is NaN at a = 0: 0·inf, 0/0).
    Value zero = rb.f32(0.0);
    Tan da;
    if (T(0)) {
      Value pm1 = rb.sub(X(1), rb.f32(1.0));
      Value c = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OEQ, X(1), zero);
      da = t.select(c, Tan{}, t.zmul(T(0), rb.mul(X(1), b.create<math::PowFOp>(loc, X(0), pm1))));
    }
    Tan dp;
    if (T(1)) {
      Value base0 = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OEQ, X(0), zero);
      Value pnn = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGE, X(1), zero);
      Value c = b.create<arith::AndIOp>(loc, base0, pnn);
      dp = t.select(c, Tan{}, t.mul(T(1), rb.mul(r, b.create<math::LogOp>(loc, X(0)))));
    }
    return t.add(da, dp);
  }
  return failure();
}

/// Common subexpressions of a straight-line block merged: the inputs' tangents are built one
/// input at a time, so ops that two of them share (the same product, or the same chain up to a
/// sign: Tan) appear once per input until here.
void mergeCommonOps(Block &block) {
  struct Key : DenseMapInfo<Operation *> {
    static unsigned getHashValue(const Operation *op) {
      return OperationEquivalence::computeHash(const_cast<Operation *>(op), OperationEquivalence::directHashValue,
                                               OperationEquivalence::ignoreHashValue,
                                               OperationEquivalence::IgnoreLocations);
    }
    static bool isEqual(const Operation *a, const Operation *b) {
      if (a == b)
        return true;
      if (a == getEmptyKey() || a == getTombstoneKey() || b == getEmptyKey() || b == getTombstoneKey())
        return false;
      return OperationEquivalence::isEquivalentTo(const_cast<Operation *>(a), const_cast<Operation *>(b),
                                                  OperationEquivalence::IgnoreLocations);
    }
  };
  DenseSet<Operation *, Key> seen;
  for (Operation &inner : llvm::make_early_inc_range(block.without_terminator())) {
    if (inner.getNumRegions() != 0 || inner.getNumResults() == 0 || !isMemoryEffectFree(&inner))
      continue;
    auto [it, fresh] = seen.insert(&inner);
    if (fresh)
      continue;
    inner.replaceAllUsesWith(*it);
    inner.erase();
  }
}

/// Whether `v` is a load of a param that is not trainable (no gradient wanted).
bool isFixedParamLoad(Value v) {
  auto load = v.getDefiningOp<LoadOp>();
  if (!load)
    return false;
  auto param = load.getSource().getDefiningOp<ParamOp>();
  return param && !param.getTrainable();
}

/// Builds `grad` for a region op. `numValueArgs` leading block arguments are
/// differentiable inputs; the grad block takes the body's arguments plus g and
/// yields g·∂f/∂(value arg k) for each, then g·∂f/∂(load k) for each load.
LogicalResult differentiateRegion(Operation *op, Region &body, Region &grad,
                                  unsigned numValueArgs) {
  if (!grad.empty())
    grad.getBlocks().clear();
  OpBuilder b(op->getContext());
  Block &src = body.front();
  Location loc = op->getLoc();
  SmallVector<Type> argTypes(src.getArgumentTypes());
  argTypes.push_back(b.getF32Type());
  Block *block = createRegionBlock(b, grad, argTypes, loc);
  RegionBuilder rb{b, loc};
  Value g = block->getArguments().back();

  // Primal recomputation.
  IRMapping map;
  map.map(src.getArguments(), block->getArguments().take_front(src.getNumArguments()));
  SmallVector<Operation *> primal;
  for (Operation &inner : src.without_terminator())
    primal.push_back(b.clone(inner, map));
  Value out = map.lookup(src.getTerminator()->getOperand(0));

  SmallVector<Value> inputs;
  for (unsigned k = 0; k < numValueArgs; ++k)
    inputs.push_back(block->getArgument(k));
  for (Operation *p : primal)
    if (isa<LoadOp>(p))
      inputs.push_back(p->getResult(0));

  // Each input's tangent is propagated through its forward cone only (the primal ops that
  // use it, transitively), in program order: ops outside the cone have no tangent and emit
  // nothing. Visiting every primal op for every input made the pass quadratic in the region
  // (FIRE: every weight is a load).
  //
  // The sum tree. A fused score is s + g_1 + ... + g_n, a chain of additions, and a component
  // sums its own terms (FIRE's hidden units) the same way. A value whose only use is an addf
  // whose result is again such a value, up to the region's result, is on the sum tree: its
  // tangent reaches the result through additions alone. Along it, d(a + b) = da + db emits
  // an op only where both sides carry a tangent of the input; while one tangent is live it
  // passes through unchanged. So the cone walk stops where it enters the tree (the entries),
  // and the tree is walked only while two or more of the input's tangents still meet
  // further up. Every input then costs its own component, not the length of the chain: the
  // pass is linear in the number of components. The ops emitted, and so the gradient, are
  // exactly those of the full walk.
  DenseMap<Operation *, unsigned> position;
  for (auto [k, p] : llvm::enumerate(primal))
    position[p] = k;
  auto primalUsers = [&](Value v) {
    SmallVector<Operation *, 2> users;
    for (Operation *user : v.getUsers())
      if (position.count(user))  // tangent ops built so far are not primal
        users.push_back(user);
    return users;
  };
  DenseSet<Value> onTree;
  auto treeUser = [&](Value v) -> Operation * {  // the addf a tree value feeds, if any
    auto users = primalUsers(v);
    return users.size() == 1 && isa<arith::AddFOp>(users[0]) ? users[0] : nullptr;
  };
  if (out.getType().isF32())
    onTree.insert(out);
  for (Operation *p : llvm::reverse(primal))
    for (Value r : p->getResults())
      if (Operation *user = treeUser(r); user && onTree.contains(user->getResult(0)))
        onTree.insert(r);
  for (Value arg : block->getArguments().take_front(numValueArgs))
    if (Operation *user = treeUser(arg); user && onTree.contains(user->getResult(0)))
      onTree.insert(arg);

  SmallVector<Value> results;
  // Forward mode walks each input's cone once: the ops it emits are the cones' sizes summed, which
  // a chain of products of many loads makes quadratic (3,000 loads of one running product, 9,000
  // ops, took minutes and gigabytes here). Past kMaxTangentOps the region is refused, said so.
  constexpr size_t kMaxTangentOps = 200000;
  size_t tangentOps = 0;
  DenseMap<Value, bool> infinite;  // reachedByInfinity's answers
  for (Value u : inputs) {
    if (isFixedParamLoad(u)) {  // a fixed param gets no gradient
      results.push_back(rb.f32(0.0));
      continue;
    }
    // The cone of u below the sum tree, and the tree values it reaches (entries).
    SmallVector<unsigned> cone;
    SmallVector<Value> entries;
    DenseSet<Operation *> seen;
    SmallVector<Value> work;
    if (onTree.contains(u))
      entries.push_back(u);
    else
      work.push_back(u);
    while (!work.empty()) {
      Value v = work.pop_back_val();
      for (Operation *user : primalUsers(v)) {
        if (!seen.insert(user).second)
          continue;
        cone.push_back(position.lookup(user));
        for (Value r : user->getResults())
          (onTree.contains(r) ? entries : work).push_back(r);
      }
    }
    llvm::sort(cone);
    tangentOps += cone.size();
    if (tangentOps > kMaxTangentOps)
      return op->emitOpError() << "is too large to differentiate: its " << inputs.size()
                               << " differentiable inputs reach more than " << kMaxTangentOps
                               << " ops between them (forward-mode tangents walk each input's "
                                  "uses; a long chain of products of loads grows as its square)";
    DenseMap<Value, Tan> tan;
    Value one = rb.f32(1.0);
    tan[u] = Tan{one};
    for (unsigned k : cone) {
      Operation *p = primal[k];
      if (p->getNumResults() != 1 || p->getResult(0) == u)
        continue;
      Operation *last = block->empty() ? nullptr : &block->back();
      FailureOr<Tan> d = tangentOf(p, tan, rb, infinite);
      // The ops of p's derivative take p's fast-math flags (-ape-fast-math): d log1p(a) =
      // da/(1+a) divides where p's flags allow an approximate function.
      if (arith::FastMathFlags flags = fastMathFlags(p); flags != arith::FastMathFlags::none)
        for (Operation &made : llvm::make_range(last ? std::next(last->getIterator()) : block->begin(),
                                                block->end()))
          addFastMathFlags(&made, flags);
      if (failed(d))
        return p->emitOpError("has no derivative rule: -ape-differentiate cannot derive the "
                              "backward of this region (use arith/math ops it knows: addf, subf, "
                              "mulf, divf, negf, maximumf, minimumf, maxnumf, minnumf, select, "
                              "exp, exp2, log, log2, log1p, sqrt, sin, cos, tanh, absf, powf; "
                              "floor, ceil, round, trunc and the integer-to-float conversions "
                              "are steps, with no gradient)");
      if (*d)
        tan[p->getResult(0)] = *d;
    }
    // Up the sum tree: the additions where two live tangents meet, in program order, until
    // one tangent is left (it passes through the rest unchanged).
    DenseSet<Value> live;
    for (Value e : entries)
      if (tan.lookup(e))
        live.insert(e);
    std::vector<std::pair<unsigned, Operation *>> heap;  // min-heap of pending additions
    auto later = [](const auto &x, const auto &y) { return x.first > y.first; };
    DenseSet<Operation *> queued;
    auto enqueue = [&](Value v) {
      if (v == out)
        return;
      Operation *user = treeUser(v);
      if (queued.insert(user).second) {
        heap.emplace_back(position.lookup(user), user);
        std::push_heap(heap.begin(), heap.end(), later);
      }
    };
    for (Value v : live)
      enqueue(v);
    while (live.size() > 1 && !heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), later);
      Operation *add = heap.back().second;
      heap.pop_back();
      Value lhs = add->getOperand(0), rhs = add->getOperand(1), sum = add->getResult(0);
      tan[sum] = Tangents{rb}.add(tan.lookup(lhs), tan.lookup(rhs));
      live.erase(lhs);
      live.erase(rhs);
      live.insert(sum);
      enqueue(sum);
    }
    Tan d = live.size() == 1 ? tan.lookup(*live.begin()) : tan.lookup(out);
    // g·1 = g written directly: the greedy folder would otherwise replace the yield's operands
    // one at a time, re-folding a yield of every input's gradient each time (quadratic).
    // (g is exactly 0 at a masked logit, where ∂f/∂u may be infinite: 0 there, not NaN)
    Value gd = !d            ? rb.f32(0.0)
               : d.v == one ? g
               : reachedByInfinity(d.v, infinite)
                   ? rb.select(Tangents{rb}.isZero(g), rb.f32(0.0), rb.mul(g, d.v))
                   : rb.mul(g, d.v);
    results.push_back(d.neg ? rb.neg(gd) : gd);
  }
  rb.yield(results);
  // Fold the constants of the chain rule (g·1, 0 + x) and drop dead primal ops; the constant
  // arithmetic first in double (the derivative 1/3 of s / 3.0 as the float 0.333333343 made an
  // fp64 kernel's gradient disagree with its own forward).
  (void)foldConstantsExactly(grad);
  MLIRContext *ctx = op->getContext();
  RewritePatternSet patterns(ctx);
  for (RegisteredOperationName name : ctx->getRegisteredOperations())
    name.getCanonicalizationPatterns(patterns, ctx);
  (void)applyPatternsAndFoldGreedily(grad, std::move(patterns));
  mergeCommonOps(grad.front());
  return success();
}

struct ApeDifferentiatePass : public mlir::ape::impl::ApeDifferentiateBase<ApeDifferentiatePass> {
  void runOnOperation() override {
    if (failed(checkTopLevel(getOperation())))
      return signalPassFailure();
    auto result = getOperation().walk([&](Operation *op) -> WalkResult {
      // The regions of a kernel only: an encoding's are composed by -ape-fuse first (a grad
      // derived before would be moved with one mod and lost with a composed one).
      if (isa<MapOp, QModOp, KModOp, ScoreModOp>(op) && !op->getParentOfType<KernelOp>()) {
        op->emitOpError("is not in an ape.kernel: run -ape-fuse before -ape-differentiate");
        return WalkResult::interrupt();
      }
      // An inference-only kernel (an attention transition, which has no derivative) gets no
      // backward at all.
      if (auto kernel = op->getParentOfType<KernelOp>(); kernel && kernel.getInferenceOnly())
        return WalkResult::advance();
      if (auto map = dyn_cast<MapOp>(op)) {  // the verifier keeps loads out of maps
        return failed(differentiateRegion(op, map.getBody(), map.getGrad(), 1))
                   ? WalkResult::interrupt() : WalkResult::advance();
      }
      if (isa<QModOp, KModOp>(op)) {
        return failed(differentiateRegion(op, op->getRegion(0), op->getRegion(1), 2))
                   ? WalkResult::interrupt() : WalkResult::advance();
      }
      if (auto score = dyn_cast<ScoreModOp>(op)) {
        return failed(differentiateRegion(op, score.getBody(), score.getGrad(), 1))
                   ? WalkResult::interrupt() : WalkResult::advance();
      }
      return WalkResult::advance();
    });
    if (result.wasInterrupted())
      signalPassFailure();
  }
};

} // namespace
