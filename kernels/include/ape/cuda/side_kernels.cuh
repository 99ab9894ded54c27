// The side kernels of the CUDA attention (ape/cuda/attention.cuh): the token program, the q/k
// mods and their backward on 16-byte runs, Delta, relative rows and the value-rows term, and the
// tables of distance and row/column biases the flash kernels read, with their gradients.
#pragma once

#include "ape/cuda/common.cuh"

namespace ape::cuda {
APE_CUDA_ABI_BEGIN
namespace detail {

// ---- token program and mods ------------------------------------------------------------------------
// One block of kTokThreads per slice (grid B*H): the stages of the token program cooperatively.
template <class Enc, class In>
__global__ void __launch_bounds__(kTokThreads) token_forward_kernel(const Params<Enc, In> p) {
  const int64_t bh = blockIdx.x;
  const DevCtx<Enc> ctx = make_ctx(p, bh, false);
  const float *feat[Params<Enc, In>::NF];
  for (int n = 0; n < Enc::kNumFeatures; ++n) feat[n] = p.feat[n] + bh * p.feat_ld;
  Enc::token_forward(ctx, feat, p.tok + bh * Enc::kNumTok * p.tok_ld);
}

template <class Enc, class In>
__global__ void __launch_bounds__(kTokThreads) token_backward_kernel(const Params<Enc, In> p) {
  const int64_t bh = blockIdx.x;
  const DevCtx<Enc> ctx = make_ctx(p, bh, false);
  const float *feat[Params<Enc, In>::NF];
  float *dfeat[Params<Enc, In>::NF];
  for (int n = 0; n < Enc::kNumFeatures; ++n) {
    feat[n] = p.feat[n] + bh * p.T;
    dfeat[n] = p.dfeat[n] + bh * p.T;
  }
  const int64_t off = bh * Enc::kNumTok * p.T;
  Enc::token_backward(ctx, feat, p.tok + bh * Enc::kNumTok * p.tok_ld, p.dtok + off, dfeat);
}

// dst[e] = the fixed-point sum of element e; NaN when the call's status word holds an error (a
// term that was not finite, was clamped, or a sum that wrapped): the poisoned gradient is the
// error's signal on the device, with no host synchronisation (docs/cuda.md, "The status word").
template <class Unused = void>
__global__ void fixed_to_float_kernel(const unsigned long long *src, float *dst, int64_t n,
                                      const uint32_t *status) {
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e < n) dst[e] = (*status & kStatusErrors) ? __int_as_float(0x7fc00000) : from_fixed(src + 2 * e);
}

// ---- runs: kV consecutive elements of a row, in 16-byte loads and stores ---------------------------
template <class In> constexpr int run_len() { return 16 / static_cast<int>(sizeof(In)); }

// v = r[c0 .. c0 + kV) (c0 kV-aligned, so every 16-byte chunk is aligned).
template <class X, int kV> __device__ inline void load_run(const X *r, int64_t c0, X (&v)[kV]) {
  static_assert(kV * sizeof(X) % 16 == 0, "whole 16-byte chunks");
  constexpr int kPer = 16 / static_cast<int>(sizeof(X));
  #pragma unroll
  for (int k = 0; k < kV / kPer; ++k) {
    const ptx::F4 w = *reinterpret_cast<const ptx::F4 *>(r + c0 + k * kPer);
    memcpy(v + k * kPer, &w, 16);
  }
}
// One 16-byte store per chunk: written as a struct copy, nvcc splits it into four 4-byte stores.
template <class X, int kV> __device__ inline void store_run(X *r, const X (&v)[kV]) {
  static_assert(kV * sizeof(X) % 16 == 0, "whole 16-byte chunks");
  constexpr int kPer = 16 / static_cast<int>(sizeof(X));
  #pragma unroll
  for (int k = 0; k < kV / kPer; ++k) {
    ptx::F4 w;
    memcpy(&w, v + k * kPer, 16);
#ifdef APE_SIMT
    *reinterpret_cast<ptx::F4 *>(r + k * kPer) = w;
#else
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(r + k * kPer), "r"(__float_as_uint(w.x)),
                 "r"(__float_as_uint(w.y)), "r"(__float_as_uint(w.z)), "r"(__float_as_uint(w.w))
                 : "memory");
#endif
  }
}

// The run at p0 = partner(c0) when the partners of run c0 form a run of their own, in order (the
// half pairing with whole runs per half): then each of the two runs is the other's partner run,
// and the thread of the lower one does both. -1 otherwise.
template <int kV, int D> __device__ inline int64_t partner_run(int pairing, double fraction, int64_t c0) {
  const int64_t p0 = partner(pairing, fraction, D, c0);
  return p0 % kV == 0 && (p0 >= c0 + kV || p0 + kV <= c0) &&
                 partner(pairing, fraction, D, c0 + kV - 1) == p0 + kV - 1
             ? p0
             : -1;
}

// out[u] = r[partner(c0 + u)] for the run at c0 whose values are `own` (no partner run): from
// `own` where the partner falls inside the run (the interleaved pairing, unpaired columns), one
// by one otherwise.
template <class X, int kV, int D>
__device__ inline void gather_partners(int pairing, double fraction, const X *r, int64_t c0,
                                       const X (&own)[kV], X (&out)[kV]) {
  #pragma unroll
  for (int u = 0; u < kV; ++u) {
    const int64_t pc = partner(pairing, fraction, D, c0 + u);
    out[u] = pc >= c0 && pc < c0 + kV ? own[pc - c0] : r[pc];
  }
}

// A side's mod (kIsQ: q_mod, else k_mod) as its kernels walk it: runs of kV elements, the side's
// pairing, and the partner run of the run at c0 (partner_run), or kSkip where that run's thread
// does both.
template <class Enc, class In, bool kIsQ, int D> struct ModSide {
  static constexpr int kV = run_len<In>();
  static constexpr int kPairing = kIsQ ? Enc::kQPairing : Enc::kKPairing;
  static constexpr double kFraction = kIsQ ? Enc::kQFraction : Enc::kKFraction;
  static_assert(D % kV == 0, "whole runs per row");
  static constexpr int64_t kSkip = -2;
  __device__ static int64_t partner_of(int64_t c0) {
    const int64_t p0 = partner_run<kV, D>(kPairing, kFraction, c0);
    return p0 >= 0 && p0 < c0 ? kSkip : p0;
  }
};

// The rows a forward mod computes: [row0, T) of every slice, x with ld_x rows per slice and xm
// with ld_xm (T, or a longer buffer's: CudaAttnArgs::ld, km).
// Rows [row0, T) of each slice: x with ld_x rows a slice, xm with ld_xm from row xm_row0 (row t
// of a slice at t - xm_row0: q' in scratch from the first row a forward reads).
struct ModRows {
  int64_t row0, ld_x, ld_xm, xm_row0 = 0, x_row0 = 0;  // x from row x_row0 (CudaAttnArgs::q_row0)
  int64_t x_group = 1;  // slice bh of xm reads x's slice bh / x_group (grouped keys, Params::k_group)
  // Slices of xm (0: every (b, h) slice, B·H), and the query head slice whose context slice bh's
  // mod evaluates: bh·ctx_group. A k' one key head's group shares (prepare, shares_k_mod): B·H_kv
  // slices, each with its group's first query head's context (b·H + g·group = (b·H_kv + g)·group).
  int64_t slices = 0, ctx_group = 1;
};

// xm = mod(x) (kIsQ: q_mod, else k_mod), computed in fp32: a thread per run of kV elements, or
// per pair of partner runs (partner_run), in 16-byte loads and stores: each byte read and
// written once.
template <class Enc, class In, bool kIsQ, int D>
__global__ void mod_forward_kernel(const Params<Enc, In> p, const In *x, In *xm, const ModRows rows) {
  using S = ModSide<Enc, In, kIsQ, D>;
  constexpr int kV = S::kV;
  const int64_t n = p.T - rows.row0;  // rows of a slice
  const int64_t e = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * kV;
  if (e >= (rows.slices > 0 ? rows.slices : p.B * p.H) * n * D) return;
  const int64_t c0 = e % D, bh = e / D / n, t = rows.row0 + e / D % n;
  const int64_t p0 = S::partner_of(c0);
  if (p0 == S::kSkip) return;
  const DevCtx<Enc> ctx = make_ctx(p, bh * rows.ctx_group, false);
  auto mod = [&](int64_t c, In xv, In yv) {
    if constexpr (kIsQ) return from_float<In>(Enc::q_mod(ctx, t, c, to_float(xv), to_float(yv)));
    else return from_float<In>(Enc::k_mod(ctx, t, c, to_float(xv), to_float(yv)));
  };
  const In *xr = x + (bh / rows.x_group * rows.ld_x + t - rows.x_row0) * D;
  In *xo = xm + (bh * rows.ld_xm + t - rows.xm_row0) * D;
  In own[kV], part[kV], out[kV];
  load_run<In, kV>(xr, c0, own);
  if (p0 >= 0) {
    load_run<In, kV>(xr, p0, part);
    In outp[kV];
    #pragma unroll
    for (int u = 0; u < kV; ++u) out[u] = mod(c0 + u, own[u], part[u]), outp[u] = mod(p0 + u, part[u], own[u]);
    store_run<In, kV>(xo + p0, outp);
  } else {
    gather_partners<In, kV, D>(S::kPairing, S::kFraction, xr, c0, own, part);
    #pragma unroll
    for (int u = 0; u < kV; ++u) out[u] = mod(c0 + u, own[u], part[u]);
  }
  store_run<In, kV>(xo + c0, out);
}

// Grouped-query attention's backward (CudaAttnArgs::kv_heads): y, of S slices of `slice`
// elements, = the sum of x's `group` slices s·group .. s·group + group - 1 (the query heads of
// key head s), added in head order in fp32 and rounded once: deterministic.
template <class X> __global__ void group_sum_kernel(const X *x, X *y, int64_t group, int64_t slice, int64_t n) {
  constexpr int kV = 16 / static_cast<int>(sizeof(X));
  const int64_t e = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * kV;  // an element of y
  if (e >= n) return;
  const int64_t s = e / slice, c = e % slice;
  float acc[kV] = {};
  for (int64_t g = 0; g < group; ++g) {
    X v[kV];
    load_run<X, kV>(x + (s * group + g) * slice, c, v);
    #pragma unroll
    for (int u = 0; u < kV; ++u) acc[u] += to_float(v[u]);
  }
  X out[kV];
  #pragma unroll
  for (int u = 0; u < kV; ++u) out[u] = from_float<X>(acc[u]);
  store_run<X, kV>(y + e, out);
}

// dx = (d mod / dx)^T gm, a thread per run of kV elements (or pair of partner runs), in 16-byte
// loads and stores. Without a mod dx = gm. With one, column c sums its own term's d/dx and its
// partner's term's d/dy (ape_abi::partner pairs columns, so the partner's partner is c; a column
// paired with itself adds both of its own): the same two additions as a row-wise sum, in either
// order. Each term's param gradients go to the sinks once: a pair of runs computes each of its
// terms once; a lone run computes its partners' terms again without sinks.
template <class Enc, class In, bool kIsQ, int D>
__global__ void mod_backward_kernel(const Params<Enc, In> p, const In *x, const float *gm, In *dx, int64_t x_group) {
  constexpr bool kHasMod = kIsQ ? Enc::kHasQMod : Enc::kHasKMod;
  using S = ModSide<Enc, In, kIsQ, D>;
  constexpr int kV = S::kV, kPairing = S::kPairing;
  constexpr double kFraction = S::kFraction;
  const int64_t e = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * kV;
  if (e >= p.B * p.H * p.T * D) return;
  const int64_t c0 = e % D, row = e / D;
  const float *gr = gm + row * D;
  float g[kV];
  In out[kV];
  if constexpr (!kHasMod) {
    load_run<float, kV>(gr, c0, g);
    #pragma unroll
    for (int u = 0; u < kV; ++u) out[u] = from_float<In>(g[u]);
  } else {
    const int64_t p0 = S::partner_of(c0);
    if (p0 == S::kSkip) return;
    const int64_t t = row % p.T, bh = row / p.T;
    const In *xr = x + (bh / x_group * p.T + t) * D;  // (grouped keys: the key head's raw k)
    In xo[kV], xp[kV];
    float gp[kV];
    load_run<float, kV>(gr, c0, g);
    load_run<In, kV>(xr, c0, xo);
    const DevCtx<Enc> sinks = make_ctx(p, bh, true);
    // The term of column c (value xv, partner value yv, gradient gv): d/dx, d/dy.
    auto term = [&](const DevCtx<Enc> &ctx, int64_t c, In xv, In yv, float gv, float &gx, float &gy) {
      if constexpr (kIsQ) Enc::q_mod_grad(ctx, t, c, to_float(xv), to_float(yv), gv, gx, gy);
      else Enc::k_mod_grad(ctx, t, c, to_float(xv), to_float(yv), gv, gx, gy);
    };
    if (p0 >= 0) {
      load_run<float, kV>(gr, p0, gp);
      load_run<In, kV>(xr, p0, xp);
      In outp[kV];
      #pragma unroll
      for (int u = 0; u < kV; ++u) {
        float gx = 0.f, gy = 0.f, hx = 0.f, hy = 0.f;
        term(sinks, c0 + u, xo[u], xp[u], g[u], gx, gy);
        term(sinks, p0 + u, xp[u], xo[u], gp[u], hx, hy);
        out[u] = from_float<In>(gx + hy), outp[u] = from_float<In>(hx + gy);
      }
      store_run<In, kV>(dx + row * D + p0, outp);
    } else {
      gather_partners<In, kV, D>(kPairing, kFraction, xr, c0, xo, xp);
      gather_partners<float, kV, D>(kPairing, kFraction, gr, c0, g, gp);
      const DevCtx<Enc> plain = make_ctx(p, bh, false);
      #pragma unroll
      for (int u = 0; u < kV; ++u) {
        const int64_t c = c0 + u, pc = partner(kPairing, kFraction, D, c);
        float gx = 0.f, gy = 0.f;
        term(sinks, c, xo[u], xp[u], g[u], gx, gy);
        if (pc != c) {
          float unused = 0.f;
          term(plain, pc, xp[u], xo[u], gp[u], unused, gy);  // the partner's term: its d/dy is ours
        }
        out[u] = from_float<In>(gx + gy);
      }
    }
  }
  store_run<In, kV>(dx + e, out);
}

// ---- mods whose gradient adds to parameters (traits::QModParams / KModParams: ExPE, ExQPE) ---------
// mod_backward_kernel gives every element's term its own fixed-point atomics, and a per-head
// parameter (ExPE's a_h and b_h, read at (head, column)) is then one address that every token of
// every batch adds to: B·T pairs of L2 atomics on one element, 4 per element of q and of k for
// ExPE. Here a thread takes one column of up to kModRows rows of a slice, kModRowStride rows
// apart, and each parameter's sinks go through a register cache of two elements (ModParamSinks):
// terms to an element the cache holds add in registers, and the cache adds its sums to the global
// ones when an element leaves it and at the end. So an index the rows share (the head and column;
// a residue of the position whose period divides kModRowStride, as ExQPE's) costs one pair of
// atomics per kModRows rows; one that differs per row (a position table) one per term, as before.
// Integers: the sums, hence the gradients, are bit for bit those of one atomic per term (a partial
// sum that leaves the range is an overflow, as with the warp sums).
constexpr int kModRows = 32;        // rows per thread, at most
constexpr int kModRowStride = 64;   // between a thread's rows
constexpr int kModRowBatch = 8;     // rows whose loads issue before any of their terms

template <int N> struct ModParamSinks {
  struct Way {
    unsigned long long *p;
    long long hi, lo;
  };
  Way w[N][2];  // per parameter: the element added to last, then the one before
  uint32_t st;
  __device__ ModParamSinks() : st(0) {
    #pragma unroll
    for (int n = 0; n < N; ++n) w[n][0] = w[n][1] = Way{nullptr, 0, 0};
  }
  __device__ static uint32_t flush(const Way &x) {
    return x.p && (x.hi != 0 || x.lo != 0) ? fixed_atomic_add(x.p, x.hi, x.lo) : 0u;
  }
  __device__ void add(int n, unsigned long long *p, float g) {
    const FixedTerm t = to_fixed(g);
    st |= t.status;
    Way(&c)[2] = w[n];
    if (c[0].p != p) {
      const Way older = c[1].p == p ? c[1] : Way{p, 0, 0};
      if (c[1].p != p) st |= flush(c[1]);
      c[1] = c[0], c[0] = older;
    }
    bool wrapped, lo_wrapped;  // (low words unchecked, as in the atomics: |lo| < 2^31 a term)
    c[0].hi = wrap_add(c[0].hi, t.hi, wrapped);
    c[0].lo = wrap_add(c[0].lo, t.lo, lo_wrapped);
    if (wrapped) st |= kStatusOverflow;
  }
  __device__ void finish(uint32_t *status) {
    #pragma unroll
    for (int n = 0; n < N; ++n) st |= flush(w[n][0]) | flush(w[n][1]);
    if (st) atomicOr(status, st);
  }
};
// `ctx.dparams[n][i] += g` of the generated code through the cache.
template <class C> struct ModParamRef {
  unsigned long long *p;
  C *c;
  int n;
  __device__ void operator+=(float g) const {
    if (p) c->add(n, p, g);
  }
};
template <class C> struct ModParamSink {
  unsigned long long *data;
  C *c;
  int n;
  __device__ ModParamRef<C> operator[](int64_t i) const { return {data ? data + 2 * i : nullptr, c, n}; }
};
template <class C, int N> struct ModParamSinksOf {
  unsigned long long *p[N];
  C *c;
  __device__ ModParamSink<C> operator[](int n) const { return {p[n], c, n}; }
};
// DevCtx whose parameter sinks go through a ModParamSinks (its other sinks as DevCtx's).
template <class Enc> struct ModParamCtx : DevCtx<Enc> {
  static constexpr int NP = array_len(Enc::kNumParams);
  using Cache = ModParamSinks<NP>;
  ModParamSinksOf<Cache, NP> dparams;  // shadows DevCtx's
  __device__ ModParamCtx(const DevCtx<Enc> &base, Cache *cache) : DevCtx<Enc>(base) {
    for (int n = 0; n < NP; ++n) dparams.p[n] = base.dparams.p[n];
    dparams.c = cache;
  }
};

// Rows of a mod_backward_params_kernel block at once (its threads: that many rows of D columns,
// about 256): a power of two, so that it divides kModRowStride.
template <int D> constexpr int mod_params_rows_at_once() {
  static_assert(D <= 1024, "a row of D threads");
  int s = 1;
  while (s * 2 * D <= 256) s *= 2;
  return s;
}
template <int D> constexpr int mod_params_threads() { return mod_params_rows_at_once<D>() * D; }
// Blocks of one slice: chunks of kModRowStride · kModRows rows, each in kModRowStride / S blocks
// (S rows at once), block o of a chunk taking its rows o·S .. o·S + S - 1 of every kModRowStride.
template <int D> APE_HD inline int64_t mod_params_blocks_per_slice(int64_t T) {
  constexpr int64_t kChunk = int64_t(kModRowStride) * kModRows;
  return (T + kChunk - 1) / kChunk * (kModRowStride / mod_params_rows_at_once<D>());
}

// dx = (d mod / dx)^T gm where the mod's gradient adds to parameters: mod_backward_kernel's terms
// (a column's own term with its sinks, its partner's for d/dy without), a thread per column of up
// to kModRows rows of one slice, kModRowStride apart (mod_params_blocks_per_slice). The threads of
// a row are consecutive: every load and store of a warp is one run of a row.
template <class Enc, class In, bool kIsQ, int D>
__global__ void __launch_bounds__(mod_params_threads<D>())
    mod_backward_params_kernel(const Params<Enc, In> p, const In *__restrict__ x, const float *__restrict__ gm,
                               In *__restrict__ dx, int64_t x_group) {
  using S = ModSide<Enc, In, kIsQ, D>;
  constexpr int kAtOnce = mod_params_rows_at_once<D>(), kOffsets = kModRowStride / kAtOnce;
  static_assert(kModRowStride % kAtOnce == 0, "a block's rows at once divide the stride");
  const int64_t per_slice = mod_params_blocks_per_slice<D>(p.T);
  const int64_t bh = blockIdx.x / per_slice, b = blockIdx.x % per_slice;
  const int64_t t0 = b / kOffsets * (int64_t(kModRowStride) * kModRows) + b % kOffsets * kAtOnce + threadIdx.x / D;
  const int64_t c = threadIdx.x % D, pc = partner(S::kPairing, S::kFraction, D, c);
  using Ctx = ModParamCtx<Enc>;
  typename Ctx::Cache cache;
  const Ctx sinks(make_ctx(p, bh, true), &cache);
  const DevCtx<Enc> plain = make_ctx(p, bh, false);
  const In *xs = x + bh / x_group * p.T * D;  // (grouped keys: the key head's raw k)
  const float *gs = gm + bh * p.T * D;
  In *ds = dx + bh * p.T * D;
  auto term = [&](const auto &ctx, int64_t t, int64_t col, float xv, float yv, float gv, float &gx, float &gy) {
    if constexpr (kIsQ) Enc::q_mod_grad(ctx, t, col, xv, yv, gv, gx, gy);
    else Enc::k_mod_grad(ctx, t, col, xv, yv, gv, gx, gy);
  };
  #pragma unroll 1
  for (int r0 = 0; r0 < kModRows && t0 + int64_t(r0) * kModRowStride < p.T; r0 += kModRowBatch) {
    float xo[kModRowBatch], xp[kModRowBatch], go[kModRowBatch], gp[kModRowBatch];
    #pragma unroll
    for (int u = 0; u < kModRowBatch; ++u) {
      const int64_t t = t0 + int64_t(r0 + u) * kModRowStride;
      if (t < p.T) {
        xo[u] = to_float(xs[t * D + c]), go[u] = gs[t * D + c];
        if (pc != c) xp[u] = to_float(xs[t * D + pc]), gp[u] = gs[t * D + pc];
        else xp[u] = xo[u], gp[u] = go[u];
      }
    }
    #pragma unroll
    for (int u = 0; u < kModRowBatch; ++u) {
      const int64_t t = t0 + int64_t(r0 + u) * kModRowStride;
      if (t >= p.T) break;
      float gx = 0.f, gy = 0.f;
      term(sinks, t, c, xo[u], xp[u], go[u], gx, gy);
      if (pc != c) {
        float unused = 0.f;
        term(plain, t, pc, xp[u], xo[u], gp[u], unused, gy);  // the partner's term: its d/dy is ours
      }
      ds[t * D + c] = from_float<In>(gx + gy);
    }
  }
  cache.finish(p.status);
}

// ---- linear mods (traits::QModLinear / KModLinear: RoPE and its scalings, xPos) -------------------
// mod(x, y) = a(t, c) x + b(t, c) y with a, b independent of the batch, the head, the data and any
// trainable param (analysis/KernelFacts.h, isLinearMod): a = mod(1, 0) and b = mod(0, 1) are
// evaluated once per (position, run) for kLinBh slices instead of once per element, so these
// kernels move bytes at memory speed where the per-element mod (pow, sin, cos and the column's
// index arithmetic) kept the generic ones compute-bound (bench/results/gpu_h100.md: 147 M
// instructions for 16.8 M elements). Grid: x over the T D / kV runs of a slice, y over groups of
// kLinBh slices; each thread loops over its group's slices, its accesses coalesced in every slice.
// The same products and sums as the CPU template's coefficient table (cpu/attention.h).
constexpr int kLinBh = 32;

template <class Enc, bool kIsQ> constexpr bool linear_mod() {
  if constexpr (kIsQ) return Enc::kHasQMod && traits::QModLinear<Enc>::value;
  else return Enc::kHasKMod && traits::KModLinear<Enc>::value;
}

// a(t, c), b(t, c) of the side's mod (ctx of any slice: the coefficients read none of it).
template <class Enc, bool kIsQ>
__device__ inline void mod_coefs(const DevCtx<Enc> &ctx, int64_t t, int64_t c, float &a, float &b) {
  if constexpr (kIsQ)
    a = Enc::q_mod(ctx, t, c, 1.f, 0.f), b = Enc::q_mod(ctx, t, c, 0.f, 1.f);
  else
    a = Enc::k_mod(ctx, t, c, 1.f, 0.f), b = Enc::k_mod(ctx, t, c, 0.f, 1.f);
}

// A linear mod kernel's thread: its run at c0 of position t, the partner run p0 (ModSide), and the
// slices [bh0, bh1) of its group. False where the thread has nothing to do.
struct LinearRun {
  int64_t c0, t, p0, bh0, bh1;
};
// (slices: the slices run over; 0: B·H)
template <class S, int D, class P>
__device__ inline bool linear_run(const P &p, LinearRun &r, int64_t row0 = 0, int64_t slices = 0) {
  const int64_t e = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * S::kV;  // in one slice, from row0
  const int64_t BH = slices > 0 ? slices : p.B * p.H;
  r.bh0 = (blockIdx.z * int64_t(gridDim.y) + blockIdx.y) * kLinBh;  // (groups on y, then z: linear_mod_grid)
  if (e >= (p.T - row0) * D || r.bh0 >= BH) return false;
  r.c0 = e % D, r.t = row0 + e / D, r.bh1 = r.bh0 + kLinBh < BH ? r.bh0 + kLinBh : BH;
  r.p0 = S::partner_of(r.c0);
  return r.p0 != S::kSkip;
}

// Where the partners of a linear mod kernel's run lie, so that each slice's loop indexes its
// registers with constants (a partner index known only at run time puts the run in local memory,
// and its load then waits for the data before the next load issues):
//   kPaired   a run of their own at p0 (the half pairing): two 16-byte loads and stores;
//   kSwapped  inside the run, column c's at c ^ 1 (the interleaved pairing);
//   kOwn      each column is its own (columns past the rotated ones);
//   kGather   anything else (a half whose length is not a whole number of runs): one by one.
enum class RunShape { kPaired, kSwapped, kOwn, kGather };
template <class S, int D> __device__ inline RunShape run_shape(int64_t c0, int64_t p0) {
  if (p0 >= 0) return RunShape::kPaired;
  bool swapped = true, own = true;
  #pragma unroll
  for (int u = 0; u < S::kV; ++u) {
    const int64_t pc = partner(S::kPairing, S::kFraction, D, c0 + u);
    swapped = swapped && pc == c0 + (u ^ 1), own = own && pc == c0 + u;
  }
  return own ? RunShape::kOwn : swapped ? RunShape::kSwapped : RunShape::kGather;
}
// Calls f(std::integral_constant<RunShape, shape>) with the run's shape as a constant.
template <class F> __device__ inline void with_run_shape(RunShape shape, F &&f) {
  switch (shape) {
  case RunShape::kPaired: f(std::integral_constant<RunShape, RunShape::kPaired>{}); break;
  case RunShape::kSwapped: f(std::integral_constant<RunShape, RunShape::kSwapped>{}); break;
  case RunShape::kOwn: f(std::integral_constant<RunShape, RunShape::kOwn>{}); break;
  case RunShape::kGather: f(std::integral_constant<RunShape, RunShape::kGather>{}); break;
  }
}
// The run's values and its partners' (part[u]: the value of column partner(c0 + u), or of the
// partner run's column p0 + u) from row r.
template <RunShape kShape, int D, class S, class X>
__device__ inline void load_partners(const X *r, int64_t c0, int64_t p0, X (&own)[S::kV], X (&part)[S::kV]) {
  load_run<X, S::kV>(r, c0, own);
  if constexpr (kShape == RunShape::kPaired) {
    load_run<X, S::kV>(r, p0, part);
  } else if constexpr (kShape == RunShape::kGather) {
    gather_partners<X, S::kV, D>(S::kPairing, S::kFraction, r, c0, own, part);
  } else {
    #pragma unroll
    for (int u = 0; u < S::kV; ++u) part[u] = own[kShape == RunShape::kSwapped ? u ^ 1 : u];
  }
}

// Slices per batch of a linear mod kernel's thread: the loads of kLinU slices issue before any of
// their stores (the input and the output never alias: __restrict__), so each thread keeps kLinU
// slices' bytes in flight where one slice's load waited for the last slice's store. The kernels
// are bound by memory latency without it (H200: RoPE's two forward mods took about 0.19 ms of a
// 1.36 ms forward at B 2, H 16, T 8192, d_h 128, some 1.4 TB/s).
constexpr int kLinU = 4;

// xm = mod(x) for a linear mod: what mod_forward_kernel computes, with the coefficients of the
// thread's run (and its partner run) evaluated once for its kLinBh slices.
template <class Enc, class In, bool kIsQ, int D>
__global__ void __launch_bounds__(256, 2) mod_forward_linear_kernel(const Params<Enc, In> p, const In *__restrict__ x, In *__restrict__ xm, const ModRows rows) {
  using S = ModSide<Enc, In, kIsQ, D>;
  constexpr int kV = S::kV;
  LinearRun r;
  if (!linear_run<S, D>(p, r, rows.row0, rows.slices)) return;
  const int64_t c0 = r.c0, t = r.t, p0 = r.p0, bh0 = r.bh0, bh1 = r.bh1;
  const DevCtx<Enc> ctx = make_ctx(p, bh0 * rows.ctx_group, false);
  float a[kV], b[kV], ap[kV] = {}, bp[kV] = {};
  #pragma unroll
  for (int u = 0; u < kV; ++u) {
    mod_coefs<Enc, kIsQ>(ctx, t, c0 + u, a[u], b[u]);
    if (p0 >= 0) mod_coefs<Enc, kIsQ>(ctx, t, p0 + u, ap[u], bp[u]);
  }
  with_run_shape(run_shape<S, D>(c0, p0), [&](auto shape) {
    constexpr RunShape kShape = decltype(shape)::value;
    for (int64_t bh = bh0; bh < bh1; bh += kLinU) {
      In own[kLinU][kV], part[kLinU][kV];
      #pragma unroll
      for (int i = 0; i < kLinU; ++i)
        if (bh + i < bh1)
          load_partners<kShape, D, S>(x + ((bh + i) / rows.x_group * rows.ld_x + t - rows.x_row0) * D, c0, p0, own[i], part[i]);
      #pragma unroll
      for (int i = 0; i < kLinU; ++i) {
        if (bh + i >= bh1) continue;
        In *xr = xm + ((bh + i) * rows.ld_xm + t - rows.xm_row0) * D, out[kV];
        #pragma unroll
        for (int u = 0; u < kV; ++u) out[u] = from_float<In>(a[u] * to_float(own[i][u]) + b[u] * to_float(part[i][u]));
        if constexpr (kShape == RunShape::kPaired) {
          In outp[kV];
          #pragma unroll
          for (int u = 0; u < kV; ++u)
            outp[u] = from_float<In>(ap[u] * to_float(part[i][u]) + bp[u] * to_float(own[i][u]));
          store_run<In, kV>(xr + p0, outp);
        }
        store_run<In, kV>(xr + c0, out);
      }
    }
  });
}

// dx = (d mod / dx)^T gm for a linear mod: dx_c = a(t, c) g_c + b(t, pc) g_pc (pc = partner(c);
// the partner's partner is c, and a column paired with itself gets (a + b) g), as
// mod_backward_kernel adds its terms; the coefficients once per run for kLinBh slices, the slices
// in batches of kLinU as the forward's. A linear mod reads no trainable param: no param gradient
// to add.
template <class Enc, class In, bool kIsQ, int D>
__global__ void __launch_bounds__(256, 2) mod_backward_linear_kernel(const Params<Enc, In> p, const float *__restrict__ gm, In *__restrict__ dx) {
  using S = ModSide<Enc, In, kIsQ, D>;
  constexpr int kV = S::kV;
  LinearRun r;
  if (!linear_run<S, D>(p, r)) return;
  const int64_t c0 = r.c0, t = r.t, p0 = r.p0, bh0 = r.bh0, bh1 = r.bh1;
  const DevCtx<Enc> ctx = make_ctx(p, bh0, false);
  // a of the own columns; b of their partners (for the lone run: of each column's partner).
  float a[kV], bq[kV], ap[kV], bo[kV];
  #pragma unroll
  for (int u = 0; u < kV; ++u) {
    float unused;
    mod_coefs<Enc, kIsQ>(ctx, t, c0 + u, a[u], bo[u]);
    if (p0 >= 0) mod_coefs<Enc, kIsQ>(ctx, t, p0 + u, ap[u], bq[u]);
    else mod_coefs<Enc, kIsQ>(ctx, t, partner(S::kPairing, S::kFraction, D, c0 + u), unused, bq[u]);
  }
  with_run_shape(run_shape<S, D>(c0, p0), [&](auto shape) {
    constexpr RunShape kShape = decltype(shape)::value;
    for (int64_t bh = bh0; bh < bh1; bh += kLinU) {
      float g[kLinU][kV], gp[kLinU][kV];
      #pragma unroll
      for (int i = 0; i < kLinU; ++i)
        if (bh + i < bh1) load_partners<kShape, D, S>(gm + ((bh + i) * p.T + t) * D, c0, p0, g[i], gp[i]);
      #pragma unroll
      for (int i = 0; i < kLinU; ++i) {
        if (bh + i >= bh1) continue;
        In *dr = dx + ((bh + i) * p.T + t) * D, out[kV];
        #pragma unroll
        for (int u = 0; u < kV; ++u) out[u] = from_float<In>(a[u] * g[i][u] + bq[u] * gp[i][u]);
        if constexpr (kShape == RunShape::kPaired) {
          In outp[kV];
          #pragma unroll
          for (int u = 0; u < kV; ++u) outp[u] = from_float<In>(ap[u] * gp[i][u] + bo[u] * g[i][u]);
          store_run<In, kV>(dr + p0, outp);
        }
        store_run<In, kV>(dr + c0, out);
      }
    }
  });
}

// Delta_i = dO_i . O_i (fp32), added in column order, one fp32 accumulator per row, exactly as a
// thread per row would (at T = 1, where dS = P (dP - Delta) vanishes, the gradients left are the
// rounding difference of Delta and the tensor cores' dP: the tests bound it). The loads are
// coalesced: a block of 128 threads reads kDeltaRows rows in 16-byte chunks into shared memory
// (rows padded by one float: no bank conflicts), then a thread per row adds them up.
constexpr int kDeltaRows = 16, kDeltaThreads = 128;
template <class Enc, class In, int D> __global__ void delta_kernel(const Params<Enc, In> p) {
  constexpr int kV = run_len<In>(), kLd = D + 1;
  APE_STATIC_SMEM(float, sO, kDeltaRows * kLd);
  APE_STATIC_SMEM(float, sDO, kDeltaRows * kLd);
  const int64_t row0 = blockIdx.x * int64_t(kDeltaRows), rows = p.B * p.H * p.T;
  for (int x = static_cast<int>(threadIdx.x); x < kDeltaRows * (D / kV); x += kDeltaThreads) {
    const int r = x / (D / kV), c = (x % (D / kV)) * kV;
    if (row0 + r >= rows) break;
    In a[kV], b[kV];
    load_run<In, kV>(p.dout + (row0 + r) * D, c, a);
    load_run<In, kV>(p.o + (row0 + r) * D, c, b);
    #pragma unroll
    for (int u = 0; u < kV; ++u) sDO[r * kLd + c + u] = to_float(a[u]), sO[r * kLd + c + u] = to_float(b[u]);
  }
  __syncthreads();
  const int r = static_cast<int>(threadIdx.x);
  if (r < kDeltaRows && row0 + r < rows) {
    float d = 0.f;
    for (int c = 0; c < D; ++c) d += sDO[r * kLd + c] * sO[r * kLd + c];
    p.delta[row0 + r] = d;
  }
}

// ---- relative rows and the value-rows term: small GEMMs against a (rows, H, D) table -----------
// Relative rows R_n[bh, t, r] = (x'_t + bias_h) . table[r, h, :] (x' = q' or k'), their gradients
// dx' += dR table and dtable += dR^T (x' + bias), dbias += colsum(dR) table, and the value rows'
// vdrow = dO table^T and dtable += mass^T dO are products of a slice's rows with a table of
// `rows` rows. Three tiled kernels serve all five: each stages a tile of tokens and a chunk of
// 32 table rows in shared memory, so a table element is read once per 64 tokens (not once per
// token and row) and a token row once per 32 table rows; every output is one thread's fp32 sum
// in a fixed order, and the table's gradient adds its per-block partial sums in fixed point
// (deterministic in any order).
constexpr int kTabTok = 64, kTabRows = 32, kTabThreads = 256, kTabGradTok = 2048;
// A grid's B H slices on y, and on z past the 65535 that y holds (B H >= 65536: a batch of 4096
// at 16 heads): slice_blocks(BH) the (y, z) extents; a block's slice is z gridDim.y + y, and the
// blocks past BH (the last z's) have none.
inline dim3 slice_blocks(unsigned x, int64_t BH) {
  const int64_t max_y = max_grid_y(), y = BH < max_y ? BH : max_y;  // (APE_CUDA_MAX_GRID_Y: a test's way to reach z)
  return dim3(x, static_cast<unsigned>(y), static_cast<unsigned>((BH + y - 1) / y));
}
__device__ inline int64_t block_slice() { return blockIdx.z * int64_t(gridDim.y) + blockIdx.y; }

template <int D> constexpr size_t table_rows_smem() {
  return sizeof(float) * (size_t(kTabTok) * D + size_t(kTabRows) * (D + 1));
}

// y[bh, t, r] = (x[bh, t, :] + bias[h, :]) . table[r, h, :] for r < rows and rows t in [row0, T) (x
// with ld_x rows a slice from row x_row0, y with ld_y from y_row0, y's row stride rows; bias may be null): grid
// (ceil((T - row0) / 64), B*H on y and z: slice_blocks). Lane l serves table row r0 + l of each chunk,
// warp w the tokens w, w + 8, ..., w + 56 of the tile (their x read as a broadcast).
template <class In, int D>
__global__ void __launch_bounds__(kTabThreads)
    table_rows_kernel(const In *x, const float *bias, const float *table, int64_t rows, int64_t H,
                      int64_t T, float *y, int64_t ld_x, int64_t ld_y, int64_t row0, int64_t BH,
                      int64_t x_row0, int64_t y_row0, int64_t x_group) {
  APE_DYNAMIC_SMEM(smem);
  float *sX = reinterpret_cast<float *>(smem);  // (kTabTok, D)
  float *sT = sX + kTabTok * D;                 // (kTabRows, D + 1)
  const int64_t bh = block_slice(), h = bh % H, t0 = row0 + blockIdx.x * int64_t(kTabTok);  // rows from row0
  if (bh >= BH) return;  // (the whole block)
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  static_assert(kTabThreads % D == 0, "a thread stages one column of x");
  const float bv = bias ? bias[h * D + threadIdx.x % D] : 0.f;
  for (int e = threadIdx.x; e < kTabTok * D; e += kTabThreads) {
    const int tt = e / D, c = e % D;
    // ld_x rows a slice from x_row0; slice bh reads x's bh / x_group (grouped keys, Params::k_group)
    sX[e] = t0 + tt < T ? to_float(x[(bh / x_group * ld_x + t0 + tt - x_row0) * D + c]) + bv : 0.f;
  }
  for (int64_t r0 = 0; r0 < rows; r0 += kTabRows) {
    __syncthreads();  // sX written; the last chunk's sT read
    for (int e = threadIdx.x; e < kTabRows * D; e += kTabThreads) {
      const int r = e / D, c = e % D;
      sT[r * (D + 1) + c] = r0 + r < rows ? table[((r0 + r) * H + h) * D + c] : 0.f;
    }
    __syncthreads();
    float acc[kTabTok / 8] = {};
    for (int c = 0; c < D; ++c) {
      const float tv = sT[lane * (D + 1) + c];
      #pragma unroll
      for (int k = 0; k < kTabTok / 8; ++k) acc[k] += sX[(w + 8 * k) * D + c] * tv;
    }
    if (r0 + lane < rows)
      #pragma unroll
      for (int k = 0; k < kTabTok / 8; ++k)
        if (t0 + w + 8 * k < T) y[(bh * ld_y + t0 + w + 8 * k - y_row0) * rows + r0 + lane] = acc[k];
  }
}

// dx[bh, t, c] = x[bh, t, c] + sum_r g[bh, t, r] table[r, h, c] (g's row stride rows), in Out: x
// and dx are one fp32 array (dx += ...), or dx is the 16-bit gradient the backward returns (the
// last rows of a side without a mod: no conversion pass after). Grid (ceil(T / 64), B*H on y and z). Lane l
// serves the columns l, l + 32, ..., warp w the tokens w, w + 8, ..., w + 56.
template <int D, class Out>
__global__ void __launch_bounds__(kTabThreads)
    table_dx_kernel(const float *g, const float *table, int64_t rows, int64_t H, int64_t T, const float *x,
                    Out *dx, int64_t BH) {
  APE_STATIC_SMEM(float, sG, kTabTok * (kTabRows + 1));
  APE_STATIC_SMEM(float, sT, kTabRows * D);
  const int64_t bh = block_slice(), h = bh % H, t0 = blockIdx.x * int64_t(kTabTok);
  if (bh >= BH) return;  // (the whole block)
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  float acc[kTabTok / 8][D / 32] = {};
  for (int64_t r0 = 0; r0 < rows; r0 += kTabRows) {
    if (r0 > 0) __syncthreads();
    for (int e = threadIdx.x; e < kTabTok * kTabRows; e += kTabThreads) {
      const int tt = e / kTabRows, r = e % kTabRows;
      sG[tt * (kTabRows + 1) + r] = t0 + tt < T && r0 + r < rows ? g[(bh * T + t0 + tt) * rows + r0 + r] : 0.f;
    }
    for (int e = threadIdx.x; e < kTabRows * D; e += kTabThreads) {
      const int r = e / D, c = e % D;
      sT[e] = r0 + r < rows ? table[((r0 + r) * H + h) * D + c] : 0.f;
    }
    __syncthreads();
    for (int r = 0; r < kTabRows; ++r) {
      float tv[D / 32];
      #pragma unroll
      for (int m = 0; m < D / 32; ++m) tv[m] = sT[r * D + lane + 32 * m];
      #pragma unroll
      for (int k = 0; k < kTabTok / 8; ++k) {
        const float gv = sG[(w + 8 * k) * (kTabRows + 1) + r];
        #pragma unroll
        for (int m = 0; m < D / 32; ++m) acc[k][m] += gv * tv[m];
      }
    }
  }
  #pragma unroll
  for (int k = 0; k < kTabTok / 8; ++k)
    if (t0 + w + 8 * k < T)
      #pragma unroll
      for (int m = 0; m < D / 32; ++m) {
        const int64_t e = (bh * T + t0 + w + 8 * k) * D + lane + 32 * m;
        dx[e] = from_float<Out>(x[e] + acc[k][m]);
      }
}

// The table's gradient dtable[r, h, c] += sum_{b,t} g[b, h, t, r] (x[b, h, t, c] + bias[h, c])
// and the bias's dbias[h, c] += sum_{b,t,r} g[b, h, t, r] table[r, h, c], into fixed-point sums
// (either may be null): grid (ceil(B*T / 2048), ceil(rows / 32), H), each block one chunk of
// 2048 of head h's (b, t) and 32 table rows, its partial sums added once per element. Lane l
// serves the columns l, l + 32, ..., warp w the table rows w, w + 8, w + 16, w + 24. The host caps
// y and z at 65,535 (CUDA's limit); a block then also takes the row groups and heads a grid's
// y and z stride over.
template <class In, int D>
__global__ void __launch_bounds__(kTabThreads)
    table_grad_kernel(const float *g, const In *x, const float *bias, const float *table, int64_t rows,
                      int64_t B, int64_t H, int64_t T, unsigned long long *dtable_fx,
                      unsigned long long *dbias_fx, uint32_t *status, int64_t x_group) {
  constexpr int kTok = 32;
  APE_STATIC_SMEM(float, sG, kTok * (kTabRows + 1));
  APE_STATIC_SMEM(float, sX, kTok * D);
  APE_STATIC_SMEM(float, sSum, kTabRows);
  const int64_t n0 = blockIdx.x * int64_t(kTabGradTok);
  for (int64_t h = blockIdx.z; h < H; h += gridDim.z)
    for (int64_t r0 = blockIdx.y * int64_t(kTabRows); r0 < rows; r0 += gridDim.y * int64_t(kTabRows)) {
      __syncthreads();  // the previous (h, r0)'s reads of the staged tiles and sums
      const int64_t n_end = n0 + kTabGradTok < B * T ? n0 + kTabGradTok : B * T;
      const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
      float acc[kTabRows / 8][D / 32] = {};
      float colsum = 0.f;  // thread r < 32: sum of g over the chunk for table row r0 + r
      static_assert(kTabThreads % D == 0, "a thread stages one column of x");
      const float bv = bias ? bias[h * D + threadIdx.x % D] : 0.f;
      for (int64_t n = n0; n < n_end; n += kTok) {
        if (n > n0) __syncthreads();
        for (int e = threadIdx.x; e < kTok * kTabRows; e += kTabThreads) {
          const int tt = e / kTabRows, r = e % kTabRows;
          const int64_t nn = n + tt, row = ((nn / T) * H + h) * T + nn % T;
          sG[tt * (kTabRows + 1) + r] = nn < n_end && r0 + r < rows ? g[row * rows + r0 + r] : 0.f;
        }
        for (int e = threadIdx.x; e < kTok * D; e += kTabThreads) {
          const int tt = e / D, c = e % D;
          const int64_t nn = n + tt, row = ((nn / T) * (H / x_group) + h / x_group) * T + nn % T;
          sX[e] = nn < n_end ? to_float(x[row * D + c]) + bv : 0.f;
        }
        __syncthreads();
        if (dbias_fx && threadIdx.x < kTabRows)
          for (int tt = 0; tt < kTok; ++tt) colsum += sG[tt * (kTabRows + 1) + threadIdx.x];
        if (dtable_fx)
          for (int tt = 0; tt < kTok; ++tt) {
            float xv[D / 32];
            #pragma unroll
            for (int m = 0; m < D / 32; ++m) xv[m] = sX[tt * D + lane + 32 * m];
            #pragma unroll
            for (int k = 0; k < kTabRows / 8; ++k) {
              const float gv = sG[tt * (kTabRows + 1) + w + 8 * k];
              #pragma unroll
              for (int m = 0; m < D / 32; ++m) acc[k][m] += gv * xv[m];
            }
          }
      }
      if (dtable_fx)
        #pragma unroll
        for (int k = 0; k < kTabRows / 8; ++k)
          if (r0 + w + 8 * k < rows)
            #pragma unroll
            for (int m = 0; m < D / 32; ++m)
              FixedRef{dtable_fx + 2 * (((r0 + w + 8 * k) * H + h) * D + lane + 32 * m), status} += acc[k][m];
      if (dbias_fx) {
        __syncthreads();
        if (threadIdx.x < kTabRows) sSum[threadIdx.x] = colsum;
        __syncthreads();
        for (int c = threadIdx.x; c < D; c += kTabThreads) {
          float s = 0.f;
          for (int r = 0; r < kTabRows && r0 + r < rows; ++r) s += sSum[r] * table[((r0 + r) * H + h) * D + c];
          FixedRef{dbias_fx + 2 * (h * D + c), status} += s;
        }
      }
    }
}

// ---- tables of distance and row/column biases, and their gradients ----------------------------
// Distance biases for the flash kernels (flash_distance<Enc>()): B(d) / scale of every distance
// of a slice, once, at dist[bh dist_ld + kDistPad + d], 0 outside [0, T). A tile's window of
// distances is then a run of 16-byte cp.async copies, and B / scale is the initial value of its
// S accumulators (S = Q'K'^T + B / scale: raw scores, scaled in the exponent like a plain
// softmax). The host launches it with scale > 0 (positive_scale).
template <class Enc, class In> __global__ void dist_table_kernel(const Params<Enc, In> p) {
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= p.B * p.H * p.dist_ld) return;
  const int64_t bh = e / p.dist_ld, d = e % p.dist_ld - kDistPad;
  float v = 0.f;
  if (d >= 0 && d < p.T) v = Enc::template distance_bias<float>(make_ctx(p, bh, false), d) / p.scale;
  p.dist[e] = v;
}

// Row/column biases for the flash kernels (flash_rowcol<Enc>()): R(i) / scale and C(j) / scale of
// every token of a slice, once, at rc[(2 bh) rc_ld + i] and rc[(2 bh + 1) rc_ld + j], 0 past T
// (rc_ld: T rounded up to the forward's query tile, so that tiles copy whole 16-byte chunks).
// R + C (over scale) is the initial value of a tile's S accumulators, as for distance biases.
template <class Enc, class In> __global__ void rowcol_table_kernel(const Params<Enc, In> p) {
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= 2 * p.B * p.H * p.rc_ld) return;
  const int64_t row = e / p.rc_ld, bh = row / 2, t = e % p.rc_ld;
  float v = 0.f;
  // R of the rows the forward computes only (from q_row0: a row bias may read the query side's
  // relative rows, which exist from there on; 0 before, where the split kernel's idle warps read)
  if (t < p.T && (row % 2 == 1 || t >= p.q_row0)) {
    const DevCtx<Enc> ctx = make_ctx(p, bh, false);
    v = (row % 2 ? Enc::template col_bias<float>(ctx, t) : Enc::template row_bias<float>(ctx, t)) / p.scale;
  }
  p.rc[e] = v;
}

// The flash backward's per-row sums of scale P (dP - Delta) (p.row_g) into the encoding's
// gradient: one row_bias_grad call per (slice, row) with a nonzero sum.
template <class Enc, class In> __global__ void row_grad_kernel(const Params<Enc, In> p) {
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= p.B * p.H * p.T) return;
  const float g = p.row_g[e] * p.inv_scale;
  if (g != 0.f) Enc::row_bias_grad(make_ctx(p, e / p.T, true), e % p.T, g);
}

// The flash backward's per-distance sums of scale P (dP - Delta) (fixed point, p.dist_g) into the
// encoding's gradient: one distance_bias_grad call per (slice, distance) with a nonzero sum.
template <class Enc, class In> __global__ void dist_grad_kernel(const Params<Enc, In> p) {
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= p.B * p.H * p.T) return;
  const float g = from_fixed(p.dist_g + 2 * e) / p.scale;
  if (g != 0.f) Enc::distance_bias_grad(make_ctx(p, e / p.T, true), e % p.T, g);
}

}  // namespace detail
APE_CUDA_ABI_END
}  // namespace ape::cuda
