// Grouped-query decode with the group's query heads packed into one block (CudaAttnArgs::kv_heads,
// one new row per query head: a decode step), as FlashAttention's "pack GQA": one block per (key
// head, share of the keys) computes the row of every query head of the group, so each key's k'
// and v are read once per group rather than once per query head. The encodings whose scores are
// scale q'·k' and nothing else (pack_gqa: no score mod, relative rows, value rows, token
// sequences or transition, and k' shared by the group): NoPE, RoPE and its scalings, xPos.
//
// fp32 on the CUDA cores: a step moves 2 D sizeof(In) bytes of k' and v per key and does 4 D
// FLOPs per key and query head, G FLOPs per byte for a group of G in bf16 (at most kPackMaxGroup:
// 16), under the ~20 of an H100's fp32 CUDA cores against its memory, so it is bound by the keys'
// bytes, not by arithmetic. P stays fp32 (the flash kernels round it to the
// dtype before P V). launch.cuh (packed_decode) splits the keys over blockIdx.y as the split
// forward does and adds the shares with split_combine_kernel.
#pragma once

#include "ape/cuda/common.cuh"
#include "ape/cuda/side_kernels.cuh"

namespace ape::cuda {
APE_CUDA_ABI_BEGIN
namespace detail {

// The largest group a block packs (its query rows in shared memory and its output in registers),
// the keys a block stages at a time (one per lane of a warp) and its threads.
constexpr int kPackMaxGroup = 16, kPackKeys = 32, kPackThreads = 128;

// Whether an encoding's decode rows may be packed: scores scale q'·k' alone, k' one per key head.
template <class Enc> constexpr bool pack_gqa() {
  return !Enc::kHasScoreMod && traits::NumRel<Enc>::value == 0 && value_rows<Enc>() == 0 && Enc::kNumTok == 0 &&
         !traits::HasTransition<Enc>::value && traits::KModShared<Enc>::value;
}

// Block (blockIdx.x = b H_kv + key head, blockIdx.y = share z): the row i = T - 1 of each of the
// `group` query heads bh0 + g (bh0 = blockIdx.x group) over keys [z per_share, (z + 1) per_share)
// ∩ [0, T). kf = scale log2(e). One share (gridDim.y 1): o and lse; else the share's o / l and lse
// into part_o, part_lse (rows (z B H + bh) part_rows + i - part_row0), -inf for an empty share.
// A NaN logit makes its row's o and lse NaN, as in the flash kernels.
template <class Enc, class In, int D>
__global__ void __launch_bounds__(kPackThreads)
    packed_decode_kernel(const Params<Enc, In> p, int group, int64_t per_share, float kf) {
  static_assert(kPackThreads % D == 0 && D % 32 == 0, "whole rows of output per pass");
  constexpr int kPass = kPackThreads / D;                             // output rows per pass
  constexpr int kOut = (kPackMaxGroup + kPass - 1) / kPass;           // a thread's outputs
  constexpr int kWarps = kPackThreads / 32, kRowsPerWarp = (kPackMaxGroup + kWarps - 1) / kWarps;
  constexpr int kV = 16 / static_cast<int>(sizeof(In));               // elements per 16-byte load
  constexpr int kLd = D + 1;                                          // sK's row stride (no bank conflicts)
  APE_STATIC_SMEM(float, sQ, kPackMaxGroup * D);
  APE_STATIC_SMEM(float, sK, kPackKeys * kLd);
  APE_STATIC_SMEM(ptx::F4, sV4, kPackKeys * D / 4);  // (16-byte aligned: float4 stores)
  float *const sV = reinterpret_cast<float *>(sV4);
  APE_STATIC_SMEM(float, sP, kPackMaxGroup * kPackKeys);
  APE_STATIC_SMEM(float, sRow, 2 * kPackMaxGroup);  // alpha per row during the loop; then m, l
  const int x = static_cast<int>(threadIdx.x), warp = x / 32, lane = x % 32;
  const int64_t T = p.T, i = T - 1, bh0 = int64_t(blockIdx.x) * group;
  const int64_t j_lo = int64_t(blockIdx.y) * per_share < T ? int64_t(blockIdx.y) * per_share : T;
  const int64_t j_hi = j_lo + per_share < T ? j_lo + per_share : T;
  const In *const km = p.km + bh0 / p.k_group * p.ld_k * D, *const vs = p.v + bh0 / p.v_group * p.ld_v * D;
  for (int e = x; e < group * D; e += kPackThreads) {  // the group's q' rows, times kf
    const int g = e / D, c = e % D;
    sQ[e] = to_float(p.qm[((bh0 + g) * p.ld_q + (i - p.qm_row0)) * D + c]) * kf;
  }
  float m[kRowsPerWarp], l[kRowsPerWarp];  // rows warp + kWarps r (every lane the same)
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) m[r] = -kInf, l[r] = 0.f;
  float acc[kOut];  // rows x / D + kPass u, column x % D
#pragma unroll
  for (int u = 0; u < kOut; ++u) acc[u] = 0.f;
  const int col = x % D, row0 = x / D;
  for (int64_t j0 = j_lo; j0 < j_hi; j0 += kPackKeys) {
    __syncthreads();  // (the previous keys' reads; the first time, sQ's writes)
    for (int e = kV * x; e < kPackKeys * D; e += kV * kPackThreads) {
      const int r = e / D, c = e % D;
      In kv[kV], vv[kV];
      if (j0 + r < j_hi) {
        load_run<In, kV>(km + (j0 + r) * D, c, kv);
        load_run<In, kV>(vs + (j0 + r) * D, c, vv);
      } else {
#pragma unroll
        for (int u = 0; u < kV; ++u) kv[u] = vv[u] = from_float<In>(0.f);
      }
      // (sV's rows 16-byte aligned: float4 stores; sK's padded rows, one float at a time)
#pragma unroll
      for (int u = 0; u < kV; u += 4) {
        const ptx::F4 f{to_float(vv[u]), to_float(vv[u + 1]), to_float(vv[u + 2]), to_float(vv[u + 3])};
        *reinterpret_cast<ptx::F4 *>(sV + r * D + c + u) = f;
      }
#pragma unroll
      for (int u = 0; u < kV; ++u) sK[r * kLd + c + u] = to_float(kv[u]);
    }
    __syncthreads();
    // Scores of rows warp + kWarps r against key j0 + lane, and their online softmax.
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int g = warp + kWarps * r;
      if (g >= group) break;
      float s = -kInf;
      if (j0 + lane < j_hi) {
        float dot = 0.f;
#pragma unroll 8
        for (int c = 0; c < D; ++c) dot = fmaf(sQ[g * D + c], sK[lane * kLd + c], dot);
        s = dot;
      }
      float mx = s;  // the tile's largest (a NaN stays: fmaxf would drop it)
#pragma unroll
      for (int o = 16; o > 0; o /= 2) {
        const float y = __shfl_xor_sync(0xffffffffu, mx, o);
        mx = y > mx || y != y ? y : mx;
      }
      // The row's running maximum (NaN, once seen, stays) and the weights against it; a row with
      // no finite logit yet (-inf) weighs everything against 0: alpha 0, p 0.
      const float m_new = m[r] != m[r] ? m[r] : mx > m[r] || mx != mx ? mx : m[r];
      const float base = m_new == -kInf ? 0.f : m_new;
      const float alpha = exp2f(m[r] - base), pj = exp2f(s - base);
      float sum = pj;
#pragma unroll
      for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      l[r] = l[r] * alpha + sum, m[r] = m_new;
      sP[g * kPackKeys + lane] = pj;
      if (lane == 0) sRow[g] = alpha;
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kOut; ++u) {
      const int g = row0 + kPass * u;
      if (g >= group) break;
      float a = acc[u] * sRow[g];
#pragma unroll 8
      for (int jj = 0; jj < kPackKeys; ++jj) a = fmaf(sP[g * kPackKeys + jj], sV[jj * D + col], a);
      acc[u] = a;
    }
  }
  __syncthreads();  // (the last keys' reads of sRow)
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int g = warp + kWarps * r;
    if (g < group && lane == 0) sRow[2 * g] = m[r], sRow[2 * g + 1] = l[r];
  }
  __syncthreads();
  constexpr float kLn2 = 0.693147180559945309f;
  const bool whole = gridDim.y == 1;
#pragma unroll
  for (int u = 0; u < kOut; ++u) {
    const int g = row0 + kPass * u;
    if (g >= group) break;
    const int64_t bh = bh0 + g;
    const float mg = sRow[2 * g], lg = sRow[2 * g + 1];
    const float inv = lg > 0.f ? 1.f / lg : 0.f;
    const float lse = lg == 0.f ? -kInf : mg * kLn2 + logf(lg);  // (a NaN l stays NaN)
    if (whole) {
      p.o[out_row(p, bh, i) * D + col] = from_float<In>(acc[u] * inv);
      if (col == 0) p.lse[out_row(p, bh, i)] = lse;
    } else {
      const int64_t row = (int64_t(blockIdx.y) * p.B * p.H + bh) * p.part_rows + (i - p.part_row0);
      p.part_o[row * D + col] = acc[u] * inv;
      if (col == 0) p.part_lse[row] = lse;
    }
  }
}

}  // namespace detail
APE_CUDA_ABI_END
}  // namespace ape::cuda
