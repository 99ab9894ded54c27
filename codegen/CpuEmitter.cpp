//===- CpuEmitter.cpp - ape.kernel to CPU C++ -----------------------------===//
//
// Translates each region of a kernel into a static member function of an
// `Enc` functor struct (templated on the scalar type T, so one kernel serves
// fp32 training and fp64 gradient checks) and instantiates the flash
// attention templates of kernels/include/ape/cpu_attention.h with it.
//
// Values inside regions become `const` locals: f32 → T, index/i64 → int64_t,
// i1 → bool. Token sequences (features, maps, scans) live in per-(batch,
// head) slots `ctx.tok[slot·T + t]`; params in `ctx.params[n][flat index]`.
// The gradient of each load (the `grad` region's trailing results) is added
// to `ctx.dtok` or `ctx.dparams` at the load's own indices, which realises
// every plan (row_sum, col_sum, head_sum, scatter, token_sum) with private,
// deterministic accumulators.
//
//===----------------------------------------------------------------------===//
#include "codegen/EmitterRegistry.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>
#include <functional>

using namespace mlir;
using namespace mlir::ape;

namespace {

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
  DenseMap<Value, unsigned> relIndex;

  /// The number of rows of a rel_rows table (its verified integer first dimension).
  int64_t rowCount(RelRowsOp r) const {
    return getDims(r.getTable().getDefiningOp<ParamOp>())[0].value;
  }

  LogicalResult build(KernelOp kernel) {
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
};

/// A floating-point constant of the region's precision T. A spec may hold non-finite constants
/// (`arith.constant 0xFF800000 : f32` is -inf, the natural way to mask a key in a score_mod):
/// they are spelled std::numeric_limits<T> (<limits>: cpu_attention.h includes it; the CUDA header
/// includes it when hasNonFiniteConstant), valid C++ in every backend; finite values print with
/// 17 digits (exact for f64).
std::string floatLiteral(double v) {
  if (std::isnan(v))
    return "std::numeric_limits<T>::quiet_NaN()";
  if (std::isinf(v))
    return v > 0 ? "std::numeric_limits<T>::infinity()" : "(-std::numeric_limits<T>::infinity())";
  return llvm::formatv("T({0:e17})", v).str();
}

} // namespace

bool mlir::ape::hasNonFiniteConstant(KernelOp kernel) {
  bool found = false;
  kernel.walk([&](Operation *op) {
    if (auto c = dyn_cast<arith::ConstantOp>(op)) {
      if (auto f = dyn_cast<FloatAttr>(c.getValue()))
        found |= !std::isfinite(f.getValueAsDouble());
    } else if (auto c = dyn_cast<ConstantOp>(op)) {
      found |= !std::isfinite(c.getValue().convertToDouble());
    }
  });
  return found;
}

namespace {

/// A param dimension as generated code: the symbols as `heads` and `headDim`, a size as itself.
std::string dimExpr(const abi::Dim &d, StringRef heads, StringRef headDim) {
  if (d.is(abi::Dim::Kind::Heads))
    return heads.str();
  return d.is(abi::Dim::Kind::HeadDim) ? headDim.str() : std::to_string(d.value);
}

std::string cType(Type t) {
  if (t.isF32() || t.isF64() || t.isF16() || t.isBF16())
    return "T";
  if (t.isInteger(1))
    return "bool";
  return "int64_t";
}

/// Emits the ops of one region body as C++ statements.
class RegionWriter {
public:
  RegionWriter(raw_ostream &os, KernelLayout &layout, StringRef prefix, StringRef indent)
      : os(os), layout(layout), prefix(prefix.str()), indent(indent.str()) {}

  void bind(Value v, StringRef expr) { names[v] = expr.str(); }
  std::string get(Value v) { return names.lookup(v); }

  /// Emits all ops but the terminator; returns the yielded values' names.
  /// An op whose result was bound beforehand (a distance `i - j` bound to `d`) is not emitted.
  FailureOr<SmallVector<std::string>> emitBody(Block &block) {
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

  /// Emits only the ops that `roots` depend on (in block order); returns the roots' names.
  /// Values bound beforehand (block arguments) are leaves.
  FailureOr<SmallVector<std::string>> emitSlice(Block &block, ArrayRef<Value> roots) {
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

  /// The C++ lvalue expression of a load's element (in tok or params) with
  /// `base` = "ctx.tok" / "ctx.dtok" or "ctx.params" / "ctx.dparams".
  FailureOr<std::string> element(LoadOp load, StringRef tokBase, StringRef paramBase) {
    Value src = load.getSource();
    auto idx = load.getIndices();
    if (isa<TokensType>(src.getType())) {
      auto slot = layout.tokSlot.find(src);
      if (slot == layout.tokSlot.end())
        return load.emitOpError("loads a token sequence the kernel does not compute");
      return llvm::formatv("{0}[{1} * ctx.T + ({2})]", tokBase, slot->second, get(idx[2])).str();
    }
    if (isa<RowsType>(src.getType())) {  // rows of this slice: ctx.rel[n] / ctx.drel[n]
      auto rel = layout.relIndex.find(src);
      if (rel == layout.relIndex.end())
        return load.emitOpError("loads rows the kernel does not compute");
      std::string base = tokBase == "ctx.dtok" ? "ctx.drel" : "ctx.rel";
      int64_t rows = layout.rowCount(layout.rels[rel->second]);
      std::string r = get(idx[3]);
      if (!isa<BlockArgument>(idx[3]))
        r = "std::clamp<int64_t>(" + r + ", 0, int64_t(" + std::to_string(rows) + ") - 1)";
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
      // A region argument (h, c) is in range by construction; a computed index (a bucket,
      // say) is clamped to the dimension so no spec can read or write out of bounds.
      std::string i = get(idx[k]);
      if (!isa<BlockArgument>(idx[k]))
        i = "std::clamp<int64_t>(" + i + ", 0, int64_t(" + size + ") - 1)";
      flat = k == 0 ? "(" + i + ")" : "(" + flat + " * " + size + " + (" + i + "))";
    }
    return llvm::formatv("{0}[{1}][{2}]", paramBase, param->second, flat).str();
  }

private:
  std::string fresh() { return prefix + std::to_string(counter++); }

  void define(Operation &op, const std::string &expr) {
    std::string n = fresh();
    os << indent << "[[maybe_unused]] const " << cType(op.getResult(0).getType()) << " " << n
       << " = " << expr << ";\n";
    names[op.getResult(0)] = n;
  }

  LogicalResult emitOp(Operation &op) {
    auto a = [&](unsigned i) { return get(op.getOperand(i)); };
    auto bin = [&](StringRef sym) { return "(" + a(0) + " " + sym.str() + " " + a(1) + ")"; };
    auto call = [&](StringRef fn) {
      std::string s = fn.str() + "(";
      for (unsigned i = 0; i < op.getNumOperands(); ++i)
        s += (i ? ", " : "") + a(i);
      return s + ")";
    };
    auto u64 = [&](unsigned i) { return "static_cast<uint64_t>(" + a(i) + ")"; };
    std::optional<std::string> e =
        llvm::TypeSwitch<Operation *, std::optional<std::string>>(&op)
            .Case([&](arith::ConstantOp c) -> std::optional<std::string> {
              if (auto f = dyn_cast<FloatAttr>(c.getValue()))
                return floatLiteral(f.getValueAsDouble());
              if (auto i = dyn_cast<IntegerAttr>(c.getValue()))
                return c.getType().isInteger(1) ? std::string(i.getInt() ? "true" : "false")
                                                : "int64_t(" + std::to_string(i.getInt()) + ")";
              return std::nullopt;
            })
            .Case([&](ConstantOp c) {
              return floatLiteral(c.getValue().convertToDouble());
            })
            .Case([&](arith::AddFOp) { return bin("+"); })
            .Case([&](arith::SubFOp) { return bin("-"); })
            .Case([&](arith::MulFOp) { return bin("*"); })
            .Case([&](arith::DivFOp) { return bin("/"); })
            .Case([&](arith::NegFOp) { return "(-" + a(0) + ")"; })
            .Case([&](arith::AddIOp) { return bin("+"); })
            .Case([&](arith::SubIOp) { return bin("-"); })
            .Case([&](arith::MulIOp) { return bin("*"); })
            .Case([&](arith::DivSIOp) { return bin("/"); })
            .Case([&](arith::RemSIOp) { return bin("%"); })
            .Case([&](arith::DivUIOp) { return "int64_t(" + u64(0) + " / " + u64(1) + ")"; })
            .Case([&](arith::RemUIOp) { return "int64_t(" + u64(0) + " % " + u64(1) + ")"; })
            // Bitwise on index/i64 (-ape-fuse's partner index c ^ 1), logical on i1 (masks).
            .Case<arith::AndIOp, arith::OrIOp, arith::XOrIOp>([&](auto o) {
              StringRef sym = isa<arith::AndIOp>(o) ? "&" : isa<arith::OrIOp>(o) ? "|" : "^";
              return o.getType().isInteger(1) ? "bool(" + bin(sym) + ")"
                                              : "int64_t(" + u64(0) + " " + sym.str() + " " + u64(1) + ")";
            })
            .Case([&](arith::FloorDivSIOp) {  // rounds toward -inf
              return "(" + a(0) + " / " + a(1) + " - ((" + a(0) + " % " + a(1) + " != 0) && ((" +
                     a(0) + " < 0) != (" + a(1) + " < 0))))";
            })
            .Case([&](arith::MaxSIOp) { return call("std::max<int64_t>"); })
            .Case([&](arith::MinSIOp) { return call("std::min<int64_t>"); })
            .Case([&](arith::MaxUIOp) {
              return "int64_t(std::max(" + u64(0) + ", " + u64(1) + "))";
            })
            .Case([&](arith::MinUIOp) {
              return "int64_t(std::min(" + u64(0) + ", " + u64(1) + "))";
            })
            .Case<arith::MaximumFOp, arith::MaxNumFOp>([&](auto) { return call("std::max<T>"); })
            .Case<arith::MinimumFOp, arith::MinNumFOp>([&](auto) { return call("std::min<T>"); })
            .Case([&](arith::SelectOp) { return "(" + a(0) + " ? " + a(1) + " : " + a(2) + ")"; })
            .Case<arith::IndexCastOp, arith::IndexCastUIOp, arith::ExtSIOp, arith::TruncIOp>(
                [&](auto) { return "int64_t(" + a(0) + ")"; })
            .Case([&](arith::SIToFPOp) { return "T(" + a(0) + ")"; })
            .Case([&](arith::UIToFPOp) { return "T(" + u64(0) + ")"; })
            .Case<arith::FPToSIOp, arith::FPToUIOp>([&](auto) { return "int64_t(" + a(0) + ")"; })
            .Case([&](arith::CmpFOp c) -> std::optional<std::string> {
              using P = arith::CmpFPredicate;
              switch (c.getPredicate()) {
              case P::OEQ: case P::UEQ: return bin("==");
              case P::ONE: case P::UNE: return bin("!=");
              case P::OLT: case P::ULT: return bin("<");
              case P::OLE: case P::ULE: return bin("<=");
              case P::OGT: case P::UGT: return bin(">");
              case P::OGE: case P::UGE: return bin(">=");
              case P::AlwaysTrue: return std::string("true");
              case P::AlwaysFalse: return std::string("false");
              default: return std::nullopt;
              }
            })
            .Case([&](arith::CmpIOp c) -> std::optional<std::string> {
              using P = arith::CmpIPredicate;
              auto ub = [&](StringRef s) { return "(" + u64(0) + " " + s.str() + " " + u64(1) + ")"; };
              switch (c.getPredicate()) {
              case P::eq: return bin("==");
              case P::ne: return bin("!=");
              case P::slt: return bin("<");
              case P::sle: return bin("<=");
              case P::sgt: return bin(">");
              case P::sge: return bin(">=");
              case P::ult: return ub("<");
              case P::ule: return ub("<=");
              case P::ugt: return ub(">");
              case P::uge: return ub(">=");
              }
              return std::nullopt;
            })
            .Case([&](math::ExpOp) { return call("std::exp"); })
            .Case([&](math::Exp2Op) { return call("std::exp2"); })
            .Case([&](math::LogOp) { return call("std::log"); })
            .Case([&](math::Log2Op) { return call("std::log2"); })
            .Case([&](math::Log1pOp) { return call("std::log1p"); })
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

  raw_ostream &os;
  KernelLayout &layout;
  std::string prefix, indent;
  DenseMap<Value, std::string> names;
  unsigned counter = 0;
};

constexpr StringLiteral kIndent = "    ";

/// How the functor's member functions are declared. CPU: on `ape::HeadCtx<T>`; CUDA: on any
/// context type (the device context redirects gradient accumulations) and `APE_HD` (host and
/// device under nvcc). The bodies are the same text for both.
struct FunctorStyle {
  StringLiteral head;       // up to the return type
  StringLiteral ctx;        // the context parameter
  StringLiteral outOfLine;  // before the return type of a function called, not inlined
};
constexpr FunctorStyle kCpuStyle{"  template <class T>\n  static ", "const ape::HeadCtx<T> &ctx", ""};
constexpr FunctorStyle kCudaStyle{"  template <class T, class Ctx>\n  APE_HD static ",
                                  "const Ctx &ctx", "APE_NOINLINE "};

/// A score mod (primal, or primal with gradient) of more operations than this is called out of
/// line by the CUDA kernels (APE_NOINLINE, ape/cuda_platform.cuh). The flash kernels evaluate
/// it at every element of fully unrolled tile loops, 16-64 copies per kernel and several kernels
/// per variant; the example specs' mods have at most ~60 operations (KERPLE's gradient), FIRE's
/// MLP ~1,600 with 99 gradient sinks, which inlined drove ptxas past 23 GB and 5 minutes for one
/// variant (bench/results/cuda_compile_memory.md). A call costs a few instructions per element
/// against the hundreds of such a mod.
constexpr unsigned kOutOfLineOps = 160;

unsigned countOps(Region &r) {
  unsigned n = 0;
  r.walk([&](Operation *) { ++n; });
  return n;
}

/// Binds `args` to the block arguments of a region (`b`) and of its gradient region (`gb`,
/// which reads the primal's values), writes the primal body, then the gradient body; returns the
/// gradient's yielded expressions.
FailureOr<SmallVector<std::string>> emitPrimalThenGrad(RegionWriter &primal, RegionWriter &grad,
                                                       Block &b, Block &gb,
                                                       ArrayRef<StringRef> args) {
  for (unsigned i = 0; i < b.getNumArguments(); ++i)
    primal.bind(b.getArgument(i), args[i]);
  for (unsigned i = 0; i < gb.getNumArguments(); ++i)
    grad.bind(gb.getArgument(i), args[i]);
  if (failed(primal.emitBody(b)))
    return failure();
  return grad.emitBody(gb);
}

/// Emits the gradient accumulations of the loads of `body` given the names of
/// their gradients; non-trainable params receive none.
/// With `keep`, only the loads k (in walk order) that it accepts.
LogicalResult emitLoadGrads(raw_ostream &os, RegionWriter &primal, Region &body,
                            ArrayRef<std::string> grads,
                            llvm::function_ref<bool(unsigned)> keep = nullptr,
                            unsigned *emitted = nullptr) {
  unsigned k = 0;
  LogicalResult result = success();
  body.walk([&](LoadOp load) {
    unsigned n = k++;
    std::string g = grads[n];
    if (keep && !keep(n))
      return;
    if (auto p = load.getSource().getDefiningOp<ParamOp>(); p && !p.getTrainable())
      return;
    FailureOr<std::string> el = primal.element(load, "ctx.dtok", "ctx.dparams");
    if (failed(el)) {
      result = failure();
      return;
    }
    os << kIndent << *el << " += " << g << ";\n";
    if (emitted)
      ++*emitted;
  });
  return result;
}

/// q_mod / k_mod and their gradients (identity when the kernel has none).
template <typename ModOp>
LogicalResult emitQKMod(raw_ostream &os, KernelLayout &layout, ModOp mod, StringRef which,
                        const FunctorStyle &st) {
  os << st.head << "T " << which << "_mod(" << st.ctx
     << ", int64_t t, int64_t c, T x, T y) {\n";
  if (!mod) {
    os << "    return x;\n  }\n";
  } else {
    RegionWriter w(os, layout, "v", kIndent);
    Block &b = mod.getBody().front();
    w.bind(b.getArgument(0), "x"), w.bind(b.getArgument(1), "y"), w.bind(b.getArgument(2), "c");
    w.bind(b.getArgument(3), "t"), w.bind(b.getArgument(4), "ctx.h");
    auto out = w.emitBody(b);
    if (failed(out))
      return failure();
    os << "    return " << (*out)[0] << ";\n  }\n";
  }
  if (layout.inferenceOnly)
    return success();
  os << st.head << "void " << which << "_mod_grad(" << st.ctx
     << ", int64_t t, int64_t c, T x, T y, T g, T &dx, "
        "T &dy) {\n";
  if (!mod) {
    os << "    dx = g;\n    dy = T(0);\n  }\n";
    return success();
  }
  RegionWriter primal(os, layout, "p", kIndent), grad(os, layout, "g", kIndent);
  auto out = emitPrimalThenGrad(primal, grad, mod.getBody().front(), mod.getGrad().front(),
                                {"x", "y", "c", "t", "ctx.h", "g"});
  if (failed(out))
    return failure();
  os << "    dx = " << (*out)[0] << ";\n    dy = " << (*out)[1] << ";\n";
  if (failed(emitLoadGrads(os, primal, mod.getBody(), ArrayRef(*out).drop_front(2))))
    return failure();
  os << "  }\n";
  return success();
}

LogicalResult emitScoreMod(raw_ostream &os, KernelLayout &layout, const FunctorStyle &st) {
  ScoreModOp mod = layout.score;
  const unsigned primalOps = mod ? countOps(mod.getBody()) : 0;
  const unsigned gradOps = mod && !layout.inferenceOnly ? primalOps + countOps(mod.getGrad()) : 0;
  os << st.head << (primalOps > kOutOfLineOps ? st.outOfLine : "") << "T score_mod(" << st.ctx
     << ", int64_t i, int64_t j, T s) {\n";
  StringRef args[] = {"s", "ctx.b", "ctx.h", "i", "j", "g"};
  if (!mod) {
    os << "    return s;\n  }\n";
  } else {
    RegionWriter w(os, layout, "v", kIndent);
    Block &b = mod.getBody().front();
    for (unsigned k = 0; k < b.getNumArguments(); ++k)
      w.bind(b.getArgument(k), args[k]);
    auto out = w.emitBody(b);
    if (failed(out))
      return failure();
    os << "    return " << (*out)[0] << ";\n  }\n";
  }
  if (layout.inferenceOnly)
    return success();
  os << st.head << (gradOps > kOutOfLineOps ? st.outOfLine : "") << "T score_mod_grad("
     << st.ctx << ", int64_t i, int64_t j, T s, T g) {\n";
  if (!mod) {
    os << "    return g;\n  }\n";
    return success();
  }
  RegionWriter primal(os, layout, "p", kIndent), grad(os, layout, "g", kIndent);
  auto out = emitPrimalThenGrad(primal, grad, mod.getBody().front(), mod.getGrad().front(), args);
  if (failed(out))
    return failure();
  if (failed(emitLoadGrads(os, primal, mod.getBody(), ArrayRef(*out).drop_front(1))))
    return failure();
  os << "    return " << (*out)[0] << ";\n  }\n";
  return success();
}

/// A q/k mod linear in its data: mod(x, y) = a(t, c) x + b(t, c) y with coefficients that read
/// only the position, the column, constants, the call's dims and params at indices that do not
/// read the head (not token sequences): RoPE and all its scalings, xPos. The CPU template then evaluates a = mod(1, 0) and
/// b = mod(0, 1) once per call into a table that every (b, h) slice reads, instead of calling the
/// mod (its pow, sin, cos) B H T D times. Found by classing each value: a coefficient (reads
/// neither x nor y, nor anything per head), linear (a coefficient times a linear value, sums and
/// differences of linear values, a select between linear values on a coefficient condition), or
/// neither.
bool isLinearMod(Operation *mod) {
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

/// A score mod of the form `s + B(i - j)` (B may be a sum of terms): the bias B reads the query and key positions only
/// through their difference and does not depend on the logit. The templates then evaluate B once
/// per distance (a table per (b, h) slice instead of one evaluation per (i, j)) and, in the
/// backward, call its gradient once per distance with the sum of dS_ij along that diagonal
/// (B's load gradients are linear in the incoming gradient, so the sum may go first).
/// Region arguments: body (s, b, h, i, j), grad (s, b, h, i, j, g).
bool isDistanceBias(ScoreModOp mod) {
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
  // body: the logit flows to the yield through a chain of additions `(s + X1) + X2 ...` (fused
  // biases), each value of the chain used once, the X free of s (they cannot read it otherwise).
  Value v = b.getArgument(0);
  Operation *yield = b.getTerminator();
  while (v != yield->getOperand(0)) {
    if (!v.hasOneUse())
      return false;
    auto add = dyn_cast<arith::AddFOp>(*v.getUsers().begin());
    if (!add || add.getLhs() == add.getRhs())
      return false;
    v = add.getResult();
  }
  if (!v.hasOneUse() || v == b.getArgument(0))
    return false;
  if (!hasGrad)
    return true;
  // grad: dS passes through unchanged (d(s + X)/ds = 1) and the logit is not read.
  Block &gb = mod.getGrad().front();
  return gb.getArgument(0).use_empty() &&
         gb.getTerminator()->getOperand(0) == gb.getArgument(5);
}

/// Emitted after the bias gradients when they write nothing (every load of the bias is a fixed
/// param or a feature without a gradient: ALiBi's standard slopes): the backward kernels then skip
/// the bias sums altogether (enc_traits.h: BiasFixed).
constexpr const char *kBiasFixedDecl =
    "  // The bias has no gradient: the backward skips its sums (templates: kBiasFixed).\n"
    "  static constexpr bool kBiasFixed = true;\n";

/// distance_bias(ctx, d) = B(d) and distance_bias_grad(ctx, d, g): B's load gradients for the
/// incoming gradient g (a diagonal's sum of dS). The bodies are the score mod's own, with
/// `i - j` bound to d and the logit to 0 (`0 + B(d)` is B(d) exactly; a sum `(s + X1) + X2`
/// becomes X1 + X2).
LogicalResult emitDistanceBias(raw_ostream &os, KernelLayout &layout, const FunctorStyle &st) {
  ScoreModOp mod = layout.score;
  StringRef args[] = {"T(0)", "ctx.b", "ctx.h", "i", "j", "g"};
  auto bindDistance = [](RegionWriter &w, Block &b) {
    for (Operation *user : b.getArgument(3).getUsers())
      w.bind(user->getResult(0), "d");
  };
  os << "  // The score mod is s + B(i - j): B once per distance d (templates: kDistanceBias).\n"
     << "  static constexpr bool kDistanceBias = true;\n"
     << st.head << "T distance_bias(" << st.ctx << ", int64_t d) {\n";
  RegionWriter w(os, layout, "v", kIndent);
  Block &b = mod.getBody().front();
  for (unsigned k = 0; k < b.getNumArguments(); ++k)
    w.bind(b.getArgument(k), args[k]);
  bindDistance(w, b);
  auto out = w.emitBody(b);
  if (failed(out))
    return failure();
  os << "    return " << (*out)[0] << ";\n  }\n";
  if (layout.inferenceOnly)
    return success();
  Block &gb = mod.getGrad().front();
  os << st.head << "void distance_bias_grad(" << st.ctx << ", int64_t d, T g) {\n";
  RegionWriter primal(os, layout, "p", kIndent), grad(os, layout, "g", kIndent);
  for (unsigned k = 0; k < b.getNumArguments(); ++k)
    primal.bind(b.getArgument(k), args[k]);
  for (unsigned k = 0; k < gb.getNumArguments(); ++k)
    grad.bind(gb.getArgument(k), args[k]);
  bindDistance(primal, b);
  bindDistance(grad, gb);
  if (failed(primal.emitBody(b)))
    return failure();
  out = grad.emitBody(gb);
  if (failed(out))
    return failure();
  unsigned sinks = 0;
  if (failed(emitLoadGrads(os, primal, mod.getBody(), ArrayRef(*out).drop_front(1), nullptr,
                           &sinks)))
    return failure();
  os << "  }\n";
  if (sinks == 0)
    os << kBiasFixedDecl;
  return success();
}

/// Which of a region's index arguments a value reads, transitively: bit 0 the query position i,
/// bit 1 the key position j, bit 2 the logit s (arguments 3, 4 and 0 of a score mod region).
unsigned readsOf(Value v, Block &block, DenseMap<Value, unsigned> &memo) {
  if (auto it = memo.find(v); it != memo.end())
    return it->second;
  unsigned r = 0;
  if (auto arg = dyn_cast<BlockArgument>(v)) {
    if (arg.getOwner() == &block)
      r = arg.getArgNumber() == 3 ? 1u : arg.getArgNumber() == 4 ? 2u : arg.getArgNumber() == 0 ? 4u : 0u;
  } else if (Operation *def = v.getDefiningOp()) {
    for (Value operand : def->getOperands())
      r |= readsOf(operand, block, memo);
  }
  return memo[v] = r;
}

/// A score mod of the form `s + R(i) + C(j)` (Cable, forget gates: S_i - S_j of cumulative
/// sums): the bias splits into a term of the query row and a term of the key column. The CUDA
/// flash kernels then evaluate R once per query and C once per key of a tile (BQ + BK values
/// instead of BQ BK) and, in the backward, sum dS along each row and each column of the tile and
/// call row_bias_grad / col_bias_grad once per row and column (load gradients are linear in the
/// incoming gradient). Found by splitting the bias at additions, subtractions and negations into
/// signed terms, each reading i or j but not both; every load's gradient must read only the side
/// its accumulation is summed on.
struct RowColBias {
  SmallVector<std::pair<Value, bool>> rowTerms, colTerms;  // (term, negated)
  SmallVector<Value> rowGrads, colGrads;                   // grad-region values of those loads
  SmallVector<bool> loadIsRow;                             // per load of the body, walk order
};

std::optional<RowColBias> rowColBias(ScoreModOp mod) {
  // Only the backward uses the split: none without a grad region (an inference-only kernel).
  if (!mod || mod.getGrad().empty() || isDistanceBias(mod))
    return std::nullopt;
  Block &b = mod.getBody().front(), &gb = mod.getGrad().front();
  if (!gb.getArgument(0).use_empty() || gb.getTerminator()->getOperand(0) != gb.getArgument(5))
    return std::nullopt;
  // The chain `(s + X1) + X2 ...` to the yield, as in isDistanceBias.
  Value v = b.getArgument(0);
  Operation *yield = b.getTerminator();
  SmallVector<Value> biases;
  while (v != yield->getOperand(0)) {
    if (!v.hasOneUse())
      return std::nullopt;
    auto add = dyn_cast<arith::AddFOp>(*v.getUsers().begin());
    if (!add || add.getLhs() == add.getRhs())
      return std::nullopt;
    biases.push_back(add.getLhs() == v ? add.getRhs() : add.getLhs());
    v = add.getResult();
  }
  if (biases.empty())
    return std::nullopt;
  RowColBias rc;
  DenseMap<Value, unsigned> memo, gmemo;
  bool ok = true;
  std::function<void(Value, bool)> split = [&](Value x, bool neg) {
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
  for (Value x : biases)
    split(x, false);
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

/// row_bias(ctx, i) = R(i), col_bias(ctx, j) = C(j) and their gradients (one call per row or
/// column with the sum of its dS): slices of the score mod's own regions.
LogicalResult emitRowColBias(raw_ostream &os, KernelLayout &layout, const RowColBias &rc,
                             const FunctorStyle &st) {
  ScoreModOp mod = layout.score;
  Block &b = mod.getBody().front(), &gb = mod.getGrad().front();
  os << "  // The score mod is s + R(i) + C(j): R once per query, C once per key (CUDA flash\n"
     << "  // kernels: kRowColBias).\n"
     << "  static constexpr bool kRowColBias = true;\n";
  unsigned sinks = 0;
  for (bool row : {true, false}) {
    StringRef side = row ? "row" : "col", index = row ? "i" : "j";
    os << st.head << "T " << side << "_bias(" << st.ctx << ", int64_t " << index << ") {\n";
    RegionWriter w(os, layout, "v", kIndent);
    w.bind(b.getArgument(1), "ctx.b"), w.bind(b.getArgument(2), "ctx.h");
    w.bind(b.getArgument(row ? 3 : 4), index);
    const auto &terms = row ? rc.rowTerms : rc.colTerms;
    SmallVector<Value> roots;
    for (auto [x, neg] : terms)
      roots.push_back(x);
    auto out = w.emitSlice(b, roots);
    if (failed(out))
      return failure();
    os << "    return T(0)";
    for (auto [n, term] : llvm::enumerate(terms))
      os << (term.second ? " - " : " + ") << (*out)[n];
    os << ";\n  }\n";

    os << st.head << "void " << side << "_bias_grad(" << st.ctx << ", int64_t " << index
       << ", T g) {\n";
    RegionWriter primal(os, layout, "p", kIndent), grad(os, layout, "g", kIndent);
    for (RegionWriter *x : {&primal, &grad}) {
      Block &blk = x == &primal ? b : gb;
      x->bind(blk.getArgument(1), "ctx.b"), x->bind(blk.getArgument(2), "ctx.h");
      x->bind(blk.getArgument(row ? 3 : 4), index);
    }
    grad.bind(gb.getArgument(5), "g");
    SmallVector<Value> indices;
    unsigned k = 0;
    b.walk([&](LoadOp load) {
      if (rc.loadIsRow[k++] == row)
        indices.append(load.getIndices().begin(), load.getIndices().end());
    });
    if (failed(primal.emitSlice(b, indices)))
      return failure();
    const auto &gvals = row ? rc.rowGrads : rc.colGrads;
    auto gout = grad.emitSlice(gb, gvals);
    if (failed(gout))
      return failure();
    SmallVector<std::string> all;
    unsigned n = 0;
    for (bool isRow : rc.loadIsRow)
      all.push_back(isRow == row ? (*gout)[n++] : std::string());
    if (failed(emitLoadGrads(os, primal, mod.getBody(), all,
                             [&](unsigned load) { return rc.loadIsRow[load] == row; },
                             &sinks)))
      return failure();
    os << "  }\n";
  }
  if (sinks == 0)
    os << kBiasFixedDecl;
  return success();
}

/// Map functions, then token_forward / token_backward over the token program.
LogicalResult emitTokenProgram(raw_ostream &os, KernelLayout &layout, const FunctorStyle &st) {
  unsigned m = 0;
  DenseMap<Operation *, unsigned> mapIndex;
  for (Operation *op : layout.tokenProgram) {
    auto map = dyn_cast<MapOp>(op);
    if (!map)
      continue;
    mapIndex[op] = m;
    RegionWriter w(os, layout, "v", kIndent), g(os, layout, "g", kIndent);
    os << st.head << "T map_" << m << "(" << st.ctx << ", T x) {\n";
    w.bind(map.getBody().getArgument(0), "x");
    auto out = w.emitBody(map.getBody().front());
    if (failed(out))
      return failure();
    os << "    return " << (*out)[0] << ";\n  }\n";
    if (layout.inferenceOnly) {
      ++m;
      continue;
    }
    os << st.head << "T map_" << m << "_grad(" << st.ctx << ", T x, T g) {\n";
    g.bind(map.getGrad().getArgument(0), "x");
    g.bind(map.getGrad().getArgument(1), "g");
    out = g.emitBody(map.getGrad().front());
    if (failed(out))
      return failure();
    os << "    return " << (*out)[0] << ";\n  }\n";
    ++m;
  }
  auto slot = [&](Value v) { return layout.tokSlot.lookup(v); };
  // The stages run cooperatively: each loop visits the tokens ctx.tok_first(), + tok_step(), ...
  // (all of them on the CPU; a thread's share of a block on the GPU), ctx.tok_sync() separates
  // the stages (a barrier on the GPU), and the scans are ctx's (serial in double on the CPU, a
  // block-parallel scan in double on the GPU).
  os << "  // Token program, forward: every token sequence of this (b, h) into its slot.\n"
     << st.head << "void token_forward(" << st.ctx << ", const T *const *feat, T *tok) {\n"
        "    const int64_t n = ctx.T;\n";
  if (layout.tokenProgram.empty())
    os << "    (void)feat, (void)tok, (void)n;\n";
  for (Operation *op : layout.tokenProgram) {
    unsigned out = slot(op->getResult(0));
    if (auto f = dyn_cast<TokenFeatureOp>(op)) {
      os << llvm::formatv("    for (int64_t t = ctx.tok_first(); t < n; t += ctx.tok_step()) "
                          "tok[{0} * n + t] = feat[{1}][t];  // feature \"{2}\"\n",
                          out, layout.featureIndex.lookup(f), f.getName());
    } else if (auto map = dyn_cast<MapOp>(op)) {
      os << llvm::formatv("    for (int64_t t = ctx.tok_first(); t < n; t += ctx.tok_step()) "
                          "tok[{0} * n + t] = map_{1}(ctx, tok[{2} * n + t]);\n",
                          out, mapIndex.lookup(op), slot(map.getInput()));
    } else if (auto scan = dyn_cast<ScanOp>(op)) {
      os << llvm::formatv("    ctx.tok_scan(tok + {1} * n, tok + {0} * n, n);  // inclusive, in double\n",
                          out, slot(scan.getInput()));
    }
    os << "    ctx.tok_sync();\n";
  }
  os << "  }\n";
  if (layout.inferenceOnly)  // no backward
    return success();
  os << "  // Token program, backward: consumers before producers; dtok holds the\n"
        "  // gradients that score/q/k mods accumulated.\n"
     << st.head << "void token_backward(" << st.ctx
     << ", const T *const *feat, const T *tok, T *dtok, T *const *dfeat) {\n"
        "    const int64_t n = ctx.T;\n";
  if (layout.tokenProgram.empty())
    os << "    (void)feat, (void)tok, (void)dtok, (void)dfeat, (void)n;\n";
  for (Operation *op : llvm::reverse(layout.tokenProgram)) {
    unsigned out = slot(op->getResult(0));
    if (auto f = dyn_cast<TokenFeatureOp>(op)) {
      os << llvm::formatv("    for (int64_t t = ctx.tok_first(); t < n; t += ctx.tok_step()) "
                          "dfeat[{1}][t] = dtok[{0} * n + t];\n",
                          out, layout.featureIndex.lookup(f));
    } else if (auto map = dyn_cast<MapOp>(op)) {
      os << llvm::formatv("    for (int64_t t = ctx.tok_first(); t < n; t += ctx.tok_step()) "
                          "dtok[{2} * n + t] += map_{1}_grad(ctx, tok[{2} * n + t], dtok[{0} * n + t]);\n",
                          out, mapIndex.lookup(op), slot(map.getInput()));
    } else if (auto scan = dyn_cast<ScanOp>(op)) {
      os << llvm::formatv("    ctx.tok_rscan_add(dtok + {0} * n, dtok + {1} * n, n);  // reverse "
                          "cumulative sum, in double\n",
                          out, slot(scan.getInput()));
    }
    os << "    ctx.tok_sync();\n";
  }
  os << "  }\n";
  return success();
}

/// The fixed absolute position table, if the kernel has one: embed_value<T>(n, c, d) from the
/// table region, and embed_table(rows, d, out) filling out[n*d + c] in double precision (the
/// runtime adds the first T rows to the token embedding; KernelEntry::embed_table).
LogicalResult emitEmbedTable(raw_ostream &os, KernelLayout &layout) {
  if (!layout.embedding || layout.embedding.getTable().empty())
    return success();
  Block &b = layout.embedding.getTable().front();
  os << "  // Absolute position table (site E), from ape.position_embedding's table region.\n"
        "  template <class T>\n  static T embed_value(int64_t n, int64_t c, int64_t d) {\n";
  RegionWriter w(os, layout, "v", kIndent);
  w.bind(b.getArgument(0), "n"), w.bind(b.getArgument(1), "c"), w.bind(b.getArgument(2), "d");
  auto out = w.emitBody(b);
  if (failed(out))
    return failure();
  os << "    return " << (*out)[0] << ";\n  }\n"
     << "  static void embed_table(int64_t rows, int64_t d, double *out) {\n"
        "    for (int64_t n = 0; n < rows; ++n)\n"
        "      for (int64_t c = 0; c < d; ++c) out[n * d + c] = embed_value<double>(n, c, d);\n"
        "  }\n";
  return success();
}

/// The pairing as the templates' Enc::kQPairing / kKPairing code: abi::Pairing's value
/// (0 none, 1 half, 2 interleaved), which they pass back to abi::partner.
int pairingCode(abi::Pairing p) { return static_cast<int>(p); }

} // namespace

LogicalResult mlir::ape::emitCpuKernel(KernelOp kernel, StringRef source, raw_ostream &os) {
  // What kernels/include/ape/cpu_attention.h implements: causal attention on 64x64 tiles.
  if (!kernel.getCausal())
    return kernel.emitOpError("is not causal: the CPU kernel template implements causal "
                              "(decoder) attention only");
  for (auto [what, tile] : {std::pair{"tile_q", kernel.getTileQ()},
                            std::pair{"tile_k", kernel.getTileK()}})
    if (tile && *tile != 64)
      return kernel.emitOpError(what) << " = " << *tile
                                      << ": the CPU kernel template is built for 64x64 tiles "
                                         "(run -ape-schedule with tile-q=64 tile-k=64)";
  StringRef name = kernel.getSymName();
  std::string manifest;
  {
    llvm::raw_string_ostream ms(manifest);
    if (failed(emitManifest(kernel, source, ms)))
      return failure();
  }
  os << "// Generated by apec from " << source << " (encoding @" << name
     << "). Do not edit: edit the spec and recompile.\n"
     << "// The functor below is translated from the regions of ape.kernel @" << name
     << "; the flash-attention\n// loops live in kernels/include/ape/cpu_attention.h.\n"
     << "// Compiled once per instruction-set level (ape/cpu_dispatch.h): as it is for the "
        "baseline, with\n// -DAPE_KERNEL_LEVEL=1 (AVX2) and =2 (AVX-512) for the others, all "
        "with -DAPE_KERNEL_LEVELS=<mask>.\n"
     << "#include \"ape/cpu_attention.h\"\n#include \"ape/kernel_entry.h\"\n\n"
     << "#include <algorithm>\n#include <cmath>\n#include <cstdint>\n\n"
     << "APE_CPU_BEGIN  // the functor is compiled for this unit's level\nnamespace {\n\n";
  if (failed(emitEncFunctor(kernel, FunctorTarget::Cpu, os)))
    return failure();
  os << "\n";
  os << "const char kManifest[] = R\"APE_MANIFEST(" << manifest << ")APE_MANIFEST\";\n\n";
  os << "} // namespace\nAPE_CPU_END\n\n"
     << "// ape_kernel_entry_" << name << "_<level>(): name, manifest, fp32 and fp64 "
        "forward/backward of this\n// unit's level; the baseline unit adds ape_kernel_entry_"
     << name << "() (the level chosen at run time)\n// and ape_kernel_entry_" << name
     << "_level(int).\n"
     << "APE_DEFINE_KERNEL_ENTRY(" << name << ", Enc, kManifest)\n";
  return success();
}

LogicalResult mlir::ape::emitEncFunctor(KernelOp kernel, FunctorTarget target, raw_ostream &os) {
  KernelLayout layout;
  if (failed(layout.build(kernel)))
    return failure();
  const FunctorStyle &st = target == FunctorTarget::Cuda ? kCudaStyle : kCpuStyle;
  os << "struct Enc {\n";
  os << "  static constexpr int kNumFeatures = " << layout.features.size() << ";\n"
     << "  static constexpr int kNumParams = " << layout.params.size() << ";\n"
     << "  static constexpr int kNumTok = " << layout.tokSlot.size() << ";\n"
     << "  static constexpr bool kHasQMod = " << (layout.qmod ? "true" : "false") << ";\n"
     << "  static constexpr bool kHasKMod = " << (layout.kmod ? "true" : "false") << ";\n"
     << "  static constexpr bool kHasScoreMod = " << (layout.score ? "true" : "false") << ";\n"
     << "  static constexpr int kQPairing = "
     << (layout.qmod ? pairingCode(layout.qmod.getPairing()) : 0) << ";\n"
     << "  static constexpr int kKPairing = "
     << (layout.kmod ? pairingCode(layout.kmod.getPairing()) : 0) << ";\n"
     << llvm::formatv("  static constexpr double kQFraction = {0:e17};\n",
                      layout.qmod ? layout.qmod.getFraction().convertToDouble() : 1.0)
     << llvm::formatv("  static constexpr double kKFraction = {0:e17};\n",
                      layout.kmod ? layout.kmod.getFraction().convertToDouble() : 1.0);
  // Decoding (cpu_decode.h) caches k' and the token sequences; it recomputes them at every step
  // when they read the sequence length, which these flags (emitted only when true) say.
  auto readsLength = [](Operation *op) {
    bool reads = false;
    if (op)
      op->walk([&](DimOp d) { reads |= d.getWhich() == abi::DimWhich::SeqLen; });
    return reads;
  };
  if (isLinearMod(layout.qmod))
    os << "  static constexpr bool kQModLinear = true;  // q_mod(x, y) = a(t, c) x + b(t, c) y\n";
  if (isLinearMod(layout.kmod))
    os << "  static constexpr bool kKModLinear = true;  // k_mod(x, y) = a(t, c) x + b(t, c) y\n";
  if (readsLength(layout.kmod))
    os << "  static constexpr bool kKModReadsLength = true;  // k' is recomputed when decoding\n";
  if (llvm::any_of(layout.tokenProgram, readsLength))
    os << "  static constexpr bool kTokensReadLength = true;  // the token program reruns when "
          "decoding\n";
  os << (target == FunctorTarget::Cuda ? "  APE_HD " : "  ")
     << "static int64_t param_numel(int n, int64_t H, int64_t D) {\n"
     << "    (void)H, (void)D;\n    switch (n) {\n";
  for (auto [n, p] : llvm::enumerate(layout.params)) {
    std::string numel;
    for (const abi::Dim &d : getDims(p))
      numel += (numel.empty() ? "" : " * ") + dimExpr(d, "H", "D");
    os << "    case " << n << ": return " << numel << ";  // \"" << p.getName() << "\"\n";
  }
  os << "    default: return 0;\n    }\n  }\n";
  if (!layout.rels.empty()) {  // relative rows (rel_rows_forward/backward of the templates)
    os << "  static constexpr int kNumRel = " << layout.rels.size() << ";\n";
    auto table = [&](StringRef what, auto fn) {
      os << "  static constexpr int rel_" << what << "(int n) {\n    switch (n) {\n";
      for (auto [n, r] : llvm::enumerate(layout.rels))
        os << "    case " << n << ": return " << fn(r) << ";\n";
      os << "    default: return -1;\n    }\n  }\n";
    };
    auto paramOf = [&](Value v) -> int64_t {
      return v ? static_cast<int64_t>(layout.paramIndex.lookup(v)) : -1;
    };
    table("side", [&](RelRowsOp r) { return r.getSide() == abi::Side::Q ? 0 : 1; });
    table("rows", [&](RelRowsOp r) { return layout.rowCount(r); });
    table("table", [&](RelRowsOp r) { return paramOf(r.getTable()); });
    table("bias", [&](RelRowsOp r) { return paramOf(r.getBias()); });
    table("table_trainable",
          [&](RelRowsOp r) { return r.getTable().getDefiningOp<ParamOp>().getTrainable() ? 1 : 0; });
    table("bias_trainable", [&](RelRowsOp r) {
      return r.getBias() && r.getBias().getDefiningOp<ParamOp>().getTrainable() ? 1 : 0;
    });
  }
  if (ValueRowsOp vr = layout.valueRows) {  // o_i += Σ_j P_ij table[r(i, j)] (the templates)
    auto table = vr.getTable().getDefiningOp<ParamOp>();
    int64_t rows = getDims(table)[0].value;  // verified: [rows, "heads", "head_dim"]
    os << "  static constexpr bool kHasValueRows = true;\n"
       << "  static constexpr int kValueTable = " << layout.paramIndex.lookup(table) << ";\n"
       << "  static constexpr int64_t kValueRows = " << rows << ";\n"
       << "  static constexpr bool kValueTableTrainable = "
       << (table.getTrainable() ? "true" : "false") << ";\n"
       << (target == FunctorTarget::Cuda
               ? "  template <class Ctx>\n  APE_HD static int64_t value_row(const Ctx &ctx, "
               : "  template <class T>\n  static int64_t value_row(const ape::HeadCtx<T> &ctx, ")
       << "int64_t i, int64_t j) {\n";
    RegionWriter w(os, layout, "v", kIndent);
    Block &b = vr.getIndex().front();
    StringRef args[] = {"ctx.b", "ctx.h", "i", "j"};
    for (unsigned k = 0; k < 4; ++k)
      w.bind(b.getArgument(k), args[k]);
    auto out = w.emitBody(b);
    if (failed(out))
      return failure();
    os << "    return std::clamp<int64_t>(" << (*out)[0] << ", 0, kValueRows - 1);\n  }\n";
  }
  if (AttentionTransitionOp t = layout.transition) {  // attention_transition.h
    if (target == FunctorTarget::Cuda)
      return t.emitOpError("is not supported on CUDA yet: the CUDA template has no post-softmax "
                           "pass (the CPU kernel has it: apec --emit=cpu)");
    os << "  // The attention transition (inference only: the entry has no backward).\n"
       << "  static constexpr ::ape::TransitionAttrs kTransition{" << t.getDivisorOffset() << ", "
       << t.getFirstLayer() << ", " << t.getSkipLast() << ", " << t.getIntervals() << ", "
       << llvm::formatv("{0:e17}, {1:e17}", t.getAlpha().convertToDouble(),
                        t.getBeta().convertToDouble())
       << "};\n";
  }
  if (failed(emitTokenProgram(os, layout, st)) ||
      failed(emitQKMod(os, layout, layout.qmod, "q", st)) ||
      failed(emitQKMod(os, layout, layout.kmod, "k", st)) || failed(emitScoreMod(os, layout, st)) ||
      (layout.score && isDistanceBias(layout.score) &&
       failed(emitDistanceBias(os, layout, st))))
    return failure();
  if (std::optional<RowColBias> rc = rowColBias(layout.score))
    if (failed(emitRowColBias(os, layout, *rc, st)))
      return failure();
  if (failed(emitEmbedTable(os, layout)))
    return failure();
  os << "};\n";
  return success();
}

void mlir::ape::registerCpuEmitter() {
  registerEmitter({"cpu", "OUTDIR/NAME_cpu.cpp: the fused CPU kernel (Enc functor, instantiations)",
                   [](KernelOp kernel, const EmitOptions &o) {
                     return writeFile(o.path(kernel.getSymName() + "_cpu.cpp"),
                                      [&](raw_ostream &os) {
                                        return emitCpuKernel(kernel, o.source, os);
                                      });
                   },
                   kEmitByDefault});
}
