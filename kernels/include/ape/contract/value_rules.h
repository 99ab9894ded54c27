//===- contract/value_rules.h - the values a kernel can use, written once ----------===//
//
// Plain C++17, no MLIR: the verifiers (dialect/ApeOps.cpp, dialect/components/), the expansions
// and passes that create fixed params (dialect/components/, passes/PushOverride.cpp) and the
// runtime (runtime/Manifest.cpp, Model.cpp: the manifest's "range" and "rotation", `ape-eval
// --set`) all check values with these rules, so a
// value apec refuses in a spec is refused at run time with the same words.
//
// The kernels compute in f32 (CPU and CUDA; fp64 only in tests), so a real number must fit f32
// (|x| <= FLT_MAX) and a length must keep positions exact in f32 (below 2^24).
//
//===----------------------------------------------------------------------===//
#ifndef APE_VALUE_RULES_H
#define APE_VALUE_RULES_H

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace ape_rules {

/// Sequence lengths (original_length, max_length, max_distance): positions t are exact in f32
/// for t < 2^24.
constexpr int64_t kMaxLength = int64_t(1) << 24;
/// Model dimensions (head_dim, model_dim hints, an override's l, T5's buckets) and each integer
/// dimension of a param's shape.
constexpr int64_t kMaxDim = int64_t(1) << 16;
/// FIRE's hidden width (ape.fire's `hidden`): its MLP is evaluated at every (i, j), and its
/// weights are params of [hidden] and [hidden, heads] elements.
constexpr int64_t kMaxFireHidden = 256;
/// Elements of a param's integer dimensions together (["16", "heads"] counts 16): keeps every
/// size product far from int64 overflow and every table allocatable.
constexpr int64_t kMaxParamElements = int64_t(1) << 28;

/// A closed interval of reals, optionally integers only. Its messages are made from the
/// numbers alone, so a range read back from a manifest speaks as the compiled-in one.
struct Range {
  double min, max;
  bool integer;

  bool contains(double v) const {
    return std::isfinite(v) && v >= min && v <= max && (!integer || v == std::floor(v));
  }
  /// "" when `v` is in the interval; else why not, e.g.
  /// "must be a positive number in [1.17549435e-38, 3.40282347e+38]; got 0".
  std::string check(double v) const {
    if (contains(v))
      return "";
    const char *what = integer ? "a whole number"
                       : min > 0 ? "a positive number"
                       : min == 0 ? "a non-negative number"
                                  : "a finite number";
    char buf[192];  // 9 digits: whole bounds up to 2^24 exactly, f32 limits to their last digit
    std::snprintf(buf, sizeof buf, "must be %s in [%.9g, %.9g]; got %.9g", what, min, max, v);
    return buf;
  }
};

/// Any real a f32 kernel can hold.
constexpr Range kFiniteF32{-FLT_MAX, FLT_MAX, false};
/// A scale, a factor: positive and normal in f32.
constexpr Range kPositiveF32{FLT_MIN, FLT_MAX, false};
/// The logits' scale: the CUDA kernels keep biases as B / scale in float and their backward
/// divides by it, so a scale far below any in use (1e-37) gave NaN in bf16; 2^-64 leaves every
/// |B| < 2^64 finite there.
constexpr double kMinScale = 0x1p-64;
constexpr Range kScale{kMinScale, FLT_MAX, false};
/// A scale a call passes (the op library's and the C ABI's `scale`): 0, or a magnitude in kScale.
inline std::string check_call_scale(double scale) {
  if (scale == 0.0 || (std::isfinite(scale) && std::fabs(scale) >= kMinScale))
    return "";
  char buf[160];
  std::snprintf(buf, sizeof buf, "scale must be finite, and 0 or at least %.9g in magnitude; got %.9g",
                kMinScale, scale);
  return buf;
}
/// Grouped-query attention: k and v have kv_heads heads, 0 meaning H (one per query head), else a
/// divisor of H whose query head h reads key head h / (H / kv_heads). Every layer that takes
/// kv_heads (the CPU kernels and decode, the C ABI, the CUDA launch and decode, the operator
/// library) refuses the same values with these words.
constexpr const char *kKvHeadsRule = "kv_heads must be 0 (= H) or a divisor of H in [1, H]";
constexpr bool kv_heads_fit(int64_t kv_heads, int64_t H) {
  return kv_heads == 0 || (kv_heads >= 1 && kv_heads <= H && H % kv_heads == 0);
}
/// "" where kv_heads fits H; else kKvHeadsRule with the values, e.g.
/// "kv_heads must be 0 (= H) or a divisor of H in [1, H]; got kv_heads=3 for H=4".
inline std::string check_kv_heads(int64_t kv_heads, int64_t H) {
  if (kv_heads_fit(kv_heads, H))
    return "";
  return std::string(kKvHeadsRule) + "; got kv_heads=" + std::to_string(kv_heads) + " for H=" + std::to_string(H);
}
/// A length in tokens.
constexpr Range kLength{1, double(kMaxLength), true};

// The fixed params the passes create (runtime-settable: ape-eval --set NAME=VALUE). A factor or
// scale of positions keeps every scaled position t/s or σ·t (t < 2^24) within 2^48: finite in
// f32, as are the sines, cosines and products made from it (a factor of 1e-38 made t/s inf and
// the loss NaN).
constexpr Range kRopeFactor{1.0 / double(kMaxLength), double(kMaxLength), false};   // "rope_factor": s in θ/s
constexpr Range kRopeOriginalLength = kLength;                                         // "rope_original_length": L
constexpr Range kPositionScale{-double(kMaxLength), double(kMaxLength), false};      // "position_scale": σ in σ·p_n

/// The rotation of q/k pairs by a rotary or xPos: r = fraction·head_dim coordinates are
/// rotated in pairs, so r must be an even whole number, and at least 2 (else the rotation is
/// the identity and the encoding silently NoPE). "" when usable.
inline std::string checkRotation(double fraction, int64_t headDim) {
  const double exact = fraction * static_cast<double>(headDim);
  char buf[256];
  if (exact != std::floor(exact) || static_cast<int64_t>(exact) % 2 != 0) {
    std::snprintf(buf, sizeof buf,
                  "fraction %g of head_dim %lld gives %g rotated coordinates; the count must be "
                  "an even whole number (pairs)",
                  fraction, static_cast<long long>(headDim), exact);
    return buf;
  }
  if (exact < 2) {
    std::snprintf(buf, sizeof buf,
                  "fraction %g of head_dim %lld rotates no pair (the encoding would be NoPE)",
                  fraction, static_cast<long long>(headDim));
    return buf;
  }
  return "";
}

} // namespace ape_rules

#endif // APE_VALUE_RULES_H
