//===- RegionWriter.cpp - ape.kernel regions as C++ statements -----------===//
#include "codegen/RegionWriter.h"

#include "analysis/KernelFacts.h"
#include "dialect/RegionTypes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>
#include <cstdint>
#include <limits>

using namespace mlir;
using namespace mlir::ape;
using namespace mlir::ape::codegen;

LogicalResult KernelLayout::build(KernelOp kernel) {
  inferenceOnly = kernel.getInferenceOnly();
  for (Operation &op : kernel.getBody().front()) {
    if (auto f = dyn_cast<TokenFeatureOp>(op)) {
      featureIndex[f] = features.size();
      features.push_back(f);
    }
    if (isa<TokenFeatureOp, MapOp, ScanOp>(op)) {
      tokSlot[op.getResult(0)] = tokSlot.size();
      tokenProgram.push_back(&op);
    } else if (auto p = dyn_cast<ParamOp>(op)) {
      paramIndex[p] = params.size();
      params.push_back(p);
    } else if (auto q = dyn_cast<QModOp>(op)) {
      qmod = q;
    } else if (auto k = dyn_cast<KModOp>(op)) {
      kmod = k;
    } else if (auto s = dyn_cast<ScoreModOp>(op)) {
      score = s;
    } else if (auto e = dyn_cast<PositionEmbeddingOp>(op)) {
      embedding = e;
    } else if (auto r = dyn_cast<RelRowsOp>(op)) {
      relIndex[r] = rels.size();
      rels.push_back(r);
    } else if (auto t = dyn_cast<AttentionTransitionOp>(op)) {
      transition = t;
    } else if (auto v = dyn_cast<ValueRowsOp>(op)) {
      if (valueRows)
        return v.emitOpError("a kernel takes at most one ape.value_rows");
      valueRows = v;
    }
  }
  if (inferenceOnly)  // forward only: -ape-differentiate derives nothing for it
    return success();
  for (Operation *op : {qmod.getOperation(), kmod.getOperation(), score.getOperation()})
    if (op && op->getRegion(1).empty())
      return op->emitOpError("has no grad region: run -ape-differentiate before emitting");
  for (Operation *op : tokenProgram)
    if (auto m = dyn_cast<MapOp>(op); m && m.getGrad().empty())
      return m.emitOpError("has no grad region: run -ape-differentiate before emitting");
  return success();
}

LogicalResult KernelLayout::checkFacts(KernelOp kernel) const {
  auto claim = [&](bool recorded, bool holds, StringRef what) -> LogicalResult {
    if (!recorded || holds)
      return success();
    return kernel.emitOpError("claims ") << what << ", which its regions do not satisfy "
                                         << "(run -ape-classify to record the facts that hold)";
  };
  std::optional<StringRef> bias = kernel.getScoreBias();
  return success(
      succeeded(claim(kernel.getQModLinear(), isLinearMod(qmod), "q_mod_linear")) &&
      succeeded(claim(kernel.getKModLinear(), isLinearMod(kmod), "k_mod_linear")) &&
      succeeded(claim(kernel.getKModReadsLength(), readsSequenceLength(kmod),
                      "k_mod_reads_length")) &&
      succeeded(claim(kernel.getTokensReadLength(),
                      llvm::any_of(tokenProgram, readsSequenceLength), "tokens_read_length")) &&
      succeeded(claim(bias == "distance", score && isDistanceBias(score),
                      "score_bias = \"distance\"")) &&
      succeeded(claim(bias == "row_col", score && rowColBias(score).has_value(),
                      "score_bias = \"row_col\"")) &&
      succeeded(claim(bias == "features", score && scoreFeatures(score, valueRows).has_value(),
                      "score_bias = \"features\"")));
}

std::string codegen::floatLiteral(double v) {
  if (std::isnan(v))
    return "std::numeric_limits<T>::quiet_NaN()";
  if (std::isinf(v))
    return v > 0 ? "std::numeric_limits<T>::infinity()" : "(-std::numeric_limits<T>::infinity())";
  return llvm::formatv("T({0:e17})", v).str();
}

std::string codegen::dimExpr(const abi::Dim &d, StringRef heads, StringRef headDim) {
  if (d.is(abi::Dim::Kind::Heads))
    return heads.str();
  return d.is(abi::Dim::Kind::HeadDim) ? headDim.str() : std::to_string(d.value);
}

std::string codegen::cType(Type t) {
  if (t.isF32() || t.isF64() || t.isF16() || t.isBF16())
    return "T";
  if (t.isInteger(1))
    return "bool";
  return "int64_t";
}

FailureOr<SmallVector<std::string>> RegionWriter::emitBody(Block &block) {
  for (Operation &op : block.without_terminator()) {
    if (op.getNumResults() == 1 && names.count(op.getResult(0)))
      continue;
    if (failed(emitOp(op)))
      return failure();
  }
  SmallVector<std::string> out;
  for (Value v : block.getTerminator()->getOperands())
    out.push_back(get(v));
  return out;
}

FailureOr<SmallVector<std::string>> RegionWriter::emitSlice(Block &block, ArrayRef<Value> roots) {
  llvm::SmallPtrSet<Operation *, 32> needed;
  SmallVector<Value> work(roots.begin(), roots.end());
  while (!work.empty()) {
    Operation *def = work.pop_back_val().getDefiningOp();
    if (!def || def->getBlock() != &block || !needed.insert(def).second)
      continue;
    for (Value operand : def->getOperands())
      work.push_back(operand);
  }
  for (Operation &op : block.without_terminator()) {
    if (!needed.count(&op) || (op.getNumResults() == 1 && names.count(op.getResult(0))))
      continue;
    if (failed(emitOp(op)))
      return failure();
  }
  SmallVector<std::string> out;
  for (Value v : roots)
    out.push_back(get(v));
  return out;
}

/// Whether `index` is a region argument that lies in `dim` by construction: h (of a q/k mod,
/// (x, y, c, t, h, ...), or of a score_mod, (s, b, h, i, j, ...)) in the heads, a q/k mod's c in
/// head_dim. Any other index (a computed one, or an argument on another dimension: t, i, j run to
/// the sequence length) is clamped to the dimension, so no spec reads or writes out of bounds.
static bool inRangeByConstruction(Value index, const abi::Dim &dim) {
  auto arg = dyn_cast<BlockArgument>(index);
  if (!arg)
    return false;
  Operation *region = arg.getOwner()->getParentOp();
  const unsigned n = arg.getArgNumber();
  const bool qk = isa_and_nonnull<QModOp, KModOp>(region), score = isa_and_nonnull<ScoreModOp>(region);
  if (dim.is(abi::Dim::Kind::Heads))
    return (qk && n == 4) || (score && n == 2);
  if (dim.is(abi::Dim::Kind::HeadDim))
    return qk && n == 2;
  return false;
}

FailureOr<std::string> RegionWriter::element(LoadOp load, StringRef tokBase, StringRef paramBase) {
  Value src = load.getSource();
  auto idx = load.getIndices();
  if (isa<TokensType>(src.getType())) {
    auto slot = layout.tokSlot.find(src);
    if (slot == layout.tokSlot.end())
      return load.emitOpError("loads a token sequence the kernel does not compute");
    return llvm::formatv("{0}[{1} * ctx.tok_stride() + ({2})]", tokBase, slot->second, get(idx[2])).str();
  }
  if (isa<RowsType>(src.getType())) {  // rows of this slice: ctx.rel[n] / ctx.drel[n]
    auto rel = layout.relIndex.find(src);
    if (rel == layout.relIndex.end())
      return load.emitOpError("loads rows the kernel does not compute");
    std::string base = tokBase == "ctx.dtok" ? "ctx.drel" : "ctx.rel";
    int64_t rows = layout.rowCount(layout.rels[rel->second]);
    // No region argument runs over the rows: the row index is clamped whatever it is.
    std::string r = "std::clamp<int64_t>(" + get(idx[3]) + ", 0, int64_t(" + std::to_string(rows) + ") - 1)";
    return llvm::formatv("{0}[{1}][({2}) * {3} + ({4})]", base, rel->second, get(idx[2]), rows,
                         r)
        .str();
  }
  auto param = layout.paramIndex.find(src);
  if (param == layout.paramIndex.end())
    return load.emitOpError("loads a value that is not an ape.param of this kernel");
  ParamOp p = layout.params[param->second];
  std::string flat;
  for (auto [k, dim] : llvm::enumerate(getDims(p))) {
    std::string size = dimExpr(dim, "ctx.H", "ctx.D");
    // h on the heads and c on head_dim are in range by construction; any other index (a
    // bucket, say, or t on a fixed dimension) is clamped to it.
    std::string i = get(idx[k]);
    if (!inRangeByConstruction(idx[k], dim))
      i = "std::clamp<int64_t>(" + i + ", 0, int64_t(" + size + ") - 1)";
    flat = k == 0 ? "(" + i + ")" : "(" + flat + " * " + size + " + (" + i + "))";
  }
  return llvm::formatv("{0}[{1}][{2}]", paramBase, param->second, flat).str();
}

void RegionWriter::define(Operation &op, const std::string &expr) {
  std::string n = fresh();
  os << indent << "[[maybe_unused]] const " << cType(op.getResult(0).getType()) << " " << n
     << " = " << expr << ";\n";
  names[op.getResult(0)] = n;
}

LogicalResult RegionWriter::emitOp(Operation &op) {
  // The region language's types (dialect/RegionTypes.h): another would be computed as f32 or int64.
  if (isa_and_nonnull<arith::ArithDialect, math::MathDialect>(op.getDialect()) && failed(checkRegionTypes(&op)))
    return failure();
  auto a = [&](unsigned i) { return get(op.getOperand(i)); };
  auto bin = [&](StringRef sym) { return "(" + a(0) + " " + sym.str() + " " + a(1) + ")"; };
  auto call = [&](StringRef fn) {
    std::string s = fn.str() + "(";
    for (unsigned i = 0; i < op.getNumOperands(); ++i)
      s += (i ? ", " : "") + a(i);
    return s + ")";
  };
  auto u64 = [&](unsigned i) { return "static_cast<uint64_t>(" + a(i) + ")"; };
  auto wrap = [&](StringRef sym) { return "int64_t(" + u64(0) + " " + sym.str() + " " + u64(1) + ")"; };
  // i1 as MLIR reads it: a 1-bit integer, true = 1 unsigned and -1 signed (C++'s bool is 1).
  auto isBool = [](Type t) { return t.isInteger(1); };
  auto signedOf = [&](unsigned i) {
    return isBool(op.getOperand(i).getType()) ? "(-int64_t(" + a(i) + "))" : a(i);
  };
  if (isa<arith::DivSIOp, arith::RemSIOp, arith::DivUIOp, arith::RemUIOp, arith::FloorDivSIOp, arith::CeilDivSIOp,
          arith::CeilDivUIOp>(op) &&
      isBool(op.getResult(0).getType()))
    return op.emitOpError("on i1 is not supported (divide integers, or combine masks with arith.andi, "
                          "arith.ori and arith.xori)");
  // An op whose fast-math flags allow it, on a target with approximate functions (approxMath):
  // the approximate form, else the exact one.
  auto approx = [&](arith::FastMathFlags need, StringRef fn, StringRef exact) {
    arith::FastMathFlags have = arith::FastMathFlags::none;
    if (auto fm = dyn_cast<arith::ArithFastMathInterface>(op))
      if (arith::FastMathFlagsAttr attr = fm.getFastMathFlagsAttr())
        have = attr.getValue();
    return layout.approxMath && arith::bitEnumContainsAll(have, need)
               ? call(("::ape::cuda::approx::" + fn).str())
               : exact.empty() ? bin("/") : call(exact);
  };
  using FM = arith::FastMathFlags;
  std::optional<std::string> e =
      llvm::TypeSwitch<Operation *, std::optional<std::string>>(&op)
          .Case([&](arith::ConstantOp c) -> std::optional<std::string> {
            if (auto f = dyn_cast<FloatAttr>(c.getValue()))
              return floatLiteral(f.getValueAsDouble());
            if (auto i = dyn_cast<IntegerAttr>(c.getValue()))
            {
              if (c.getType().isInteger(1))
                return std::string(i.getInt() ? "true" : "false");
              // INT64_MIN has no literal of its own (9223372036854775808 is an unsigned literal
              // negated: a warning on every use under GCC and Clang, an error under -Werror).
              const int64_t n = i.getInt();
              return n == std::numeric_limits<int64_t>::min() ? std::string("int64_t(-9223372036854775807LL - 1)")
                                                              : "int64_t(" + std::to_string(n) + ")";
            }
            return std::nullopt;
          })
          .Case([&](ConstantOp c) {
            return floatLiteral(c.getValue().convertToDouble());
          })
          .Case([&](arith::AddFOp) { return bin("+"); })
          .Case([&](arith::SubFOp) { return bin("-"); })
          .Case([&](arith::MulFOp) { return bin("*"); })
          .Case([&](arith::DivFOp) { return approx(FM::arcp, "div", ""); })
          .Case([&](arith::NegFOp) { return "(-" + a(0) + ")"; })
          // On i1, modulo 2: + and - are xor, * is and. On i64 and index they wrap modulo 2^64, as
          // MLIR means them: computed on uint64_t (signed overflow is undefined in C++, and the
          // compiler folded (n * 2^62) < 0 to n < 0).
          .Case([&](arith::AddIOp o) { return isBool(o.getType()) ? "bool(" + bin("^") + ")" : wrap("+"); })
          .Case([&](arith::SubIOp o) { return isBool(o.getType()) ? "bool(" + bin("^") + ")" : wrap("-"); })
          .Case([&](arith::MulIOp o) { return isBool(o.getType()) ? "bool(" + bin("&") + ")" : wrap("*"); })
          // Integer division and remainder are total (contract/int_math.h): x / 0 = 0, x % 0 = x.
          .Case([&](arith::DivSIOp) { return call("::ape::int_math::div"); })
          .Case([&](arith::RemSIOp) { return call("::ape::int_math::rem"); })
          .Case([&](arith::DivUIOp) { return call("::ape::int_math::udiv"); })
          .Case([&](arith::RemUIOp) { return call("::ape::int_math::urem"); })
          // Bitwise on index/i64 (-ape-fuse's partner index c ^ 1), logical on i1 (masks).
          .Case<arith::AndIOp, arith::OrIOp, arith::XOrIOp>([&](auto o) {
            StringRef sym = isa<arith::AndIOp>(o) ? "&" : isa<arith::OrIOp>(o) ? "|" : "^";
            return o.getType().isInteger(1) ? "bool(" + bin(sym) + ")"
                                            : "int64_t(" + u64(0) + " " + sym.str() + " " + u64(1) + ")";
          })
          .Case([&](arith::FloorDivSIOp) { return call("::ape::int_math::floordiv"); })
          .Case<arith::MaxSIOp, arith::MinSIOp>([&](auto o) {
            const std::string fn =
                std::is_same_v<decltype(o), arith::MaxSIOp> ? "std::max<int64_t>(" : "std::min<int64_t>(";
            const std::string e = fn + signedOf(0) + ", " + signedOf(1) + ")";
            return isBool(o.getType()) ? "bool(" + e + ")" : e;
          })
          .Case([&](arith::MaxUIOp) {
            return "int64_t(std::max(" + u64(0) + ", " + u64(1) + "))";
          })
          .Case([&](arith::MinUIOp) {
            return "int64_t(std::min(" + u64(0) + ", " + u64(1) + "))";
          })
          // NaN: maximumf / minimumf propagate it, maxnumf / minnumf take the number
          // (contract/float_math.h).
          .Case([&](arith::MaximumFOp) { return call("::ape::float_math::maximum<T>"); })
          .Case([&](arith::MinimumFOp) { return call("::ape::float_math::minimum<T>"); })
          .Case([&](arith::MaxNumFOp) { return call("::ape::float_math::maxnum<T>"); })
          .Case([&](arith::MinNumFOp) { return call("::ape::float_math::minnum<T>"); })
          .Case([&](arith::SelectOp) { return "(" + a(0) + " ? " + a(1) + " : " + a(2) + ")"; })
          .Case<arith::IndexCastOp, arith::ExtSIOp>([&](auto) { return "int64_t(" + signedOf(0) + ")"; })
          .Case<arith::IndexCastUIOp, arith::ExtUIOp>([&](auto) { return "int64_t(" + a(0) + ")"; })
          // To i1: the low bit.
          .Case([&](arith::TruncIOp o) {
            return isBool(o.getType()) ? "bool(" + u64(0) + " & 1u)" : "int64_t(" + a(0) + ")";
          })
          .Case([&](arith::SIToFPOp) { return "T(" + signedOf(0) + ")"; })
          .Case([&](arith::UIToFPOp) { return "T(" + u64(0) + ")"; })
          // Truncation saturated to int64, NaN -> 0 (contract/float_math.h).
          .Case<arith::FPToSIOp, arith::FPToUIOp>([&](auto) { return call("::ape::float_math::to_int<T>"); })
          // C++'s comparisons are the ordered ones (false with a NaN operand, != aside); an
          // unordered predicate is the negation of the opposite ordered one.
          .Case([&](arith::CmpFOp c) -> std::optional<std::string> {
            using P = arith::CmpFPredicate;
            auto lnot = [](const std::string &s) { return "(!" + s + ")"; };
            auto ordered = [&] { return "(" + a(0) + " == " + a(0) + " && " + a(1) + " == " + a(1) + ")"; };
            switch (c.getPredicate()) {
            case P::OEQ: return bin("==");
            case P::ONE: return "(" + bin("<") + " || " + bin(">") + ")";
            case P::OLT: return bin("<");
            case P::OLE: return bin("<=");
            case P::OGT: return bin(">");
            case P::OGE: return bin(">=");
            case P::ORD: return ordered();
            case P::UEQ: return lnot("(" + bin("<") + " || " + bin(">") + ")");
            case P::UNE: return bin("!=");
            case P::ULT: return lnot(bin(">="));
            case P::ULE: return lnot(bin(">"));
            case P::UGT: return lnot(bin("<="));
            case P::UGE: return lnot(bin("<"));
            case P::UNO: return lnot(ordered());
            case P::AlwaysTrue: return std::string("true");
            case P::AlwaysFalse: return std::string("false");
            }
            return std::nullopt;
          })
          .Case([&](arith::CmpIOp c) -> std::optional<std::string> {
            using P = arith::CmpIPredicate;
            auto ub = [&](StringRef s) { return "(" + u64(0) + " " + s.str() + " " + u64(1) + ")"; };
            auto sb = [&](StringRef s) { return "(" + signedOf(0) + " " + s.str() + " " + signedOf(1) + ")"; };
            switch (c.getPredicate()) {
            case P::eq: return bin("==");
            case P::ne: return bin("!=");
            case P::slt: return sb("<");
            case P::sle: return sb("<=");
            case P::sgt: return sb(">");
            case P::sge: return sb(">=");
            case P::ult: return ub("<");
            case P::ule: return ub("<=");
            case P::ugt: return ub(">");
            case P::uge: return ub(">=");
            }
            return std::nullopt;
          })
          .Case([&](math::ExpOp) { return approx(FM::afn, "exp", "std::exp"); })
          .Case([&](math::Exp2Op) { return approx(FM::afn, "exp2", "std::exp2"); })
          .Case([&](math::LogOp) { return approx(FM::afn, "log", "std::log"); })
          .Case([&](math::Log2Op) { return approx(FM::afn, "log2", "std::log2"); })
          .Case([&](math::Log1pOp) { return approx(FM::afn, "log1p", "std::log1p"); })
          .Case([&](math::SqrtOp) { return call("std::sqrt"); })
          .Case([&](math::SinOp) { return call("std::sin"); })
          .Case([&](math::CosOp) { return call("std::cos"); })
          .Case([&](math::TanhOp) { return call("std::tanh"); })
          .Case([&](math::AbsFOp) { return call("std::abs"); })
          .Case([&](math::FloorOp) { return call("std::floor"); })
          .Case([&](math::CeilOp) { return call("std::ceil"); })
          .Case([&](math::RoundOp) { return call("std::round"); })
          .Case([&](math::TruncOp) { return call("std::trunc"); })
          .Case([&](math::PowFOp) { return call("std::pow"); })
          .Case([&](DimOp d) {
            switch (d.getWhich()) {
            case abi::DimWhich::Heads: return std::string("ctx.H");
            case abi::DimWhich::HeadDim: return std::string("ctx.D");
            case abi::DimWhich::SeqLen: break;
            }
            return std::string("ctx.T");
          })
          .Default([](Operation *) { return std::nullopt; });
  if (auto load = dyn_cast<LoadOp>(op)) {
    FailureOr<std::string> el = element(load, "ctx.tok", "ctx.params");
    if (failed(el))
      return failure();
    define(op, *el);
    return success();
  }
  if (!e || op.getNumResults() != 1)
    return op.emitOpError("has no CPU C++ translation");
  define(op, *e);
  return success();
}
