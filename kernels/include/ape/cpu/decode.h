// CPU KV-cache decoding for generated positional encodings (docs/decoding.md).
//
// The same `Enc` functor as the full forward (cpu/attention.h), driven step by step: a step
// appends n new tokens (their raw q, k, v and token features) to a cache of L0 tokens and
// returns the attention outputs of the n new queries over all L = L0 + n keys. A prefill is the
// first step (L0 = 0). Contract: the outputs of a step equal rows L0 .. L - 1 of the full
// forward over the L tokens so far (for encodings that do not read the sequence length, also the
// rows of a full forward over any longer sequence: attention is causal).
//
// What a slice (b, h) keeps, and why it suffices (the functor's members read only these):
//   kt    (D, Cp)    k'^T of every cached key: k_mod reads (k, partner, c, t, h, params, D, H),
//                    fixed once its position t is known; the tile loops read k'^T directly;
//   v     (C, D)     values;
//   feat  (F, C)     the token features (the token program's inputs);
//   tok   (NT, C)    every token sequence of the token program (maps and scans of the features);
//   carry (NT)       each scan's running sum in double: a step runs the token program on the new
//                    tokens only (HeadCtx::tok0), the scans continuing from these sums, so the
//                    cached values are bitwise those of the full forward;
//   rel   (C, R_n)   key-side relative rows (k' + b) table^T of every cached key.
// Query-side state (q', query-side relative rows) is computed for the new queries only.
// Encodings whose k mod reads the sequence length (ape.dim "seq_len": dynamic NTK, xPos's
// centre) keep the raw keys instead (kraw (C, D)) and recompute k' (and key-side rows) at the
// new length every step; a token program that reads it is rerun from the cached features.
// Those are the only members that read it (EncDecodeTraits below, emitted by apec).
//
// Grouped-query attention (DecodeArgs::kv_heads = H_kv < H, as AttnArgs::kv_heads): k and v are
// (B, H_kv, n, D) and query head h reads key head h / (H / H_kv). The cache keeps v and kraw per
// key head, and k'^T per key head too where one key head's k' serves its whole group
// (traits::KModShared: no k mod, or a linear one, whose coefficients read neither the head nor
// the data); else per query head (a k mod reading the head, a token sequence or a trainable
// param), each computed from its key head's raw keys. The token state and the key side's
// relative rows stay per query head.
//
// Names of shapes: B batch, H heads, Hkv key heads (H when not grouped), Hk the heads of k'^T (Hkv
// or H, above), D head dim, n new tokens, C capacity, Cp = detail::padded_row(C) (C rounded up to
// kTileK, plus 64 bytes), F = Enc::kNumFeatures, NT = Enc::kNumTok.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "ape/cpu/attention.h"

namespace ape {

// The cache of one attention layer for B x H slices (plain data, filled by decode_step).
template <typename Real> struct DecodeCache {
  int64_t capacity = 0;  // tokens it can hold; set before the first step
  int64_t len = 0;       // tokens cached
  int64_t B = 0, H = 0, D = 0, Cp = 0;        // fixed by the first step
  int64_t Hkv = 0;                            // key heads, fixed by the first step (H: not grouped)
  std::vector<Real> kt;                       // (B*Hk, D, Cp) k'^T, zero padded
  std::vector<Real> kraw;                     // (B*Hkv, C, D) raw k (length-dependent keys only)
  std::vector<Real> v;                        // (B*Hkv, C, D)
  std::vector<Real> feat;                     // (B*H, F, C)
  std::vector<Real> tok;                      // (B*H, NT, C)
  std::vector<double> carry;                  // (B*H, NT)
  std::vector<std::vector<Real>> rel;         // per relative-rows value n: (B*H, C, R_n) (key side)
  bool started() const { return B > 0; }
};

// One step: n new tokens of every (b, h) slice.
template <typename Real> struct DecodeArgs {
  int64_t B, H, n, D;
  const Real *q, *k, *v;             // q (B, H, n, D), k and v (B, Hkv, n, D), contiguous: raw projections
  const Real *const *features;       // Enc::kNumFeatures arrays, each (B, H, n)
  const Real *const *params;         // Enc::kNumParams arrays, as in AttnArgs
  Real scale;                        // kappa
  Real *o;                           // (B, H, n, D)
  Real *lse;                         // (B, H, n) or null
  // The layer (0-based) of a model of num_layers, as AttnArgs: an attention transition
  // (contract/transition.h) transforms the prompt only, i.e. the prefill (the first step), at
  // T = n; later steps attend as usual.
  int64_t layer = 0, num_layers = 0;
  // Heads of k and v: 0 = H; else a divisor of H (grouped-query attention, as AttnArgs::kv_heads).
  int64_t kv_heads = 0;
};

}  // namespace ape

// Compiled for this unit's level (no #include inside the region, see cpu/dispatch.h).
APE_CPU_BEGIN
namespace ape {
inline namespace APE_CPU_NS {
namespace detail {

// k' is recomputed for every key (from kraw) where the k mod reads the length, or may read a
// token sequence that does (as cuda/launch.cuh's caches_k_mod).
template <class Enc> constexpr bool keys_read_length() {
  return traits::KModReadsLength<Enc>::value || (Enc::kHasKMod && traits::TokensReadLength<Enc>::value);
}

// The heads of k'^T a batch row keeps (Hk above).
template <class Enc, typename Real> int64_t kt_heads(const DecodeCache<Real> &c) {
  return traits::KModShared<Enc>::value ? c.Hkv : c.H;
}

// k' of keys [k0, L) into columns k0.. of k'^T (kt: D rows of Cp); kin: their raw rows, from row k0.
// Returns k' of those keys as rows (kin itself without a k mod; else km_buf).
template <class Enc, typename Real>
const Real *keys_into(const HeadCtx<Real> &ctx, const Real *kin, int64_t k0, int64_t L, Real *kt,
                      int64_t Cp, std::vector<Real> &km_buf) {
  const int64_t D = ctx.D;
  const Real *km = kin;
  if constexpr (Enc::kHasKMod) {
    km_buf.resize(static_cast<std::size_t>((L - k0) * D));
    mod_rows<Enc, false>(ctx, kin, k0, L - k0, km_buf.data());
    km = km_buf.data();
  }
  for (int64_t t = k0; t < L; ++t)
    for (int64_t d = 0; d < D; ++d) kt[d * Cp + t] = km[(t - k0) * D + d];
  return km;
}

// Key head g of batch row b: its new values (and raw keys) into the cache; its k' when the group
// shares it (else each query head's slice computes its own from these raw keys).
template <class Enc, typename Real>
void decode_keys(DecodeCache<Real> &c, const DecodeArgs<Real> &a, int64_t b, int64_t g) {
  constexpr bool kKeysLen = keys_read_length<Enc>();
  const int64_t sk = b * c.Hkv + g, n = a.n, D = a.D, C = c.capacity, L0 = c.len, L = L0 + n;
  const Real *k = a.k + sk * n * D, *v = a.v + sk * n * D;
  std::copy(v, v + n * D, c.v.data() + (sk * C + L0) * D);
  const Real *kin = k;
  if constexpr (kKeysLen) {
    Real *raw = c.kraw.data() + sk * C * D;
    std::copy(k, k + n * D, raw + L0 * D);
    kin = raw;
  }
  if constexpr (traits::KModShared<Enc>::value) {
    // The group's first query head (a shared k' reads no head; the context wants one).
    const HeadCtx<Real> ctx{b, g * (c.H / c.Hkv), a.H, L, D, a.params, nullptr, nullptr, nullptr};
    std::vector<Real> km_buf;
    keys_into<Enc>(ctx, kin, kKeysLen ? 0 : L0, L, c.kt.data() + sk * D * c.Cp, c.Cp, km_buf);
  }
}

template <class Enc, typename Real>
void decode_slice(DecodeCache<Real> &c, const DecodeArgs<Real> &a, int64_t b, int64_t h) {
  constexpr int F = Enc::kNumFeatures, NT = Enc::kNumTok, kNumRel = NumRel<Enc>::value;
  constexpr bool kKeysLen = keys_read_length<Enc>();
  constexpr bool kTokLen = traits::TokensReadLength<Enc>::value;
  const int64_t s = b * a.H + h, n = a.n, D = a.D, C = c.capacity, Cp = c.Cp;
  const int64_t sk = b * c.Hkv + h / (c.H / c.Hkv);  // its key head's slice
  const int64_t L0 = c.len, L = L0 + n;
  HeadCtx<Real> ctx{b, h, a.H, L, D, a.params, nullptr, nullptr, nullptr};

  // Token features, then the token program on the new tokens (in a (NT, L) copy: the functor
  // reads tok[slot * T + t] with T = L).
  std::array<const Real *, array_len(F)> feat{};
  for (int f = 0; f < F; ++f) {
    Real *row = c.feat.data() + (s * F + f) * C;
    const Real *src = a.features[f] + s * n;
    std::copy(src, src + n, row + L0);
    feat[f] = row;
  }
  std::vector<Real> tok;
  if constexpr (NT > 0) {
    const int64_t t0 = kTokLen ? 0 : L0;  // a program reading the length is rerun
    tok.resize(static_cast<std::size_t>(NT * L));
    Real *cached = c.tok.data() + s * NT * C;
    for (int m = 0; m < NT; ++m) std::copy(cached + m * C, cached + m * C + t0, tok.data() + m * L);
    ctx.tok = tok.data();
    ctx.tok0 = t0;
    ctx.scan_carry = kTokLen ? nullptr : c.carry.data() + s * NT;
    Enc::token_forward(ctx, feat.data(), tok.data());
    for (int m = 0; m < NT; ++m)
      std::copy(tok.data() + m * L + t0, tok.data() + (m + 1) * L, cached + m * C + t0);
    ctx.tok0 = 0;
    ctx.scan_carry = nullptr;
  }

  // q' of the new queries; k' of the new keys (or of all keys at the new length) into k'^T,
  // this query head's own unless its key head's serves the group (decode_keys wrote it).
  const Real *q = a.q + s * n * D;
  std::vector<Real> qm_buf;
  const Real *qm = q;
  if constexpr (Enc::kHasQMod) {
    qm_buf.resize(static_cast<std::size_t>(n * D));
    mod_rows<Enc, true>(ctx, q, L0, n, qm_buf.data());
    qm = qm_buf.data();
  }
  const int64_t k0 = kKeysLen ? 0 : L0;  // first key whose k' (and key-side rows) is computed now
  Real *kt = c.kt.data() + (traits::KModShared<Enc>::value ? sk : s) * D * Cp;
  std::vector<Real> km_buf;
  const Real *km = nullptr;
  if constexpr (!traits::KModShared<Enc>::value) {
    const Real *kin = kKeysLen ? c.kraw.data() + sk * C * D : a.k + sk * n * D;
    km = keys_into<Enc>(ctx, kin, k0, L, kt, Cp, km_buf);
  }
  // Relative rows: query side for the new queries (rows L0.. of an (L, R) array), key side cached.
  std::array<std::vector<Real>, array_len(kNumRel)> qrows;
  std::array<const Real *, array_len(kNumRel)> rel_ptr{};
  if constexpr (kNumRel > 0) {
    for (int r = 0; r < kNumRel; ++r) {
      const int64_t R = Enc::rel_rows(r);
      if (Enc::rel_side(r) == 0) {
        qrows[r].assign(static_cast<std::size_t>(L * R), Real(0));
        rel_rows_range<Enc>(ctx, r, qm, n, qrows[r].data() + L0 * R);
        rel_ptr[r] = qrows[r].data();
      } else {
        if (!km) {  // the group's k' rows, from its k'^T
          km_buf.resize(static_cast<std::size_t>((L - k0) * D));
          for (int64_t t = k0; t < L; ++t)
            for (int64_t d = 0; d < D; ++d) km_buf[(t - k0) * D + d] = kt[d * Cp + t];
          km = km_buf.data();
        }
        Real *rows = c.rel[r].data() + s * C * R;
        rel_rows_range<Enc>(ctx, r, km, L - k0, rows + k0 * R);
        rel_ptr[r] = rows;
      }
    }
    ctx.rel = rel_ptr.data();
  }

  // The new queries against every cached key, query tile by query tile.
  Real *o = a.o + s * n * D;
  std::vector<Real> lse_buf(a.lse ? 0 : static_cast<std::size_t>(n));
  Real *lse = a.lse ? a.lse + s * n : lse_buf.data();
  AttendScratch<Enc, Real> scratch(D);
  for (int64_t i0 = 0; i0 < n; i0 += kTileQ) {
    const int64_t nq = std::min(kTileQ, n - i0);
    attend_rows<Enc>(ctx, a.scale, qm + i0 * D, L0 + i0, nq, kt, Cp, c.v.data() + sk * C * D,
                     o + i0 * D, lse + i0, scratch);
  }
  if constexpr (traits::HasTransition<Enc>::value) {
    if (L0 == 0) {  // the prefill is the prompt: the full forward's transition at T = n
      const TransitionRows rows = transition_rows_of(Enc::kTransition, n, a.num_layers, a.layer);
      if (!rows.empty())
        transition_rows<Enc>(ctx, a.scale, rows, qm, kt, Cp, c.v.data() + sk * C * D, o, lse, scratch);
    }
  }
}

}  // namespace detail

// Appends a.n tokens to `c` and writes their attention outputs (see the top of this file).
// Throws std::invalid_argument on shapes that do not match the cache (or a kv_heads that does not
// divide H), std::length_error when the
// tokens do not fit its capacity.
template <class Enc, typename Real> void decode_step(DecodeCache<Real> &c, const DecodeArgs<Real> &a) {
  if (a.B < 1 || a.H < 1 || a.D < 1 || a.n < 1)
    throw std::invalid_argument("decode_step: B, H, D and n must be >= 1 (got B=" +
                                std::to_string(a.B) + ", H=" + std::to_string(a.H) +
                                ", D=" + std::to_string(a.D) + ", n=" + std::to_string(a.n) + ")");
  if (std::string why = ape_rules::check_kv_heads(a.kv_heads, a.H); !why.empty())
    throw std::invalid_argument("decode_step: " + why);
  const int64_t Hkv = a.kv_heads == 0 ? a.H : a.kv_heads;
  if (c.capacity < 1) throw std::invalid_argument("decode_step: the cache has no capacity");
  if (c.len + a.n > c.capacity)
    throw std::length_error("decode_step: " + std::to_string(c.len) + " cached + " +
                            std::to_string(a.n) + " new tokens exceed the cache's capacity " +
                            std::to_string(c.capacity));
  if (!c.started()) {
    constexpr int F = Enc::kNumFeatures, NT = Enc::kNumTok, kNumRel = detail::NumRel<Enc>::value;
    const int64_t S = a.B * a.H, Skv = a.B * Hkv, C = c.capacity, D = a.D;
    c.B = a.B, c.H = a.H, c.Hkv = Hkv, c.D = D, c.len = 0;
    c.Cp = detail::padded_row<Real>(C);
    c.kt.assign(static_cast<std::size_t>(a.B * detail::kt_heads<Enc>(c) * D * c.Cp), Real(0));
    if constexpr (detail::keys_read_length<Enc>())
      c.kraw.assign(static_cast<std::size_t>(Skv * C * D), Real(0));
    c.v.assign(static_cast<std::size_t>(Skv * C * D), Real(0));
    c.feat.assign(static_cast<std::size_t>(S * F * C), Real(0));
    c.tok.assign(static_cast<std::size_t>(S * NT * C), Real(0));
    c.carry.assign(static_cast<std::size_t>(S * NT), 0.0);
    c.rel.assign(static_cast<std::size_t>(kNumRel), std::vector<Real>());
    if constexpr (kNumRel > 0)
      for (int r = 0; r < kNumRel; ++r)
        if (Enc::rel_side(r) != 0)
          c.rel[r].assign(static_cast<std::size_t>(S * C * Enc::rel_rows(r)), Real(0));
  } else if (a.B != c.B || a.H != c.H || Hkv != c.Hkv || a.D != c.D) {
    throw std::invalid_argument(
        "decode_step: the step has B=" + std::to_string(a.B) + ", H=" + std::to_string(a.H) +
        ", key heads=" + std::to_string(Hkv) + ", D=" + std::to_string(a.D) + " but the cache holds B=" +
        std::to_string(c.B) + ", H=" + std::to_string(c.H) + ", key heads=" + std::to_string(c.Hkv) +
        ", D=" + std::to_string(c.D));
  } else if (static_cast<int64_t>(c.v.size()) != c.B * c.Hkv * c.capacity * c.D) {
    // The buffers are laid out by the capacity of the first step.
    throw std::invalid_argument("decode_step: the cache's capacity changed after its first step (it holds " +
                                std::to_string(c.v.size() / static_cast<std::size_t>(c.B * c.Hkv * c.D)) +
                                " tokens a slice, capacity says " + std::to_string(c.capacity) + ")");
  }
  const int64_t slices = a.B * a.H, key_slices = a.B * Hkv;
  // A step that throws (memory running out in a slice's scratch) leaves the cache as it was: the
  // rows past len are rewritten by the next step; the scans' sums, which a slice advances in
  // place, are put back.
  std::vector<double> carry;
  if constexpr (Enc::kNumTok > 0) carry = c.carry;
  try {
    // Each key head's new keys and values first (the slices of its group read them), then every
    // query head's slice.
    detail::each_slice(key_slices, [&](int64_t s) { detail::decode_keys<Enc>(c, a, s / Hkv, s % Hkv); });
    detail::each_slice(slices, [&](int64_t s) { detail::decode_slice<Enc>(c, a, s / a.H, s % a.H); });
  } catch (...) {
    if constexpr (Enc::kNumTok > 0) c.carry = std::move(carry);
    throw;
  }
  c.len += a.n;
}

}  // namespace APE_CPU_NS
}  // namespace ape
APE_CPU_END
