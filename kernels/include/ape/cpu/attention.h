// CPU flash-attention template for generated positional encodings (docs/internals.md §2).
//
// apec emits, per encoding, a functor struct `Enc` (token program, q/k mods, score mod and their
// gradients, all static) and instantiates attention_forward / attention_backward with it. This
// header is plain C++17: no MLIR, no LibTorch; OpenMP is used when the compiler enables it.
//
// Attention is causal (key j visible from query i iff j <= i). Both passes work per (b, h) slice
// on tiles of kTileQ queries x kTileK keys and never materialise a T x T matrix:
//   forward  : tok = token_forward(features), q' = q_mod(q), k' = k_mod(k),
//              s_ij = score_mod(scale * q'_i . k'_j), online softmax, o = softmax(s) v,
//              lse_i = log sum_j exp(s_ij).
//   backward : recompute tok, q', k' and P = exp(s - lse); dV = P^T dO; dP = dO V^T;
//              G = P o (dP - Delta) with Delta_i = dO_i . O_i; dS = score_mod_grad(G);
//              dQ' = scale dS K'; dK' = scale dS^T Q'; then back through the mods and the token
//              program. Every slice uses private buffers, parameter gradients are reduced in a
//              fixed (b, h) order: results are bitwise independent of the thread count.
//
// Names of shapes: B batch, H heads, T sequence length, D head dim, Tp = padded_row(T) (T rounded
// up to kTileK, plus 64 bytes).
//
// Members of Enc that a feature does not need are never used, so they may be omitted:
// kHasQMod == false: q_mod, q_mod_grad, kQPairing, kQFraction (k likewise); kHasScoreMod == false:
// score_mod, score_mod_grad; kNumTok == 0: token_forward, token_backward; kNumParams == 0:
// param_numel.
//
// Instruction-set levels (cpu/dispatch.h): the loops below are compiled once per level; they sit
// in a target region and in the level's namespace (ape::cpu_avx2::attention_forward, ...), which
// `inline` makes reachable as ape::attention_forward in every unit. AttnArgs and HeadCtx are
// plain data shared by all levels.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "ape/contract/enc_traits.h"
#include "ape/contract/transition.h"
#include "ape/contract/vocabulary.h"
#include "ape/cpu/dispatch.h"

#ifdef _OPENMP
#define APE_PRAGMA(x) _Pragma(#x)
#else
#define APE_PRAGMA(x)
#endif
#define APE_SIMD APE_PRAGMA(omp simd)
#define APE_SIMD_REDUCE(clause) APE_PRAGMA(omp simd reduction(clause))

namespace ape {

// The type parameter is named Real (not T as in the docs) because T is a member name.
template <typename Real> struct AttnArgs {
  int64_t B, H, T, D;
  const Real *q, *k, *v;           // (B, H, T, D) contiguous
  Real *o;                         // (B, H, T, D)
  Real *lse;                       // (B, H, T): log sum_j exp(l_ij) of the final logits
  const Real *const *features;     // Enc::kNumFeatures arrays, each (B, H, T)
  const Real *const *params;       // Enc::kNumParams arrays, flattened, shapes per manifest
  Real scale;                      // kappa
  // backward only
  const Real *dout;                // (B, H, T, D)
  Real *dq, *dk, *dv;              // (B, H, T, D), overwritten
  Real *const *dfeatures;          // (B, H, T) each, overwritten
  Real *const *dparams;            // shapes of params, overwritten
  // The layer this call computes (0-based) of a model of num_layers: read only by encodings with
  // an attention transition (contract/transition.h), which transform the rows of some layers;
  // num_layers = 0 (the default) transforms none.
  int64_t layer = 0, num_layers = 0;
};

template <typename Real> struct HeadCtx {  // one (b, h) slice, built by the template
  int64_t b, h, H, T, D;
  const Real *const *params;  // global
  Real *const *dparams;       // private accumulators of this (b, h), zeroed; null in forward
  const Real *tok;            // Enc::kNumTok arrays of length T: tok[n*T + t]
  Real *dtok;                 // gradient w.r.t. tok, zeroed, same layout; null in forward
  const Real *const *rel = nullptr;  // Enc::kNumRel arrays (T, rows_n): relative rows
  Real *const *drel = nullptr;       // their gradients, zeroed; null in forward

  // Decoding (cpu/decode.h) extends the token program by new tokens instead of recomputing it:
  // the stages start at token tok0 (the entries before it are already in tok) and each scan
  // continues from its running sum scan_carry[slot] (double; slot = the scan's output sequence,
  // (dst - tok) / T), which it updates. The full forward leaves them at 0 and null.
  int64_t tok0 = 0;
  double *scan_carry = nullptr;

  // The token program's stages (emitEncFunctor): every token from tok0, in order, by one thread.
  // dst[t] = f(a[t]) or f(a[t], b[t]) (dst is none of the sources); dst[t] += f(a[t], b[t]).
  template <class T, class F> void tok_map(T *dst, int64_t n, F f, const T *a) const {
    for (int64_t t = tok0; t < n; ++t) dst[t] = f(a[t]);
  }
  template <class T, class F> void tok_map(T *dst, int64_t n, F f, const T *a, const T *b) const {
    for (int64_t t = tok0; t < n; ++t) dst[t] = f(a[t], b[t]);
  }
  template <class T, class F> void tok_map_add(T *dst, int64_t n, F f, const T *a, const T *b) const {
    for (int64_t t = tok0; t < n; ++t) dst[t] += f(a[t], b[t]);
  }
  static void tok_sync() {}
  // dst[t] = sum_{u <= t} src[u] for t >= tok0, accumulated in double (from scan_carry when set).
  template <class T> void tok_scan(const T *src, T *dst, int64_t n) const {
    double *carry = scan_carry ? scan_carry + (dst - tok) / this->T : nullptr;
    double acc = carry ? *carry : 0;
    for (int64_t t = tok0; t < n; ++t) acc += src[t], dst[t] = T(acc);
    if (carry) *carry = acc;
  }
  // dst[t] += sum_{u >= t} src[u], accumulated in double (the scan's backward).
  template <class T> static void tok_rscan_add(const T *src, T *dst, int64_t n) {
    double acc = 0;
    for (int64_t t = n - 1; t >= 0; --t) acc += src[t], dst[t] += T(acc);
  }
};

}  // namespace ape

// Compiled for this unit's level (no #include inside the region, see cpu/dispatch.h).
APE_CPU_BEGIN
namespace ape {
inline namespace APE_CPU_NS {

namespace detail {

constexpr int64_t kTileQ = 64;  // queries per tile
constexpr int64_t kTileK = 64;  // keys per tile (also the padding unit of the transposed keys)

// Length of a std::array holding n entries (never zero-length).
constexpr std::size_t array_len(int n) { return n > 0 ? static_cast<std::size_t>(n) : 1; }

template <typename Real> constexpr Real neg_inf() {
  return -std::numeric_limits<Real>::infinity();
}

// exp for the softmax, vectorisable (no libm call, branch free): Cephes' exp / expf. Range
// reduction x = n ln2 + r with |r| <= ln2/2 (n rounded by adding and subtracting 1.5 * 2^mantissa
// bits), a polynomial (float) or rational (double) approximation of exp(r), and 2^n built in the
// exponent bits. Relative error within 2 ulp; exactly 0 below the smallest normal (including -inf);
// NaN propagates. Arguments are <= ~0 here (logits minus their max or their lse).
constexpr float kExpLo = -87.3365447f, kExpHi = 88.0f;              // ln(FLT_MIN), < ln(FLT_MAX)
constexpr double kExpLoD = -708.39641853226408, kExpHiD = 709.0;    // ln(DBL_MIN), < ln(DBL_MAX)
constexpr float kRound = 12582912.0f;                               // 1.5 2^23
constexpr double kRoundD = 6755399441055744.0;                      // 1.5 2^52

// exp(r) of x = n ln2 + r (ln2 in two parts).
inline float exp_of_rest(float x, float n) {
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}
inline double exp_of_rest(double x, double n) {
  const double r = (x - n * 6.93145751953125e-1) - n * 1.42860682030941723212e-6;
  // exp(r) = 1 + 2 r P(r^2) / (Q(r^2) - r P(r^2))
  const double rr = r * r;
  const double p = r * ((1.26177193074810590878e-4 * rr + 3.02994407707441961300e-2) * rr +
                        9.99999999999999999910e-1);
  const double q = ((3.00198505138664455042e-6 * rr + 2.52448340349684104192e-3) * rr +
                    2.27265548208155028766e-1) * rr + 2.00000000000000000009e0;
  return 1.0 + 2.0 * p / (q - p);
}

inline float softmax_exp(float x) {
  const float xc = std::min(std::max(x, kExpLo), kExpHi);
  const float n = (xc * 1.44269504088896341f + kRound) - kRound;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float pow2n;
  std::memcpy(&pow2n, &bits, sizeof pow2n);
  return x < kExpLo ? 0.0f : exp_of_rest(xc, n) * pow2n;
}
inline double softmax_exp(double x) {
  const double xc = std::min(std::max(x, kExpLoD), kExpHiD);
  const double n = (xc * 1.4426950408889634073599 + kRoundD) - kRoundD;
  const int64_t bits = (static_cast<int64_t>(n) + 1023) << 52;
  double pow2n;
  std::memcpy(&pow2n, &bits, sizeof pow2n);
  return x < kExpLoD ? 0.0 : exp_of_rest(xc, n) * pow2n;
}

// softmax_exp for the arguments of a softmax, x <= kExpHi (a logit minus its max or its lse; -inf
// and NaN too): the same value bit for bit, without the clamps. Their compare-and-blend made the
// vectoriser compute the whole polynomial under masks (a third more instructions a vector, in the
// forward's hottest loop after its GEMMs). n is read from the bits of v = x log2(e) + kRound
// (whose low bits hold n exactly for |n| < 2^22, 2^51) instead of converted from a float, so an
// argument below the range (-inf included) gives defined garbage that the final select replaces
// with 0.
inline float softmax_exp_le(float x) {
  const float v = x * 1.44269504088896341f + kRound;
  uint32_t vbits, round_bits;
  std::memcpy(&vbits, &v, sizeof vbits);
  std::memcpy(&round_bits, &kRound, sizeof round_bits);
  const uint32_t bits = (vbits - round_bits + 127u) << 23;
  float pow2n;
  std::memcpy(&pow2n, &bits, sizeof pow2n);
  return x < kExpLo ? 0.0f : exp_of_rest(x, v - kRound) * pow2n;
}
inline double softmax_exp_le(double x) {
  const double v = x * 1.4426950408889634073599 + kRoundD;
  uint64_t vbits, round_bits;
  std::memcpy(&vbits, &v, sizeof vbits);
  std::memcpy(&round_bits, &kRoundD, sizeof round_bits);
  const uint64_t bits = (vbits - round_bits + 1023u) << 52;
  double pow2n;
  std::memcpy(&pow2n, &bits, sizeof pow2n);
  return x < kExpLoD ? 0.0 : exp_of_rest(x, v - kRoundD) * pow2n;
}

// ---- small GEMM kernels on tiles ---------------------------------------------------------------
// C(m, W) (+)= A(m, n) B(n, W): A(r, p) = a[r*a_rs + p*a_cs] (so A^T is a stride swap), B rows
// ldb apart, C rows ldc apart. MR rows of C are kept in local accumulators that the compiler holds
// in vector registers; the W columns are the vector dimension.
template <int MR, int W, typename Real>
inline void gemm_rows(int64_t n, const Real *a, int64_t a_rs, int64_t a_cs, const Real *b,
                      int64_t ldb, Real *c, int64_t ldc, bool accumulate) {
  Real acc[MR][W];
  for (int r = 0; r < MR; ++r) {
    if (accumulate) {
      APE_SIMD for (int w = 0; w < W; ++w) acc[r][w] = c[r * ldc + w];
    } else {
      APE_SIMD for (int w = 0; w < W; ++w) acc[r][w] = Real(0);
    }
  }
  for (int64_t p = 0; p < n; ++p) {
    const Real *bp = b + p * ldb;
    for (int r = 0; r < MR; ++r) {
      const Real ar = a[r * a_rs + p * a_cs];
      APE_SIMD for (int w = 0; w < W; ++w) acc[r][w] += ar * bp[w];
    }
  }
  for (int r = 0; r < MR; ++r)
    APE_SIMD for (int w = 0; w < W; ++w) c[r * ldc + w] = acc[r][w];
}

// All m rows of a block of W columns: MR rows at a time (as many as fit in registers).
template <int W, typename Real>
inline void gemm_block(int64_t m, int64_t n, const Real *a, int64_t a_rs, int64_t a_cs,
                       const Real *b, int64_t ldb, Real *c, int64_t ldc, bool accumulate) {
  constexpr int kMR = std::clamp<int>(1024 / (W * static_cast<int>(sizeof(Real))), 1, 8);
  int64_t r = 0;
  for (; r + kMR <= m; r += kMR)
    gemm_rows<kMR, W>(n, a + r * a_rs, a_rs, a_cs, b, ldb, c + r * ldc, ldc, accumulate);
  for (; r < m; ++r)
    gemm_rows<1, W>(n, a + r * a_rs, a_rs, a_cs, b, ldb, c + r * ldc, ldc, accumulate);
}

// Any width w: blocks of W columns while they fit, the rest with W/2, W/4, ..., 1.
template <int W = 64, typename Real>
inline void gemm(int64_t m, int64_t n, int64_t w, const Real *a, int64_t a_rs, int64_t a_cs,
                 const Real *b, int64_t ldb, Real *c, int64_t ldc, bool accumulate) {
  int64_t c0 = 0;
  for (; c0 + W <= w; c0 += W)
    gemm_block<W>(m, n, a, a_rs, a_cs, b + c0, ldb, c + c0, ldc, accumulate);
  if constexpr (W > 1) {
    if (c0 < w)
      gemm<W / 2>(m, n, w - c0, a, a_rs, a_cs, b + c0, ldb, c + c0, ldc, accumulate);
  }
}

// ---- reductions of a tile row -------------------------------------------------------------------
// A row of kTileK logits or probabilities is reduced as 64-byte vectors (GCC's and Clang's vector
// extensions: one register under AVX-512, two under AVX2, four on the baseline): the vectors
// pairwise, then the lanes by halving. The order is the code's, not the vectoriser's (which
// reduced an `omp simd` loop's lanes through the stack one scalar add after another: 16 dependent
// adds a row, a tenth of the forward on an Intel Xeon), so the full forward and decoding, which
// share attend_rows, sum every row in the same order. kTileK * sizeof(Real) is a multiple of 64.
template <typename Real, int kBytes> struct VecOf;
template <> struct VecOf<float, 64> { typedef float type __attribute__((vector_size(64))); };
template <> struct VecOf<float, 32> { typedef float type __attribute__((vector_size(32))); };
template <> struct VecOf<float, 16> { typedef float type __attribute__((vector_size(16))); };
template <> struct VecOf<float, 8> { typedef float type __attribute__((vector_size(8))); };
template <> struct VecOf<double, 64> { typedef double type __attribute__((vector_size(64))); };
template <> struct VecOf<double, 32> { typedef double type __attribute__((vector_size(32))); };
template <> struct VecOf<double, 16> { typedef double type __attribute__((vector_size(16))); };

// Vectors pass by reference only: a vector argument or result by value draws GCC's and Clang's
// -Wpsabi warning (its calling convention depends on the target), which pragmas do not silence.
template <bool kMax, class V> inline void combine(V &a, const V &b) {
  if constexpr (kMax) {
    a = a > b ? a : b;  // a NaN loses against a number, as in `x > m ? x : m`
  } else {
    a = a + b;
  }
}
template <class V, class H, std::size_t... I>
inline void halves(const V &v, H &lo, H &hi, std::index_sequence<I...>) {
  lo = __builtin_shufflevector(v, v, I...);
  hi = __builtin_shufflevector(v, v, (I + sizeof...(I))...);
}
template <bool kMax, typename Real, int kBytes, class V> inline Real fold_lanes(const V &v) {
  constexpr int kLanes = kBytes / static_cast<int>(sizeof(Real));
  if constexpr (kLanes == 2) {
    Real a = v[0];
    combine<kMax>(a, static_cast<Real>(v[1]));
    return a;
  } else {
    using H = typename VecOf<Real, kBytes / 2>::type;
    H lo, hi;
    halves(v, lo, hi, std::make_index_sequence<kLanes / 2>());
    combine<kMax>(lo, hi);
    return fold_lanes<kMax, Real, kBytes / 2>(lo);
  }
}
// The max (kMax) or the sum of s[0 .. kTileK).
template <bool kMax, typename Real> inline Real row_reduce(const Real *s) {
  using V = typename VecOf<Real, 64>::type;
  constexpr int kVecs = static_cast<int>(kTileK * sizeof(Real) / sizeof(V));
  static_assert(kVecs * sizeof(V) == kTileK * sizeof(Real), "a row is whole vectors");
  V v[kVecs];
  std::memcpy(v, s, sizeof v);
  for (int w = kVecs / 2; w >= 1; w /= 2)
    for (int k = 0; k < w; ++k) combine<kMax>(v[k], v[k + w]);
  return fold_lanes<kMax, Real, 64>(v[0]);
}
template <typename Real> inline Real row_sum(const Real *s) { return row_reduce<false>(s); }
template <typename Real> inline Real row_max(const Real *s) { return row_reduce<true>(s); }

// The row length of k'^T and v^T (D rows of keys): T rounded up to kTileK, so that every key tile
// up to the last query is readable, plus 64 bytes. The 64 bytes keep the rows from starting a
// multiple of 4 KiB apart, as they would for every T a multiple of 1024 floats: the tile GEMMs
// read one tile's 64 columns from each of D rows, and rows 4 KiB apart all fall in the same sets
// of the L1 cache, which then holds only a few of them (bench/results/cpu_peers_intel.md: about
// 10% of the forward and backward at T 4096 on an Intel Xeon). The arithmetic, and so the bits,
// are the same.
template <typename Real = float> constexpr int64_t padded_row(int64_t T) {
  return (T + kTileK - 1) / kTileK * kTileK + 64 / static_cast<int64_t>(sizeof(Real));
}

// xt(D, Tp) = x(T, D)^T with the columns t >= T zero.
template <typename Real>
void transpose_padded(const Real *x, int64_t T, int64_t D, int64_t Tp, Real *xt) {
  for (int64_t c = 0; c < D; ++c) {
    Real *row = xt + c * Tp;
    for (int64_t t = 0; t < T; ++t) row[t] = x[t * D + c];
    std::fill(row + T, row + Tp, Real(0));
  }
}

// ---- q / k mods ---------------------------------------------------------------------------------
// Partner columns under a pairing (Enc::kQPairing / kKPairing: ape_abi::Pairing's code, 0 none,
// 1 half, 2 interleaved), the rule of ape_abi::partner; a column paired with itself still calls the
// mod, with y = x.
inline std::vector<int64_t> partners(int pairing, double fraction, int64_t D) {
  std::vector<int64_t> p(static_cast<std::size_t>(D));
  for (int64_t c = 0; c < D; ++c)
    p[c] = ::ape_abi::partner(static_cast<::ape_abi::Pairing>(pairing), fraction, D, c);
  return p;
}

// Linear mods (traits::QModLinear / KModLinear, enc_traits.h: RoPE and its scalings, xPos):
// mod(x, y) = a(t, c) x + b(t, c) y with a, b independent of the head, the batch and the data.
// Their coefficients are evaluated once per call, a = mod(1, 0) and b = mod(0, 1), into a
// (T, D, 2) table that every (b, h) slice reads: T D evaluations of the mod (its pow, sin and
// cos) instead of B H T D, forward and backward. Empty when the side's mod is not linear.
template <class Enc, bool kIsQ> constexpr bool linear_mod() {
  if constexpr (kIsQ) return Enc::kHasQMod && traits::QModLinear<Enc>::value;
  else return Enc::kHasKMod && traits::KModLinear<Enc>::value;
}

template <typename Real> struct ModCoefs {
  std::vector<Real> q, k;  // (T, D, 2): a(t, c), b(t, c)
};

template <class Enc, bool kIsQ, typename Real>
void mod_coefs_side(const AttnArgs<Real> &a, std::vector<Real> &out) {
  if constexpr (linear_mod<Enc, kIsQ>()) {
    const int64_t T = a.T, D = a.D;
    out.resize(static_cast<std::size_t>(2 * T * D));
    // The coefficients read no head, batch, param or token value (the kernel's q_mod_linear /
    // k_mod_linear, recorded by -ape-classify: analysis/KernelFacts.h).
    const HeadCtx<Real> ctx{0, 0, a.H, T, D, a.params, nullptr, nullptr, nullptr};
    Real *ab = out.data();
    APE_PRAGMA(omp parallel for schedule(static))
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < D; ++c) {
        Real *e = ab + 2 * (t * D + c);
        if constexpr (kIsQ)
          e[0] = Enc::q_mod(ctx, t, c, Real(1), Real(0)), e[1] = Enc::q_mod(ctx, t, c, Real(0), Real(1));
        else
          e[0] = Enc::k_mod(ctx, t, c, Real(1), Real(0)), e[1] = Enc::k_mod(ctx, t, c, Real(0), Real(1));
      }
  } else {
    (void)a, (void)out;
  }
}

// The linear mods' tables of a call. Without params they read only (t, c) and the dims T, D and
// H, so the tables of the last two shapes are kept and shared: a training step calls the forward
// and the backward at one length, step after step, and building the tables (a pow, cos and sin
// per (t, c) for RoPE) cost about a tenth of RoPE's forward at T 4096 on two cores, more than the
// rotations themselves. With params (which a linear mod may read, KernelFacts.h) every call
// builds its own.
template <class Enc, typename Real>
std::shared_ptr<const ModCoefs<Real>> mod_coefs(const AttnArgs<Real> &a) {
  const auto build = [&a] {
    auto m = std::make_shared<ModCoefs<Real>>();
    mod_coefs_side<Enc, true>(a, m->q);
    mod_coefs_side<Enc, false>(a, m->k);
    return std::shared_ptr<const ModCoefs<Real>>(std::move(m));
  };
  if constexpr ((!linear_mod<Enc, true>() && !linear_mod<Enc, false>()) || Enc::kNumParams > 0) {
    return build();
  } else {
    struct Entry {
      int64_t T = -1, D = -1, H = -1;
      std::shared_ptr<const ModCoefs<Real>> coefs;
    };
    static std::mutex mu;
    static std::array<Entry, 2> cache;  // the most recent first
    {
      const std::lock_guard<std::mutex> lock(mu);
      for (const Entry &e : cache)
        if (e.coefs && e.T == a.T && e.D == a.D && e.H == a.H) return e.coefs;
    }
    std::shared_ptr<const ModCoefs<Real>> m = build();
    const std::lock_guard<std::mutex> lock(mu);
    cache[1] = std::move(cache[0]);
    cache[0] = Entry{a.T, a.D, a.H, m};
    return m;
  }
}

// xm(n, D) = mod(x) of the n rows x(n, D) at positions t0, t0 + 1, ... for the q side (kIsQ) or
// the k side; `ab`: the side's (T, D, 2) coefficient table of a linear mod, or null.
template <class Enc, bool kIsQ, typename Real>
void mod_rows(const HeadCtx<Real> &ctx, const Real *x, int64_t t0, int64_t n, Real *xm,
              const Real *ab = nullptr) {
  const int64_t D = ctx.D;
  const std::vector<int64_t> partner = kIsQ ? partners(Enc::kQPairing, Enc::kQFraction, D)
                                            : partners(Enc::kKPairing, Enc::kKFraction, D);
  for (int64_t r = 0; r < n; ++r) {
    const Real *xt = x + r * D;
    const int64_t t = t0 + r;
    if (ab) {
      const Real *e = ab + 2 * t * D;
      for (int64_t c = 0; c < D; ++c) xm[r * D + c] = e[2 * c] * xt[c] + e[2 * c + 1] * xt[partner[c]];
      continue;
    }
    for (int64_t c = 0; c < D; ++c) {
      if constexpr (kIsQ)
        xm[r * D + c] = Enc::q_mod(ctx, t, c, xt[c], xt[partner[c]]);
      else
        xm[r * D + c] = Enc::k_mod(ctx, t, c, xt[c], xt[partner[c]]);
    }
  }
}

// xm(T, D) = mod(x) for the q side (kIsQ) or the k side.
template <class Enc, bool kIsQ, typename Real>
void mod_forward(const HeadCtx<Real> &ctx, const Real *x, Real *xm, const Real *ab = nullptr) {
  mod_rows<Enc, kIsQ>(ctx, x, 0, ctx.T, xm, ab);
}

// dx(T, D) = d mod(x) / dx applied to the gradient gm(T, D) w.r.t. the modded values; `ab` as
// in mod_rows (a linear mod's gradient: dx[c] += a g, dx[partner] += b g).
template <class Enc, bool kIsQ, typename Real>
void mod_backward(const HeadCtx<Real> &ctx, const Real *x, const Real *gm, Real *dx,
                  const Real *ab = nullptr) {
  const int64_t T = ctx.T, D = ctx.D;
  const std::vector<int64_t> partner = kIsQ ? partners(Enc::kQPairing, Enc::kQFraction, D)
                                            : partners(Enc::kKPairing, Enc::kKFraction, D);
  std::fill(dx, dx + T * D, Real(0));
  for (int64_t t = 0; t < T; ++t) {
    const Real *xt = x + t * D;
    Real *dxt = dx + t * D;
    const Real *gt = gm + t * D;
    if (ab) {
      const Real *e = ab + 2 * t * D;
      for (int64_t c = 0; c < D; ++c) {
        dxt[c] += e[2 * c] * gt[c];
        dxt[partner[c]] += e[2 * c + 1] * gt[c];
      }
      continue;
    }
    for (int64_t c = 0; c < D; ++c) {
      const int64_t pc = partner[c];
      Real gx = 0, gy = 0;
      if constexpr (kIsQ)
        Enc::q_mod_grad(ctx, t, c, xt[c], xt[pc], gt[c], gx, gy);
      else
        Enc::k_mod_grad(ctx, t, c, xt[c], xt[pc], gt[c], gx, gy);
      dxt[c] += gx;
      dxt[pc] += gy;
    }
  }
}

// ---- relative rows ----------------------------------------------------------------------------------
// Enc::kNumRel (0 when the functor does not declare it) rel_rows values: for n < kNumRel,
// R_n(T, rows) = (x' + bias_h) table_h^T with x' = q' (rel_side(n) == 0) or k', table_h the
// (rows, D) slice of head h of the (rows, H, D) param rel_table(n), bias_h the (D) row of the
// optional (H, D) param rel_bias(n) (-1: none).
template <class Enc> using NumRel = traits::NumRel<Enc>;  // contract/enc_traits.h

// Enc::kHasValueRows: o_i += sum_j P_ij table[value_row(i, j), h, :] for the (kValueRows, H, D)
// param kValueTable (false when the functor does not declare it).
template <class Enc> using HasValueRows = traits::HasValueRows<Enc>;

// Enc::kDistanceBias: the score mod is s + B(i - j). Both passes evaluate B once per distance:
// the forward (attend_rows, also decoding) keeps B(d) in order and reads it backwards along a
// tile row; the backward keeps the slice's table reversed, rb[T - 1 - d] = B(d), so that B(i - j)
// for the keys j0 + jj of a tile is rb[T - 1 - i + j0 + jj], contiguous in jj, sums dS along each
// diagonal (gb, same layout) and calls distance_bias_grad once per distance: T evaluations of B
// and its gradient per slice instead of T^2 / 2. Encodings with value rows keep the per-element
// path.
template <class Enc> using DistanceBias = traits::DistanceBias<Enc>;
template <class Enc, typename Real> std::vector<Real> distance_table(const HeadCtx<Real> &ctx) {
  std::vector<Real> rb;
  if constexpr (DistanceBias<Enc>::value) {
    rb.resize(static_cast<std::size_t>(ctx.T));
    for (int64_t d = 0; d < ctx.T; ++d) rb[ctx.T - 1 - d] = Enc::distance_bias(ctx, d);
  }
  return rb;
}

// rel_rows_forward for `count` rows x(count, D) (decoding: the new tokens), out (count, rows_n).
template <class Enc, typename Real>
void rel_rows_range(const HeadCtx<Real> &ctx, int n, const Real *x, int64_t count, Real *out) {
  const int64_t T = count, D = ctx.D, H = ctx.H, h = ctx.h, R = Enc::rel_rows(n);
  const Real *table = ctx.params[Enc::rel_table(n)];
  const Real *bias = Enc::rel_bias(n) >= 0 ? ctx.params[Enc::rel_bias(n)] + h * D : nullptr;
  std::vector<Real> xb(static_cast<std::size_t>(D));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < D; ++c) xb[c] = x[t * D + c] + (bias ? bias[c] : Real(0));
    for (int64_t r = 0; r < R; ++r) {
      const Real *row = table + (r * H + h) * D;
      Real d = 0;
      APE_SIMD_REDUCE(+ : d) for (int64_t c = 0; c < D; ++c) d += xb[c] * row[c];
      out[t * R + r] = d;
    }
  }
}

template <class Enc, typename Real>
void rel_rows_forward(const HeadCtx<Real> &ctx, int n, const Real *x, Real *out) {
  rel_rows_range<Enc>(ctx, n, x, ctx.T, out);
}

// dx(T, D) += dR table_h; the slice's private table / bias gradients += dR^T (x' + bias_h) / dR table_h.
template <class Enc, typename Real>
void rel_rows_backward(const HeadCtx<Real> &ctx, int n, const Real *x, const Real *drows,
                       Real *dx) {
  const int64_t T = ctx.T, D = ctx.D, H = ctx.H, h = ctx.h, R = Enc::rel_rows(n);
  const Real *table = ctx.params[Enc::rel_table(n)];
  const Real *bias = Enc::rel_bias(n) >= 0 ? ctx.params[Enc::rel_bias(n)] + h * D : nullptr;
  Real *dtable = Enc::rel_table_trainable(n) ? ctx.dparams[Enc::rel_table(n)] : nullptr;
  Real *dbias = Enc::rel_bias_trainable(n) ? ctx.dparams[Enc::rel_bias(n)] + h * D : nullptr;
  for (int64_t t = 0; t < T; ++t) {
    Real *dxt = dx + t * D;
    const Real *xt = x + t * D;
    for (int64_t r = 0; r < R; ++r) {
      const Real g = drows[t * R + r];
      if (g == Real(0)) continue;  // rows no key of this query used
      const Real *row = table + (r * H + h) * D;
      APE_SIMD for (int64_t c = 0; c < D; ++c) dxt[c] += g * row[c];
      if (dbias) {
        APE_SIMD for (int64_t c = 0; c < D; ++c) dbias[c] += g * row[c];
      }
      if (dtable) {
        Real *drow = dtable + (r * H + h) * D;
        APE_SIMD for (int64_t c = 0; c < D; ++c) drow[c] += g * (xt[c] + (bias ? bias[c] : Real(0)));
      }
    }
  }
}

// ---- one (b, h) slice -----------------------------------------------------------------------------
// The inputs of the tile loops of a slice: token arrays, q' and k' after the mods, k'^T.
template <class Enc, typename Real> struct SliceInputs {
  HeadCtx<Real> ctx;
  int64_t Tp;                                                  // padded_row(T)
  std::array<const Real *, array_len(Enc::kNumFeatures)> feat{};  // (T) row of each feature
  std::vector<Real> tok;                                       // (kNumTok, T)
  std::vector<Real> qm_buf, km_buf;                            // (T, D) when the mod exists
  const Real *q, *k, *v;                                       // (T, D) raw inputs
  const Real *qm, *km;                                         // (T, D) q', k' (raw without mod)
  std::vector<Real> kt;                                        // (D, Tp) k'^T, zero padded
  static constexpr int kNumRel = NumRel<Enc>::value;
  std::array<std::vector<Real>, array_len(kNumRel)> rel;       // (T, rows_n) relative rows
  std::array<const Real *, array_len(kNumRel)> rel_ptr{};

  SliceInputs(const SliceInputs &) = delete;  // ctx.tok points into tok
  SliceInputs &operator=(const SliceInputs &) = delete;
  // `coefs`: the linear mods' coefficient tables of the call (mod_coefs).
  SliceInputs(const AttnArgs<Real> &a, int64_t b, int64_t h, const ModCoefs<Real> &coefs)
      : ctx{b, h, a.H, a.T, a.D, a.params, nullptr, nullptr, nullptr},
        Tp(padded_row<Real>(a.T)) {
    const int64_t T = a.T, D = a.D, row = b * a.H + h;  // row of (B*H, T) arrays
    q = a.q + row * T * D;
    k = a.k + row * T * D;
    v = a.v + row * T * D;
    for (int n = 0; n < Enc::kNumFeatures; ++n) feat[n] = a.features[n] + row * T;
    if constexpr (Enc::kNumTok > 0) {
      tok.assign(static_cast<std::size_t>(Enc::kNumTok * T), Real(0));
      ctx.tok = tok.data();
      Enc::token_forward(ctx, feat.data(), tok.data());
    }
    qm = q;
    if constexpr (Enc::kHasQMod) {
      qm_buf.resize(static_cast<std::size_t>(T * D));
      mod_forward<Enc, true>(ctx, q, qm_buf.data(), coefs.q.empty() ? nullptr : coefs.q.data());
      qm = qm_buf.data();
    }
    km = k;
    if constexpr (Enc::kHasKMod) {
      km_buf.resize(static_cast<std::size_t>(T * D));
      mod_forward<Enc, false>(ctx, k, km_buf.data(), coefs.k.empty() ? nullptr : coefs.k.data());
      km = km_buf.data();
    }
    kt.resize(static_cast<std::size_t>(D * Tp));
    transpose_padded(km, T, D, Tp, kt.data());
    if constexpr (kNumRel > 0) {
      for (int n = 0; n < kNumRel; ++n) {
        rel[n].resize(static_cast<std::size_t>(T * Enc::rel_rows(n)));
        rel_rows_forward<Enc>(ctx, n, Enc::rel_side(n) == 0 ? qm : km, rel[n].data());
        rel_ptr[n] = rel[n].data();
      }
      ctx.rel = rel_ptr.data();
    }
  }
};

// Number of keys of the tile starting at j0 visible from query i (causal: j <= i), at most nk.
inline int64_t visible(int64_t i, int64_t j0, int64_t nk) {
  return std::clamp<int64_t>(i - j0 + 1, 0, nk);
}

// The final logits s[jj] = score_mod(scale * s[jj]) of query i against the nv visible keys
// j0 + jj of a tile row holding q'_i . k'_j (bias: B(d) for d <= i, distance-bias encodings).
template <class Enc, typename Real>
inline void final_logits(const HeadCtx<Real> &ctx, Real scale, int64_t i, int64_t j0, int64_t nv,
                         const std::vector<Real> &bias, Real *s) {
  if constexpr (DistanceBias<Enc>::value && !HasValueRows<Enc>::value) {
    const Real *bi = bias.data() + (i - j0);  // B(i - j0 - jj) = bi[-jj]
    APE_SIMD for (int64_t jj = 0; jj < nv; ++jj) s[jj] = scale * s[jj] + bi[-jj];
  } else if constexpr (Enc::kHasScoreMod) {
    for (int64_t jj = 0; jj < nv; ++jj) s[jj] = Enc::score_mod(ctx, i, j0 + jj, scale * s[jj]);
  } else {
    (void)ctx, (void)i, (void)j0, (void)bias;
    APE_SIMD for (int64_t jj = 0; jj < nv; ++jj) s[jj] *= scale;
  }
}

// Scratch of attend_rows: one query tile's logits, output accumulator and softmax state.
template <class Enc, typename Real> struct AttendScratch {
  std::vector<Real> st;          // (kTileQ, kTileK): logits, then probabilities
  std::vector<Real> acc;         // (kTileQ, D): unnormalised output
  std::array<Real, kTileQ> m{}, l{};  // running max and sum of each query
  std::array<Real, kTileQ> ref{}, alpha{};  // per key tile: exp's reference, rescale of m and l
  int64_t R = 0;                 // value rows: unnormalised probability mass of each row, per query
  std::vector<Real> mass;        // (kTileQ, R)
  std::vector<Real> bias;        // distance bias: B(d) for d < bias.size() (extended on demand)
  explicit AttendScratch(int64_t D) : st(kTileQ * kTileK), acc(static_cast<std::size_t>(kTileQ * D)) {
    if constexpr (HasValueRows<Enc>::value) R = Enc::kValueRows;
    mass.resize(static_cast<std::size_t>(kTileQ * R));
  }
};

// The causal online-softmax attention of nq <= kTileQ queries at positions i0, ..., i0 + nq - 1
// (qm: their (nq, D) rows after the q mod) over the keys j <= i: kt (D, ldk) holds k'^T, zero
// padded so that every key tile of kTileK columns up to the last query is readable; v (., D) the
// values. Writes o (nq, D) and lse (nq). The full forward runs it on every query tile of a slice,
// decoding (cpu/decode.h) on the new queries against the cache: the same arithmetic in the same
// order, key tile by key tile from j = 0.
template <class Enc, typename Real>
void attend_rows(const HeadCtx<Real> &ctx, Real scale, const Real *qm, int64_t i0, int64_t nq,
                 const Real *kt, int64_t ldk, const Real *v, Real *o, Real *lse,
                 AttendScratch<Enc, Real> &w) {
  const int64_t D = ctx.D;
  constexpr bool kValue = HasValueRows<Enc>::value;
  const int64_t R = w.R;
  Real *st = w.st.data(), *acc = w.acc.data();
  w.m.fill(neg_inf<Real>());
  w.l.fill(Real(0));
  std::fill(w.acc.begin(), w.acc.end(), Real(0));
  std::fill(w.mass.begin(), w.mass.end(), Real(0));
  const int64_t nkeys = i0 + nq;  // keys visible from the last query
  // Distance bias: B(d) for the distances d < nkeys, once per call (not per (i, j)).
  constexpr bool kDist = DistanceBias<Enc>::value && !kValue;
  if constexpr (kDist) {
    for (int64_t d = static_cast<int64_t>(w.bias.size()); d < nkeys; ++d)
      w.bias.push_back(Enc::distance_bias(ctx, d));
  }
  std::array<Real, kTileQ> &ref = w.ref, &alpha = w.alpha;
  for (int64_t j0 = 0; j0 < nkeys; j0 += kTileK) {  // tiles above the diagonal skipped
    const int64_t nk = std::min(kTileK, nkeys - j0);
    gemm<kTileK>(nq, D, kTileK, qm, D, 1, kt + j0, ldk, st, kTileK, false);
    // The final logits, the keys past the causal edge -inf, and each query's new running max.
    for (int64_t ii = 0; ii < nq; ++ii) {
      const int64_t i = i0 + ii, nv = visible(i, j0, nk);
      Real *s = st + ii * kTileK;
      final_logits<Enc>(ctx, scale, i, j0, nv, w.bias, s);
      std::fill(s + nv, s + kTileK, neg_inf<Real>());
      const Real tile_max = row_max(s), mx = tile_max > w.m[ii] ? tile_max : w.m[ii];
      // All logits so far -inf (a score_mod mask): keep exp finite, the row stays zero.
      ref[ii] = mx == neg_inf<Real>() ? Real(0) : mx;
      alpha[ii] = w.m[ii] - ref[ii];
      w.m[ii] = mx;
    }
    APE_SIMD for (int64_t ii = 0; ii < nq; ++ii) alpha[ii] = softmax_exp_le(alpha[ii]);
    for (int64_t ii = 0; ii < nq; ++ii) {
      Real *s = st + ii * kTileK;
      const Real r = ref[ii];
      APE_SIMD for (int64_t jj = 0; jj < kTileK; ++jj) s[jj] = softmax_exp_le(s[jj] - r);  // -inf: 0
      w.l[ii] = w.l[ii] * alpha[ii] + row_sum(s);
      Real *accr = acc + ii * D;
      const Real al = alpha[ii];
      APE_SIMD for (int64_t c = 0; c < D; ++c) accr[c] *= al;
      if constexpr (kValue) {
        const int64_t i = i0 + ii, nv = visible(i, j0, nk);
        Real *mr = w.mass.data() + ii * R;
        for (int64_t r = 0; r < R; ++r) mr[r] *= al;
        for (int64_t jj = 0; jj < nv; ++jj) mr[Enc::value_row(ctx, i, j0 + jj)] += s[jj];
      }
    }
    gemm(nq, nk, D, st, kTileK, 1, v + j0 * D, D, acc, D, true);
  }
  for (int64_t ii = 0; ii < nq; ++ii) {
    const Real inv = w.l[ii] > 0 ? Real(1) / w.l[ii] : Real(0);
    const Real *accr = acc + ii * D;
    Real *orow = o + ii * D;
    APE_SIMD for (int64_t c = 0; c < D; ++c) orow[c] = accr[c] * inv;
    if constexpr (kValue) {
      const Real *table = ctx.params[Enc::kValueTable];
      for (int64_t r = 0; r < R; ++r) {
        const Real wr = w.mass[ii * R + r] * inv;
        if (wr == Real(0)) continue;
        const Real *row = table + (r * ctx.H + ctx.h) * D;
        APE_SIMD for (int64_t c = 0; c < D; ++c) orow[c] += wr * row[c];
      }
    }
    lse[ii] = w.m[ii] + std::log(w.l[ii]);
  }
}

// The attention transition (contract/transition.h) of the rows [lo, hi) of this layer that a
// T-key call transforms, on top of attend_rows' outputs: o and lse hold the ordinary forward of
// every row (pass 1: lse is the row's log-sum-exp), and the rows of `rows` get o rewritten. Per
// block of kTileQ rows, two passes over their keys, tile by tile, recomputing the logits:
//   pass 2: A = exp(s - lse); kept mass K_r = Σ_c transition_kept(A) and, over the window
//           W = [s - 2I, s), the mask sum N_r; avg_r = beta (1 - K_r) / N_r;
//   pass 3: the weights w_rc = transition_weight(A, ...) and o_r = Σ_c w_rc v_c (a tile GEMM).
// Only (kTileQ, kTileK) logits are ever held. Arguments as attend_rows (qm: the rows of all T
// queries; kt (D, ldk); v (T, D); o (T, D); lse (T)).
template <class Enc, typename Real>
void transition_rows(const HeadCtx<Real> &ctx, Real scale, const TransitionRows &rows,
                     const Real *qm, const Real *kt, int64_t ldk, const Real *v, Real *o,
                     const Real *lse, AttendScratch<Enc, Real> &w) {
  static_assert(!HasValueRows<Enc>::value, "the transition does not combine with value rows");
  constexpr TransitionAttrs kAttrs = Enc::kTransition;
  const int64_t D = ctx.D, I = rows.I;
  Real *st = w.st.data(), *acc = w.acc.data();
  std::array<Real, kTileQ> kept{}, nmask{}, avg{}, bound{};
  std::array<int64_t, kTileQ> start{};
  for (int64_t i0 = rows.lo; i0 < rows.hi; i0 += kTileQ) {
    const int64_t nq = std::min(kTileQ, rows.hi - i0), nkeys = i0 + nq;
    if constexpr (DistanceBias<Enc>::value) {
      for (int64_t d = static_cast<int64_t>(w.bias.size()); d < nkeys; ++d)
        w.bias.push_back(Enc::distance_bias(ctx, d));
    }
    for (int64_t ii = 0; ii < nq; ++ii) {
      start[ii] = rows.start(i0 + ii);
      bound[ii] = Real(kAttrs.alpha) / Real(start[ii] + I);  // 1. alpha / e
      kept[ii] = nmask[ii] = Real(0);
    }
    for (int pass = 2; pass <= 3; ++pass) {
      if (pass == 3) {
        for (int64_t ii = 0; ii < nq; ++ii)
          avg[ii] = Real(kAttrs.beta) * (Real(1) - kept[ii]) / nmask[ii];  // N_r >= 2I * 0.01
        std::fill(w.acc.begin(), w.acc.begin() + nq * D, Real(0));
      }
      for (int64_t j0 = 0; j0 < nkeys; j0 += kTileK) {
        const int64_t nk = std::min(kTileK, nkeys - j0);
        gemm<kTileK>(nq, D, kTileK, qm + i0 * D, D, 1, kt + j0, ldk, st, kTileK, false);
        for (int64_t ii = 0; ii < nq; ++ii) {
          const int64_t i = i0 + ii, nv = visible(i, j0, nk), s0 = start[ii];
          Real *s = st + ii * kTileK;
          final_logits<Enc>(ctx, scale, i, j0, nv, w.bias, s);
          // A row whose every key a score mod masked (lse = -inf) has A = 0 (attend_rows wrote
          // o = 0): subtracting +inf makes every exp 0 instead of NaN; the steps then apply to
          // that zero row as to any other.
          const Real l = lse[i] == neg_inf<Real>() ? -neg_inf<Real>() : lse[i], bd = bound[ii];
          if (pass == 2) {
            Real km = 0, nm = 0;
            for (int64_t jj = 0; jj < nv; ++jj) {
              const int64_t c = j0 + jj;
              const Real kc = transition_kept(softmax_exp(s[jj] - l), c, bd);
              km += kc;
              if (c >= s0 - 2 * I && c < s0) nm += transition_mask(kc, bd);
            }
            kept[ii] += km, nmask[ii] += nm;
          } else {
            const Real a = avg[ii];
            for (int64_t jj = 0; jj < nv; ++jj)
              s[jj] = transition_weight(softmax_exp(s[jj] - l), j0 + jj, s0, I, bd, a);
            std::fill(s + nv, s + kTileK, Real(0));
          }
        }
        if (pass == 3) gemm(nq, nk, D, st, kTileK, 1, v + j0 * D, D, acc, D, true);
      }
    }
    std::copy(acc, acc + nq * D, o + i0 * D);  // the weights are not renormalised
  }
}

template <class Enc, typename Real>
void forward_slice(const AttnArgs<Real> &a, int64_t b, int64_t h, const ModCoefs<Real> &coefs) {
  const SliceInputs<Enc, Real> in(a, b, h, coefs);
  const int64_t T = a.T, D = a.D, row = b * a.H + h;
  Real *o = a.o + row * T * D;  // (T, D)
  Real *lse = a.lse + row * T;  // (T)
  AttendScratch<Enc, Real> scratch(D);
  for (int64_t i0 = 0; i0 < T; i0 += kTileQ) {
    const int64_t nq = std::min(kTileQ, T - i0);
    attend_rows<Enc>(in.ctx, a.scale, in.qm + i0 * D, i0, nq, in.kt.data(), in.Tp, in.v,
                     o + i0 * D, lse + i0, scratch);
  }
  if constexpr (traits::HasTransition<Enc>::value) {
    const TransitionRows rows = transition_rows_of(Enc::kTransition, T, a.num_layers, a.layer);
    if (!rows.empty())
      transition_rows<Enc>(in.ctx, a.scale, rows, in.qm, in.kt.data(), in.Tp, in.v, o, lse, scratch);
  }
}

// dparams: this slice's private accumulators, parameter n at dparams + poff[n], zeroed.
template <class Enc, typename Real>
void backward_slice(const AttnArgs<Real> &a, int64_t b, int64_t h, Real *dparams,
                    const std::array<int64_t, array_len(Enc::kNumParams)> &poff,
                    const ModCoefs<Real> &coefs) {
  SliceInputs<Enc, Real> in(a, b, h, coefs);
  HeadCtx<Real> &ctx = in.ctx;
  const int64_t T = a.T, D = a.D, row = b * a.H + h;
  const Real scale = a.scale;
  const Real *o = a.o + row * T * D;        // (T, D)
  const Real *lse = a.lse + row * T;        // (T)
  const Real *dout = a.dout + row * T * D;  // (T, D)
  Real *dq = a.dq + row * T * D, *dk = a.dk + row * T * D, *dv = a.dv + row * T * D;

  std::array<Real *, array_len(Enc::kNumParams)> dparam_ptrs{};
  for (int n = 0; n < Enc::kNumParams; ++n) dparam_ptrs[n] = dparams + poff[n];
  ctx.dparams = dparam_ptrs.data();
  std::vector<Real> dtok(static_cast<std::size_t>(Enc::kNumTok * T), Real(0));  // (kNumTok, T)
  ctx.dtok = dtok.data();
  constexpr int kNumRel = NumRel<Enc>::value;
  std::array<std::vector<Real>, array_len(kNumRel)> drel;  // (T, rows_n) each, zeroed
  std::array<Real *, array_len(kNumRel)> drel_ptr{};
  if constexpr (kNumRel > 0) {
    for (int n = 0; n < kNumRel; ++n) {
      drel[n].assign(static_cast<std::size_t>(T * Enc::rel_rows(n)), Real(0));
      drel_ptr[n] = drel[n].data();
    }
    ctx.drel = drel_ptr.data();
  }

  std::vector<Real> vt(static_cast<std::size_t>(D * in.Tp));  // (D, Tp) v^T, zero padded
  transpose_padded(in.v, T, D, in.Tp, vt.data());
  std::vector<Real> delta(static_cast<std::size_t>(T));  // (T): Delta_i = dO_i . O_i
  for (int64_t t = 0; t < T; ++t) {
    Real d = 0;
    APE_SIMD_REDUCE(+ : d) for (int64_t c = 0; c < D; ++c) d += dout[t * D + c] * o[t * D + c];
    delta[t] = d;
  }
  // Gradients w.r.t. q', k' (T, D): straight into dq / dk when there is no mod.
  std::vector<Real> dqm_buf(Enc::kHasQMod ? static_cast<std::size_t>(T * D) : 0);
  std::vector<Real> dkm_buf(Enc::kHasKMod ? static_cast<std::size_t>(T * D) : 0);
  Real *dqm = Enc::kHasQMod ? dqm_buf.data() : dq;
  Real *dkm = Enc::kHasKMod ? dkm_buf.data() : dk;
  std::fill(dqm, dqm + T * D, Real(0));
  std::fill(dkm, dkm + T * D, Real(0));
  std::fill(dv, dv + T * D, Real(0));

  std::vector<Real> st(kTileQ * kTileK);  // (kTileQ, kTileK): logits, then P
  std::vector<Real> dp(kTileQ * kTileK);  // (kTileQ, kTileK): dO V^T, then scale * dS
  // Value rows: dP_ij also gets dO_i . table[r(i, j)] (drow, (T, R)); mass (T, R) collects
  // sum_j P_ij per row for the table's gradient.
  constexpr bool kValue = HasValueRows<Enc>::value;
  int64_t R = 0;
  if constexpr (kValue) R = Enc::kValueRows;
  std::vector<Real> drow(static_cast<std::size_t>(T * R)), mass(static_cast<std::size_t>(T * R));
  constexpr bool kDist = DistanceBias<Enc>::value && !kValue;
  const std::vector<Real> rb = kDist ? distance_table<Enc>(ctx) : std::vector<Real>();
  std::vector<Real> gb(rb.size(), Real(0));  // diagonal sums of dS / scale, reversed like rb
  if constexpr (kValue) {
    const Real *table = a.params[Enc::kValueTable];
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < R; ++r) {
        const Real *row = table + (r * a.H + h) * D;
        Real d = 0;
        APE_SIMD_REDUCE(+ : d) for (int64_t c = 0; c < D; ++c) d += dout[t * D + c] * row[c];
        drow[t * R + r] = d;
      }
  }

  for (int64_t i0 = 0; i0 < T; i0 += kTileQ) {
    const int64_t nq = std::min(kTileQ, T - i0);
    for (int64_t j0 = 0; j0 < i0 + nq; j0 += kTileK) {
      const int64_t nk = std::min(kTileK, T - j0);
      gemm<kTileK>(nq, D, kTileK, in.qm + i0 * D, D, 1, in.kt.data() + j0, in.Tp, st.data(),
                   kTileK, false);
      gemm<kTileK>(nq, D, kTileK, dout + i0 * D, D, 1, vt.data() + j0, in.Tp, dp.data(), kTileK,
                   false);
      for (int64_t ii = 0; ii < nq; ++ii) {
        const int64_t i = i0 + ii, nv = visible(i, j0, nk);
        // A row without any finite logit (lse = -inf) has P = 0. Every logit is <= its row's lse
        // (the forward's max plus log l, l >= 1), so P's exps take softmax_exp_le.
        const Real lse_i = lse[i] == neg_inf<Real>() ? std::numeric_limits<Real>::infinity()
                                                      : lse[i];
        const Real delta_i = delta[i];
        Real *s = st.data() + ii * kTileK, *g = dp.data() + ii * kTileK;
        if constexpr (kValue) {
          for (int64_t jj = 0; jj < nv; ++jj) {
            const int64_t r = Enc::value_row(ctx, i, j0 + jj);
            const Real raw = scale * s[jj];
            Real logit = raw;
            if constexpr (Enc::kHasScoreMod) logit = Enc::score_mod(ctx, i, j0 + jj, raw);
            const Real p = softmax_exp_le(logit - lse_i);
            const Real gp = p * (g[jj] + drow[i * R + r] - delta_i);
            s[jj] = p;
            mass[i * R + r] += p;
            if constexpr (Enc::kHasScoreMod)
              g[jj] = scale * Enc::score_mod_grad(ctx, i, j0 + jj, raw, gp);
            else
              g[jj] = scale * gp;
          }
        } else if constexpr (kDist) {
          const Real *bi = rb.data() + (T - 1 - i + j0);
          Real *gi = gb.data() + (T - 1 - i + j0);
          APE_SIMD for (int64_t jj = 0; jj < nv; ++jj) {
            const Real p = softmax_exp_le(scale * s[jj] + bi[jj] - lse_i);
            const Real gp = p * (g[jj] - delta_i);
            s[jj] = p;
            gi[jj] += gp;
            g[jj] = scale * gp;
          }
        } else if constexpr (Enc::kHasScoreMod) {
          for (int64_t jj = 0; jj < nv; ++jj) {
            const Real raw = scale * s[jj];
            const Real p = softmax_exp_le(Enc::score_mod(ctx, i, j0 + jj, raw) - lse_i);
            s[jj] = p;
            g[jj] = scale * Enc::score_mod_grad(ctx, i, j0 + jj, raw, p * (g[jj] - delta_i));
          }
        } else {
          APE_SIMD for (int64_t jj = 0; jj < nv; ++jj) {
            const Real p = softmax_exp_le(scale * s[jj] - lse_i);
            s[jj] = p;
            g[jj] = scale * p * (g[jj] - delta_i);
          }
        }
        std::fill(s + nv, s + kTileK, Real(0));
        std::fill(g + nv, g + kTileK, Real(0));
      }
      // dV[j] += P^T dO, dK'[j] += scale dS^T Q', dQ'[i] += scale dS K'.
      gemm(nk, nq, D, st.data(), 1, kTileK, dout + i0 * D, D, dv + j0 * D, D, true);
      gemm(nk, nq, D, dp.data(), 1, kTileK, in.qm + i0 * D, D, dkm + j0 * D, D, true);
      gemm(nq, nk, D, dp.data(), kTileK, 1, in.km + j0 * D, D, dqm + i0 * D, D, true);
    }
  }

  if constexpr (kDist) {  // B's gradients, one call per distance with its diagonal's sum
    for (int64_t d = 0; d < T; ++d)
      if (const Real gd = gb[T - 1 - d]; gd != Real(0)) Enc::distance_bias_grad(ctx, d, gd);
  }
  if constexpr (kValue) {  // table[r] gradient: sum_i mass_i[r] dO_i
    if constexpr (Enc::kValueTableTrainable) {
      Real *dtable = ctx.dparams[Enc::kValueTable];
      for (int64_t t = 0; t < T; ++t)
        for (int64_t r = 0; r < R; ++r) {
          const Real w = mass[t * R + r];
          if (w == Real(0)) continue;
          Real *drow_t = dtable + (r * a.H + h) * D;
          APE_SIMD for (int64_t c = 0; c < D; ++c) drow_t[c] += w * dout[t * D + c];
        }
    }
  }
  if constexpr (kNumRel > 0) {  // the rows' gradients into dq', dk' and the tables
    for (int n = 0; n < kNumRel; ++n) {
      const bool q_side = Enc::rel_side(n) == 0;
      rel_rows_backward<Enc>(ctx, n, q_side ? in.qm : in.km, drel[n].data(), q_side ? dqm : dkm);
    }
  }
  if constexpr (Enc::kHasQMod)
    mod_backward<Enc, true>(ctx, in.q, dqm, dq, coefs.q.empty() ? nullptr : coefs.q.data());
  if constexpr (Enc::kHasKMod)
    mod_backward<Enc, false>(ctx, in.k, dkm, dk, coefs.k.empty() ? nullptr : coefs.k.data());
  if constexpr (Enc::kNumTok > 0) {
    std::array<Real *, array_len(Enc::kNumFeatures)> dfeat{};
    for (int n = 0; n < Enc::kNumFeatures; ++n) dfeat[n] = a.dfeatures[n] + row * T;
    Enc::token_backward(ctx, in.feat.data(), in.tok.data(), dtok.data(), dfeat.data());
  } else {
    for (int n = 0; n < Enc::kNumFeatures; ++n)  // features without tokens have no effect
      std::fill(a.dfeatures[n] + row * T, a.dfeatures[n] + (row + 1) * T, Real(0));
  }
}

}  // namespace detail

template <class Enc, typename Real> void attention_forward(const AttnArgs<Real> &a) {
  const int64_t slices = a.B * a.H;
  const auto coefs = detail::mod_coefs<Enc>(a);
  APE_PRAGMA(omp parallel for schedule(dynamic, 1))
  for (int64_t s = 0; s < slices; ++s) detail::forward_slice<Enc>(a, s / a.H, s % a.H, *coefs);
}

template <class Enc, typename Real> void attention_backward(const AttnArgs<Real> &a) {
  static_assert(!traits::HasTransition<Enc>::value,
                "an attention transition is inference-only: its encoding has no backward");
  const int64_t slices = a.B * a.H;
  // Private parameter-gradient accumulators: (B*H, sum_n numel_n), parameter n at offset poff[n].
  std::array<int64_t, detail::array_len(Enc::kNumParams)> poff{}, numel{};
  int64_t per_slice = 0;
  if constexpr (Enc::kNumParams > 0) {
    for (int n = 0; n < Enc::kNumParams; ++n) {
      poff[n] = per_slice;
      numel[n] = Enc::param_numel(n, a.H, a.D);
      per_slice += numel[n];
    }
  }
  std::vector<Real> priv(static_cast<std::size_t>(slices * per_slice), Real(0));
  const auto coefs = detail::mod_coefs<Enc>(a);

  APE_PRAGMA(omp parallel for schedule(dynamic, 1))
  for (int64_t s = 0; s < slices; ++s)
    detail::backward_slice<Enc>(a, s / a.H, s % a.H, priv.data() + s * per_slice, poff, *coefs);

  // Fixed (b, h) order: bitwise reproducible for any thread count.
  for (int n = 0; n < Enc::kNumParams; ++n) {
    Real *dst = a.dparams[n];
    std::fill(dst, dst + numel[n], Real(0));
    for (int64_t s = 0; s < slices; ++s) {
      const Real *src = priv.data() + s * per_slice + poff[n];
      for (int64_t e = 0; e < numel[n]; ++e) dst[e] += src[e];
    }
  }
}

}  // namespace APE_CPU_NS
}  // namespace ape
APE_CPU_END
