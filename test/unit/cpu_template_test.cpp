// Tests of the CPU attention template (kernels/include/ape/cpu/attention.h) with hand-written
// encoding functors, against a materialised fp64 LibTorch reference (full T x T logits, explicit
// rotations and biases, causal mask, softmax, autograd).
//
// Shapes: q, k, v, o, dout (B, H, T, D); lse, features (B, H, T); logits (B, H, T, T).
#include <ape/cpu/attention.h>
#include <ape/cpu/kernel_entry.h>

#include <gtest/gtest.h>
#include "reference_lse.h"
#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using ape::HeadCtx;

// ---- building blocks of the test encodings ------------------------------------------------------

// Rotary embedding on the pairs of internals.md §2 (pairing 1 half, 2 interleaved), r rotated dims
// out of D, theta_k = 10000^(-2k/r). Column c is rotated with its partner y by the angle t*theta_k:
// x' = x cos - y sin for the first member of a pair, x cos + y sin for the second.
struct Rotary {
  int pairing;
  double fraction;

  // cos, and sin signed for the pair member; (1, 0) for columns that are not rotated.
  template <class T> void coefficients(const HeadCtx<T> &ctx, int64_t t, int64_t c, T &cs,
                                       T &sn) const {
    const int64_t r = 2 * static_cast<int64_t>(std::floor(fraction * ctx.D / 2));
    if (c >= r) {
      cs = 1;
      sn = 0;
      return;
    }
    const bool first = pairing == 1 ? c < r / 2 : c % 2 == 0;
    const int64_t k = pairing == 1 ? c % (r / 2) : c / 2;
    const double angle = t * std::pow(10000.0, -2.0 * k / r);
    cs = static_cast<T>(std::cos(angle));
    sn = static_cast<T>(first ? -std::sin(angle) : std::sin(angle));
  }
  template <class T> T apply(const HeadCtx<T> &ctx, int64_t t, int64_t c, T x, T y) const {
    T cs, sn;
    coefficients(ctx, t, c, cs, sn);
    return x * cs + y * sn;
  }
  template <class T> void grad(const HeadCtx<T> &ctx, int64_t t, int64_t c, T g, T &dx,
                               T &dy) const {
    T cs, sn;
    coefficients(ctx, t, c, cs, sn);
    dx = g * cs;
    dy = g * sn;
  }
};

template <class T> T softplus(T x) {
  return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}
template <class T> T sigmoid(T x) { return T(1) / (T(1) + std::exp(-x)); }

// Cumulative bias from feature 0 into token array 0: tok_t = sum_{u<=t} -softplus(f_u),
// s' = s + tok_i - tok_j.
struct CumBias {
  template <class T> static void token_forward(const HeadCtx<T> &ctx, const T *const *feat,
                                               T *tok) {
    T run = 0;
    for (int64_t t = 0; t < ctx.T; ++t) tok[t] = run += -softplus(feat[0][t]);
  }
  template <class T> static void token_backward(const HeadCtx<T> &ctx, const T *const *feat,
                                                const T *, T *dtok, T *const *dfeat) {
    T run = 0;  // reverse cumulative sum of dtok
    for (int64_t t = ctx.T - 1; t >= 0; --t) {
      run += dtok[t];
      dfeat[0][t] = -run * sigmoid(feat[0][t]);
    }
  }
  template <class T> static T score(const HeadCtx<T> &ctx, int64_t i, int64_t j, T s) {
    return s + ctx.tok[i] - ctx.tok[j];
  }
  template <class T> static void grad(const HeadCtx<T> &ctx, int64_t i, int64_t j, T g) {
    ctx.dtok[i] += g;  // row sum
    ctx.dtok[j] -= g;  // column sum
  }
};

// Learned per-head slope in param n (shape [H]): s' = s - p[h] (i - j).
template <int n> struct Slope {
  template <class T> static T score(const HeadCtx<T> &ctx, int64_t i, int64_t j, T s) {
    return s - ctx.params[n][ctx.h] * static_cast<T>(i - j);
  }
  template <class T> static void grad(const HeadCtx<T> &ctx, int64_t i, int64_t j, T g) {
    ctx.dparams[n][ctx.h] -= g * static_cast<T>(i - j);
  }
};

// ---- the test encodings ------------------------------------------------------------------------

struct NoPE {
  static constexpr int kNumFeatures = 0, kNumParams = 0, kNumTok = 0;
  static constexpr bool kHasQMod = false, kHasKMod = false, kHasScoreMod = false;
  static constexpr int kQPairing = 0, kKPairing = 0;
  static constexpr double kQFraction = 1.0, kKFraction = 1.0;
  static int64_t param_numel(int, int64_t, int64_t) { return 0; }
};

// Rotary on q and k with the given pairing and fraction (fraction in percent).
template <int kPairing, int kPercent> struct Rope {
  static constexpr int kNumFeatures = 0, kNumParams = 0, kNumTok = 0;
  static constexpr bool kHasQMod = true, kHasKMod = true, kHasScoreMod = false;
  static constexpr int kQPairing = kPairing, kKPairing = kPairing;
  static constexpr double kQFraction = kPercent / 100.0, kKFraction = kPercent / 100.0;
  static constexpr Rotary kRot{kPairing, kPercent / 100.0};
  static int64_t param_numel(int, int64_t, int64_t) { return 0; }
  template <class T> static T q_mod(const HeadCtx<T> &ctx, int64_t t, int64_t c, T x, T y) {
    return kRot.apply(ctx, t, c, x, y);
  }
  template <class T> static void q_mod_grad(const HeadCtx<T> &ctx, int64_t t, int64_t c, T, T,
                                            T g, T &dx, T &dy) {
    kRot.grad(ctx, t, c, g, dx, dy);
  }
  template <class T> static T k_mod(const HeadCtx<T> &ctx, int64_t t, int64_t c, T x, T y) {
    return kRot.apply(ctx, t, c, x, y);
  }
  template <class T> static void k_mod_grad(const HeadCtx<T> &ctx, int64_t t, int64_t c, T, T,
                                            T g, T &dx, T &dy) {
    kRot.grad(ctx, t, c, g, dx, dy);
  }
};
using RopeHalf = Rope<1, 50>;
using RopeInterleaved = Rope<2, 100>;

struct Cable {
  static constexpr int kNumFeatures = 1, kNumParams = 0, kNumTok = 1;
  static constexpr bool kHasQMod = false, kHasKMod = false, kHasScoreMod = true;
  static constexpr int kQPairing = 0, kKPairing = 0;
  static constexpr double kQFraction = 1.0, kKFraction = 1.0;
  static int64_t param_numel(int, int64_t, int64_t) { return 0; }
  template <class T> static void token_forward(const HeadCtx<T> &ctx, const T *const *feat,
                                               T *tok) {
    CumBias::token_forward(ctx, feat, tok);
  }
  template <class T> static void token_backward(const HeadCtx<T> &ctx, const T *const *feat,
                                                const T *tok, T *dtok, T *const *dfeat) {
    CumBias::token_backward(ctx, feat, tok, dtok, dfeat);
  }
  template <class T> static T score_mod(const HeadCtx<T> &ctx, int64_t i, int64_t j, T s) {
    return CumBias::score(ctx, i, j, s);
  }
  template <class T> static T score_mod_grad(const HeadCtx<T> &ctx, int64_t i, int64_t j, T,
                                             T g) {
    CumBias::grad(ctx, i, j, g);
    return g;
  }
};

struct LearnedSlope {
  static constexpr int kNumFeatures = 0, kNumParams = 1, kNumTok = 0;
  static constexpr bool kHasQMod = false, kHasKMod = false, kHasScoreMod = true;
  static constexpr int kQPairing = 0, kKPairing = 0;
  static constexpr double kQFraction = 1.0, kKFraction = 1.0;
  static int64_t param_numel(int, int64_t H, int64_t) { return H; }
  template <class T> static T score_mod(const HeadCtx<T> &ctx, int64_t i, int64_t j, T s) {
    return Slope<0>::score(ctx, i, j, s);
  }
  template <class T> static T score_mod_grad(const HeadCtx<T> &ctx, int64_t i, int64_t j, T,
                                             T g) {
    Slope<0>::grad(ctx, i, j, g);
    return g;
  }
};

// Everything at once: half rotary (fraction 0.5) on q; interleaved rotary times a learned gain
// (param 1, shape [H, D]) on k; cumulative bias and learned slope (param 0) on the scores.
struct Combined {
  static constexpr int kNumFeatures = 1, kNumParams = 2, kNumTok = 1;
  static constexpr bool kHasQMod = true, kHasKMod = true, kHasScoreMod = true;
  static constexpr int kQPairing = 1, kKPairing = 2;
  static constexpr double kQFraction = 0.5, kKFraction = 1.0;
  static constexpr Rotary kQRot{1, 0.5}, kKRot{2, 1.0};
  static int64_t param_numel(int n, int64_t H, int64_t D) { return n == 0 ? H : H * D; }
  template <class T> static void token_forward(const HeadCtx<T> &ctx, const T *const *feat,
                                               T *tok) {
    CumBias::token_forward(ctx, feat, tok);
  }
  template <class T> static void token_backward(const HeadCtx<T> &ctx, const T *const *feat,
                                                const T *tok, T *dtok, T *const *dfeat) {
    CumBias::token_backward(ctx, feat, tok, dtok, dfeat);
  }
  template <class T> static T q_mod(const HeadCtx<T> &ctx, int64_t t, int64_t c, T x, T y) {
    return kQRot.apply(ctx, t, c, x, y);
  }
  template <class T> static void q_mod_grad(const HeadCtx<T> &ctx, int64_t t, int64_t c, T, T,
                                            T g, T &dx, T &dy) {
    kQRot.grad(ctx, t, c, g, dx, dy);
  }
  template <class T> static T k_mod(const HeadCtx<T> &ctx, int64_t t, int64_t c, T x, T y) {
    return ctx.params[1][ctx.h * ctx.D + c] * kKRot.apply(ctx, t, c, x, y);
  }
  template <class T> static void k_mod_grad(const HeadCtx<T> &ctx, int64_t t, int64_t c, T x,
                                            T y, T g, T &dx, T &dy) {
    const T gain = ctx.params[1][ctx.h * ctx.D + c];
    ctx.dparams[1][ctx.h * ctx.D + c] += g * kKRot.apply(ctx, t, c, x, y);
    kKRot.grad(ctx, t, c, g * gain, dx, dy);
  }
  template <class T> static T score_mod(const HeadCtx<T> &ctx, int64_t i, int64_t j, T s) {
    return Slope<0>::score(ctx, i, j, CumBias::score(ctx, i, j, s));
  }
  template <class T> static T score_mod_grad(const HeadCtx<T> &ctx, int64_t i, int64_t j, T,
                                             T g) {
    CumBias::grad(ctx, i, j, g);
    Slope<0>::grad(ctx, i, j, g);
    return g;
  }
};

}  // namespace

APE_DEFINE_KERNEL_ENTRY(test_combined, Combined, "{\"encoding\": \"test_combined\"}")

namespace {

// ---- the fp64 reference ----------------------------------------------------------------------------

// What the reference applies; params are ordered slope (if any), then k gain (if any).
struct Spec {
  int q_pairing = 0, k_pairing = 0;  // 0 no mod, 1 half, 2 interleaved rotary
  double q_fraction = 1, k_fraction = 1;
  bool k_gain = false, bias = false, slope = false;
};

struct Problem {
  int64_t B, H, T, D;
  double scale;
  torch::Tensor q, k, v, dout;               // (B, H, T, D) fp64 holding fp32 values
  std::vector<torch::Tensor> features;       // (B, H, T)
  std::vector<torch::Tensor> params;         // per Spec
};

struct Result {
  torch::Tensor o, lse, dq, dk, dv;
  std::vector<torch::Tensor> dfeatures, dparams;
};

Problem make_problem(const Spec &spec, int64_t B, int64_t H, int64_t T, int64_t D, int seed) {
  torch::manual_seed(seed);
  auto gen = [](std::vector<int64_t> shape, double std, double mean) {
    return (torch::randn(shape, torch::kFloat32) * std + mean).to(torch::kFloat64);
  };
  Problem p{B, H, T, D, 1.0 / std::sqrt(static_cast<double>(D)), {}, {}, {}, {}, {}, {}};
  p.q = gen({B, H, T, D}, 1, 0);
  p.k = gen({B, H, T, D}, 1, 0);
  p.v = gen({B, H, T, D}, 1, 0);
  p.dout = gen({B, H, T, D}, 1, 0);
  if (spec.bias) p.features.push_back(gen({B, H, T}, 1, -2));
  if (spec.slope) p.params.push_back(gen({H}, 0.05, 0.1));
  if (spec.k_gain) p.params.push_back(gen({H, D}, 0.2, 1));
  return p;
}

// Explicit rotation: x' = x cos + x[partner] sin_signed, tables (T, D).
torch::Tensor rotate(const torch::Tensor &x, int pairing, double fraction) {
  const int64_t T = x.size(2), D = x.size(3);
  const int64_t r = 2 * static_cast<int64_t>(std::floor(fraction * D / 2));
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  torch::Tensor cs = torch::ones({T, D}, opts), sn = torch::zeros({T, D}, opts);
  torch::Tensor partner = torch::arange(D, torch::kLong);
  for (int64_t c = 0; c < r; ++c) {
    const bool first = pairing == 1 ? c < r / 2 : c % 2 == 0;
    const int64_t k = pairing == 1 ? c % (r / 2) : c / 2;
    partner[c] = pairing == 1 ? (first ? c + r / 2 : c - r / 2) : (c ^ 1);
    torch::Tensor angle = torch::arange(T, opts) * std::pow(10000.0, -2.0 * k / r);
    cs.select(1, c).copy_(angle.cos());
    sn.select(1, c).copy_(first ? -angle.sin() : angle.sin());
  }
  return x * cs + x.index_select(3, partner) * sn;
}

Result reference(const Spec &spec, const Problem &p) {
  const auto leaf = [](const torch::Tensor &t) { return t.clone().requires_grad_(true); };
  torch::Tensor q = leaf(p.q), k = leaf(p.k), v = leaf(p.v);
  std::vector<torch::Tensor> feats, params;
  for (const auto &f : p.features) feats.push_back(leaf(f));
  for (const auto &w : p.params) params.push_back(leaf(w));

  torch::Tensor qm = spec.q_pairing ? rotate(q, spec.q_pairing, spec.q_fraction) : q;
  torch::Tensor km = spec.k_pairing ? rotate(k, spec.k_pairing, spec.k_fraction) : k;
  if (spec.k_gain) km = km * params.back().view({1, p.H, 1, p.D});
  torch::Tensor logits = torch::matmul(qm, km.transpose(-1, -2)) * p.scale;  // (B, H, T, T)
  torch::Tensor pos = torch::arange(p.T, torch::kFloat64);
  torch::Tensor dist = pos.view({p.T, 1}) - pos.view({1, p.T});  // i - j
  if (spec.bias) {
    torch::Tensor tok = torch::cumsum(-torch::softplus(feats[0]), -1);  // (B, H, T)
    logits = logits + tok.unsqueeze(-1) - tok.unsqueeze(-2);
  }
  if (spec.slope) logits = logits - params[0].view({1, p.H, 1, 1}) * dist;
  logits = logits.masked_fill(dist < 0, -std::numeric_limits<double>::infinity());
  Result r;
  r.lse = ape_test::reference_logsumexp(logits);
  torch::Tensor o = torch::matmul(torch::softmax(logits, -1), v);
  r.o = o.detach();

  std::vector<torch::Tensor> inputs{q, k, v};
  inputs.insert(inputs.end(), feats.begin(), feats.end());
  inputs.insert(inputs.end(), params.begin(), params.end());
  auto grads = torch::autograd::grad({o}, inputs, {p.dout}, false, false, true);
  r.dq = grads[0];
  r.dk = grads[1];
  r.dv = grads[2];
  for (size_t n = 0; n < feats.size(); ++n) r.dfeatures.push_back(grads[3 + n]);
  for (size_t n = 0; n < params.size(); ++n)
    r.dparams.push_back(grads[3 + feats.size() + n]);
  return r;
}

// ---- running the template ----------------------------------------------------------------------

template <class Enc, typename Real> Result run_template(const Problem &p) {
  constexpr auto dtype = std::is_same_v<Real, float> ? torch::kFloat32 : torch::kFloat64;
  const auto cast = [&](const torch::Tensor &t) { return t.to(dtype).contiguous(); };
  const auto ptr = [](const torch::Tensor &t) { return t.data_ptr<Real>(); };
  torch::Tensor q = cast(p.q), k = cast(p.k), v = cast(p.v), dout = cast(p.dout);
  std::vector<torch::Tensor> feats, params, dfeats, dparams;
  std::vector<const Real *> feat_ptrs, param_ptrs;
  std::vector<Real *> dfeat_ptrs, dparam_ptrs;
  for (const auto &f : p.features) {
    feats.push_back(cast(f));
    feat_ptrs.push_back(ptr(feats.back()));
    dfeats.push_back(torch::full_like(feats.back(), NAN));  // must be overwritten
    dfeat_ptrs.push_back(ptr(dfeats.back()));
  }
  for (const auto &w : p.params) {
    params.push_back(cast(w));
    param_ptrs.push_back(ptr(params.back()));
    dparams.push_back(torch::full_like(params.back(), NAN));
    dparam_ptrs.push_back(ptr(dparams.back()));
  }
  Result r;
  r.o = torch::full_like(q, NAN);
  r.lse = torch::full({p.B, p.H, p.T}, NAN, q.options());
  r.dq = torch::full_like(q, NAN);
  r.dk = torch::full_like(q, NAN);
  r.dv = torch::full_like(q, NAN);

  ape::AttnArgs<Real> a{};
  a.B = p.B;
  a.H = p.H;
  a.T = p.T;
  a.D = p.D;
  a.q = ptr(q);
  a.k = ptr(k);
  a.v = ptr(v);
  a.o = ptr(r.o);
  a.lse = ptr(r.lse);
  a.features = feat_ptrs.data();
  a.params = param_ptrs.data();
  a.scale = static_cast<Real>(p.scale);
  a.dout = ptr(dout);
  a.dq = ptr(r.dq);
  a.dk = ptr(r.dk);
  a.dv = ptr(r.dv);
  a.dfeatures = dfeat_ptrs.data();
  a.dparams = dparam_ptrs.data();
  ape::attention_forward<Enc>(a);
  ape::attention_backward<Enc>(a);
  r.dfeatures = dfeats;
  r.dparams = dparams;
  return r;
}

// max |got - want| relative to max |want|, with a floor of 1: the gradients that are exactly zero
// in exact arithmetic (dq, dk, dfeatures, dparams at T = 1) are rounding noise of size ~ulp.
void expect_close(const torch::Tensor &got, const torch::Tensor &want, double tol,
                  const std::string &what) {
  ASSERT_TRUE(want.defined()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const torch::Tensor g = got.to(torch::kFloat64);
  ASSERT_TRUE(torch::isfinite(g).all().item<bool>()) << what << " has non-finite entries";
  const double err = (g - want).abs().max().item<double>();
  const double mag = std::max(want.abs().max().item<double>(), 1.0);
  EXPECT_LE(err / mag, tol) << what << ": max error " << err << ", max magnitude " << mag;
}

void expect_result_close(const Result &got, const Result &want, double tol,
                         const std::string &tag) {
  expect_close(got.o, want.o, tol, tag + " o");
  expect_close(got.lse, want.lse, tol, tag + " lse");
  expect_close(got.dq, want.dq, tol, tag + " dq");
  expect_close(got.dk, want.dk, tol, tag + " dk");
  expect_close(got.dv, want.dv, tol, tag + " dv");
  ASSERT_EQ(got.dfeatures.size(), want.dfeatures.size());
  for (size_t n = 0; n < got.dfeatures.size(); ++n)
    expect_close(got.dfeatures[n], want.dfeatures[n], tol, tag + " dfeatures" + std::to_string(n));
  ASSERT_EQ(got.dparams.size(), want.dparams.size());
  for (size_t n = 0; n < got.dparams.size(); ++n)
    expect_close(got.dparams[n], want.dparams[n], tol, tag + " dparams" + std::to_string(n));
}

using Shape = std::tuple<int64_t, int64_t, int64_t, int64_t>;  // B, H, T, D

Spec rope_spec(int pairing, double fraction) {
  Spec s;
  s.q_pairing = s.k_pairing = pairing;
  s.q_fraction = s.k_fraction = fraction;
  return s;
}
Spec cable_spec() {
  Spec s;
  s.bias = true;
  return s;
}
Spec slope_spec() {
  Spec s;
  s.slope = true;
  return s;
}
Spec combined_spec() {
  Spec s;
  s.q_pairing = 1;
  s.q_fraction = 0.5;
  s.k_pairing = 2;
  s.k_fraction = 1.0;
  s.k_gain = s.bias = s.slope = true;
  return s;
}

std::string shape_name(const Shape &shape) {
  const auto [B, H, T, D] = shape;
  return "B=" + std::to_string(B) + " H=" + std::to_string(H) + " T=" + std::to_string(T) +
         " D=" + std::to_string(D);
}

// The main grid, then head dims off it: tiny, odd rotated widths, not a power of two, wide.
std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (int64_t B : {1, 3})
    for (int64_t H : {1, 4})
      for (int64_t T : {1, 7, 64, 129, 300})
        for (int64_t D : {16, 64}) out.emplace_back(B, H, T, D);
  for (int64_t D : {2, 6, 32, 40, 128}) out.emplace_back(2, 2, 65, D);
  return out;
}

// Template (fp64 and fp32) against the reference on every shape.
template <class Enc> void check(const Spec &spec) {
  for (const Shape &shape : shapes()) {
    SCOPED_TRACE(shape_name(shape));
    const auto [B, H, T, D] = shape;
    const Problem p = make_problem(spec, B, H, T, D, static_cast<int>(B * 1000 + H * 100 + T + D));
    const Result want = reference(spec, p);
    expect_result_close(run_template<Enc, double>(p), want, 1e-10, "fp64");
    expect_result_close(run_template<Enc, float>(p), want, 2e-4, "fp32");
  }
}

// A slice's exception leaves the kernels' OpenMP region as an exception of the call (it ended the
// process before: std::terminate), the first one, with every thread joined; the slices after it
// may be skipped, none runs twice.
TEST(CpuTemplate, AnExceptionInASliceReachesTheCaller) {
  std::vector<std::atomic<int>> runs(64);
  EXPECT_THROW(ape::detail::each_slice(64,
                                       [&](int64_t s) {
                                         ++runs[static_cast<size_t>(s)];
                                         if (s == 5) throw std::bad_alloc();
                                       }),
               std::bad_alloc);
  for (auto &r : runs) EXPECT_LE(r.load(), 1);
  EXPECT_EQ(runs[5].load(), 1);
  std::atomic<int> all{0};
  ape::detail::each_slice(64, [&](int64_t) { ++all; });
  EXPECT_EQ(all.load(), 64);
}

TEST(CpuTemplate, NoPE) { check<NoPE>(Spec{}); }
TEST(CpuTemplate, RopeHalf) { check<RopeHalf>(rope_spec(1, 0.5)); }
TEST(CpuTemplate, RopeInterleaved) { check<RopeInterleaved>(rope_spec(2, 1.0)); }
TEST(CpuTemplate, CumulativeBias) { check<Cable>(cable_spec()); }
TEST(CpuTemplate, LearnedSlope) { check<LearnedSlope>(slope_spec()); }
TEST(CpuTemplate, Combined) { check<Combined>(combined_spec()); }

// softmax_exp_le (the softmax's exps: arguments at most 88 in float, 709 in double, -inf and NaN)
// is softmax_exp bit for bit there: every 4099th float bit pattern and a million doubles, with the
// edges of both ranges.
TEST(CpuTemplate, SoftmaxExpLeIsSoftmaxExp) {
  namespace d = ape::detail;
  const auto same = [](auto a, auto b) {
    return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b));
  };
  std::vector<float> xf = {-INFINITY, NAN, -0.0f, 0.0f, 88.0f, -87.3365447f, -87.3365f, -87.34f,
                           -104.0f, 1e-45f, -1e-45f, 0.5f, -0.5f};
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) {
    const auto bits = static_cast<uint32_t>(u);
    float x;
    std::memcpy(&x, &bits, sizeof x);
    if (x <= 88.0f || std::isnan(x)) xf.push_back(x);
  }
  int64_t bad = 0;
  for (const float x : xf)
    if (!same(d::softmax_exp(x), d::softmax_exp_le(x)) && bad++ < 5)
      ADD_FAILURE() << "float " << x << ": " << d::softmax_exp(x) << " vs " << d::softmax_exp_le(x);
  std::vector<double> xd = {-INFINITY, NAN, -0.0, 0.0, 709.0, -708.39641853226408, -708.4, -745.2,
                            5e-324, -5e-324, 0.5, -0.5};
  uint64_t state = 88172645463325252ull;
  for (int k = 0; k < 1000000; ++k) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    double x;
    if (k % 2) {
      std::memcpy(&x, &state, sizeof x);
    } else {
      x = -750.0 + 1460.0 * static_cast<double>(state >> 11) / 9007199254740992.0;
    }
    if (x <= 709.0 || std::isnan(x)) xd.push_back(x);
  }
  for (const double x : xd)
    if (!same(d::softmax_exp(x), d::softmax_exp_le(x)) && bad++ < 10)
      ADD_FAILURE() << "double " << x << ": " << d::softmax_exp(x) << " vs " << d::softmax_exp_le(x);
  EXPECT_EQ(bad, 0);
}

// Backward results do not depend on the run or on the number of threads.
TEST(CpuTemplateDeterminism, BitwiseReproducibleGradients) {
  const Spec spec = combined_spec();
  const Problem p = make_problem(spec, 3, 4, 129, 64, 7);
  const auto same = [](const torch::Tensor &a, const torch::Tensor &b) {
    return a.numel() == b.numel() &&
           std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) == 0;
  };
  const Result first = run_template<Combined, float>(p);
  std::vector<Result> others{run_template<Combined, float>(p)};
#ifdef _OPENMP
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  others.push_back(run_template<Combined, float>(p));
  omp_set_num_threads(3);
  others.push_back(run_template<Combined, float>(p));
  omp_set_num_threads(threads);
#endif
  for (const Result &r : others) {
    for (size_t n = 0; n < first.dparams.size(); ++n)
      EXPECT_TRUE(same(first.dparams[n], r.dparams[n])) << "dparams" << n;
    EXPECT_TRUE(same(first.dq, r.dq));
    EXPECT_TRUE(same(first.dk, r.dk));
    EXPECT_TRUE(same(first.dv, r.dv));
    EXPECT_TRUE(same(first.dfeatures[0], r.dfeatures[0]));
  }
}

TEST(KernelEntry, DefinedByMacro) {
  const ape::KernelEntry *e = ape_kernel_entry_test_combined();
  ASSERT_NE(e, nullptr);
  EXPECT_STREQ(e->name, "test_combined");
  EXPECT_STREQ(e->manifest_json, "{\"encoding\": \"test_combined\"}");
  EXPECT_EQ(e->forward_f32, (&ape::attention_forward<Combined, float>));
  EXPECT_EQ(e->backward_f32, (&ape::attention_backward<Combined, float>));
  EXPECT_EQ(e->forward_f64, (&ape::attention_forward<Combined, double>));
  EXPECT_EQ(e->backward_f64, (&ape::attention_backward<Combined, double>));
}

}  // namespace
