// The general forward (ape/cuda/attention.cuh): wmma tiles in shared memory, for f32 inputs and
// value rows, where the flash kernels do not apply.
#pragma once

#include "ape/cuda/common.cuh"

namespace ape::cuda {
APE_CUDA_ABI_BEGIN
namespace detail {

template <class In, int D> struct FwdSmem {
  using C = Cfg<In, D>;
  static constexpr int BQ = C::kFwdBQ, BK = C::kFwdBK, LI = C::kLdIn, LO = C::kLdAcc;
  static constexpr int LS = BK + 4, LP = BK + C::kPadIn;
  static constexpr size_t q = 0;
  static constexpr size_t k = align_up(q + sizeof(In) * BQ * LI);
  static constexpr size_t v = align_up(k + sizeof(In) * BK * LI);
  static constexpr size_t s = align_up(v + sizeof(In) * BK * LI);     // logits (fp32)
  static constexpr size_t pr = align_up(s + sizeof(float) * BQ * LS);  // probabilities (In)
  static constexpr size_t o = align_up(pr + sizeof(In) * BQ * LP);     // unnormalised output
  static constexpr size_t m = align_up(o + sizeof(float) * BQ * LO);   // running max
  static constexpr size_t l = align_up(m + sizeof(float) * BQ);        // running sum
  static constexpr size_t alpha = align_up(l + sizeof(float) * BQ);    // rescale of this step
  static constexpr size_t bytes = align_up(alpha + sizeof(float) * BQ);
  static_assert(bytes <= kSmemLimit, "forward tiles exceed sm_86/89's 99 KiB of shared memory");
};

// Shared memory of the forward of Enc: FwdSmem, then the value rows' masses (BQ x kValueRows).
template <class Enc, class In, int D> constexpr size_t fwd_smem_bytes() {
  using L = FwdSmem<In, D>;
  return align_up(L::bytes + sizeof(float) * L::BQ * value_rows<Enc>());
}

// One block per (query tile, slice): grid (B*H, ceil(T / BQ) - first_row / BQ) in launches of at
// most max_grid_y() tiles on y, each from its own tile0 (CudaAttnArgs::first_row's tile; 0 but for
// a decode step). With value rows, each query row
// also keeps its unnormalised probability mass per table row (rescaled with the running max
// like O), and o_i gains sum_r mass_i[r] table[r, h, :] / l_i.
template <class Enc, class In, int D>
__global__ void __launch_bounds__(kThreads) forward_kernel(const Params<Enc, In> p) {
  using L = FwdSmem<In, D>;
  constexpr int BQ = L::BQ, BK = L::BK;
  constexpr int64_t R = value_rows<Enc>();
  static_assert(fwd_smem_bytes<Enc, In, D>() <= kSmemLimit, "value rows exceed shared memory");
  APE_DYNAMIC_SMEM(smem);
  float *sMass = reinterpret_cast<float *>(smem + L::bytes);  // (BQ, R)
  In *sQ = reinterpret_cast<In *>(smem + L::q), *sK = reinterpret_cast<In *>(smem + L::k);
  In *sV = reinterpret_cast<In *>(smem + L::v), *sP = reinterpret_cast<In *>(smem + L::pr);
  float *sS = reinterpret_cast<float *>(smem + L::s), *sO = reinterpret_cast<float *>(smem + L::o);
  float *sM = reinterpret_cast<float *>(smem + L::m), *sL = reinterpret_cast<float *>(smem + L::l);
  float *sA = reinterpret_cast<float *>(smem + L::alpha);

  const int64_t bh = blockIdx.x, T = p.T, i0 = (p.tile0 + int64_t(blockIdx.y)) * BQ;
  // q', k', v: Params::ld_q, ld_k, ld_v rows a slice (q' from row qm_row0); o: out_row
  const DevCtx<Enc> ctx = make_ctx(p, bh, false);

  load_rows<In, BQ, D>(sQ, L::LI, p.qm + bh * p.ld_q * D, i0 - p.qm_row0, T - p.qm_row0);
  zero_acc<BQ, D>(sO, L::LO);
  for (int r = threadIdx.x; r < BQ; r += kThreads) sM[r] = -kInf, sL[r] = 0.f;
  for (int64_t e = threadIdx.x; e < BQ * R; e += kThreads) sMass[e] = 0.f;
  __syncthreads();

  const int64_t i_end = i0 + BQ < T ? i0 + BQ : T;  // queries of this tile: [i0, i_end)
  for (int64_t j0 = 0; j0 < i_end; j0 += BK) {     // causal: keys < i_end
    load_rows<In, BK, D>(sK, L::LI, p.km + bh / p.k_group * p.ld_k * D, j0, T);
    load_rows<In, BK, D>(sV, L::LI, p.v + bh / p.v_group * p.ld_v * D, j0, T);
    __syncthreads();
    mm_abt<BQ, BK, D>(sQ, L::LI, sK, L::LI, sS, L::LS);  // S = Q' K'^T
    __syncthreads();
    // Final logits (-inf where not visible), elementwise.
    for (int e = threadIdx.x; e < BQ * BK; e += kThreads) {
      const int r = e / BK, c = e % BK;
      const int64_t i = i0 + r, j = j0 + c;
      float s = -kInf;
      if (i < T && j <= i) {
        s = p.scale * sS[r * L::LS + c];
        if constexpr (Enc::kHasScoreMod) s = Enc::score_mod(ctx, i, j, s);
      }
      sS[r * L::LS + c] = s;
    }
    __syncthreads();
    // Online softmax, one thread per query row.
    for (int r = threadIdx.x; r < BQ; r += kThreads) {
      float *s = sS + r * L::LS;
      float mx = sM[r];
      for (int c = 0; c < BK; ++c) mx = fmaxf(mx, s[c]);
      const float ref = mx == -kInf ? 0.f : mx;  // all logits -inf so far: the row stays zero
      const float alpha = expf(sM[r] - ref);
      float sum = 0.f;
      if constexpr (R > 0)
        for (int64_t k = 0; k < R; ++k) sMass[r * R + k] *= alpha;
      for (int c = 0; c < BK; ++c) {
        const float e = s[c] == -kInf ? 0.f : expf(s[c] - ref);
        sP[r * L::LP + c] = from_float<In>(e);
        sum += e;
        if constexpr (R > 0)
          if (e != 0.f) sMass[r * R + Enc::value_row(ctx, i0 + r, j0 + c)] += e;
      }
      sL[r] = sL[r] * alpha + sum;
      sM[r] = mx;
      sA[r] = alpha;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < BQ * D; e += kThreads) sO[(e / D) * L::LO + e % D] *= sA[e / D];
    __syncthreads();
    mm_acc<BQ, D, BK, false>(sP, L::LP, sV, L::LI, sO, L::LO);  // O += P V
    __syncthreads();
  }
  for (int e = threadIdx.x; e < BQ * D; e += kThreads) {
    const int r = e / D, c = e % D;
    if (i0 + r < T) {
      const float inv = sL[r] > 0.f ? 1.f / sL[r] : 0.f;
      float o = sO[r * L::LO + c] * inv;
      if constexpr (R > 0) {
        const float *table = p.params[Enc::kValueTable] + ctx.h * D + c;
        for (int64_t k = 0; k < R; ++k) o += sMass[r * R + k] * inv * table[k * p.H * D];
      }
      if (i0 + r >= p.o_row0) p.o[out_row(p, bh, i0 + r) * D + c] = from_float<In>(o);
    }
  }
  for (int r = threadIdx.x; r < BQ; r += kThreads)
    if (out_stored(p, i0 + r)) p.lse[out_row(p, bh, i0 + r)] = sM[r] + logf(sL[r]);
}

}  // namespace detail
APE_CUDA_ABI_END
}  // namespace ape::cuda
