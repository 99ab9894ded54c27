// The attention transition (kernels/include/ape/contract/transition.h, docs/encodings-math.md
// "Attention transition (P)"): the spec's hand-checked row, and the fused three-pass kernel of
// cpu/attention.h / cpu/decode.h against a materialised reference (the T x T softmax, the steps
// applied literally to each transformed row, times V), with hand-written functors: no RoPE, a
// rotary q/k mod, a per-element score mod and a distance bias.
//
// Shapes: q, k, v, o (B, H, T, D); lse (B, H, T); P (T, T) per slice.
#include <ape/contract/transition.h>
#include <ape/cpu/attention.h>
#include <ape/cpu/decode.h>
#include <ape/cpu/kernel_entry.h>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using ape::HeadCtx;
using ape::TransitionAttrs;

// ---- the spec's hand-checked row -----------------------------------------------------------------

TEST(TransitionRow, HandCheckedRowOfTheSpec) {
  // r = 5, (s, e) = (4, 6), I = 2, alpha = 0.5, beta = 0.1.
  std::vector<double> A = {0.30, 0.02, 0.08, 0.10, 0.20, 0.30};
  ape::transition_row_reference(A.data(), 4, 6, 0.5, 0.1);
  const double want[] = {0.187129, 0.000371, 0.000866, 0.186634, 0.200000, 0.300000};
  double sum = 0;
  for (int c = 0; c < 6; ++c) {
    EXPECT_NEAR(A[c], want[c], 1e-6) << "c = " << c;
    sum += A[c];
  }
  EXPECT_NEAR(sum, 0.875, 1e-12);  // not renormalised
  // The fused form's per-weight formulas give the same row (kept mass and mask sum first).
  const std::vector<double> P = {0.30, 0.02, 0.08, 0.10, 0.20, 0.30};
  const double bound = 0.5 / 6;
  double kept = 0, nmask = 0;
  for (int c = 0; c < 6; ++c) {
    const double k = ape::transition_kept(P[c], c, bound);
    kept += k;
    if (c < 4) nmask += ape::transition_mask(k, bound);
  }
  EXPECT_NEAR(nmask, 2.02, 1e-15);
  const double avg = 0.1 * (1 - kept) / nmask;
  for (int c = 0; c < 6; ++c)
    EXPECT_NEAR(ape::transition_weight(P[c], c, 4, 2, bound, avg), want[c], 1e-6) << "c = " << c;
}

TEST(TransitionRow, Geometry) {
  const TransitionAttrs a;  // the spec's: divisor N + 1, layers 1 .. N-3, two intervals
  // N = 32 gives the authors' 33: T = 33 * 12 -> floor(T / 33) = 12 -> I = 10.
  EXPECT_EQ(ape::transition_width(a, 33 * 12, 32), 10);
  EXPECT_EQ(ape::transition_width(a, 34, 6), 0);   // floor(34 / 7) = 4 < 5: no-op
  EXPECT_EQ(ape::transition_width(a, 35, 6), 5);
  EXPECT_EQ(ape::transition_width(a, 1000, 6), 140);  // 142 rounded down to a multiple of 5
  // Layers 1 .. N-3 of N = 6 (1, 2, 3); layer l: rows [(l+1)I, (l+3)I).
  for (int64_t l : {0, 4, 5}) EXPECT_TRUE(ape::transition_rows_of(a, 1000, 6, l).empty()) << l;
  const auto r = ape::transition_rows_of(a, 1000, 6, 3);
  EXPECT_EQ(r.lo, 4 * 140);
  EXPECT_EQ(r.hi, 6 * 140);
  EXPECT_EQ(r.start(4 * 140 + 139), 4 * 140);
  EXPECT_EQ(r.start(5 * 140), 5 * 140);
  EXPECT_TRUE(ape::transition_rows_of(a, 1000, 0, 1).empty());  // no depth given: nothing
  // Layer 0 has no window before its interval (s = I < 2I): never transformed.
  TransitionAttrs zero = a;
  zero.first_layer = 0;
  EXPECT_TRUE(ape::transition_rows_of(zero, 1000, 6, 0).empty());
  // Intervals past the end are clipped to T (divisor N + 2, three intervals, no layer skipped).
  const TransitionAttrs wide{2, 1, 0, 3, 0.5, 0.1};
  const auto last = ape::transition_rows_of(wide, 1000, 6, 5);  // I = 125: rows [750, 1125)
  EXPECT_EQ(last.I, 125);
  EXPECT_EQ(last.lo, 750);
  EXPECT_EQ(last.hi, 1000);
}

// ---- test functors ------------------------------------------------------------------------------

// The transition of the spec on top of each functor.
struct WithTransition {
  static constexpr ape::TransitionAttrs kTransition{};
};

struct NoMods : WithTransition {
  static constexpr int kNumFeatures = 0, kNumParams = 0, kNumTok = 0;
  static constexpr bool kHasQMod = false, kHasKMod = false, kHasScoreMod = false;
  static constexpr int kQPairing = 0, kKPairing = 0;
  static constexpr double kQFraction = 1, kKFraction = 1;
  template <class T> static T q_mod(const HeadCtx<T> &, int64_t, int64_t, T x, T) { return x; }
  template <class T> static T k_mod(const HeadCtx<T> &, int64_t, int64_t, T x, T) { return x; }
  // The reference's logit, given the raw dot product (the kernel: q'_i . k'_j, then the mods).
  template <class T> static T ref_logit(int64_t, int64_t, int64_t, T scale, T dot) {
    return scale * dot;
  }
  static constexpr bool kRefRotates = false;
};

// Interleaved rotation by t * theta_c (theta_c = 10000^(-2 floor(c/2) / D)).
struct Rotated : NoMods {
  static constexpr bool kHasQMod = true, kHasKMod = true;
  static constexpr int kQPairing = 2, kKPairing = 2;
  template <class T> static T rot(int64_t D, int64_t t, int64_t c, T x, T y) {
    const double th = t * std::pow(10000.0, -2.0 * double(c / 2) / double(D));
    return c % 2 == 0 ? T(x * std::cos(th) - y * std::sin(th)) : T(x * std::cos(th) + y * std::sin(th));
  }
  template <class T> static T q_mod(const HeadCtx<T> &ctx, int64_t t, int64_t c, T x, T y) {
    return rot(ctx.D, t, c, x, y);
  }
  template <class T> static T k_mod(const HeadCtx<T> &ctx, int64_t t, int64_t c, T x, T y) {
    return rot(ctx.D, t, c, x, y);
  }
  static constexpr bool kRefRotates = true;
};

// A per-element score mod: s + 0.3 sin(i) - 0.05 (i - j) h (read per (i, j)).
struct ScoreMod : NoMods {
  static constexpr bool kHasScoreMod = true;
  template <class T> static T score_mod(const HeadCtx<T> &ctx, int64_t i, int64_t j, T s) {
    return s + T(0.3 * std::sin(double(i))) - T(0.05) * T(i - j) * T(ctx.h + 1);
  }
  template <class T> static T ref_logit(int64_t h, int64_t i, int64_t j, T scale, T dot) {
    return scale * dot + T(0.3 * std::sin(double(i))) - T(0.05) * T(i - j) * T(h + 1);
  }
};

// A distance bias (ALiBi-like: the templates' per-distance table path).
struct Distance : NoMods {
  static constexpr bool kHasScoreMod = true, kDistanceBias = true;
  template <class T> static T distance_bias(const HeadCtx<T> &ctx, int64_t d) {
    return -T(0.02) * T(ctx.h + 1) * T(d);
  }
  template <class T> static T score_mod(const HeadCtx<T> &ctx, int64_t, int64_t, T s) { return s; }
  template <class T> static T ref_logit(int64_t h, int64_t i, int64_t j, T scale, T dot) {
    return scale * dot - T(0.02) * T(h + 1) * T(i - j);
  }
};

// A score mod that masks keys (-inf): every key j with j % 5 == 1, and every key of the rows
// i % 23 == 7 (rows without a visible key: A = 0, the steps still apply to that zero row).
struct Masked : NoMods {
  static constexpr bool kHasScoreMod = true;
  template <class T> static T mask(int64_t i, int64_t j, T s) {
    return (j % 5 == 1 || i % 23 == 7) ? -std::numeric_limits<T>::infinity() : s;
  }
  template <class T> static T score_mod(const HeadCtx<T> &, int64_t i, int64_t j, T s) { return mask(i, j, s); }
  template <class T> static T ref_logit(int64_t, int64_t i, int64_t j, T scale, T dot) {
    return mask(i, j, scale * dot);
  }
};

// Other attributes: divisor N + 2, layers 2 .. N-1, three intervals (the last layers' clipped
// at T), alpha 0.3, beta 0.2.
struct Custom : Rotated {
  static constexpr ape::TransitionAttrs kTransition{2, 2, 0, 3, 0.3, 0.2};
};

// ---- the materialised reference -------------------------------------------------------------------

struct Problem {
  int64_t B, H, T, D;
  std::vector<double> q, k, v;
};

Problem make_problem(int64_t B, int64_t H, int64_t T, int64_t D, unsigned seed) {
  Problem p{B, H, T, D, {}, {}, {}};
  std::mt19937 rng(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  for (auto *x : {&p.q, &p.k, &p.v}) {
    x->resize(size_t(B * H * T * D));
    for (double &e : *x) e = n(rng);
  }
  // Sharper logits than unit Gaussians give (many weights on both sides of the bound).
  for (double &e : p.q) e *= 2.5;
  return p;
}

// o (B, H, T, D): softmax of the full causal logits, the transition of layer `layer` of N on its
// rows (the literal steps), then P V. In double.
template <class Enc>
std::vector<double> reference(const Problem &p, int64_t layer, int64_t N) {
  const int64_t T = p.T, D = p.D;
  const double scale = 1.0 / std::sqrt(double(D));
  const ape::TransitionRows rows = ape::transition_rows_of(Enc::kTransition, T, N, layer);
  std::vector<double> o(p.q.size(), 0.0), P(size_t(T * T)), qm(size_t(T * D)), km(size_t(T * D));
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h) {
      const int64_t base = (b * p.H + h) * T * D;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < D; ++c) {
          const int64_t pc = Enc::kRefRotates ? (c ^ 1) : c;
          qm[t * D + c] = Enc::kRefRotates ? Rotated::rot(D, t, c, p.q[base + t * D + c], p.q[base + t * D + pc])
                                           : p.q[base + t * D + c];
          km[t * D + c] = Enc::kRefRotates ? Rotated::rot(D, t, c, p.k[base + t * D + c], p.k[base + t * D + pc])
                                           : p.k[base + t * D + c];
        }
      for (int64_t i = 0; i < T; ++i) {
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < D; ++c) dot += qm[i * D + c] * km[j * D + c];
          P[i * T + j] = Enc::ref_logit(h, i, j, scale, dot);
          mx = std::max(mx, P[i * T + j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < T; ++j)
          sum += P[i * T + j] = j <= i && mx > -INFINITY ? std::exp(P[i * T + j] - mx) : 0.0;
        for (int64_t j = 0; j <= i; ++j) P[i * T + j] = sum > 0 ? P[i * T + j] / sum : 0.0;  // no key: 0
        if (!rows.empty() && i >= rows.lo && i < rows.hi) {
          const int64_t s = rows.start(i), e = s + rows.I;  // e may pass T (a clipped interval)
          std::vector<double> row(size_t(std::max(T, e)), 0.0);
          std::copy(P.begin() + i * T, P.begin() + (i + 1) * T, row.begin());
          ape::transition_row_reference(row.data(), s, e, Enc::kTransition.alpha, Enc::kTransition.beta);
          std::copy(row.begin(), row.begin() + T, P.begin() + i * T);
        }
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t c = 0; c < D; ++c) o[base + i * D + c] += P[i * T + j] * p.v[base + j * D + c];
      }
    }
  return o;
}

// The fused forward (attention_forward) at precision Real.
template <class Enc, class Real>
std::vector<double> fused(const Problem &p, int64_t layer, int64_t N) {
  std::vector<Real> q(p.q.begin(), p.q.end()), k(p.k.begin(), p.k.end()), v(p.v.begin(), p.v.end());
  std::vector<Real> o(q.size()), lse(size_t(p.B * p.H * p.T));
  ape::AttnArgs<Real> a{};
  a.B = p.B, a.H = p.H, a.T = p.T, a.D = p.D;
  a.q = q.data(), a.k = k.data(), a.v = v.data(), a.o = o.data(), a.lse = lse.data();
  a.scale = Real(1.0 / std::sqrt(double(p.D)));
  a.layer = layer, a.num_layers = N;
  ape::attention_forward<Enc, Real>(a);
  return std::vector<double>(o.begin(), o.end());
}

// The decode path: a prefill of `prompt` tokens (the transition at T = prompt), then steps of
// `step` tokens; returns o of every token in order.
template <class Enc, class Real>
std::vector<double> decoded(const Problem &p, int64_t prompt, int64_t step, int64_t layer, int64_t N) {
  ape::DecodeCache<Real> cache;
  cache.capacity = p.T;
  std::vector<double> out(p.q.size());
  for (int64_t L0 = 0; L0 < p.T;) {
    const int64_t n = std::min(L0 == 0 ? prompt : step, p.T - L0);
    const int64_t S = p.B * p.H, D = p.D;
    std::vector<Real> q(size_t(S * n * D)), k(q.size()), v(q.size()), o(q.size());
    for (int64_t s = 0; s < S; ++s)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t c = 0; c < D; ++c) {
          const size_t src = size_t((s * p.T + L0 + t) * D + c), dst = size_t((s * n + t) * D + c);
          q[dst] = Real(p.q[src]), k[dst] = Real(p.k[src]), v[dst] = Real(p.v[src]);
        }
    ape::DecodeArgs<Real> a{};
    a.B = p.B, a.H = p.H, a.n = n, a.D = D;
    a.q = q.data(), a.k = k.data(), a.v = v.data(), a.o = o.data(), a.lse = nullptr;
    a.scale = Real(1.0 / std::sqrt(double(D)));
    a.layer = layer, a.num_layers = N;
    ape::decode_step<Enc, Real>(cache, a);
    for (int64_t s = 0; s < S; ++s)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t c = 0; c < D; ++c) out[size_t((s * p.T + L0 + t) * D + c)] = o[size_t((s * n + t) * D + c)];
    L0 += n;
  }
  return out;
}

// max |x - y| / max(1, max |y|)
double max_err(const std::vector<double> &x, const std::vector<double> &y) {
  double e = 0, m = 1;
  for (size_t i = 0; i < x.size(); ++i) e = std::max(e, std::abs(x[i] - y[i])), m = std::max(m, std::abs(y[i]));
  return e / m;
}

// ---- fused vs reference ----------------------------------------------------------------------------

struct Case {
  int64_t B, H, T, D, N;
};
// T = 1 (nothing to transform), a partial tile, I < 5 (no-op), several query and key tiles, a
// depth whose last transformed layer ends near T; every layer of each depth.
const Case kCases[] = {{1, 1, 1, 8, 6},   {2, 2, 34, 8, 6},  {1, 2, 35, 8, 6},   {1, 1, 100, 16, 4},
                       {2, 3, 150, 8, 6}, {1, 2, 300, 16, 8}, {1, 1, 520, 8, 12}};

template <class Enc> void check_fused(const char *name) {
  unsigned seed = 1;
  int transformed = 0;
  for (const Case &c : kCases) {
    const Problem p = make_problem(c.B, c.H, c.T, c.D, seed++);
    for (int64_t layer = 0; layer < c.N; ++layer) {
      SCOPED_TRACE(std::string(name) + " T=" + std::to_string(c.T) + " N=" + std::to_string(c.N) +
                   " layer=" + std::to_string(layer));
      const std::vector<double> ref = reference<Enc>(p, layer, c.N);
      EXPECT_LT(max_err(fused<Enc, double>(p, layer, c.N), ref), 1e-12);
      EXPECT_LT(max_err(fused<Enc, float>(p, layer, c.N), ref), 2e-5);
      if (!ape::transition_rows_of(Enc::kTransition, c.T, c.N, layer).empty()) {
        ++transformed;
        // The transformed rows differ from plain attention (the check can fail).
        EXPECT_GT(max_err(fused<Enc, double>(p, layer, 0), ref), 1e-3);
      }
    }
  }
  EXPECT_GE(transformed, 10);
}

TEST(TransitionFused, MatchesTheMaterialisedReference_NoMods) { check_fused<NoMods>("no mods"); }
TEST(TransitionFused, MatchesTheMaterialisedReference_Rotated) { check_fused<Rotated>("rotated"); }
TEST(TransitionFused, MatchesTheMaterialisedReference_ScoreMod) { check_fused<ScoreMod>("score mod"); }
TEST(TransitionFused, MatchesTheMaterialisedReference_DistanceBias) { check_fused<Distance>("distance"); }
TEST(TransitionFused, MatchesTheMaterialisedReference_OtherAttributes) { check_fused<Custom>("custom"); }
TEST(TransitionFused, MatchesTheMaterialisedReference_MaskedKeysAndRows) { check_fused<Masked>("masked"); }

// The prefill is the prompt: it equals the full forward over the prompt (transition at T =
// prompt); later steps attend as usual (rows past the prompt equal plain attention).
TEST(TransitionDecode, PrefillIsThePromptLaterStepsAreUnchanged) {
  const Problem p = make_problem(1, 2, 200, 8, 7);
  const int64_t N = 6, prompt = 140;
  Problem head = p;
  head.T = prompt;
  for (auto *x : {&head.q, &head.k, &head.v}) x->clear();
  for (int64_t s = 0; s < 2; ++s)
    for (int64_t t = 0; t < prompt; ++t)
      for (int64_t c = 0; c < 8; ++c) {
        const size_t i = size_t((s * 200 + t) * 8 + c);
        head.q.push_back(p.q[i]), head.k.push_back(p.k[i]), head.v.push_back(p.v[i]);
      }
  int transformed = 0;
  for (int64_t layer = 0; layer < N; ++layer) {
    SCOPED_TRACE("layer " + std::to_string(layer));
    const std::vector<double> got = decoded<Rotated, double>(p, prompt, 3, layer, N);
    const std::vector<double> ref_prompt = reference<Rotated>(head, layer, N);
    const std::vector<double> plain = reference<Rotated>(p, layer, 0);
    double e_prompt = 0, e_rest = 0;
    for (int64_t s = 0; s < 2; ++s)
      for (int64_t t = 0; t < 200; ++t)
        for (int64_t c = 0; c < 8; ++c) {
          const size_t i = size_t((s * 200 + t) * 8 + c);
          if (t < prompt)
            e_prompt = std::max(e_prompt, std::abs(got[i] - ref_prompt[size_t((s * prompt + t) * 8 + c)]));
          else
            e_rest = std::max(e_rest, std::abs(got[i] - plain[i]));
        }
    EXPECT_LT(e_prompt, 1e-12);
    EXPECT_LT(e_rest, 1e-12);
    transformed += !ape::transition_rows_of(Rotated::kTransition, prompt, N, layer).empty();
  }
  EXPECT_EQ(transformed, 3);  // layers 1, 2, 3 of 6
}

// Training through an inference-only functor fails with the reason (the entry's backward).
TEST(TransitionEntry, BackwardRefuses) {
  ape::AttnArgs<float> a{};
  auto backward = ape::entry_detail::backward_of<NoMods, float>();
  try {
    backward(a);
    FAIL() << "the backward of an inference-only functor ran";
  } catch (const ape::entry_detail::InferenceOnlyError &e) {
    EXPECT_NE(std::string(e.what()).find("inference-only"), std::string::npos) << e.what();
  }
}

}  // namespace
