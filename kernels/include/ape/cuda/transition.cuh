// The attention transition on CUDA (contract/transition.h; the CPU form is transition_rows in
// cpu/attention.h): an inference-only post-softmax pass. After the ordinary forward has written o
// and lse of every row, the rows [lo, hi) that this layer of the model transforms get o rewritten,
// one warp per row, with two passes over the row's keys that recompute the logits the way the
// general forward does (s_ij = score_mod(scale q'_i . k'_j), forward.cuh):
//   pass 2: A = exp(s - lse_i); the kept mass K_i = sum_c transition_kept(A) and, over the window
//           W = [s - 2I, s), the mask sum N_i; avg_i = beta (1 - K_i) / N_i;
//   pass 3: the weights w_ic = transition_weight(A, ...) and o_i = sum_c w_ic v_c (the weights are
//           not renormalised, as the spec says).
// The per-weight formulas are contract/transition.h's, on the device. lse stays the softmax's.
// Deterministic: every lane sums its keys in order, the lanes are combined by a fixed shuffle
// tree, and o_i's columns are sums over the keys in order. The rows of a transformed layer are a
// few intervals of I rows (I ~ T / (N + 1)), so this pass costs about that share of the rows'
// forward FLOPs again, twice, on CUDA cores: fine for a prefill, not a training kernel (the
// transition has no backward).
#pragma once

#include <cstdlib>

#include "ape/contract/transition.h"
#include "ape/cuda/common.cuh"

namespace ape::cuda {
APE_CUDA_ABI_BEGIN
namespace detail {

// The rows one call transforms and the spec's numbers (host-computed, contract/transition.h).
struct TransitionLaunch {
  int64_t lo, hi, I;  // intervals of I rows from lo (the layer's first row); this launch's rows end at hi
  int64_t row0;       // the first row this launch rewrites (lo, a decode step's first row, or a chunk's)
  float alpha, beta;
};

template <class Enc, class In, int D>
__global__ void __launch_bounds__(kThreads)
    transition_kernel(const Params<Enc, In> p, const TransitionLaunch tr) {
  static_assert(D % 32 == 0, "one column per lane and step");
  constexpr int kCols = D / 32;  // output columns per lane
  APE_STATIC_SMEM(float, sQall, kWarps * D);  // each warp's q'_i
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float *sQ = sQall + warp * D;
  const int64_t bh = blockIdx.x, T = p.T;
  // k' and v of the slice's key head (grouped-query attention: bh / k_group, bh / v_group)
  const int64_t kbase = bh / p.k_group * T * D, vbase = bh / p.v_group * T * D;
  const int64_t i = tr.row0 + int64_t(blockIdx.y) * kWarps + warp;
  if (i >= tr.hi) return;  // whole warps only: no block barrier below
  const DevCtx<Enc> ctx = make_ctx(p, bh, false);
  // (q' from row qm_row0 of ld_q a slice; k' and v (B, H, T, D): no ld with num_layers, check_args)
  for (int c = lane; c < D; c += 32) sQ[c] = to_float(p.qm[(bh * p.ld_q + i - p.qm_row0) * D + c]);
  __syncwarp();
  const float *q = sQ;
  auto logit = [&](int64_t j) {
    const In *k = p.km + kbase + j * D;
    float dot = 0.f;
    for (int c = 0; c < D; ++c) dot += q[c] * to_float(k[c]);
    float s = p.scale * dot;
    if constexpr (Enc::kHasScoreMod) s = Enc::score_mod(ctx, i, j, s);
    return s;
  };
  const int64_t I = tr.I, s0 = tr.lo + (i - tr.lo) / I * I;
  const float bound = tr.alpha / float(s0 + I);  // 1. alpha / e
  // A row whose every key a score mod masked (lse = -inf) has A = 0 everywhere (the forward
  // wrote o = 0): subtracting +inf makes every exp 0, and the steps apply to the zero row.
  const float lse = p.lse[out_row(p, bh, i)], l = lse == -kInf ? kInf : lse;
  auto weight = [&](int64_t j) { return expf(logit(j) - l); };

  float kept = 0.f, nmask = 0.f;  // pass 2
  for (int64_t j = lane; j <= i; j += 32) {
    const float kc = transition_kept(weight(j), j, bound);
    kept += kc;
    if (j >= s0 - 2 * I && j < s0) nmask += transition_mask(kc, bound);
  }
  for (int o = 16; o > 0; o /= 2) {
    kept += __shfl_xor_sync(0xffffffffu, kept, o);
    nmask += __shfl_xor_sync(0xffffffffu, nmask, o);
  }
  const float avg = tr.beta * (1.f - kept) / nmask;  // N_i >= 2I * 0.01 > 0

  float acc[kCols];  // pass 3: lane owns columns lane + 32 u
  for (int u = 0; u < kCols; ++u) acc[u] = 0.f;
  for (int64_t j0 = 0; j0 <= i; j0 += 32) {  // 32 keys a step: lane r's weight, then broadcast
    const int64_t j = j0 + lane;
    const float wl = j <= i ? transition_weight(weight(j), j, s0, I, bound, avg) : 0.f;
    const int n = i - j0 + 1 < 32 ? int(i - j0 + 1) : 32;
    for (int r = 0; r < n; ++r) {
      const float w = __shfl_sync(0xffffffffu, wl, r);
      const In *vr = p.v + vbase + (j0 + r) * D + lane;
      for (int u = 0; u < kCols; ++u) acc[u] += w * to_float(vr[32 * u]);
    }
  }
  for (int u = 0; u < kCols; ++u) p.o[out_row(p, bh, i) * D + lane + 32 * u] = from_float<In>(acc[u]);
}

// The transition of the rows of [first_row, T) that layer a.layer of a.num_layers transforms, on
// the stream after the forward (p as the forward used it: q', k' and the scale that go together).
template <class Enc, class In, int D>
cudaError_t launch_transition(const Params<Enc, In> &p, const CudaAttnArgs &a, cudaStream_t st) {
  constexpr TransitionAttrs kAttrs = Enc::kTransition;
  const TransitionRows rows = transition_rows_of(kAttrs, a.T, a.num_layers, a.layer);
  const int64_t row0 = rows.lo > a.first_row ? rows.lo : a.first_row;
  if (rows.empty() || row0 >= rows.hi) return cudaSuccess;
  // Rows in launches of at most max_grid_y() blocks on y (a prompt of some 655K tokens at 4 layers
  // has more rows to transform than one launch takes).
  const int64_t kChunk = max_grid_y() * kWarps;
  for (int64_t r = row0; r < rows.hi; r += kChunk) {
    const int64_t hi = rows.hi - r < kChunk ? rows.hi : r + kChunk;
    const TransitionLaunch tr{rows.lo, hi, rows.I, r, float(kAttrs.alpha), float(kAttrs.beta)};
    const dim3 grid(static_cast<unsigned>(a.B * a.H), static_cast<unsigned>((hi - r + kWarps - 1) / kWarps));
    const cudaError_t err = launch(transition_kernel<Enc, In, D>, grid, kThreads, 0, st, p, tr);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace detail
APE_CUDA_ABI_END
}  // namespace ape::cuda
