// The general backward (ape/cuda/attention.cuh): dkdv_kernel per key tile and dq_kernel per query
// tile on wmma tiles in shared memory, for f32 inputs and value rows.
#pragma once

#include "ape/cuda/forward.cuh"

namespace ape::cuda {
APE_CUDA_ABI_BEGIN
namespace detail {

// ---- backward --------------------------------------------------------------------------------------
// Shared memory of both backward kernels: the row tile (queries: q', dO, lse, Delta), the column
// tile (keys: k', v), S and dP (fp32), P and dS (In), and the fp32 accumulators (kernel 1: dK',
// dV over the key tile; kernel 2: dQ' over the query tile).
template <class In, int D> struct BwdSmem {
  using C = Cfg<In, D>;
  static constexpr int BQ = C::kBwdBQ, BK = C::kBwdBK, LI = C::kLdIn, LA = C::kLdAcc;
  static constexpr int LS = BK + 4, LP = BK + C::kPadIn;
  static constexpr size_t q = 0;
  static constexpr size_t dout = align_up(q + sizeof(In) * BQ * LI);
  static constexpr size_t k = align_up(dout + sizeof(In) * BQ * LI);
  static constexpr size_t v = align_up(k + sizeof(In) * BK * LI);
  static constexpr size_t s = align_up(v + sizeof(In) * BK * LI);
  static constexpr size_t dp = align_up(s + sizeof(float) * BQ * LS);
  static constexpr size_t pr = align_up(dp + sizeof(float) * BQ * LS);
  static constexpr size_t ds = align_up(pr + sizeof(In) * BQ * LP);
  static constexpr size_t lse = align_up(ds + sizeof(In) * BQ * LP);
  static constexpr size_t delta = align_up(lse + sizeof(float) * BQ);
  static constexpr size_t acc1 = align_up(delta + sizeof(float) * BQ);
  static constexpr size_t acc2 = align_up(acc1 + sizeof(float) * BK * LA);
  static constexpr size_t bytes_dkdv = align_up(acc2 + sizeof(float) * BK * LA);
  static constexpr size_t bytes_dq = align_up(acc1 + sizeof(float) * BQ * LA);
  static_assert(bytes_dkdv <= kSmemLimit && bytes_dq <= kSmemLimit,
                "backward tiles exceed sm_86/89's 99 KiB of shared memory");
};

// The tile step shared by both kernels: S = Q' K'^T, dP = dO V^T, then per element
// P = exp(s' - lse) and dS = scale score_mod_grad(s, P (dP - Delta)); masked elements 0.
// `ctx` accumulates the score mod's load gradients only when its sinks are on.
template <class Enc, class In, int D>
__device__ inline void bwd_tile(const Params<Enc, In> &p, const DevCtx<Enc> &ctx,
                                unsigned char *smem, int64_t i0, int64_t j0) {
  using L = BwdSmem<In, D>;
  constexpr int BQ = L::BQ, BK = L::BK;
  const In *sQ = reinterpret_cast<const In *>(smem + L::q);
  const In *sDO = reinterpret_cast<const In *>(smem + L::dout);
  const In *sK = reinterpret_cast<const In *>(smem + L::k);
  const In *sV = reinterpret_cast<const In *>(smem + L::v);
  float *sS = reinterpret_cast<float *>(smem + L::s), *sDP = reinterpret_cast<float *>(smem + L::dp);
  In *sP = reinterpret_cast<In *>(smem + L::pr), *sDS = reinterpret_cast<In *>(smem + L::ds);
  const float *sLse = reinterpret_cast<const float *>(smem + L::lse);
  const float *sDelta = reinterpret_cast<const float *>(smem + L::delta);

  mm_abt<BQ, BK, D>(sQ, L::LI, sK, L::LI, sS, L::LS);   // S = Q' K'^T
  mm_abt<BQ, BK, D>(sDO, L::LI, sV, L::LI, sDP, L::LS); // dP = dO V^T
  __syncthreads();
  for (int e = threadIdx.x; e < BQ * BK; e += kThreads) {
    const int r = e / BK, c = e % BK;
    const int64_t i = i0 + r, j = j0 + c;
    float pv = 0.f, dsv = 0.f;
    if (i < p.T && j <= i) {
      const float raw = p.scale * sS[r * L::LS + c];
      float logit = raw;
      if constexpr (Enc::kHasScoreMod) logit = Enc::score_mod(ctx, i, j, raw);
      const float lse = sLse[r] == -kInf ? kInf : sLse[r];  // a row without finite logits: P = 0
      pv = expf(logit - lse);
      float dp = sDP[r * L::LS + c];
      if constexpr (value_rows<Enc>() > 0) {  // o_i also holds sum_j P_ij table[r(i, j)]
        const int64_t vr = Enc::value_row(ctx, i, j);
        dp += p.vdrow[((ctx.b * ctx.H + ctx.h) * p.T + i) * value_rows<Enc>() + vr];
        if constexpr (Enc::kValueTableTrainable) ctx.vmass[i * value_rows<Enc>() + vr] += pv;
      }
      const float g = pv * (dp - sDelta[r]);
      if constexpr (Enc::kHasScoreMod)
        dsv = p.scale * Enc::score_mod_grad(ctx, i, j, raw, g);
      else
        dsv = p.scale * g;
    }
    sP[r * L::LP + c] = from_float<In>(pv);
    sDS[r * L::LP + c] = from_float<In>(dsv);
  }
  __syncthreads();
}

// Loads the query-side tile (q', dO, lse, Delta) of rows [i0, i0 + BQ).
template <class Enc, class In, int D>
__device__ inline void bwd_load_rows(const Params<Enc, In> &p, unsigned char *smem, int64_t bh,
                                     int64_t i0) {
  using L = BwdSmem<In, D>;
  const int64_t T = p.T, base = bh * T * D;
  load_rows<In, L::BQ, D>(reinterpret_cast<In *>(smem + L::q), L::LI, p.qm + base, i0, T);
  load_rows<In, L::BQ, D>(reinterpret_cast<In *>(smem + L::dout), L::LI, p.dout + base, i0, T);
  float *sLse = reinterpret_cast<float *>(smem + L::lse);
  float *sDelta = reinterpret_cast<float *>(smem + L::delta);
  for (int r = threadIdx.x; r < L::BQ; r += kThreads) {
    const bool in = i0 + r < T;
    sLse[r] = in ? p.lse[bh * T + i0 + r] : kInf;
    sDelta[r] = in ? p.delta[bh * T + i0 + r] : 0.f;
  }
}

// Kernel 1, one block per (key tile, slice): grid (B*H, ceil(T / BK)) (from tile0: max_grid_y). dV = P^T dO and
// dK' = dS^T Q' over the query tiles that see the key tile; accumulates the score mod's load
// gradients.
template <class Enc, class In, int D>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(const Params<Enc, In> p) {
  using L = BwdSmem<In, D>;
  constexpr int BQ = L::BQ, BK = L::BK;
  APE_DYNAMIC_SMEM(smem);
  In *sK = reinterpret_cast<In *>(smem + L::k), *sV = reinterpret_cast<In *>(smem + L::v);
  const In *sQ = reinterpret_cast<const In *>(smem + L::q);
  const In *sDO = reinterpret_cast<const In *>(smem + L::dout);
  const In *sP = reinterpret_cast<const In *>(smem + L::pr);
  const In *sDS = reinterpret_cast<const In *>(smem + L::ds);
  float *sDK = reinterpret_cast<float *>(smem + L::acc1), *sDV = reinterpret_cast<float *>(smem + L::acc2);

  const int64_t bh = blockIdx.x, T = p.T, j0 = (p.tile0 + int64_t(blockIdx.y)) * BK, base = bh * T * D;
  const DevCtx<Enc> ctx = make_ctx(p, bh, true);
  // (k' and v of the slice's key head: bh / k_group, bh / v_group)
  load_rows<In, BK, D>(sK, L::LI, p.km + bh / p.k_group * T * D, j0, T);
  load_rows<In, BK, D>(sV, L::LI, p.v + bh / p.v_group * T * D, j0, T);
  zero_acc<BK, D>(sDK, L::LA);
  zero_acc<BK, D>(sDV, L::LA);
  for (int64_t i0 = j0 / BQ * BQ; i0 < T; i0 += BQ) {  // causal: queries >= j0
    bwd_load_rows<Enc, In, D>(p, smem, bh, i0);
    __syncthreads();
    bwd_tile<Enc, In, D>(p, ctx, smem, i0, j0);
    mm_acc<BK, D, BQ, true>(sP, L::LP, sDO, L::LI, sDV, L::LA);  // dV += P^T dO
    mm_acc<BK, D, BQ, true>(sDS, L::LP, sQ, L::LI, sDK, L::LA);  // dK' += dS^T Q'
    __syncthreads();
  }
  for (int e = threadIdx.x; e < BK * D; e += kThreads) {
    const int r = e / D, c = e % D;
    if (j0 + r < T) {
      p.dv[base + (j0 + r) * D + c] = from_float<In>(sDV[r * L::LA + c]);
      p.dkm[base + (j0 + r) * D + c] = sDK[r * L::LA + c];
    }
  }
}

// Kernel 2, one block per (query tile, slice): grid (B*H, ceil(T / BQ)) (from tile0). dQ' = dS K' over the
// visible key tiles; the score mod's load gradients are kernel 1's (sinks off here).
template <class Enc, class In, int D>
__global__ void __launch_bounds__(kThreads) dq_kernel(const Params<Enc, In> p) {
  using L = BwdSmem<In, D>;
  constexpr int BQ = L::BQ, BK = L::BK;
  APE_DYNAMIC_SMEM(smem);
  In *sK = reinterpret_cast<In *>(smem + L::k), *sV = reinterpret_cast<In *>(smem + L::v);
  const In *sDS = reinterpret_cast<const In *>(smem + L::ds);
  float *sDQ = reinterpret_cast<float *>(smem + L::acc1);

  const int64_t bh = blockIdx.x, T = p.T, i0 = (p.tile0 + int64_t(blockIdx.y)) * BQ, base = bh * T * D;
  const DevCtx<Enc> ctx = make_ctx(p, bh, false);
  bwd_load_rows<Enc, In, D>(p, smem, bh, i0);
  zero_acc<BQ, D>(sDQ, L::LA);
  const int64_t i_end = i0 + BQ < T ? i0 + BQ : T;
  for (int64_t j0 = 0; j0 < i_end; j0 += BK) {
    load_rows<In, BK, D>(sK, L::LI, p.km + bh / p.k_group * T * D, j0, T);
    load_rows<In, BK, D>(sV, L::LI, p.v + bh / p.v_group * T * D, j0, T);
    __syncthreads();
    bwd_tile<Enc, In, D>(p, ctx, smem, i0, j0);
    mm_acc<BQ, D, BK, false>(sDS, L::LP, sK, L::LI, sDQ, L::LA);  // dQ' += dS K'
    __syncthreads();
  }
  for (int e = threadIdx.x; e < BQ * D; e += kThreads) {
    const int r = e / D, c = e % D;
    if (i0 + r < T) p.dqm[base + (i0 + r) * D + c] = sDQ[r * L::LA + c];
  }
}

}  // namespace detail
APE_CUDA_ABI_END
}  // namespace ape::cuda
