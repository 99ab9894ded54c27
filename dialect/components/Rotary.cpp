//===- Rotary.cpp - ape.rotary --------------------------------------------===//
//
// RoPE and its scalings (PI, NTK, dynamic NTK, YaRN, Llama 3): a q_mod and a k_mod rotating
// the first r = 2·floor(fraction·d_h/2) coordinates in pairs by t·θ'_k, plus the fixed
// scalars a scaling reads (rope_factor, rope_original_length).
//
//===----------------------------------------------------------------------===//
#include "dialect/ComponentSupport.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"

#include <cmath>
#include <string>

using namespace mlir;
using namespace mlir::ape;
using namespace mlir::ape::component;

namespace {

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

} // namespace

LogicalResult RotaryOp::verify() {
  double base = getBase().convertToDouble(), fraction = getFraction().convertToDouble();
  if (!(base > 1.0 && isFinite(base)))
    return emitOpError("base must be a finite number greater than 1, got ") << base;
  if (!(fraction > 0.0 && fraction <= 1.0))
    return emitOpError("fraction must be in (0, 1], got ") << fraction;
  using abi::Scaling;
  Scaling scaling = getScaling();
  std::string quoted = "\"" + std::string(abi::name(scaling)) + "\"";
  std::optional<double> factor = toDouble(getFactor());
  if (scaling == Scaling::None) {
    if (factor || getOriginalLength())
      return emitOpError("factor and original_length need a scaling (\"linear\", \"ntk\", "
                         "\"dynamic_ntk\", \"yarn\" or \"llama3\")");
    return success();
  }
  if (!factor)
    return emitOpError("scaling ") << quoted << " needs a `factor` (f64)";
  if (std::string why = ::ape_rules::kRopeFactor.check(*factor); !why.empty())
    return emitOpError("factor ") << why;
  bool needsLength =
      scaling == Scaling::DynamicNtk || scaling == Scaling::Yarn || scaling == Scaling::Llama3;
  if (needsLength && !getOriginalLength())
    return emitOpError("scaling ") << quoted << " needs `original_length` (the training length L)";
  if (getOriginalLength())
    if (std::string why = ::ape_rules::kRopeOriginalLength.check(
            static_cast<double>(static_cast<int64_t>(*getOriginalLength())));
        !why.empty())
      return emitOpError("original_length ") << why;
  if (scaling == Scaling::Yarn) {
    double fast = getBetaFast().convertToDouble(), slow = getBetaSlow().convertToDouble();
    if (!(fast > 0.0 && slow > 0.0 && fast > slow && isFinite(fast)))
      return emitOpError("beta_fast must exceed beta_slow and both be positive, got ")
             << num(fast) << " and " << num(slow);
  }
  if (scaling == Scaling::Llama3) {
    double low = getLowFreqFactor().convertToDouble(), high = getHighFreqFactor().convertToDouble();
    if (!(low > 0.0 && high > low && isFinite(high)))
      return emitOpError("high_freq_factor must exceed low_freq_factor and both be positive, "
                         "got ")
             << num(high) << " and " << num(low);
  }
  return success();
}

void RotaryOp::expand(OpBuilder &b) {
  RotaryOp rot = *this;
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
