// The FlashAttention-2-class forward (ape/cuda/attention.cuh): mma.sync on register fragments,
// 16-bit inputs, sm_80+; its softmax and bias helpers are shared with the Hopper forward and the
// flash backward.
#pragma once

#include "ape/cuda/common.cuh"
#include "ape/cuda/flash_tile.cuh"

namespace ape::cuda {
APE_CUDA_ABI_BEGIN
namespace detail {

// ---- forward, FlashAttention-2 class (16-bit inputs) ----------------------------------------------
// One block per (query tile of BQ = 128 rows, slice): 4 warps of 32 query rows (two m16 tiles)
// each, or at D = 128, where a warp's registers hold one m16 tile, 8 warps of 16 rows (each K
// and V tile serves 128 rows either way: half the bytes per FLOP of 64-row tiles; 96 KiB of
// shared memory, within sm_86/89's 99 KiB). Q stays in shared memory (ldmatrix per k-step), K and V
// tiles of BK = 64 keys are prefetched with 16-byte cp.async into double buffers one tile ahead;
// S = Q'K'^T and O += P V on mma.sync.m16n8k16 with fp32 accumulators; S, P and O never leave
// registers: the score mod and the causal mask are applied to the accumulator elements, the
// online softmax reduces each row over its quad of lanes (shuffles) and uses exp2 with log2 e
// folded into one FMA, and P, rounded to the input dtype, is the A operand of P V as it stands.
// One barrier per tile (after the wait that lands it), which also frees the buffer the next
// prefetch overwrites.
template <class In, int D> struct FlashFwd {
  static constexpr int kMT = D == 128 ? 1 : 2;   // m16 tiles per warp (registers at D = 128)
  static constexpr int kWarps = 8 / kMT, kThreads = 32 * kWarps;
  static constexpr int BQ = kWarps * 16 * kMT;   // 128 query rows
  static constexpr int BK = 64;                  // keys per tile
  static constexpr int kNT = BK / 8;             // n8 tiles of S per row block
  static constexpr int kDT = D / 8;              // n8 tiles of O per row block
  static constexpr size_t q = 0, k = sizeof(In) * BQ * D, v = k + 2 * sizeof(In) * BK * D;
  static constexpr size_t bytes = v + 2 * sizeof(In) * BK * D;
  static_assert(bytes <= kSmemLimit, "forward tiles exceed sm_86/89's 99 KiB of shared memory");
  // Distance biases: two windows of the slice's table of B(d) / scale (dist_table_kernel), BQ + BK
  // distances each (those of a tile pair and one before).
  static constexpr int kDistLen = BQ + BK;
  static constexpr size_t dist = bytes;
  static constexpr size_t bytes_dist = dist + 2 * sizeof(float) * kDistLen;
  static_assert(bytes_dist <= kSmemLimit, "forward tiles exceed sm_86/89's 99 KiB of shared memory");
  // Row/column biases: two windows of the slice's column table (BK keys); the rows are per-thread
  // registers.
  static constexpr size_t rowcol = bytes, bytes_rowcol = rowcol + 2 * sizeof(float) * BK;
  static_assert(bytes_rowcol <= kSmemLimit, "forward tiles exceed sm_86/89's 99 KiB of shared memory");
};

// Distance biases (Enc::kDistanceBias, contract/enc_traits.h: the score mod is s + B(i - j)): the flash
// kernels evaluate B once per distance of a tile pair into shared memory (BQ + BK - 1 values
// instead of BQ BK), the forward adds it with one FFMA per element, and the backward sums
// P (dP - Delta) along each diagonal of the tile in a fixed order and calls distance_bias_grad
// once per distance: the sinks see BQ + BK - 1 terms per tile pair instead of BQ BK.
template <class Enc> constexpr bool flash_distance() {
  return traits::DistanceBias<Enc>::value && value_rows<Enc>() == 0;
}

// Row/column biases (Enc::kRowColBias, contract/enc_traits.h: the score mod is s + R(i) + C(j), Cable's
// S_i - S_j): the flash kernels evaluate R once per query and C once per key of a tile into
// shared memory, the forward adds R + C with one FFMA per element, and the backward sums
// P (dP - Delta) along each query row of the tile and each key column (over all the block's
// query tiles) in a fixed order and calls row_bias_grad / col_bias_grad once per row and column:
// the sinks see BQ terms per tile and BK per block instead of 2 BQ BK per tile.
template <class Enc> constexpr bool flash_rowcol() {
  return traits::RowColBias<Enc>::value && !flash_distance<Enc>() && value_rows<Enc>() == 0;
}

// Parameters of a general score mod in shared memory. A score mod that is neither a distance nor
// a row/column bias (those have their own tables) runs at every element, and may read parameters
// and add to their gradients there: FIRE's MLP of the distance reads 99 parameters per pair and
// its gradient adds to as many sums, one pair of fixed-point L2 atomics each, per lane. A flash
// kernel stages such parameters (Enc::kScoreParams) once per block in shared memory
// (Params::param_cache: bit n for parameter n, chosen at launch while they fit, param_cache_mask), the functors read them there
// and, in the backward, add their gradients to block sums there in the same fixed point
// (shared-memory atomics on the two words, FixedRef; integer sums, so the same in any order); the
// block adds each non-zero sum to the global one at its end. A parameter's gradient then costs one
// pair of L2 atomics per block instead of one per element. Layout from the cache's base (16-byte
// aligned, after the kernel's tiles): the gradients' two words per element (backward), then the
// values, the cached parameters in order.
template <class Enc> constexpr bool flash_param_cache() {
  return Enc::kHasScoreMod && Enc::kNumParams > 0 && Enc::kNumParams <= 32 && !traits::DistanceBias<Enc>::value &&
         !traits::RowColBias<Enc>::value && value_rows<Enc>() == 0 && (traits::ScoreParams<Enc>::value != 0u);
}
// A score mod of the general form (neither a distance nor a row/column bias) whose gradient
// adds to per-token sums for each element (relative rows: Transformer-XL, DeBERTa; token sums:
// K-Cable), or value rows: the flash backward's sinks are warp collectives there (flash_backward_kernel).
template <class Enc> constexpr bool flash_warp_sinks() {
  return !flash_distance<Enc>() && !flash_rowcol<Enc>() &&
         ((Enc::kHasScoreMod && (traits::NumRel<Enc>::value > 0 || Enc::kNumTok > 0)) || value_rows<Enc>() > 0);
}
// Score mods over features (Enc::kFeatures, contract/enc_traits.h: every load reads at the query
// row, the key column or the slice, an index of the distance d saturating at some d_sat): the
// flash backward's steps whose every distance is >= d_sat (feat_sat_kernel) read each feature
// once per query (the next tile's, staged in shared memory by the step before), key or block
// (registers), call score_mod_features on them, and sum the features' gradients in registers and
// shuffles: per query over the warp's 16 keys, then over the warps in shared memory, and one call
// of row_features_grad per query and step (two L2 atomics per feature); per key and per block over
// all the block's steps, one call at its end. The steps nearer the diagonal keep the per-element
// path. The flash forward likewise takes its key tiles past d_sat on the features. Not with a
// parameter cache (its sums' barrier at the block's end).
template <class Enc> constexpr bool flash_feature_steps() {
  if constexpr (traits::Features<Enc>::value)
    return flash_warp_sinks<Enc>() && !flash_param_cache<Enc>();
  else
    return false;
}
template <class Enc> constexpr int feat_count(int side) {  // 0 row, 1 col, 2 slice
  if constexpr (flash_feature_steps<Enc>())
    return side == 0 ? Enc::kRowFeatures : side == 1 ? Enc::kColFeatures : Enc::kSliceFeatures;
  else
    return 0;
}
// Score mods over features (flash_feature_steps): d_sat is 1 + the last d at which some index
// that reads the distance differs from its value at T - 1 (Enc::features_same; 0 when none does),
// per slice in p.dist_sat.
template <class Enc, class In> __global__ void feat_sat_kernel(const Params<Enc, In> p) {
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= p.B * p.H * p.T) return;
  const int64_t bh = e / p.T, d = e % p.T;
  if constexpr (flash_feature_steps<Enc>()) {
    const DevCtx<Enc> ctx = make_ctx(p, bh, false);
    if (!Enc::template features_same<float>(ctx, d, p.T - 1)) atomicMax(p.dist_sat + bh, static_cast<int>(d + 1));
  }
}

constexpr size_t kParamCacheValue = sizeof(float), kParamCacheGrad = 2 * sizeof(unsigned long long);
// At most this many bytes of a block's shared memory (the backward's largest FIRE case, H 64: 43 KiB).
constexpr size_t kParamCacheMax = 48 * 1024;
template <class Enc> APE_HD inline int64_t param_cache_elems(uint32_t mask, int64_t H, int64_t D) {
  int64_t n_el = 0;
  for (int n = 0; n < array_len(Enc::kNumParams); ++n)
    if (mask >> n & 1u) n_el += Enc::param_numel(n, H, D);
  return n_el;
}
APE_HD constexpr size_t param_cache_bytes(int64_t n_el, bool grads) {
  return (static_cast<size_t>(n_el) * (kParamCacheValue + (grads ? kParamCacheGrad : 0)) + 15) / 16 * 16;
}
// The parameters to stage, in order, each that fits in `budget` bytes with those before it.
template <class Enc> inline uint32_t param_cache_mask(int64_t H, int64_t D, size_t budget, bool grads) {
  uint32_t mask = 0;
  if constexpr (flash_param_cache<Enc>()) {
    const size_t cap = budget < kParamCacheMax ? budget : kParamCacheMax;
    int64_t n_el = 0;
    for (int n = 0; n < Enc::kNumParams; ++n) {
      const int64_t numel = Enc::param_numel(n, H, D);
      if ((traits::ScoreParams<Enc>::value >> n & 1u) && numel > 0 && param_cache_bytes(n_el + numel, grads) <= cap)
        mask |= 1u << n, n_el += numel;
    }
  }
  return mask;
}
// Stages the cached parameters at `base` and points the context's parameters (and, with `grads`,
// its parameter sinks) there; a barrier must follow before the functors run. flush() adds the
// block's sums to the global ones after a barrier that follows the last sink. Threads
// 0 .. threads - 1 copy and flush (every thread of the block, or a warp-specialised kernel's
// consumers: the wgmma backward's producer warpgroup does neither).
template <class Enc> struct ParamCache {
  template <class In>
  __device__ static void stage(const Params<Enc, In> &p, unsigned char *base, DevCtx<Enc> &ctx, bool grads,
                               int threads) {
    copy(p, base, grads, threads);
    point(p, base, ctx, grads);
  }
  // The two halves of stage(), for a kernel whose threads make their contexts after the barrier.
  template <class In>
  __device__ static void copy(const Params<Enc, In> &p, unsigned char *base, bool grads, int threads) {
    each(p, base, grads, [&](int n, int64_t numel, float *v, unsigned long long *g) {
      for (int64_t x = threadIdx.x; x < numel; x += threads) {
        v[x] = p.params[n][x];
        if (grads) g[2 * x] = g[2 * x + 1] = 0;
      }
    });
  }
  template <class In>
  __device__ static void point(const Params<Enc, In> &p, unsigned char *base, DevCtx<Enc> &ctx, bool grads) {
    each(p, base, grads, [&](int n, int64_t, float *v, unsigned long long *g) {
      ctx.params.p[n] = v;
      if (grads && ctx.dparams.p[n]) ctx.dparams.p[n] = g;
    });
  }
  template <class In> __device__ static void flush(const Params<Enc, In> &p, unsigned char *base, int threads) {
    uint32_t st = 0;
    each(p, base, true, [&](int n, int64_t numel, float *, unsigned long long *g) {
      for (int64_t x = threadIdx.x; x < numel; x += threads) {
        const long long hi = static_cast<long long>(g[2 * x]), lo = static_cast<long long>(g[2 * x + 1]);
        if (hi != 0 || lo != 0) st |= fixed_atomic_add(p.dparam_fx[n] + 2 * x, hi, lo);
      }
    });
    if (st) atomicOr(p.status, st);
  }
  // f(n, numel, values, gradient words) for each cached parameter, in order.
  template <class In, class F>
  __device__ static void each(const Params<Enc, In> &p, unsigned char *base, bool grads, F &&f) {
    const uint32_t mask = p.param_cache;
    if (!mask) return;
    const int64_t n_el = param_cache_elems<Enc>(mask, p.H, p.D);
    unsigned long long *g = reinterpret_cast<unsigned long long *>(base);
    float *v = reinterpret_cast<float *>(base + (grads ? kParamCacheGrad * n_el : 0));
    int64_t off = 0;
    for (int n = 0; n < Enc::kNumParams; ++n) {
      if (!(mask >> n & 1u)) continue;
      const int64_t numel = Enc::param_numel(n, p.H, p.D);
      f(n, numel, v + off, g + 2 * off);
      off += numel;
    }
  }
};

// Dynamic shared memory of a flash kernel (FlashFwd or FlashBwd layout F) for Enc.
template <class Enc, class F> constexpr size_t flash_smem_bytes() {
  return flash_distance<Enc>() ? F::bytes_dist : flash_rowcol<Enc>() ? F::bytes_rowcol : F::bytes;
}

// Value rows (Enc::kHasValueRows: Shaw's value term, o_i += sum_j P_ij table[r(i, j), h, :]) in the
// flash forward: each query row keeps its unnormalised probability mass per table row in shared
// memory (BQ x kValueRows floats after the tiles), rescaled with the running max like O; the quad
// of lanes that holds a row adds its P to the row's masses one lane after the other (a fixed
// order: the same sums run to run), and at the end o_i gains sum_r mass_i[r] table[r, h, :] / l_i.
// Where the masses do not fit sm_86/89's 99 KiB beside the tiles (D = 128: 96 KiB of tiles) it
// runs where the device gives a block more (sm_80, 90: flash_forward_everywhere false, the launch
// asks), the general forward elsewhere.
template <class Enc, class In, int D> constexpr size_t flash_mass_bytes() {
  return sizeof(float) * FlashFwd<In, D>::BQ * value_rows<Enc>();
}
// A score mod over features (flash_feature_steps): the key tiles' column features, by tile parity.
template <class Enc, class In, int D> constexpr size_t flash_fwd_feature_bytes() {
  return sizeof(float) * 2 * FlashFwd<In, D>::BK * feat_count<Enc>(1);
}
template <class Enc, class In, int D> constexpr bool flash_forward_runs() {
  if constexpr (std::is_same_v<In, float>) return false;
  else return value_rows<Enc>() == 0 || FlashFwd<In, D>::bytes + flash_mass_bytes<Enc, In, D>() + flash_fwd_feature_bytes<Enc, In, D>() <= kSmemLimitWide;
}
template <class Enc, class In, int D> constexpr bool flash_forward_everywhere() {
  if constexpr (std::is_same_v<In, float>) return false;
  else return value_rows<Enc>() == 0 || FlashFwd<In, D>::bytes + flash_mass_bytes<Enc, In, D>() + flash_fwd_feature_bytes<Enc, In, D>() <= kSmemLimit;
}
// Dynamic shared memory of the flash forward for Enc, the parameter cache aside.
template <class Enc, class In, int D> constexpr size_t flash_fwd_bytes() {
  return flash_smem_bytes<Enc, FlashFwd<In, D>>() + flash_mass_bytes<Enc, In, D>() + flash_fwd_feature_bytes<Enc, In, D>();
}

// Logits and the online softmax of one key tile (keys j0 ..) for the thread's rows of a flash forward:
// scale, score mod, causal mask (kMasked), then each of the thread's rows (mt, h) is reduced over
// its quad of lanes and exponentiated in base 2 (kf: see the callers), its running max m and
// partial sum l updated and the factor alpha of its O accumulators given back
// (flash_softmax_alpha; flash_softmax applies it); S becomes P. Element (row rr = r0 + 16
// mt + g + 8 h, column cc = 8 nt + 2 t + e) of S (the mma.m16n8k16 / wgmma accumulator layout) is
// query i = i0 + rr, key j = j0 + cc: visible iff cc - rr <= dlt (j <= i) and rr < rows (i < T),
// in 32-bit tile coordinates. Masked elements never reach the score mod: their indices may lie
// outside the token arrays.
// `mod(mt, h, cc, i, j, x)` is the score mod of element (row 16 mt + 8 h + .., column cc), query i,
// key j (the overloads with a context call Enc::score_mod).
template <class Enc, bool kMasked, bool kRaw, int kMT, int kNT, class Mod>
__device__ __forceinline__ void flash_softmax_alpha_mod(float (&s)[kMT][kNT][4], float (&alpha_out)[kMT][2],
                                                  float (&m)[kMT][2], float (&l)[kMT][2], const Mod &mod,
                                                  float scale, float kf, int64_t i0, int64_t j0, int r0,
                                                  int g, int t, int64_t T) {
  constexpr int BK = 8 * kNT;
  const int dlt = static_cast<int>(i0 - j0 < BK ? i0 - j0 : BK);
  const int rows = static_cast<int>(T - i0 < 65536 ? T - i0 : 65536);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rr = r0 + 16 * mt + g + 8 * h;
      float mx = m[mt][h];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int cc = 8 * nt + 2 * t + e;
          const bool visible = !kMasked || (cc - rr <= dlt && rr < rows);
          float x = s[mt][nt][2 * h + e];  // kRaw: the raw score (kf scales it)
          if constexpr (!kRaw) {
            x *= scale;
            if (visible) x = mod(mt, h, cc, i0 + rr, j0 + cc, x);
          }
          if constexpr (kMasked) x = visible ? x : -kInf;
          s[mt][nt][2 * h + e] = x;
          mx = fmaxf(mx, x);
        }
      mx = flash::quad_max(mx);
      const float ref = mx == -kInf ? 0.f : mx * kf;  // no finite logit yet: the row stays 0
      const float alpha = ptx::ex2(fmaf(m[mt][h], kf, -ref));
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pe = ptx::ex2(fmaf(s[mt][nt][2 * h + e], kf, -ref));
          s[mt][nt][2 * h + e] = pe;
          sum += pe;
        }
      l[mt][h] = l[mt][h] * alpha + sum;  // this lane's part of the row sum
      m[mt][h] = mx;
      alpha_out[mt][h] = alpha;  // the factor of the row's O accumulators
    }
}
// The score mod of flash_softmax_alpha_mod's `mod` from the encoding's functor alone.
template <class Enc> __device__ __forceinline__ auto plain_mod(const DevCtx<Enc> &ctx) {
  return [&ctx](int, int, int, int64_t i, int64_t j, float x) { return Enc::score_mod(ctx, i, j, x); };
}
template <class Enc, bool kMasked, bool kRaw, int kMT, int kNT>
__device__ __forceinline__ void flash_softmax_alpha(float (&s)[kMT][kNT][4], float (&alpha_out)[kMT][2],
                                              float (&m)[kMT][2], float (&l)[kMT][2],
                                              const DevCtx<Enc> &ctx, float scale, float kf,
                                              int64_t i0, int64_t j0, int r0, int g, int t,
                                              int64_t T) {
  flash_softmax_alpha_mod<Enc, kMasked, kRaw>(s, alpha_out, m, l, plain_mod(ctx), scale, kf, i0, j0, r0, g, t, T);
}
template <class Enc, bool kMasked, bool kRaw, int kMT, int kNT, int kDT, class Mod>
__device__ __forceinline__ void flash_softmax_mod(float (&s)[kMT][kNT][4], float (&o)[kMT][kDT][4],
                                                  float (&m)[kMT][2], float (&l)[kMT][2], const Mod &mod,
                                                  float scale, float kf, int64_t i0, int64_t j0, int r0,
                                                  int g, int t, int64_t T, float (&alpha)[kMT][2]) {
  flash_softmax_alpha_mod<Enc, kMasked, kRaw>(s, alpha, m, l, mod, scale, kf, i0, j0, r0, g, t, T);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
      for (int x = 0; x < 4; ++x) o[mt][dt][x] *= alpha[mt][x / 2];
}
template <class Enc, bool kMasked, bool kRaw, int kMT, int kNT, int kDT>
__device__ __forceinline__ void flash_softmax(float (&s)[kMT][kNT][4], float (&o)[kMT][kDT][4],
                                              float (&m)[kMT][2], float (&l)[kMT][2],
                                              const DevCtx<Enc> &ctx, float scale, float kf,
                                              int64_t i0, int64_t j0, int r0, int g, int t,
                                              int64_t T, float (&alpha)[kMT][2]) {
  flash_softmax_mod<Enc, kMasked, kRaw>(s, o, m, l, plain_mod(ctx), scale, kf, i0, j0, r0, g, t, T, alpha);
}
template <class Enc, bool kMasked, bool kRaw, int kMT, int kNT, int kDT>
__device__ __forceinline__ void flash_softmax(float (&s)[kMT][kNT][4], float (&o)[kMT][kDT][4],
                                              float (&m)[kMT][2], float (&l)[kMT][2],
                                              const DevCtx<Enc> &ctx, float scale, float kf,
                                              int64_t i0, int64_t j0, int r0, int g, int t,
                                              int64_t T) {
  float alpha[kMT][2];
  flash_softmax<Enc, kMasked, kRaw>(s, o, m, l, ctx, scale, kf, i0, j0, r0, g, t, T, alpha);
}

// kSplit: the keys split over blockIdx.z (Params::num_splits > 1), or one share (1): the rows from
// part_row0 only, its warps without one computing nothing (an instantiation of its own, so that
// the unsplit kernel's loop keeps its constant start).
template <class Enc, class In, int D, bool kSplit = false>
__global__ void __launch_bounds__(FlashFwd<In, D>::kThreads) flash_forward_kernel(const Params<Enc, In> p) {
  using C = FlashFwd<In, D>;
  constexpr int BQ = C::BQ, BK = C::BK, kMT = C::kMT, kNT = C::kNT, kDT = C::kDT;
  constexpr float kLog2e = 1.44269504088896341f;
  APE_DYNAMIC_SMEM(smem);
  In *sQ = reinterpret_cast<In *>(smem + C::q), *sK = reinterpret_cast<In *>(smem + C::k);
  In *sV = reinterpret_cast<In *>(smem + C::v);
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int g = lane / 4, t = lane % 4;
  const int64_t bh = blockIdx.x, T = p.T;
  // The longest rows (last query tiles) start first; tiles before p.tile0 are not computed.
  const int64_t i0 = (p.tile0 + int64_t(gridDim.y - 1 - blockIdx.y)) * BQ;
  // q', k', v: Params::ld_q, ld_k, ld_v rows a slice (q' from row qm_row0); o: out_row
  // (k' and v of the slice's key head: bh / k_group, bh / v_group)
  const In *const qm = p.qm + bh * p.ld_q * D, *const km = p.km + bh / p.k_group * p.ld_k * D,
                  *const vs = p.v + bh / p.v_group * p.ld_v * D;
  const int r0 = warp * 16 * kMT;  // this warp's first row in the tile
  // Keys split (or one share, launch.cuh): a warp none of whose rows the block writes (all before
  // part_row0 or past T: a one-token decode step's tile holds one row of 128) takes its part in
  // the loads and barriers and reads and computes nothing of its rows (their q' and relative rows
  // need not exist): the step's tensor-core work is its warp's, not the tile's.
  [[maybe_unused]] const bool idle = kSplit && (i0 + r0 + 16 * kMT <= p.part_row0 || i0 + r0 >= T);
  DevCtx<Enc> ctx = make_ctx(p, bh, false);
  if constexpr (flash_param_cache<Enc>())  // read after the first step's barrier
    ParamCache<Enc>::stage(p, smem + flash_fwd_bytes<Enc, In, D>(), ctx, false, C::kThreads);
  // Value rows: the masses of this warp's rows (kMass per row) at sMass (flash_forward_runs).
  constexpr int kMass = static_cast<int>(value_rows<Enc>());
  [[maybe_unused]] float *sMass = reinterpret_cast<float *>(smem + flash_smem_bytes<Enc, C>());
  if constexpr (kMass > 0)
    for (int x = static_cast<int>(threadIdx.x); x < BQ * kMass; x += C::kThreads) sMass[x] = 0.f;
  // A score mod over features (flash_feature_steps): key tiles [0, n_feat), whose every distance is
  // >= d_sat (feat_sat_kernel), run it on the features: the thread's rows' and the slice's in
  // registers, the tile's keys' in shared memory (sCF, by tile parity, filled a step ahead).
  constexpr bool kFeat = flash_feature_steps<Enc>();
  constexpr int kRF = feat_count<Enc>(0), kCF = feat_count<Enc>(1), kSF = feat_count<Enc>(2);
  [[maybe_unused]] float rfv[kMT][2][kRF > 0 ? kRF : 1] = {}, sfv[kSF > 0 ? kSF : 1] = {};
  [[maybe_unused]] float *sCF = reinterpret_cast<float *>(smem + flash_smem_bytes<Enc, C>() + flash_mass_bytes<Enc, In, D>());
  int n_feat = 0;
  if constexpr (kFeat) {
    for (int mt = 0; mt < kMT; ++mt)
      for (int h = 0; h < 2; ++h) {
        const int64_t i = i0 + r0 + 16 * mt + g + 8 * h;
        if constexpr (kRF > 0)
          if (!idle) Enc::row_features(ctx, i < T ? i : T - 1, T - 1, rfv[mt][h]);
      }
    if constexpr (kSF > 0) Enc::slice_features(ctx, 0, T - 1, sfv);
    if (p.dist_sat) {  // tiles with j0 + BK - 1 <= i0 - d_sat (null: feature steps turned off)
      const int64_t last = i0 - (BK - 1) - p.dist_sat[bh];
      n_feat = last < 0 ? 0 : static_cast<int>(last / BK + 1);
    }
  }
  [[maybe_unused]] int64_t vsat = 0;  // value rows: the table row of every saturated distance
  if constexpr (kFeat && kMass > 0) vsat = Enc::value_row(ctx, T - 1, 0);
  [[maybe_unused]] auto fill_cols = [&](int kt) {  // key tile kt's column features, by thread x < BK
    if constexpr (kFeat && kCF > 0) {
      static_assert(BK <= C::kThreads, "one key per thread");
      const int x = static_cast<int>(threadIdx.x);
      if (x < BK && kt < n_feat) {
        float fv[kCF > 0 ? kCF : 1];
        Enc::col_features(ctx, int64_t(kt) * BK + x, T - 1, fv);
        for (int a = 0; a < kCF; ++a) sCF[((kt & 1) * BK + x) * kCF + a] = fv[a];
      }
    }
  };

  // Distance bias: B(i - j) / scale of key tile kt at x = i - j - (i0 - j0 - (BK - 1)) + 1 =
  // rr - cc + BK in window kt & 1, copied from the slice's table a step ahead like K and V (16-byte
  // cp.async: the window starts at distance i0 - j0 - BK, a multiple of BK); it is the initial
  // value of the S accumulators, so that S = Q'K'^T + B / scale holds raw scores and kf scales
  // them like a plain softmax. Distances outside [0, T) belong to masked elements only (0).
  // Row/column bias (flash_rowcol): likewise R(i) / scale + C(j) / scale, R of the thread's rows
  // in registers, C of key tile kt in window kt & 1 (cp.async from the slice's table).
  constexpr bool kDist = flash_distance<Enc>(), kRC = flash_rowcol<Enc>();
  constexpr bool kRaw = !Enc::kHasScoreMod || kDist || kRC;  // S in raw-score units
  float *sB = reinterpret_cast<float *>(smem + C::dist);
  [[maybe_unused]] float *sCw = reinterpret_cast<float *>(smem + C::rowcol);
  [[maybe_unused]] const float *dist_bh = p.dist + bh * p.dist_ld + kDistPad;
  [[maybe_unused]] const float *rc_bh = p.rc + 2 * bh * p.rc_ld;
  auto fill_bias = [&](int kt) {
    if constexpr (kDist) {
      static_assert(C::kDistLen % 4 == 0 && C::kDistLen / 4 <= C::kThreads, "one chunk per thread");
      const int x = static_cast<int>(threadIdx.x);
      if (x < C::kDistLen / 4)
        ptx::cp_async_16(sB + (kt & 1) * C::kDistLen + 4 * x, dist_bh + (i0 - int64_t(kt) * BK - BK) + 4 * x);
    } else if constexpr (kRC) {
      const int x = static_cast<int>(threadIdx.x);
      if (x < BK / 4) ptx::cp_async_16(sCw + (kt & 1) * BK + 4 * x, rc_bh + p.rc_ld + int64_t(kt) * BK + 4 * x);
    }
  };
  [[maybe_unused]] float rb[kMT][2];  // R / scale of the thread's rows (rc_ld covers the tile)
  if constexpr (kRC)
    for (int mt = 0; mt < kMT; ++mt)
      for (int h = 0; h < 2; ++h) rb[mt][h] = rc_bh[i0 + r0 + 16 * mt + g + 8 * h];
  const int64_t i_end = i0 + BQ < T ? i0 + BQ : T;
  // Keys split (Params::num_splits; 1: every key tile): this block's key tiles [kt_lo, kt_hi), an even share of
  // the tile's; its rows' o / l and lse of them from part_row0 on (the combine adds the shares), so
  // the rows before part_row0 are not read (zeros).
  // (Value rows' masses are not split: launch.cuh runs a kernel with value rows as one share only.)
  int kt_lo = 0, kt_hi = static_cast<int>((i_end + BK - 1) / BK);  // causal: keys < i_end
  int q_skip = 0;
  if constexpr (kSplit) {
    const int per = (kt_hi + p.num_splits - 1) / p.num_splits, z = static_cast<int>(blockIdx.z);
    kt_lo = z * per < kt_hi ? z * per : kt_hi;
    kt_hi = kt_lo + per < kt_hi ? kt_lo + per : kt_hi;
    q_skip = p.part_row0 > i0 ? static_cast<int>(p.part_row0 - i0) : 0;
  }
  flash::load_tile_async<BQ, D, C::kThreads>(sQ, qm, i0 - p.qm_row0, T - p.qm_row0, q_skip);
  if (!kSplit || kt_lo < kt_hi) {  // (unsplit: at least one key tile)
    flash::load_tile_async<BK, D, C::kThreads>(sK + (kt_lo & 1) * BK * D, km, int64_t(kt_lo) * BK, T);
    flash::load_tile_async<BK, D, C::kThreads>(sV + (kt_lo & 1) * BK * D, vs, int64_t(kt_lo) * BK, T);
    fill_bias(kt_lo);  // and the column window
  }
  ptx::cp_async_commit();

  // ldmatrix lane bases (cuda/flash_tile.cuh); the other buffer is BK D elements on.
  const ptx::SmemAddr lQ = flash::lane_base<D, flash::kRowsByQuad>(sQ);
  const ptx::SmemAddr lK = flash::lane_base<D, flash::kColsByQuad>(sK);
  const ptx::SmemAddr lV = flash::lane_base<D, flash::kRowsByQuad>(sV);
  float o[kMT][kDT][4] = {};
  float m[kMT][2], l[kMT][2];
  for (int mt = 0; mt < kMT; ++mt)
    for (int h = 0; h < 2; ++h) m[mt][h] = -kInf, l[mt][h] = 0.f;

  // Tiles [0, n_plain) lie below the diagonal for every row of the block (and the block's rows
  // exist): they run without a mask; the rest test each element. Two copies of the step, so the
  // steady state carries no masking code.
  const int n_plain = i0 + BQ <= T ? static_cast<int>((i0 + 1) / BK) : 0;
  if (n_feat > n_plain) n_feat = n_plain;
  fill_cols(kt_lo);  // (read after the first step's barrier)
  // The softmax in base 2: p = 2^(x kf - m kf). With a score mod, x and m are logits and kf =
  // log2 e; without one (or with a distance or row/column bias, in S) they are raw scores
  // q'.k' (+ the bias / scale) and kf = scale log2 e (one FFMA per element; the host launches the
  // flash kernels with scale > 0, positive_scale, so the max of the raw scores is the max of the
  // logits).
  const float kf = kRaw ? p.scale * kLog2e : kLog2e;
  const float mscale = kRaw ? p.scale : 1.f;  // m in logit units
  auto step = [&](int kt, auto masked, auto feat) {
    constexpr bool kMasked = decltype(masked)::value, kFeatStep = decltype(feat)::value;
    ptx::cp_async_wait<0>();
    __syncthreads();  // tile kt landed; every warp is done with buffer (kt + 1) % 2
    fill_cols(kt + 1);
    if (kt + 1 < kt_hi) {
      flash::load_tile_async<BK, D, C::kThreads>(sK + ((kt + 1) & 1) * BK * D, km,
                                                 int64_t(kt + 1) * BK, T);
      flash::load_tile_async<BK, D, C::kThreads>(sV + ((kt + 1) & 1) * BK * D, vs,
                                                 int64_t(kt + 1) * BK, T);
      fill_bias(kt + 1);
    }
    ptx::cp_async_commit();
    if constexpr (kSplit)
      if (idle) return;  // (warp-uniform)
    const ptx::SmemAddr cK = lK + (kt & 1) * 2 * BK * D, cV = lV + (kt & 1) * 2 * BK * D;
    const int64_t j0 = int64_t(kt) * BK;

    // B at rr - cc + BK: this lane's base, plus 16 mt + 8 h - 8 nt - e (immediates).
    [[maybe_unused]] const float *tb = sB + (kt & 1) * C::kDistLen + (r0 + g - 2 * t + BK);
    // C at cc: this lane's base plus 8 nt + e.
    [[maybe_unused]] const float *cw = sCw + (kt & 1) * BK + 2 * t;
    // S = Q' K'^T (+ B / scale, or + (R + C) / scale)
    float s[kMT][kNT][4] = {};
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          if constexpr (kDist) s[mt][nt][x] = tb[16 * mt + 8 * (x / 2) - 8 * nt - x % 2];
          if constexpr (kRC) s[mt][nt][x] = rb[mt][x / 2] + cw[8 * nt + x % 2];
        }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) flash::ldsm_a(a[mt], flash::frag_at<D>(lQ, r0 + 16 * mt, 16 * kk));
#pragma unroll
      for (int nt = 0; nt < kNT; nt += 2) {
        uint32_t b[4];
        flash::ldsm_b_nk(b, flash::frag_at<D>(cK, 8 * nt, 16 * kk));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          flash::mma<In>(s[mt][nt], a[mt], b);
          flash::mma<In>(s[mt][nt + 1], a[mt], b + 2);
        }
      }
    }

    float alpha[kMT][2];
    if constexpr (kFeatStep) {  // the score mod on the features
      using FE = std::conditional_t<kFeatStep, Enc, Enc>;  // (a name of the step's template)
      const float *cfs = sCF + (kt & 1) * BK * kCF;
      const auto fmod = [&](int mt, int h, int cc, int64_t i, int64_t j, float x) {
        return FE::score_mod_features(ctx, static_cast<const float *>(rfv[mt][h]), cfs + cc * kCF,
                                      static_cast<const float *>(sfv), i, j, x);
      };
      flash_softmax_mod<Enc, kMasked, kRaw>(s, o, m, l, fmod, p.scale, kf, i0, j0, r0, g, t, T, alpha);
    } else {
      flash_softmax<Enc, kMasked, kRaw>(s, o, m, l, ctx, p.scale, kf, i0, j0, r0, g, t, T, alpha);
    }
    if constexpr (kMass > 0) {
      // The rows' masses: rescaled (lane t of the quad takes the rows' entries t, t + 4, ...),
      // then each lane of the quad in turn adds its P (masked and underflowed elements: 0).
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float *row = sMass + (r0 + 16 * mt + g + 8 * h) * kMass;
          for (int k = t; k < kMass; k += 4) row[k] *= alpha[mt][h];
        }
      __syncwarp();
      if constexpr (kFeatStep) {
        // A feature tile: every element reaches the saturated table row (vsat): one sum per row,
        // over the lane's elements and then its quad (shuffles, a fixed order), added by lane 0.
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) sum += s[mt][nt][2 * h] + s[mt][nt][2 * h + 1];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            if (t == 0) sMass[(r0 + 16 * mt + g + 8 * h) * kMass + vsat] += sum;
          }
        __syncwarp();
      } else {
        for (int turn = 0; turn < 4; ++turn) {
          if (t == turn)
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const int rr = r0 + 16 * mt + g + 8 * h;
                float *row = sMass + rr * kMass;
#pragma unroll
                for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                  for (int e = 0; e < 2; ++e) {
                    const float pe = s[mt][nt][2 * h + e];
                    if (pe != 0.f) row[Enc::value_row(ctx, i0 + rr, j0 + 8 * nt + 2 * t + e)] += pe;
                  }
              }
          __syncwarp();
        }
      }
    }

    // O += P V, P from registers.
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) flash::acc_to_a<In>(a[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
      for (int dt = 0; dt < kDT; dt += 2) {
        uint32_t b[4];
        flash::ldsm_b_kn(b, flash::frag_at<D>(cV, 16 * kk, 8 * dt));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          flash::mma<In>(o[mt][dt], a[mt], b);
          flash::mma<In>(o[mt][dt + 1], a[mt], b + 2);
        }
      }
    }
  };
  int kt = kt_lo;
  int feat_end = n_feat, plain_end = n_plain;  // (unsplit: n_feat <= n_plain <= kt_hi)
  if constexpr (kSplit) {
    feat_end = n_feat < kt_hi ? n_feat : kt_hi;
    plain_end = n_plain < kt_hi ? n_plain : kt_hi;
  }
  if constexpr (kFeat)
    for (; kt < feat_end; ++kt) step(kt, std::false_type{}, std::true_type{});
  for (; kt < plain_end; ++kt) step(kt, std::false_type{}, std::false_type{});
  for (; kt < kt_hi; ++kt) step(kt, std::true_type{}, std::false_type{});
  ptx::cp_async_wait<0>();

  // Value rows: this head's table rows, table[r, h, :] for every r, into the K and V buffers
  // (free now) as floats, read by every row of the block below.
  [[maybe_unused]] float *sTab = reinterpret_cast<float *>(smem + C::k);
  if constexpr (kMass > 0) {
    static_assert(sizeof(float) * kMass * D <= C::bytes - C::k, "the value table in the K and V buffers");
    __syncthreads();  // every warp is done with K and V
    const float *table = p.params[Enc::kValueTable] + (bh % p.H) * D;
    for (int x = static_cast<int>(threadIdx.x); x < kMass * D; x += C::kThreads)
      sTab[x] = table[int64_t(x / D) * p.H * D + x % D];
    __syncthreads();
  }
  // O += sum_r mass[r] table[r, h, :] for the thread's row rr of m16 tile mt (the masses' order: r).
  [[maybe_unused]] auto add_value_rows = [&](int mt, int h, int rr) {
    if constexpr (kMass > 0) {
      const float *row = sMass + rr * kMass;
      for (int r = 0; r < kMass; ++r) {
        const float w = row[r];
        if (w == 0.f) continue;
        const float *tr = sTab + r * D + 2 * t;
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt) {
          o[mt][dt][2 * h] = fmaf(w, tr[8 * dt], o[mt][dt][2 * h]);
          o[mt][dt][2 * h + 1] = fmaf(w, tr[8 * dt + 1], o[mt][dt][2 * h + 1]);
        }
      }
    }
  };

  if constexpr (kSplit) {  // this share's o / l and lse (natural log; -inf where no key is visible)
    // One share (num_splits 1: a call whose tiles' rows are mostly idle, launch.cuh): the rows' o
    // and lse themselves, the unsplit epilogue's values (no combine).
    const bool whole = p.num_splits == 1;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t i = i0 + r0 + 16 * mt + g + 8 * h;
        const float lt = flash::quad_sum(l[mt][h]);
        const float inv = lt > 0.f ? 1.f / lt : 0.f;
        if (i < p.part_row0 || i >= T) continue;  // (part_row0 >= o_row0: launch.cuh)
        if (whole) {
          add_value_rows(mt, h, r0 + 16 * mt + g + 8 * h);
          In *po = p.o + out_row(p, bh, i) * D + 2 * t;
#pragma unroll
          for (int dt = 0; dt < kDT; ++dt)
            *reinterpret_cast<uint32_t *>(po + 8 * dt) = flash::pack2<In>(o[mt][dt][2 * h] * inv, o[mt][dt][2 * h + 1] * inv);
          if (t == 0) p.lse[out_row(p, bh, i)] = m[mt][h] * mscale + logf(lt);
          continue;
        }
        const int64_t row = (int64_t(blockIdx.z) * p.B * p.H + bh) * p.part_rows + (i - p.part_row0);
        float *po = p.part_o + row * D + 2 * t;
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt)
          *reinterpret_cast<ptx::F2 *>(po + 8 * dt) = ptx::F2{o[mt][dt][2 * h] * inv, o[mt][dt][2 * h + 1] * inv};
        // (lt = 0: no visible key; a NaN lt stays NaN, as unsplit, and makes the row's sum NaN)
        if (t == 0) p.part_lse[row] = lt == 0.f ? -kInf : m[mt][h] * mscale + logf(lt);
      }
    return;
  }

  // o = O / l, lse = m + log l (natural log); a row without a finite logit: o = 0, lse = -inf.
  // o leaves through the warp's own rows of the Q tile (only this warp reads them, and its last
  // read is done: __syncwarp): the fragments' 4-byte pairs go there in the tile's swizzled layout
  // (8 rows at one logical column fall in 8 bank groups), then whole rows leave in 16-byte chunks,
  // 512 contiguous bytes per warp instruction at D = 128, where a fragment's 2-byte stores each
  // touched 8 rows.
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rr = r0 + 16 * mt + g + 8 * h;  // row in the tile
      const int64_t i = i0 + rr;
      const float lt = flash::quad_sum(l[mt][h]);
      const float inv = lt > 0.f ? 1.f / lt : 0.f;
      add_value_rows(mt, h, rr);
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt)
        *reinterpret_cast<uint32_t *>(sQ + flash::Swizzle<D>::offset(rr, 8 * dt + 2 * t)) =
            flash::pack2<In>(o[mt][dt][2 * h] * inv, o[mt][dt][2 * h + 1] * inv);
      if (t == 0 && out_stored(p, i)) p.lse[out_row(p, bh, i)] = m[mt][h] * mscale + logf(lt);
    }
  __syncwarp();
  constexpr int kRows = 16 * kMT, kChunks = D / 8;  // the warp's rows; 16-byte chunks per row
  static_assert(kRows * kChunks % 32 == 0, "whole chunks per lane");
  const int64_t rows = T - (i0 + r0) < kRows ? T - (i0 + r0) : kRows;
#pragma unroll
  for (int u = 0; u < kRows * kChunks / 32; ++u) {
    const int xc = lane + 32 * u, r = xc / kChunks, c = 8 * (xc % kChunks);
    if (r < rows && i0 + r0 + r >= p.o_row0)
      *reinterpret_cast<ptx::F4 *>(p.o + out_row(p, bh, i0 + r0 + r) * D + c) =
          *reinterpret_cast<const ptx::F4 *>(sQ + flash::Swizzle<D>::offset(r0 + r, c));
  }
}

// The keys' shares of a split forward (Params::num_splits) added: for rows [row0, row0 + rows) of
// each of S slices, lse = log sum_z exp(lse_z) and o = sum_z exp(lse_z - lse) o_z, the shares in
// order z = 0, 1, ... (the same sums run to run); a row without a visible key: o = 0, lse = -inf,
// as unsplit; a share's NaN makes the row's o and lse NaN, as unsplit. One thread per 4 columns of
// a row (D / 4 a row: coalesced 16-byte reads).
template <class In>
__global__ void split_combine_kernel(const float *part_o, const float *part_lse, int splits, int64_t S,
                                     int64_t rows, int64_t row0, int64_t o_row0, int64_t o_ld, int64_t D, In *o, float *lse) {
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, chunks = D / 4;
  if (e >= S * rows * chunks) return;
  const int64_t c = e % chunks, r = e / chunks % rows, s = e / chunks / rows;
  float mx = -kInf;
  for (int z = 0; z < splits; ++z) {
    const float x = part_lse[(z * S + s) * rows + r];
    mx = x > mx || x != x ? x : mx;  // a NaN stays (fmaxf would drop it)
  }
  float acc[4] = {0.f, 0.f, 0.f, 0.f}, sum = 0.f;
  if (mx != -kInf)
    for (int z = 0; z < splits; ++z) {
      const int64_t row = (z * S + s) * rows + r;
      const float w = expf(part_lse[row] - mx);
      if (w == 0.f) continue;  // (an empty share's o is 0; its lse -inf)
      const ptx::F4 x = *reinterpret_cast<const ptx::F4 *>(part_o + row * D + 4 * c);
      sum += w;
      acc[0] = fmaf(w, x.x, acc[0]), acc[1] = fmaf(w, x.y, acc[1]);
      acc[2] = fmaf(w, x.z, acc[2]), acc[3] = fmaf(w, x.w, acc[3]);
    }
  const float inv = mx == -kInf ? 0.f : 1.f / sum;  // (a finite mx: its share's weight 1, sum >= 1)
  const int64_t orow = s * o_ld + row0 + r - o_row0;  // (row0 >= o_row0: launch.cuh)
  In *out = o + orow * D + 4 * c;
  for (int x = 0; x < 4; ++x) out[x] = from_float<In>(acc[x] * inv);
  if (c == 0) lse[orow] = mx == -kInf ? -kInf : mx + logf(sum);
}

}  // namespace detail
APE_CUDA_ABI_END
}  // namespace ape::cuda
