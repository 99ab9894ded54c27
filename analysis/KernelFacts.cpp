//===- KernelFacts.cpp - the analyses behind the kernels' fast paths ------===//
#include "analysis/KernelFacts.h"

#include "mlir/Dialect/Arith/IR/Arith.h"

#include <functional>
#include <map>

using namespace mlir;
using namespace mlir::ape;

namespace {

/// Which of a region's index arguments a value reads, transitively: bit 0 the query position i,
/// bit 1 the key position j, bit 2 the logit s (arguments 3, 4 and 0 of a score mod region).
/// The value of f at `root`, memoised over root's def-use cone, without recursion: after fusion a
/// kernel's region chains every mod of a spec, each up to 10,000 ops (the verifier's bound), and a
/// recursive walk of a chain of some 40,000 overflowed the stack (twelve fused score mods of 9,990
/// ops: SIGSEGV in apec and ape-opt). `leaf(v, out)` sets v's value and returns true where it needs
/// no operand's; otherwise `combine(v, def)` computes it from the memo entries of the operands of
/// v's defining op, each visited first.
template <class T, class Leaf, class Combine>
T walkCone(Value root, DenseMap<Value, T> &memo, Leaf leaf, Combine combine) {
  SmallVector<std::pair<Value, unsigned>> stack;  // a value and its next operand to visit
  auto enter = [&](Value v) {
    if (memo.count(v))
      return;
    T out{};
    if (leaf(v, out))
      memo[v] = std::move(out);
    else
      stack.push_back({v, 0u});
  };
  enter(root);
  while (!stack.empty()) {
    const Value v = stack.back().first;
    Operation *def = v.getDefiningOp();  // (a block argument is a leaf)
    if (const unsigned next = stack.back().second; next < def->getNumOperands()) {
      stack.back().second = next + 1;
      enter(def->getOperand(next));
      continue;
    }
    T out = combine(v, def);
    stack.pop_back();
    memo[v] = std::move(out);
  }
  return memo.find(root)->second;
}

unsigned readsOf(Value v, Block &block, DenseMap<Value, unsigned> &memo) {
  return walkCone<unsigned>(
      v, memo,
      [&](Value x, unsigned &out) {
        auto arg = dyn_cast<BlockArgument>(x);
        if (!arg)
          return false;
        out = arg.getOwner() != &block ? 0u
              : arg.getArgNumber() == 3 ? 1u
              : arg.getArgNumber() == 4 ? 2u
              : arg.getArgNumber() == 0 ? 4u
                                        : 0u;
        return true;
      },
      [&](Value, Operation *def) {
        unsigned r = 0;
        for (Value operand : def->getOperands())
          r |= memo.find(operand)->second;
        return r;
      });
}

/// The chain `(s ± X1) ± X2 ...` from the logit to the yield of a score mod's body (fused biases),
/// each value of the chain used once, the chain on the left of a subtraction (`s - X`, as a spec
/// writes a penalty): the X in order, each with its sign (true: subtracted); none when the body is
/// not of that form.
std::optional<SmallVector<std::pair<Value, bool>>> biasChain(Block &b) {
  Value v = b.getArgument(0);
  Operation *yield = b.getTerminator();
  SmallVector<std::pair<Value, bool>> biases;
  while (v != yield->getOperand(0)) {
    if (!v.hasOneUse())
      return std::nullopt;
    Operation *user = *v.getUsers().begin();
    if (auto add = dyn_cast<arith::AddFOp>(user)) {
      if (add.getLhs() == add.getRhs())
        return std::nullopt;
      biases.push_back({add.getLhs() == v ? add.getRhs() : add.getLhs(), false});
    } else if (auto sub = dyn_cast<arith::SubFOp>(user)) {
      if (sub.getLhs() != v || sub.getRhs() == v)
        return std::nullopt;
      biases.push_back({sub.getRhs(), true});
    } else {
      return std::nullopt;
    }
    v = user->getResult(0);
  }
  if (!v.hasOneUse() || v == b.getArgument(0))
    return std::nullopt;
  return biases;
}

/// A grad region that passes dS through unchanged (d(s + X)/ds = 1) and does not read the logit.
bool passesGradientThrough(Block &gb) {
  return gb.getArgument(0).use_empty() && gb.getTerminator()->getOperand(0) == gb.getArgument(5);
}

} // namespace

bool mlir::ape::isLinearMod(Operation *mod) {
  if (!mod)
    return false;
  Block &b = mod->getRegion(0).front();
  enum Kind { kCoef, kLinear, kOther };
  DenseMap<Value, Kind> kind;
  kind[b.getArgument(0)] = kind[b.getArgument(1)] = kLinear;           // x, y
  kind[b.getArgument(2)] = kind[b.getArgument(3)] = kCoef;             // c, t
  kind[b.getArgument(4)] = kOther;                                     // h: per head
  auto of = [&](Value v) { return kind.lookup(v); };                   // absent: kCoef
  for (Operation &op : b.without_terminator()) {
    if (op.getNumResults() != 1)
      return false;
    Kind k = kCoef;
    const bool anyLinear = llvm::any_of(op.getOperands(), [&](Value v) { return of(v) == kLinear; });
    if (llvm::any_of(op.getOperands(), [&](Value v) { return of(v) == kOther; }))
      k = kOther;
    else if (auto load = dyn_cast<LoadOp>(op)) {  // a param is the call's; token sequences a slice's
      // A trainable param's gradient comes from the mod's grad region: not tabulated.
      auto param = load.getSource().getDefiningOp<ParamOp>();
      k = param && !param.getTrainable() && !anyLinear ? kCoef : kOther;
    }
    else if (!anyLinear)
      k = kCoef;
    else if (isa<arith::MulFOp>(op))
      k = of(op.getOperand(0)) == kCoef || of(op.getOperand(1)) == kCoef ? kLinear : kOther;
    else if (isa<arith::DivFOp>(op))
      k = of(op.getOperand(1)) == kCoef ? kLinear : kOther;
    else if (isa<arith::AddFOp, arith::SubFOp>(op))
      k = of(op.getOperand(0)) == kLinear && of(op.getOperand(1)) == kLinear ? kLinear : kOther;
    else if (isa<arith::NegFOp>(op))
      k = kLinear;
    else if (auto sel = dyn_cast<arith::SelectOp>(op))
      k = of(sel.getCondition()) == kCoef && of(sel.getTrueValue()) == kLinear &&
                  of(sel.getFalseValue()) == kLinear
              ? kLinear
              : kOther;
    else
      k = kOther;
    kind[op.getResult(0)] = k;
  }
  Operation *yield = b.getTerminator();
  return yield->getNumOperands() == 1 && of(yield->getOperand(0)) == kLinear;
}

bool mlir::ape::isDistanceBias(ScoreModOp mod) {
  auto onlyThroughDifference = [](Block &b) {
    Value i = b.getArgument(3), j = b.getArgument(4);
    for (Value x : {i, j})
      for (Operation *user : x.getUsers()) {
        auto sub = dyn_cast<arith::SubIOp>(user);
        if (!sub || sub.getLhs() != i || sub.getRhs() != j)
          return false;
      }
    return true;
  };
  Block &b = mod.getBody().front();
  const bool hasGrad = !mod.getGrad().empty();  // none in an inference-only kernel
  if (!onlyThroughDifference(b) || (hasGrad && !onlyThroughDifference(mod.getGrad().front())))
    return false;
  // body: the logit flows to the yield through a chain of additions and subtractions
  // `(s + X1) - X2 ...` (fused biases), the X free of s (they cannot read it otherwise); grad: dS
  // passes through.
  if (!biasChain(b))
    return false;
  return !hasGrad || passesGradientThrough(mod.getGrad().front());
}

std::optional<RowColBias> mlir::ape::rowColBias(ScoreModOp mod) {
  // Only the backward uses the split: none without a grad region (an inference-only kernel).
  if (!mod || mod.getGrad().empty() || isDistanceBias(mod))
    return std::nullopt;
  Block &b = mod.getBody().front(), &gb = mod.getGrad().front();
  std::optional<SmallVector<std::pair<Value, bool>>> biases = biasChain(b);
  if (!biases || !passesGradientThrough(gb))
    return std::nullopt;
  RowColBias rc;
  DenseMap<Value, unsigned> memo, gmemo;
  bool ok = true;
  // The terms of a sum, one per path through its adds: a shared term is visited once per path,
  // 2^n times for n adds of a value to itself. Past kMaxTerms visits the mod is not taken for a
  // row/column bias (the general path computes it): a spec of 30 such adds took 8.5 GB here.
  constexpr unsigned kMaxTerms = 4096;
  unsigned visits = 0;
  std::function<void(Value, bool)> split = [&](Value x, bool neg) {
    if (!ok || ++visits > kMaxTerms) {
      ok = false;
      return;
    }
    if (auto add = x.getDefiningOp<arith::AddFOp>()) {
      split(add.getLhs(), neg);
      split(add.getRhs(), neg);
      return;
    }
    if (auto sub = x.getDefiningOp<arith::SubFOp>()) {
      split(sub.getLhs(), neg);
      split(sub.getRhs(), !neg);
      return;
    }
    if (auto n = x.getDefiningOp<arith::NegFOp>()) {
      split(n.getOperand(), !neg);
      return;
    }
    unsigned r = readsOf(x, b, memo);
    if ((r & 4) || r == 3)
      ok = false;
    else
      (r == 2 ? rc.colTerms : rc.rowTerms).push_back({x, neg});
  };
  for (auto [x, neg] : *biases)
    split(x, neg);
  if (!ok || rc.colTerms.empty() || rc.rowTerms.empty())
    return std::nullopt;
  // Loads: the side of the load's own indices and of its gradient, together.
  auto grads = gb.getTerminator()->getOperands().drop_front(1);
  unsigned k = 0;
  b.walk([&](LoadOp load) {
    Value g = k < grads.size() ? grads[k] : Value();
    ++k;
    if (!g) {
      ok = false;
      return;
    }
    unsigned r = readsOf(load.getResult(), b, memo) | readsOf(g, gb, gmemo);
    if ((r & 4) || r == 3)
      ok = false;
    rc.loadIsRow.push_back(r != 2);
    (r != 2 ? rc.rowGrads : rc.colGrads).push_back(g);
  });
  if (!ok || k != grads.size())
    return std::nullopt;
  return rc;
}

bool mlir::ape::readsSequenceLength(Operation *op) {
  bool reads = false;
  if (op)
    op->walk([&](DimOp d) { reads |= d.getWhich() == abi::DimWhich::SeqLen; });
  return reads;
}

std::optional<StringRef> mlir::ape::scoreBiasKind(KernelOp kernel) {
  Block &body = kernel.getBody().front();
  ValueRowsOp valueRows;
  for (ValueRowsOp v : body.getOps<ValueRowsOp>())
    valueRows = v;
  for (ScoreModOp mod : body.getOps<ScoreModOp>()) {
    if (isDistanceBias(mod))
      return StringRef("distance");
    if (rowColBias(mod))
      return StringRef("row_col");
    if (scoreFeatures(mod, valueRows))
      return StringRef("features");
  }
  return std::nullopt;
}

namespace {
/// What an index value of a region reads, transitively (bits below): the distance d is the value
/// of `arith.subi %i, %j` and reads nothing else.
enum Reads : unsigned { kI = 1, kJ = 2, kD = 4, kSlice = 8, kOther = 16 };
unsigned featureReads(Value v, Value i, Value j, Block &block, DenseMap<Value, unsigned> &memo) {
  return walkCone<unsigned>(
      v, memo,
      [&](Value x, unsigned &out) {
        if (x == i)
          out = kI;
        else if (x == j)
          out = kJ;
        else if (auto arg = dyn_cast<BlockArgument>(x))
          out = arg.getOwner() == &block ? kOther : 0u;  // (b, h: the callers bind them as kSlice)
        else if (auto sub = x.getDefiningOp<arith::SubIOp>(); sub && sub.getLhs() == i && sub.getRhs() == j)
          out = kD;
        else
          return false;
        return true;
      },
      [&](Value, Operation *def) {
        unsigned r = isa<LoadOp>(def) ? unsigned(kOther) : 0u;  // an index read from memory
        for (Value operand : def->getOperands())
          r |= memo.find(operand)->second;
        return r;
      });
}
/// A structural key of a region value (ops, attributes, block arguments by number), equal for the
/// same computation in the body and the grad region. An operand appears in its user's key by the
/// number of its own key (`ids`, shared by the regions compared), so a key's length is its op's,
/// not its whole cone's (that doubled per level of a DAG: x2 = x1 + x1, ... took 9 GB at 24).
std::string structuralKey(Value v, DenseMap<Value, std::string> &memo, std::map<std::string, unsigned> &ids) {
  return walkCone<std::string>(
      v, memo,
      [&](Value x, std::string &out) {
        auto arg = dyn_cast<BlockArgument>(x);
        if (!arg)
          return false;
        out = "a" + std::to_string(arg.getArgNumber());
        return true;
      },
      [&](Value x, Operation *def) {
        std::string key;
        llvm::raw_string_ostream os(key);
        os << def->getName() << "#" << cast<OpResult>(x).getResultNumber() << def->getAttrDictionary() << "(";
        for (Value operand : def->getOperands())
          os << "k" << ids.try_emplace(memo.find(operand)->second, static_cast<unsigned>(ids.size())).first->second
             << ",";
        os << ")";
        return key;
      });
}
} // namespace

std::optional<ScoreFeatures> mlir::ape::scoreFeatures(ScoreModOp mod, ValueRowsOp valueRows) {
  if (!mod || mod.getGrad().empty() || isDistanceBias(mod) || rowColBias(mod))
    return std::nullopt;
  ScoreFeatures sf;
  std::map<std::pair<void *, std::string>, unsigned> byKey;
  std::map<std::string, unsigned> keyIds;  // structuralKey's numbers, the same in both regions
  bool ok = true;
  unsigned slots[3] = {0, 0, 0};
  for (Region *region : {&mod.getBody(), &mod.getGrad()}) {
    Block &b = region->front();
    Value i = b.getArgument(3), j = b.getArgument(4);
    DenseMap<Value, unsigned> memo;
    memo[b.getArgument(1)] = memo[b.getArgument(2)] = kSlice;  // b, h
    DenseMap<Value, std::string> keys;
    b.walk([&](LoadOp load) {
      unsigned all = 0;
      std::string key;
      for (Value x : load.getIndices()) {
        const unsigned r = featureReads(x, i, j, b, memo);
        // A component that reads d reads nothing else (one saturation point per call).
        if ((r & kOther) || ((r & kD) && (r & ~kD)))
          ok = false;
        all |= r;
        key += structuralKey(x, keys, keyIds) + ";";
      }
      if ((all & kI) && (all & kJ))
        ok = false;
      if (!ok)
        return;
      const ScoreFeatures::Side side = (all & kI) ? ScoreFeatures::kRow
                                       : (all & kJ) ? ScoreFeatures::kCol
                                                    : ScoreFeatures::kSlice;
      auto [it, fresh] = byKey.try_emplace({load.getSource().getAsOpaquePointer(), key},
                                           static_cast<unsigned>(sf.features.size()));
      if (fresh)
        sf.features.push_back({load, side, slots[side]++, (all & kD) != 0});
      sf.featureOf[load] = it->second;
    });
  }
  if (!ok || sf.features.empty() || slots[0] > ScoreFeatures::kMaxFeatures ||
      slots[1] > ScoreFeatures::kMaxFeatures || slots[2] > ScoreFeatures::kMaxFeatures)
    return std::nullopt;
  if (valueRows) {  // its row index: of d and constants only
    Block &vb = valueRows.getIndex().front();
    DenseMap<Value, unsigned> memo;
    const unsigned r = featureReads(vb.getTerminator()->getOperand(0), vb.getArgument(2),
                                    vb.getArgument(3), vb, memo);
    if (r & ~kD)
      return std::nullopt;
  }
  return sf;
}
