//===- FunctorWriter.cpp - the `Enc` functor of the CPU and CUDA emitters -===//
//
// Translates each region of a kernel into a static member function of an `Enc` functor struct
// (templated on the scalar type T, so one kernel serves fp32 training and fp64 gradient checks),
// which the kernel templates instantiate: kernels/include/ape/cpu/attention.h (CpuEmitter.cpp)
// and cuda/attention.cuh (CudaEmitter.cpp). The member declarations differ by target
// (FunctorStyle), the bodies are the same text.
//
// The gradient of each load (the `grad` region's trailing results) is added to `ctx.dtok` or
// `ctx.dparams` at the load's own indices, which realises every plan (row_sum, col_sum,
// head_sum, scatter, token_sum) with private, deterministic accumulators. The fast paths
// (kQModLinear, kDistanceBias, kRowColBias, ...) follow the facts -ape-classify recorded on the
// kernel (analysis/KernelFacts.h).
//
//===----------------------------------------------------------------------===//
#include "analysis/KernelFacts.h"
#include "codegen/Emitters.h"
#include "codegen/RegionWriter.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>

using namespace mlir;
using namespace mlir::ape;
using namespace mlir::ape::codegen;

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
/// line by the CUDA kernels (APE_NOINLINE, ape/cuda/platform.cuh). The flash kernels evaluate
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

/// Binds `args` to the block arguments of a primal region and writes its body, then
/// `    return <its value>;` and the closing brace of the member function.
/// With `writer`, through it (values it binds, loads say, are not emitted).
LogicalResult emitPrimalReturn(raw_ostream &os, KernelLayout &layout, Block &b,
                               ArrayRef<StringRef> args, RegionWriter *writer = nullptr) {
  RegionWriter own(os, layout, "v", kIndent);
  RegionWriter &w = writer ? *writer : own;
  for (unsigned k = 0; k < b.getNumArguments(); ++k)
    w.bind(b.getArgument(k), args[k]);
  auto out = w.emitBody(b);
  if (failed(out))
    return failure();
  os << "    return " << (*out)[0] << ";\n  }\n";
  return success();
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
  } else if (failed(emitPrimalReturn(os, layout, mod.getBody().front(),
                                      {"x", "y", "c", "t", "ctx.h"}))) {
    return failure();
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
  } else if (failed(emitPrimalReturn(os, layout, mod.getBody().front(), args))) {
    return failure();
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

/// Emitted after the bias gradients when they write nothing (every load of the bias is a fixed
/// param or a feature without a gradient: ALiBi's standard slopes): the backward kernels then skip
/// the bias sums altogether (contract/enc_traits.h: BiasFixed).
constexpr const char *kBiasFixedDecl =
    "  // The bias has no gradient: the backward skips its sums (templates: kBiasFixed).\n"
    "  static constexpr bool kBiasFixed = true;\n";

/// distance_bias(ctx, d) = B(d) and distance_bias_grad(ctx, d, g): B's load gradients for the
/// incoming gradient g (a diagonal's sum of dS). The bodies are the score mod's own, with
/// `i - j` bound to d and the logit to 0 (`0 + B(d)` is B(d) exactly, `0 - X` is -X; a sum `(s + X1) + X2`
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

/// The score mod over features (analysis/KernelFacts.h, ScoreFeatures; CUDA flash kernels:
/// kFeatures), slices of its own regions:
///   row_features(ctx, i, d, f) / col_features(ctx, j, d, f) / slice_features(ctx, i, d, f): the
///     values of the features of a side at query i, key j (or the slice), distance d;
///   score_mod_features(ctx, rf, cf, sf, i, j, s): the score mod with its loads read from them;
///   score_mod_features_grad(ctx, rf, cf, sf, i, j, s, g, drf, dcf, dsf): dS, and each
///     feature's gradient into drf, dcf, dsf (set, not added);
///   row_features_grad(ctx, i, d, g) ...: the gradient sums into the features' elements;
///   features_same<T>(ctx, d1, d2): whether every index that reads the distance (and the value
///     rows' index) is the same at d1 and d2 (the flash kernels' saturation point).
LogicalResult emitScoreFeatures(raw_ostream &os, KernelLayout &layout, const ScoreFeatures &sf,
                                const FunctorStyle &st) {
  ScoreModOp mod = layout.score;
  Block &b = mod.getBody().front(), &gb = mod.getGrad().front();
  static constexpr StringLiteral kArr[] = {"rf", "cf", "sf"};
  static constexpr StringLiteral kSide[] = {"row", "col", "slice"};
  auto name = [&](unsigned f) {
    return (kArr[sf.features[f].side] + "[" + Twine(sf.features[f].slot) + "]").str();
  };
  auto trainable = [](LoadOp load) {
    auto p = load.getSource().getDefiningOp<ParamOp>();
    return !p || p.getTrainable();
  };
  // Binds a region's positions for a side's features: x is i (row), j (col) or unused (slice).
  auto bindPositions = [](RegionWriter &w, Block &blk, unsigned side, StringRef d) {
    w.bind(blk.getArgument(1), "ctx.b"), w.bind(blk.getArgument(2), "ctx.h");
    w.bind(blk.getArgument(3), side == ScoreFeatures::kRow ? "x" : side == ScoreFeatures::kCol ? "(x + d)" : "d");
    w.bind(blk.getArgument(4), side == ScoreFeatures::kRow ? "(x - d)" : side == ScoreFeatures::kCol ? "x" : "int64_t(0)");
    for (Operation *user : blk.getArgument(3).getUsers())
      if (auto sub = dyn_cast<arith::SubIOp>(user); sub && sub.getLhs() == blk.getArgument(3) &&
                                                    sub.getRhs() == blk.getArgument(4))
        w.bind(sub.getResult(), d);
  };
  os << "  // The score mod reads memory only at features of the query row, the key column or the\n"
     << "  // slice (CUDA flash kernels: kFeatures).\n"
     << "  static constexpr bool kFeatures = true;\n"
     << "  static constexpr int kRowFeatures = " << sf.count(ScoreFeatures::kRow)
     << ", kColFeatures = " << sf.count(ScoreFeatures::kCol)
     << ", kSliceFeatures = " << sf.count(ScoreFeatures::kSlice) << ";\n";
  unsigned sinks = 0;
  for (unsigned side = 0; side < 3; ++side)
    for (bool grad : {false, true}) {
      os << st.head << "void " << kSide[side] << "_features" << (grad ? "_grad(" : "(") << st.ctx
         << ", int64_t x, int64_t d, " << (grad ? "const T *g" : "T *f") << ") {\n"
         << "    (void)ctx, (void)x, (void)d, (void)" << (grad ? "g" : "f") << ";\n";
      for (auto [k, f] : llvm::enumerate(sf.features)) {
        if (f.side != side || (grad && !trainable(LoadOp(f.load))))
          continue;
        RegionWriter w(os, layout, ("f" + Twine(k) + "_").str(), kIndent);
        Block &blk = *f.load->getBlock();
        bindPositions(w, blk, side, "d");
        LoadOp load = f.load;
        SmallVector<Value> idx(load.getIndices().begin(), load.getIndices().end());
        if (failed(w.emitSlice(blk, idx)))
          return failure();
        FailureOr<std::string> el = grad ? w.element(load, "ctx.dtok", "ctx.dparams")
                                         : w.element(load, "ctx.tok", "ctx.params");
        if (failed(el))
          return failure();
        if (grad) {
          os << kIndent << *el << " += g[" << f.slot << "];\n";
          ++sinks;
        } else {
          os << kIndent << "f[" << f.slot << "] = " << *el << ";\n";
        }
      }
      os << "  }\n";
    }
  if (sinks == 0)
    os << kBiasFixedDecl;
  // The score mod and its gradient over the features.
  auto bindLoads = [&](RegionWriter &w, Block &blk) {
    blk.walk([&](LoadOp load) { w.bind(load.getResult(), name(sf.featureOf.lookup(load))); });
  };
  StringRef args[] = {"s", "ctx.b", "ctx.h", "i", "j", "g"};
  os << st.head << "T score_mod_features(" << st.ctx
     << ", const T *rf, const T *cf, const T *sf, int64_t i, int64_t j, T s) {\n"
     << "    (void)rf, (void)cf, (void)sf;\n";
  {
    RegionWriter w(os, layout, "v", kIndent);
    bindLoads(w, b);
    if (failed(emitPrimalReturn(os, layout, b, args, &w)))
      return failure();
  }
  os << st.head << "T score_mod_features_grad(" << st.ctx
     << ", const T *rf, const T *cf, const T *sf, int64_t i, int64_t j, T s, T g, T *drf, T *dcf, "
        "T *dsf) {\n"
     << "    (void)rf, (void)cf, (void)sf, (void)drf, (void)dcf, (void)dsf;\n";
  for (unsigned side = 0; side < 3; ++side)
    for (unsigned k = 0; k < sf.count(static_cast<ScoreFeatures::Side>(side)); ++k)
      os << kIndent << "d" << kArr[side] << "[" << k << "] = T(0);\n";
  RegionWriter primal(os, layout, "p", kIndent), grad(os, layout, "g", kIndent);
  bindLoads(primal, b);
  bindLoads(grad, gb);
  auto out = emitPrimalThenGrad(primal, grad, b, gb, args);
  if (failed(out))
    return failure();
  unsigned k = 0;
  b.walk([&](LoadOp load) {
    const std::string &g = (*out)[1 + k++];
    if (trainable(load))
      os << kIndent << "d" << name(sf.featureOf.lookup(load)) << " += " << g << ";\n";
  });
  os << "    return " << (*out)[0] << ";\n  }\n";
  // Whether the indices that read the distance agree at d1 and d2.
  os << st.head << "bool features_same(" << st.ctx << ", int64_t d1, int64_t d2) {\n"
     << "    (void)ctx, (void)d1, (void)d2;\n    bool same = true;\n";
  auto compare = [&](Block &blk, ArrayRef<Value> roots, unsigned k, bool scoreRegion) -> LogicalResult {
    RegionWriter w1(os, layout, ("a" + Twine(k) + "_").str(), kIndent),
        w2(os, layout, ("b" + Twine(k) + "_").str(), kIndent);
    for (auto [w, d] : {std::pair{&w1, "d1"}, std::pair{&w2, "d2"}}) {
      if (scoreRegion) {
        bindPositions(*w, blk, ScoreFeatures::kSlice, d);
      } else {  // the value rows' index region: (b, h, i, j)
        w->bind(blk.getArgument(0), "ctx.b"), w->bind(blk.getArgument(1), "ctx.h");
        w->bind(blk.getArgument(2), d), w->bind(blk.getArgument(3), "int64_t(0)");
        for (Operation *user : blk.getArgument(2).getUsers())
          if (auto sub = dyn_cast<arith::SubIOp>(user); sub && sub.getRhs() == blk.getArgument(3))
            w->bind(sub.getResult(), d);
      }
      if (failed(w->emitSlice(blk, roots)))
        return failure();
    }
    for (Value x : roots)
      if (w1.get(x) != w2.get(x))  // (not the slice's b, h)
        os << kIndent << "same = same && " << w1.get(x) << " == " << w2.get(x) << ";\n";
    return success();
  };
  for (auto [k, f] : llvm::enumerate(sf.features)) {
    if (!f.readsDistance)
      continue;
    LoadOp load = f.load;
        SmallVector<Value> idx(load.getIndices().begin(), load.getIndices().end());
    if (failed(compare(*f.load->getBlock(), idx, k, true)))
      return failure();
  }
  if (ValueRowsOp vr = layout.valueRows) {
    Block &vb = vr.getIndex().front();
    if (failed(compare(vb, {vb.getTerminator()->getOperand(0)}, sf.features.size(), false)))
      return failure();
  }
  os << "    return same;\n  }\n";
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
  // The stages run cooperatively: ctx.tok_map(dst, n, f, a[, b]) sets dst[t] = f(a[t][, b[t]])
  // for every token and tok_map_add adds it (in order on the CPU; a thread's share of a block on
  // the GPU, its tokens' loads in flight together), ctx.tok_sync() separates the stages (a barrier on the GPU), and the
  // scans are ctx's (serial in double on the CPU, block-parallel in double on the GPU).
  // Slot k of tok is tok + k * ld (ctx.tok_stride(): T on the CPU; a decode cache's capacity
  // where the CUDA kernels keep the sequences across steps); n tokens of each.
  os << "  // Token program, forward: every token sequence of this (b, h) into its slot.\n"
     << st.head << "void token_forward(" << st.ctx << ", const T *const *feat, T *tok) {\n"
        "    const int64_t n = ctx.T, ld = ctx.tok_stride();\n";
  if (layout.tokenProgram.empty())
    os << "    (void)feat, (void)tok, (void)n, (void)ld;\n";
  for (Operation *op : layout.tokenProgram) {
    unsigned out = slot(op->getResult(0));
    if (auto f = dyn_cast<TokenFeatureOp>(op)) {
      os << llvm::formatv("    ctx.tok_map(tok + {0} * ld, n, [&](T x) {{ return x; }, feat[{1}]);  "
                          "// feature \"{2}\"\n",
                          out, layout.featureIndex.lookup(f), f.getName());
    } else if (auto map = dyn_cast<MapOp>(op)) {
      os << llvm::formatv("    ctx.tok_map(tok + {0} * ld, n, [&](T x) {{ return map_{1}(ctx, x); }, tok + {2} * ld);\n",
                          out, mapIndex.lookup(op), slot(map.getInput()));
    } else if (auto scan = dyn_cast<ScanOp>(op)) {
      os << llvm::formatv("    ctx.tok_scan(tok + {1} * ld, tok + {0} * ld, n);  // inclusive, in double\n",
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
        "    const int64_t n = ctx.T, ld = ctx.tok_stride();\n";
  if (layout.tokenProgram.empty())
    os << "    (void)feat, (void)tok, (void)dtok, (void)dfeat, (void)n, (void)ld;\n";
  for (Operation *op : llvm::reverse(layout.tokenProgram)) {
    unsigned out = slot(op->getResult(0));
    if (auto f = dyn_cast<TokenFeatureOp>(op)) {
      os << llvm::formatv("    ctx.tok_map(dfeat[{1}], n, [&](T g) {{ return g; }, dtok + {0} * ld);\n",
                          out, layout.featureIndex.lookup(f));
    } else if (auto map = dyn_cast<MapOp>(op)) {
      os << llvm::formatv("    ctx.tok_map_add(dtok + {2} * ld, n, [&](T x, T g) {{ return map_{1}_grad(ctx, x, g); }, "
                          "tok + {2} * ld, dtok + {0} * ld);\n",
                          out, mapIndex.lookup(op), slot(map.getInput()));
    } else if (auto scan = dyn_cast<ScanOp>(op)) {
      os << llvm::formatv("    ctx.tok_rscan_add(dtok + {0} * ld, dtok + {1} * ld, n);  // reverse "
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

LogicalResult mlir::ape::emitEncFunctor(KernelOp kernel, FunctorTarget target, raw_ostream &os) {
  KernelLayout layout;
  if (failed(layout.build(kernel)))
    return failure();
  layout.approxMath = target == FunctorTarget::Cuda;
  const FunctorStyle &st = target == FunctorTarget::Cuda ? kCudaStyle : kCpuStyle;
  // A functor need not read each of its arguments (a q mod its pair partner y, a body no param's
  // ctx), nor a kernel each of its constants (Clang's -Wunused-const-variable, the struct being in
  // an unnamed namespace): the sources build free of GCC's and Clang's -Wall -Wextra warnings,
  // whatever the includer's flags.
  os << "#if defined(__GNUC__)\n#pragma GCC diagnostic push\n"
        "#pragma GCC diagnostic ignored \"-Wunused-parameter\"\n"
        "#pragma GCC diagnostic ignored \"-Wunused-const-variable\"\n#endif\n";
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
  // Decoding (cpu/decode.h) caches k' and the token sequences; it recomputes them at every step
  // when they read the sequence length, which these flags (emitted only when true) say.
  // The facts of -ape-classify (analysis/KernelFacts.h), each checked before it is used.
  if (failed(layout.checkFacts(kernel)))
    return failure();
  if (kernel.getQModLinear())
    os << "  static constexpr bool kQModLinear = true;  // q_mod(x, y) = a(t, c) x + b(t, c) y\n";
  if (kernel.getKModLinear())
    os << "  static constexpr bool kKModLinear = true;  // k_mod(x, y) = a(t, c) x + b(t, c) y\n";
  if (kernel.getKModReadsLength())
    os << "  static constexpr bool kKModReadsLength = true;  // k' is recomputed when decoding\n";
  if (kernel.getTokensReadLength())
    os << "  static constexpr bool kTokensReadLength = true;  // the token program reruns when "
          "decoding\n";
  // The trainable parameters each q/k mod reads (so its gradient adds to them), a bit each: the
  // CUDA backward sums those gradients over rows in registers (cuda/side_kernels.cuh,
  // mod_backward_params_kernel). Emitted with every mod of the CUDA functor, 0 where it reads none.
  auto modParams = [&](Operation *mod, StringRef name) {
    if (!mod || target != FunctorTarget::Cuda || layout.params.size() > 32)
      return;
    uint32_t mask = 0;
    mod->walk([&](LoadOp load) {
      auto it = layout.paramIndex.find(load.getSource());
      auto p = load.getSource().getDefiningOp<ParamOp>();
      if (it != layout.paramIndex.end() && (!p || p.getTrainable()))
        mask |= 1u << it->second;
    });
    os << llvm::formatv("  static constexpr unsigned k{0}ModParams = {1:x}u;  // trainable, read by the "
                        "{2} mod, a bit each\n",
                        name, mask, name.lower());
  };
  modParams(layout.qmod ? layout.qmod.getOperation() : nullptr, "Q");
  modParams(layout.kmod ? layout.kmod.getOperation() : nullptr, "K");
  // The parameters the score mod reads (and its gradient adds to), a bit each: the flash kernels
  // stage those in shared memory (cuda/flash_forward.cuh, ParamCache). Emitted with every score
  // mod, 0 where it reads none (relative rows' tables are read through the rows, not by it).
  if (layout.score && layout.params.size() <= 32) {
    uint32_t mask = 0;
    layout.score->walk([&](LoadOp load) {
      auto it = layout.paramIndex.find(load.getSource());
      if (it != layout.paramIndex.end())
        mask |= 1u << it->second;
    });
    os << llvm::formatv("  static constexpr unsigned kScoreParams = {0:x}u;  // read by the score "
                        "mod, a bit each\n",
                        mask);
  }
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
  if (AttentionTransitionOp t = layout.transition) {  // contract/transition.h
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
      (kernel.getScoreBias() == "distance" && failed(emitDistanceBias(os, layout, st))))
    return failure();
  if (kernel.getScoreBias() == "row_col")
    if (failed(emitRowColBias(os, layout, *rowColBias(layout.score), st)))
      return failure();
  if (kernel.getScoreBias() == "features" && target == FunctorTarget::Cuda && !layout.inferenceOnly)
    if (failed(emitScoreFeatures(os, layout, *scoreFeatures(layout.score, layout.valueRows), st)))
      return failure();
  if (failed(emitEmbedTable(os, layout)))
    return failure();
  os << "};\n#if defined(__GNUC__)\n#pragma GCC diagnostic pop\n#endif\n";
  return success();
}
