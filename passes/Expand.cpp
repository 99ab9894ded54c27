//===- Expand.cpp - named components to generic forms ---------------------===//
//
// Each named component is sugar: this pass replaces it, in place, by the
// params, token features, maps, scans and mod regions it stands for. After
// it, only generic forms (and ape.override, for -ape-push-override) remain.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/RegionBuilder.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

#include <cmath>

namespace mlir::ape {
#define GEN_PASS_DEF_APEEXPAND
#include "passes/Passes.h.inc"
} // namespace mlir::ape

using namespace mlir;
using namespace mlir::ape;

namespace {

/// A fixed scalar param (shape ["1"]) holding `value`, which a runtime may change between
/// calls without recompiling (ape-eval --set NAME=VALUE) within `range` (the rule the
/// verifier applied to the spec's attribute).
ParamOp fixedScalar(OpBuilder &b, Location loc, StringRef name, double value,
                    const ape_rules::Range &range) {
  ParamOp p = createParam(b, loc, name, {"1"}, abi::InitKind::Constant, /*trainable=*/false);
  p.setValueAttr(b.getF64FloatAttr(value));
  setValueRange(p, range);
  return p;
}

/// The fixed params of a rotary scaling (null when the scaling has none).
struct RotaryScalars {
  Value factor, originalLength;
};

/// θ'_k of the rotary scalings (s = factor, L = original length, r rotated coordinates,
/// k the pair index, θ_k = base^(-2k/r)); also sets `mscale` for YaRN.
Value scaledTheta(RegionBuilder &rb, RotaryOp rot, const RotaryScalars &sc, Value kF, Value rF,
                  Value &mscale) {
  OpBuilder &b = rb.b;
  Location loc = rb.loc;
  auto pow = [&](Value x, Value y) { return b.create<math::PowFOp>(loc, x, y).getResult(); };
  auto log = [&](Value x) { return b.create<math::LogOp>(loc, x).getResult(); };
  auto cmp = [&](arith::CmpFPredicate p, Value x, Value y) {
    return b.create<arith::CmpFOp>(loc, p, x, y).getResult();
  };
  double base = rot.getBase().convertToDouble();
  using abi::Scaling;
  Scaling scaling = rot.getScaling();
  Value exponent = rb.div(rb.mul(kF, rb.f32(-2.0)), rF);  // -2k/r
  Value theta = pow(rb.f32(base), exponent);             // exact operands: fp64-exact in fp64
  if (scaling == Scaling::None)
    return theta;
  Value s = rb.load(sc.factor, {rb.idx(0)});
  if (scaling == Scaling::Linear)  // position interpolation
    return rb.div(theta, s);
  if (scaling == Scaling::Ntk || scaling == Scaling::DynamicNtk) {
    // base' = base·g^(r/(r-2)), g = s (NTK) or s·l/L - (s-1), l = max(T, L) (dynamic NTK)
    Value g = s;
    if (scaling == Scaling::DynamicNtk) {
      Value L = rb.load(sc.originalLength, {rb.idx(0)});
      Value l = rb.maxf(rb.toF32(rb.dim("seq_len")), L);
      g = rb.sub(rb.div(rb.mul(s, l), L), rb.sub(s, rb.f32(1.0)));
    }
    Value scaledBase = rb.mul(rb.f32(base), pow(g, rb.div(rF, rb.sub(rF, rb.f32(2.0)))));
    return pow(scaledBase, exponent);
  }
  Value L = rb.load(sc.originalLength, {rb.idx(0)});
  if (scaling == Scaling::Yarn) {
    // dimIdx(R) = r·ln(L/(2πR)) / (2 ln base); ramp over [low, high] blends θ/s into θ.
    auto dimIdx = [&](double rotations) {
      Value ratio = rb.div(L, rb.f32(2.0 * M_PI * rotations));
      return rb.div(rb.mul(rF, log(ratio)), rb.f32(2.0 * std::log(base)));
    };
    Value low = rb.maxf(b.create<math::FloorOp>(loc, dimIdx(rot.getBetaFast().convertToDouble())),
                        rb.f32(0.0));
    Value high = rb.minf(b.create<math::CeilOp>(loc, dimIdx(rot.getBetaSlow().convertToDouble())),
                         rb.sub(rF, rb.f32(1.0)));
    high = rb.select(cmp(arith::CmpFPredicate::OEQ, low, high), rb.add(high, rb.f32(0.001)), high);
    Value ramp = rb.div(rb.sub(kF, low), rb.sub(high, low));
    ramp = rb.minf(rb.maxf(ramp, rb.f32(0.0)), rb.f32(1.0));
    Value interpolated = rb.div(theta, s);
    // mscale = 0.1·ln(s) + 1 for s > 1, else 1; it multiplies q and k, so logits by mscale².
    mscale = rb.select(cmp(arith::CmpFPredicate::OGT, s, rb.f32(1.0)),
                       rb.add(rb.mul(rb.f32(0.1), log(s)), rb.f32(1.0)), rb.f32(1.0));
    return rb.add(rb.mul(interpolated, ramp), rb.mul(theta, rb.sub(rb.f32(1.0), ramp)));
  }
  // llama3: wavelength λ = 2π/θ; λ < L/high keeps θ, λ > L/low uses θ/s, blend between.
  double lowFF = rot.getLowFreqFactor().convertToDouble();
  double highFF = rot.getHighFreqFactor().convertToDouble();
  Value lambda = rb.div(rb.f32(2.0 * M_PI), theta);
  Value interpolated = rb.div(theta, s);
  Value smooth = rb.div(rb.sub(rb.div(L, lambda), rb.f32(lowFF)), rb.f32(highFF - lowFF));
  Value blended = rb.add(rb.mul(rb.sub(rb.f32(1.0), smooth), interpolated), rb.mul(smooth, theta));
  Value longWave = cmp(arith::CmpFPredicate::OGT, lambda, rb.div(L, rb.f32(lowFF)));
  Value shortWave = cmp(arith::CmpFPredicate::OLT, lambda, rb.div(L, rb.f32(highFF)));
  return rb.select(shortWave, theta, rb.select(longWave, interpolated, blended));
}

/// The rotation of a pair: x' = x·cos(a) ∓ y·sin(a) (minus for the first of the pair).
Value rotatePair(RegionBuilder &rb, Value x, Value y, Value first, Value angle) {
  Value cs = rb.b.create<math::CosOp>(rb.loc, angle);
  Value sn = rb.b.create<math::SinOp>(rb.loc, angle);
  Value sign = rb.select(first, rb.f32(-1.0), rb.f32(1.0));
  return rb.add(rb.mul(x, cs), rb.mul(rb.mul(sign, y), sn));
}

/// Pair bookkeeping shared by rotary and xPos: r = 2·floor(fraction·d_h/2) rotated
/// coordinates, k the pair index of c, `first` whether c is the first of its pair.
struct PairInfo {
  Value r, k, first, inRotation;
};

PairInfo pairInfo(RegionBuilder &rb, Value c, double fraction, bool half) {
  OpBuilder &b = rb.b;
  Location loc = rb.loc;
  // r = 0 is the identity, as in the kernel template's pairing; the divisor r/2 is kept >= 1
  // so the index arithmetic stays defined.
  Value halfI = rb.rotatedHalf(fraction);
  PairInfo p;
  p.r = rb.imul(halfI, rb.idx(2));
  Value halfR = b.create<arith::MaxUIOp>(loc, halfI, rb.idx(1));
  p.inRotation = rb.ult(c, p.r);
  p.k = half ? rb.irem(c, halfR) : rb.idiv(c, rb.idx(2));
  p.first = half ? rb.ult(c, halfR)
                 : b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, rb.irem(c, rb.idx(2)),
                                           rb.idx(0));
  return p;
}

/// The body of a rotary q_mod / k_mod:
///   x' = x·cos(t·θ'_k) ∓ y·sin(t·θ'_k) on the first r coordinates, x' = x past r,
///   times mscale for YaRN.
void buildRotaryBody(OpBuilder &b, Region &region, RotaryOp rot, const RotaryScalars &sc,
                     Location loc) {
  MLIRContext *ctx = b.getContext();
  Type f32 = Float32Type::get(ctx), idx = IndexType::get(ctx);
  Block *block = createRegionBlock(b, region, {f32, f32, idx, idx, idx}, loc);
  RegionBuilder rb{b, loc};
  Value x = block->getArgument(0), y = block->getArgument(1), c = block->getArgument(2),
        t = block->getArgument(3);
  PairInfo p = pairInfo(rb, c, rot.getFraction().convertToDouble(),
                        rot.getPairing() == abi::Pairing::Half);
  Value mscale;
  Value theta = scaledTheta(rb, rot, sc, rb.toF32(p.k), rb.toF32(p.r), mscale);
  Value rotated = rotatePair(rb, x, y, p.first, rb.mul(rb.toF32(t), theta));
  Value out = rb.select(p.inRotation, rotated, x);
  rb.yield(mscale ? rb.mul(out, mscale) : out);
}

void expandRotary(OpBuilder &b, RotaryOp rot) {
  Location loc = rot.getLoc();
  RotaryScalars sc;
  using abi::Scaling;
  Scaling scaling = rot.getScaling();
  if (scaling != Scaling::None)
    sc.factor = fixedScalar(b, loc, "rope_factor", rot.getFactor()->convertToDouble(),
                            ape_rules::kRopeFactor);
  if (scaling == Scaling::DynamicNtk || scaling == Scaling::Yarn || scaling == Scaling::Llama3)
    sc.originalLength = fixedScalar(b, loc, "rope_original_length",
                                    static_cast<double>(*rot.getOriginalLength()),
                                    ape_rules::kRopeOriginalLength);
  auto build = [&](auto mod) {
    OpBuilder::InsertionGuard guard(b);
    buildRotaryBody(b, mod.getBody(), rot, sc, loc);
  };
  build(b.create<QModOp>(loc, rot.getPairingAttr(), rot.getFractionAttr()));
  build(b.create<KModOp>(loc, rot.getPairingAttr(), rot.getFractionAttr()));
}

/// xPos: interleaved rotation times ζ_k^(±t_c/B), ζ_k = (k/(d_h/2) + γ)/(1 + γ),
/// t_c = t - floor(T/2); + for q, - for k.
void expandXpos(OpBuilder &b, XposOp op) {
  Location loc = op.getLoc();
  MLIRContext *ctx = b.getContext();
  Type f32 = Float32Type::get(ctx), idx = IndexType::get(ctx);
  double gamma = op.getGamma().convertToDouble(), scaleBase = op.getScaleBase().convertToDouble(),
         base = op.getBase().convertToDouble();
  auto build = [&](Region &region, double sign) {
    OpBuilder::InsertionGuard guard(b);
    Block *block = createRegionBlock(b, region, {f32, f32, idx, idx, idx}, loc);
    RegionBuilder rb{b, loc};
    Value x = block->getArgument(0), y = block->getArgument(1), c = block->getArgument(2),
          t = block->getArgument(3);
    PairInfo p = pairInfo(rb, c, 1.0, /*half=*/false);
    Value kF = rb.toF32(p.k);
    Value exponent = rb.div(rb.mul(kF, rb.f32(-2.0)), rb.toF32(p.r));
    Value theta = b.create<math::PowFOp>(loc, rb.f32(base), exponent);
    Value rotated = rotatePair(rb, x, y, p.first, rb.mul(rb.toF32(t), theta));
    Value halfHead = rb.mul(rb.toF32(rb.dim("head_dim")), rb.f32(0.5));
    Value zeta = rb.div(rb.add(rb.div(kF, halfHead), rb.f32(gamma)), rb.f32(1.0 + gamma));
    Value centred = rb.toF32(rb.isub(t, rb.idiv(rb.dim("seq_len"), rb.idx(2))));
    Value power = rb.mul(centred, rb.f32(sign / scaleBase));
    Value decay = b.create<math::PowFOp>(loc, zeta, power);
    rb.yield(rb.select(p.inRotation, rb.mul(rotated, decay), x));
  };
  StringAttr interleaved = b.getStringAttr(abi::name(abi::Pairing::Interleaved));
  auto q = b.create<QModOp>(loc, interleaved, b.getF64FloatAttr(1.0));
  build(q.getBody(), 1.0);
  auto k = b.create<KModOp>(loc, interleaved, b.getF64FloatAttr(1.0));
  build(k.getBody(), -1.0);
}

/// Absolute positions: a sinusoidal table region or a learned table.
void expandAbsolute(OpBuilder &b, AbsoluteOp op) {
  Location loc = op.getLoc();
  bool learned = op.getKind() == abi::AbsoluteKind::Learned;
  auto pe = b.create<PositionEmbeddingOp>(
      loc, learned ? b.getUnitAttr() : nullptr, op.getMaxLengthAttr(), op.getStdAttr(),
      op.getScaleEmbedding() ? b.getUnitAttr() : nullptr);
  if (learned)
    return;
  // PE[n, 2k] = sin(n / base^(2k/d)), PE[n, 2k+1] = cos(n / base^(2k/d))
  OpBuilder::InsertionGuard guard(b);
  Type idx = b.getIndexType();
  Block *block = createRegionBlock(b, pe.getTable(), {idx, idx, idx}, loc);
  RegionBuilder rb{b, loc};
  Value n = block->getArgument(0), c = block->getArgument(1), d = block->getArgument(2);
  Value odd = rb.irem(c, rb.idx(2));
  Value even = rb.toF32(rb.isub(c, odd));  // 2k
  Value exponent = rb.div(rb.neg(even), rb.toF32(d));
  Value freq = b.create<math::PowFOp>(loc, rb.f32(op.getBase().convertToDouble()), exponent);
  Value angle = rb.mul(rb.toF32(n), freq);
  Value isSin = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, odd, rb.idx(0));
  Value sn = b.create<math::SinOp>(loc, angle);
  Value cs = b.create<math::CosOp>(loc, angle);
  rb.yield(rb.select(isSin, sn, cs));
}

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

void expandAlibi(OpBuilder &b, AlibiOp op) {
  Location loc = op.getLoc();
  ParamOp slopes = createParam(b, loc, "alibi_slopes", {"heads"}, abi::InitKind::AlibiSlopes,
                               op.getLearned());
  // B_ij = -m_h·(i - j)
  buildScoreMod(b, loc, [&](RegionBuilder &rb, Value, Value h, Value i, Value j) {
    Value m = rb.load(slopes, {h});
    return rb.neg(rb.mul(m, rb.toF32(rb.isub(i, j))));
  });
}

void expandCable(OpBuilder &b, CableOp op) {
  Location loc = op.getLoc();
  MLIRContext *ctx = b.getContext();
  auto tokens = TokensType::get(ctx);
  auto feature = b.create<TokenFeatureOp>(loc, tokens, b.getStringAttr("cable"),
                                          op.getWeightStdAttr(), b.getF64FloatAttr(0.0));
  // b_t = -softplus(f_t)
  auto map = b.create<MapOp>(loc, tokens, feature.getResult());
  {
    OpBuilder::InsertionGuard guard(b);
    Block *block = createRegionBlock(b, map.getBody(), {Float32Type::get(ctx)}, loc);
    RegionBuilder rb{b, loc};
    rb.yield(rb.neg(rb.softplus(block->getArgument(0))));
  }
  // S_t = Σ_{u<=t} b_u
  auto scan = b.create<ScanOp>(loc, tokens, map.getResult());
  bool kernel = op.getKernel() == abi::CableKernel::Log1pSq;
  buildScoreMod(b, loc, [&](RegionBuilder &rb, Value bb, Value h, Value i, Value j) {
    Value si = rb.load(scan, {bb, h, i});
    Value sj = rb.load(scan, {bb, h, j});
    Value d = rb.sub(si, sj);
    // Cable: B = S_i - S_j;  K-Cable: B = -log(1 + (S_i - S_j)^2)
    return kernel ? rb.neg(rb.log1p(rb.mul(d, d))) : d;
  });
  if (auto kappa = op.getKappaAttr())
    op->getParentOfType<EncodingOp>().setScaleAttr(kappa);
}

/// A param of `shape` with initialiser `init`; `shared` params are one tensor for all layers.
ParamOp newParam(OpBuilder &b, Location loc, StringRef name, ArrayRef<StringRef> shape,
                 abi::InitKind init, bool trainable, bool shared = false) {
  ParamOp p = createParam(b, loc, name, shape, init, trainable);
  p.setShared(shared);
  return p;
}

/// n = max(i - j, 0) as an index (rows above the diagonal, which the mask drops, give 0).
Value distance(RegionBuilder &rb, Value i, Value j) {
  return rb.b.create<arith::MaxSIOp>(rb.loc, rb.isub(i, j), rb.idx(0));
}

/// T5: B_ij = T[bucket(i - j), h], one [buckets, heads] table shared by all layers.
void expandT5(OpBuilder &b, T5BiasOp op) {
  Location loc = op.getLoc();
  int64_t buckets = op.getBuckets(), exact = buckets / 2;
  double maxDistance = static_cast<double>(op.getMaxDistance());
  std::string rows = std::to_string(buckets);
  ParamOp table = newParam(b, loc, "t5_table", {rows, "heads"}, abi::InitKind::Normal, true,
                           /*shared=*/true);
  table.setStdAttr(op.getStdAttr());
  buildScoreMod(b, loc, [&](RegionBuilder &rb, Value, Value h, Value i, Value j) {
    OpBuilder &ob = rb.b;
    Value n = distance(rb, i, j);
    Value exactIdx = rb.idx(exact);
    Value small = ob.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, n, exactIdx);
    // exact + floor(ln(n/exact) / ln(max_distance/exact) · exact), n >= exact (no log 0)
    Value nF = rb.toF32(ob.create<arith::MaxSIOp>(loc, n, exactIdx));
    Value logRatio = ob.create<math::LogOp>(loc, rb.div(nF, rb.f32(static_cast<double>(exact))));
    Value steps = ob.create<math::FloorOp>(
        loc, rb.mul(logRatio, rb.f32(static_cast<double>(exact) /
                                     std::log(maxDistance / static_cast<double>(exact)))));
    Value stepsIdx = ob.create<arith::IndexCastOp>(
        loc, ob.getIndexType(), ob.create<arith::FPToSIOp>(loc, ob.getI64Type(), steps));
    Value large = ob.create<arith::MinSIOp>(loc, rb.iadd(exactIdx, stepsIdx), rb.idx(buckets - 1));
    Value bucket = ob.create<arith::SelectOp>(loc, small, n, large);
    return rb.load(table, {bucket, h});
  });
}

/// KERPLE: -p_h·ln(1 + a_h·Δ) ("log") or -a_h·Δ^(p_h) ("power"), p and a clamped.
void expandKerple(OpBuilder &b, KerpleOp op) {
  Location loc = op.getLoc();
  bool power = op.getKind() == abi::KerpleKind::Power;
  ParamOp p =
      newParam(b, loc, "kerple_p", {"heads"}, abi::InitKind::Constant, true, /*shared=*/true);
  p.setValueAttr(op.getPInitAttr());
  ParamOp a =
      newParam(b, loc, "kerple_a", {"heads"}, abi::InitKind::Constant, true, /*shared=*/true);
  a.setValueAttr(op.getAInitAttr());
  buildScoreMod(b, loc, [&](RegionBuilder &rb, Value, Value h, Value i, Value j) {
    Value pv = rb.maxf(rb.load(p, {h}), rb.f32(0.01));
    Value av = rb.maxf(rb.load(a, {h}), rb.f32(0.01));
    Value d = rb.toF32(distance(rb, i, j));
    if (!power)
      return rb.neg(rb.mul(pv, rb.log1p(rb.mul(av, d))));
    pv = rb.minf(pv, rb.f32(2.0));
    // Δ^p at Δ = 0 is 0; the select keeps ln(0) out of the exponent's gradient.
    Value positive = rb.b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, d, rb.f32(0.0));
    Value powered = rb.b.create<math::PowFOp>(loc, d, pv);
    return rb.neg(rb.mul(av, rb.select(positive, powered, rb.f32(0.0))));
  });
}

/// FIRE: MLP_h(ψ(Δ) / (ψ(max(i, l_init·L)) + 1e-6)), ψ(x) = ln(|c·x| + 1), ReLU hidden layer.
void expandFire(OpBuilder &b, FireOp op) {
  Location loc = op.getLoc();
  int64_t hidden = op.getHidden();
  std::string width = std::to_string(hidden);
  ParamOp c = newParam(b, loc, "fire_c", {"1"}, abi::InitKind::Constant, true);
  c.setValueAttr(op.getCAttr());
  ParamOp lMult = newParam(b, loc, "fire_l_mult", {"1"}, abi::InitKind::Constant, true);
  lMult.setValueAttr(b.getF64FloatAttr(1.0));
  ParamOp w1 = newParam(b, loc, "fire_w1", {width}, abi::InitKind::Normal, true);
  w1.setStdAttr(b.getF64FloatAttr(1.0));
  ParamOp b1 = newParam(b, loc, "fire_b1", {width}, abi::InitKind::Zeros, true);
  ParamOp w2 = newParam(b, loc, "fire_w2", {width, "heads"}, abi::InitKind::Normal, true);
  w2.setStdAttr(b.getF64FloatAttr(0.1));
  ParamOp b2 = newParam(b, loc, "fire_b2", {"heads"}, abi::InitKind::Zeros, true);
  double lInit = op.getLInit().convertToDouble();
  buildScoreMod(b, loc, [&](RegionBuilder &rb, Value, Value h, Value i, Value j) {
    Value cv = rb.load(c, {rb.idx(0)});
    Value lv = rb.load(lMult, {rb.idx(0)});
    auto psi = [&](Value x) { return rb.log1p(rb.absf(rb.mul(cv, x))); };
    Value d = rb.toF32(distance(rb, i, j));
    Value norm = rb.maxf(rb.toF32(i), rb.mul(rb.f32(lInit), lv));
    Value x = rb.div(psi(d), rb.add(psi(norm), rb.f32(1e-6)));
    SmallVector<Value> terms;
    for (int64_t k = 0; k < hidden; ++k) {
      Value kk = rb.idx(k);
      Value pre = rb.add(rb.mul(rb.load(w1, {kk}), x), rb.load(b1, {kk}));
      Value act = rb.maxf(pre, rb.f32(0.0));
      terms.push_back(rb.mul(rb.load(w2, {kk, h}), act));
    }
    // A balanced sum keeps every weight's gradient path short.
    while (terms.size() > 1) {
      SmallVector<Value> next;
      for (size_t k = 0; k + 1 < terms.size(); k += 2)
        next.push_back(rb.add(terms[k], terms[k + 1]));
      if (terms.size() % 2)
        next.push_back(terms.back());
      terms = std::move(next);
    }
    return rb.add(terms.front(), rb.load(b2, {h}));
  });
}

/// Components expanded twice (two ape.alibi, say) would declare the same
/// param or feature name; later ones get a numeric suffix: "alibi_slopes_1".
void uniquifyNames(EncodingOp enc) {
  llvm::StringSet<> seen;
  llvm::StringMap<unsigned> nextSuffix;  // per name: the first suffix not tried yet
  auto unique = [&](Operation *op) {
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
    if (isa<TokenFeatureOp>(op))
      unique(&op);
}

struct ApeExpandPass : public mlir::ape::impl::ApeExpandBase<ApeExpandPass> {
  void runOnOperation() override {
    SmallVector<Operation *> named;
    getOperation().walk([&](Operation *op) {
      if (isa<RotaryOp, XposOp, AbsoluteOp, AlibiOp, CableOp, T5BiasOp, KerpleOp, FireOp>(op))
        named.push_back(op);
    });
    for (Operation *op : named) {
      OpBuilder b(op);
      if (auto rot = dyn_cast<RotaryOp>(op)) {
        expandRotary(b, rot);
      } else if (auto xpos = dyn_cast<XposOp>(op)) {
        expandXpos(b, xpos);
      } else if (auto abs = dyn_cast<AbsoluteOp>(op)) {
        expandAbsolute(b, abs);
      } else if (auto alibi = dyn_cast<AlibiOp>(op)) {
        expandAlibi(b, alibi);
      } else if (auto cable = dyn_cast<CableOp>(op)) {
        expandCable(b, cable);
      } else if (auto t5 = dyn_cast<T5BiasOp>(op)) {
        expandT5(b, t5);
      } else if (auto kerple = dyn_cast<KerpleOp>(op)) {
        expandKerple(b, kerple);
      } else if (auto fire = dyn_cast<FireOp>(op)) {
        expandFire(b, fire);
      }
      op->erase();
    }
    for (EncodingOp enc : getOperation().getOps<EncodingOp>())
      uniquifyNames(enc);
  }
};

} // namespace
