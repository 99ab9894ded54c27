// The flash backward (ape/cuda/attention.cuh): one pass over the key tiles, 16-bit inputs, on
// mma.sync (sm_80+) or, in its wgmma layout, on wgmma (sm_90a; BwdTiles below), with the side
// kernels only it uses (a distance bias's saturation, the row statistics).
#pragma once

#include "ape/cuda/bwd_layouts.h"
#include "ape/cuda/flash_forward.cuh"
#include "ape/cuda/side_kernels.cuh"

namespace ape::cuda {
APE_CUDA_ABI_BEGIN
namespace detail {

// ---- FlashAttention-2-class backward (16-bit inputs) ---------------------------------------------
// One pass over the key tiles: a block owns 128 keys (16 per warp; 64 in the narrow layout,
// FlashBwd) and walks the query tiles that see them, from the diagonal down. Per query tile, on
// mma.sync m16n8k16 with ldmatrix operands:
//   S^T = K' Q'^T and dP^T = V dO^T            (keys are the M dimension: rows of this warp)
//   P^T = exp2(S^T log2e - lse log2e), dS^T = scale * mod_grad(P^T (dP^T - Delta))   (registers)
//   dV += P^T dO,  dK' += dS^T Q'               (P^T, dS^T reused from registers as A operands)
//   dQ'(tile) += dS K'                          (dS^T through shared memory, ldmatrix.trans)
// so 5 GEMMs per tile pair (the two-kernel backward recomputed S and dP: 7), with dK', dV in
// registers until the end. Q', dO of the next query tile (and its rows' lse and Delta) are
// prefetched into the other half of double buffers: by cp.async, or in the wgmma layout by TMA and
// bulk copies from its producer warpgroup, two steps ahead.
//
// dQ is deterministic: the blocks of one slice add their dQ' tiles into the fp32 dQ' in a fixed
// order, highest key tile first, by a semaphore per (slice, query tile): the block of key tile kt
// adds to query tile qt once the last(qt) - kt blocks of higher key tiles have (last(qt) is the
// last key tile that qt sees), then releases it. While it holds the turn the rows are its own:
// the first block to reach the tile stores it and key tile 0, the last, adds the sum so far and
// can write dq, both in 16-byte chunks staged in shared memory; the blocks between add their
// fragments by fp32 reductions, in the semaphore's order (the wgmma layout and kBwdWideTma: the
// staged tile by TMA reductions, complete before the release). The semaphores work as CUTLASS's generic
// barrier: one thread (thread 0; the producer's in the wgmma layout) polls with relaxed loads (thread
// 0 issues the first a step before it is needed), fences (acq_rel, gpu scope) and increments by a
// relaxed reduction, and the bar.sync before the fence makes it cover every thread's adds
// (cumulativity): no thread of the block fences its own.
// The grid is 1-D and slice-major, highest key tile first within a slice, so a block waits only on
// blocks that started before it; a block starts at its diagonal, BK / BQ query tiles below its
// neighbour's, so in steady state it trails by as many steps and finds its turn ready; the blocks
// resident at once touch the dQ' rows of a few slices (L2, not DRAM). The sums are identical run
// to run.
// The layouts of the kernel (its template argument kLayout):
//   kBwdNarrow  4 warps, 64 keys: D = 128 on sm_86/89, whose 99 KiB per block the wide tiles exceed
//               (flash_bwd_fallback);
//   kBwdWide    8 warps, 128 keys, on mma.sync (sm_80+);
//   kBwdWgmma   8 warps (two warpgroups of 64 keys), 128 keys, BQ 64 at every head dim, the five
//               products on wgmma (sm_90a, D 64 and 128: HopperBwd below);
//   kBwdWideSub the wide layout at D = 128 with steps of 64 queries in sub-tiles of 32
//               (APE_CUDA_BWD_SUBTILES=1: BwdTiles below);
//   kBwdWideTma the wide layout with its dQ' tiles added by TMA reductions from shared memory, as
//               the wgmma layout adds them (sm_90a, D 64 and 128; APE_CUDA_DQ_TMA=1);
//   kBwdSquare  8 warps, 128 keys, 64 queries per step, FlashAttention-2's tiling of the products
//               (APE_CUDA_BWD_SQUARE=1, encodings without a score mod of their own, or with a
//               distance or row/column bias, and without value rows, D = 128; flash_bwd_square):
//               a warp forms S^T and dP^T for 32 keys x 32
//               queries, P^T and dS^T go to shared memory, and its dK', dV are 32 keys x D/2
//               columns, its dQ' 32 queries x D/4 columns. The others keep P^T and dS^T in
//               registers (A fragments of dV, dK'), so a warp owns 16 keys x every column and its
//               S^T tiles are 16 x BQ: every warp reads all of Q' and dO twice a step, 96 bytes of
//               shared memory per kFLOP at D = 128 where this tiling moves about 63
//               (bench/results/cuda_sass.md; docs/cuda.md, "Shared memory per FLOP").
//   kBwdSquareTma kBwdSquare with its dQ' tiles added by TMA reductions from shared memory, as in
//               kBwdWideTma (sm_90a; APE_CUDA_BWD_SQUARE=1 and APE_CUDA_DQ_TMA=1).
// Every step reloads a Q' and a dO tile and adds a dQ' tile for the block's BK keys, so those
// bytes per FLOP fall as 1 / BK: the wide layouts move half of what the narrow one does, with the
// same registers per thread (16 keys per warp either way; the dQ' tile over twice the warps).
// (The ids, and the names the tests and tools print: cuda/bwd_layouts.h.)
// kQ: the queries per step, BQ: 32 on mma.sync at D = 128 (its registers: S^T and dP^T beside the
// 128 of dK' and dV), 64 elsewhere, and 32 where an encoding's shared memory at 64 would exceed
// the layout's (BwdLayout). kBwdWideSub takes 64 at D = 128 on mma.sync and works in sub-tiles of
// kSub = 32 queries (S^T, dP^T, P^T, dS^T, the dV and dK' products, a loop inside the step's):
// the registers of a 32-query step, while the step's two barriers, its turn on the dQ' tile and
// its dQ' product come once per 64 queries. Off by default until a GPU has timed it.
constexpr int bwd_default_bq(int D, int kLayout) {
  return D == 128 && (kLayout == kBwdNarrow || kLayout == kBwdWide || kLayout == kBwdWideTma) ? 32 : 64;
}
template <class In, int D, int kLayout, int kQ = bwd_default_bq(D, kLayout)> struct BwdTiles {
  static constexpr bool kWgmma = kLayout == kBwdWgmma;
  // dQ' staged in shared memory and added by TMA reductions (sm_90a): the wgmma layout's way, and
  // the wide and square layouts' in kBwdWideTma and kBwdSquareTma.
  static constexpr bool kDqTma = kWgmma || kLayout == kBwdWideTma || kLayout == kBwdSquareTma;
  static constexpr bool kSquare = kLayout == kBwdSquare || kLayout == kBwdSquareTma;
  static constexpr int kWarps = kLayout == kBwdNarrow ? 4 : 8, kThreads = 32 * kWarps;
  // kBwdWgmma: a producer warpgroup beside the kWarps consumer warps (warps kWarps .. kWarps + 3,
  // FlashAttention-3's form; flash_backward_kernel): the block's threads. Every other layout's
  // threads are its consumers.
  static constexpr bool kProducer = kWgmma;
  static constexpr int kBlockThreads = kThreads + (kProducer ? 128 : 0);
  // __launch_bounds__'s minimum of blocks per SM, stated so that ptxas knows the registers a
  // thread starts with (65,536 / 384 = 168 with a producer; 255 for every other layout, as without
  // it): without it ptxas ignores setmaxnreg where it cannot tell them (its note C7508; the wgmma
  // layout at d_h 64 then ran its consumers in 168 registers and spilled).
  static constexpr int kMinBlocks = kProducer ? 1 : 0;
  // (kBwdSquare: sm_90's where its distance sums need it; the launch asks the device.)
  static constexpr size_t kLimit =
      kLayout == kBwdNarrow ? kSmemLimit : kDqTma || kSquare ? kSmemLimitSm90 : kSmemLimitWide;
  static constexpr int BK = 16 * kWarps;  // keys per block, 16 per warp
  static constexpr int BQ = kQ;           // queries per step
  static_assert(BQ == 32 || BQ == 64, "32 or 64 queries per step");
  static constexpr int kSub = kLayout == kBwdWideSub && D == 128 ? 32 : BQ, kSubs = BQ / kSub;  // a step's sub-tiles
  static constexpr int kNT = kSub / 8, kDT = D / 8;
  // The dQ' tile (BQ x D) over the warps: kQW warps per 16 kQM rows, kQCols columns each (with
  // wgmma, warpgroup w's product holds columns [w D / 2, (w + 1) D / 2) of every row; kBwdSquare:
  // 32 rows, kQM = 2 m16 tiles, by 4 warps of D / 4 columns).
  static constexpr int kQM = kSquare ? 2 : 1;
  static constexpr int kQW = kSquare ? 4 : kWarps / (BQ / 16), kQCols = D / kQW;
  static_assert(kQW >= 1 && kQCols % 16 == 0, "the dQ' tile's columns in pairs of n8 tiles");
  static_assert(!kWgmma || (kQW == 2 && (D == 64 || D == 128)), "wgmma: two warpgroups, D 64 or 128");
  static_assert(!kSquare || (kWarps == 8 && BQ == 64), "kBwdSquare: 8 warps of 32 x 32 tiles");
  __device__ static int dq_row0(int warp) {
    return kWgmma ? 16 * (warp % 4) : kSquare ? 32 * (warp / 4) : 16 * (warp / kQW);
  }
  __device__ static int dq_col0(int warp) {
    return kWgmma ? (warp / 4) * kQCols : (warp % kQW) * kQCols;
  }
  static constexpr size_t k = 0, v = k + sizeof(In) * BK * D, q = v + sizeof(In) * BK * D;
  static constexpr size_t dout = q + 2 * sizeof(In) * BQ * D;
  static constexpr size_t ds = dout + 2 * sizeof(In) * BQ * D;
  // kDqTma: the step's fp32 dQ' tile, which TMA reductions add to dQ': D / 32 boxes of 32
  // columns, BQ rows of 128 bytes each in TMA's 128-byte swizzle (1024-byte aligned, as every tile
  // here).
  // kBwdSquare: P^T beside dS^T (BK x BQ, the A fragments of dV).
  static constexpr size_t ps = ds + sizeof(In) * BK * BQ;
  static constexpr size_t dqs = ps + (kSquare ? sizeof(In) * BK * BQ : 0);
  static_assert(dqs % 1024 == 0, "TMA's 128-byte swizzle needs 1024-byte aligned boxes");
  static constexpr size_t lse = dqs + (kDqTma ? sizeof(float) * BQ * D : 0);
  static constexpr size_t delta = lse + 2 * sizeof(float) * BQ;
  // wgmma: the mbarriers of the two Q' and dO buffers, which TMA fills.
  static constexpr size_t bars = delta + 2 * sizeof(float) * BQ;
  static constexpr size_t bytes = bars + (kWgmma ? 2 * sizeof(uint64_t) : 0);
  static_assert(bytes <= kLimit, "backward tiles exceed the shared memory of a block");
  // Distance biases: two windows of the slice's table of B(d) / scale (BQ + BK distances: those of
  // a tile pair and one before), each warp's two sets of partial diagonal sums of the tile's
  // scale P (dP - Delta) (kDiagLen slots per set, by tile diagonal; flash_diag_partials), and
  // kDistAcc running sums per distance (slot d mod kDistAcc) that carry a distance over the steps
  // that see it.
  static constexpr int kDistLen = BQ + BK, kDistAcc = kWarps == 8 ? 256 : 128, kDiagLen = BQ + BK;
  static_assert(BQ + BK - 1 <= kThreads, "one diagonal per thread");
  static_assert(BQ + BK - 1 <= kDistAcc, "a step's distances in distinct slots");
  static constexpr size_t dist = bytes, gsum = dist + 2 * sizeof(float) * kDistLen;
  static constexpr size_t dacc = gsum + sizeof(float) * 2 * kWarps * kDiagLen;
  static constexpr size_t bytes_dist = dacc + sizeof(float) * kDistAcc;
  static_assert(bytes_dist <= kLimit, "backward tiles exceed the shared memory of a block");
  // Row/column biases: C(j) / scale of the block's BK keys (R(i) goes into the rows' lse), and a
  // 16-byte row of 16-bit ones: the B fragment of the sums' products, by ldmatrix.
  static constexpr size_t rowcol = bytes, ones = rowcol + sizeof(float) * BK;
  static constexpr size_t bytes_rowcol = ones + 16;
  static_assert(bytes_rowcol <= kLimit, "backward tiles exceed the shared memory of a block");
};
template <class In, int D, bool kWide = true> using FlashBwd = BwdTiles<In, D, kWide ? kBwdWide : kBwdNarrow>;
template <class In, int D> using HopperBwd = BwdTiles<In, D, kBwdWgmma>;

// Value rows (Enc::kHasValueRows: Shaw's value term, o_i += sum_j P_ij table[r(i, j), h, :]) in the
// flash backward. dP_ij gains dO_i . table[r(i, j)], read from the rows vdrow = dO table^T that a
// side kernel forms before (table_rows_kernel); the table's gradient is mass^T dO with
// mass_i[r] = sum_j P_ij [r(i, j) = r] (table_grad_kernel, after). A block sums its keys' share of
// the masses of the step's query rows in shared memory, BQ x kValueRows elements after the tiles
// in the sinks' fixed point (shared-memory atomics on integers: the same sums in any order), and
// adds the non-zero ones to the slice's fixed-point masses after the step's last barrier: one pair
// of L2 atomics per (query row, table row) that the block's keys reach, instead of one per
// element. For Shaw's clipped distance, a query tile more than 32 positions past the block's last
// key reaches one table row (r = 32).
template <class Enc> constexpr bool value_table_trains() {
  if constexpr (traits::HasValueRows<Enc>::value) return Enc::kValueTableTrainable;
  else return false;
}
template <class Enc, class L> constexpr size_t flash_bwd_mass_bytes() {
  return value_table_trains<Enc>() ? 2 * sizeof(unsigned long long) * L::BQ * value_rows<Enc>() : 0;
}
// Per query of a step: the row features, then (value rows) dO_i . table[r_sat]; and each warp's
// sums: the row features' gradients, then (a trained value table) the mass sum_j P_ij.
template <class Enc> constexpr int feat_row_vals() {
  if constexpr (flash_feature_steps<Enc>()) return Enc::kRowFeatures + (value_rows<Enc>() > 0 ? 1 : 0);
  else return 0;
}
template <class Enc> constexpr int feat_row_sums() {
  if constexpr (flash_feature_steps<Enc>()) return Enc::kRowFeatures + (value_table_trains<Enc>() ? 1 : 0);
  else return 0;
}
// Both double-buffered by step parity: BQ x vals floats, then kWarps x BQ x sums floats, after the
// masses.
template <class Enc, class L> constexpr size_t flash_bwd_feature_bytes() {
  return sizeof(float) * 2 * L::BQ * (feat_row_vals<Enc>() + L::kWarps * feat_row_sums<Enc>());
}
// Dynamic shared memory of the flash backward for Enc in layout L, before a parameter cache.
// A distance bias without a gradient (traits::BiasFixed: ALiBi's standard slopes) takes only its
// windows of the table (up to L::gsum): no diagonal sets, no running sums.
template <class Enc, class L> constexpr size_t flash_bwd_bytes() {
  if constexpr (flash_distance<Enc>() && traits::BiasFixed<Enc>::value)
    return L::gsum + flash_bwd_mass_bytes<Enc, L>();
  else
    return flash_smem_bytes<Enc, L>() + flash_bwd_mass_bytes<Enc, L>() + flash_bwd_feature_bytes<Enc, L>();
}

// The layout kLayout of the flash backward for Enc: its queries per step where its shared memory
// fits the layout's, else 32 (value rows' masses at D = 128 in kBwdWideSub: no sub-tiles there).
template <class Enc, class In, int D, int kLayout> constexpr int flash_bwd_bq() {
  constexpr int bq = bwd_default_bq(D, kLayout);
  using L = BwdTiles<In, D, kLayout, bq>;
  return bq == 64 && flash_bwd_bytes<Enc, L>() > L::kLimit ? 32 : bq;
}
template <class Enc, class In, int D, int kLayout>
using BwdLayout = BwdTiles<In, D, kLayout, flash_bwd_bq<Enc, In, D, kLayout>()>;

// Whether kBwdSquare applies to Enc at D (16-bit inputs): no score mod of its own (NoPE, the q/k
// mods: RoPE and its scalings, xPos, ...) or a distance bias (ALiBi, T5, KERPLE) or a row/column
// bias (Cable), no value rows, D = 128. Its 161 KiB of tiles fit sm_80's and sm_90's blocks with
// Cable's row/column tables and ALiBi's distance windows (fixed slopes: no sums); the distance sums
// of T5 and KERPLE make 175 KiB, sm_90's only (the launch asks the device, and the wide layout
// runs elsewhere). (At D = 64 it compiles and runs, but moves
// 93 bytes of shared memory per kFLOP where the wide layout moves 95: not worth a kernel.)
template <class Enc, class In, int D> constexpr bool flash_bwd_square() {
  return sizeof(In) == 2 && D == 128 && value_rows<Enc>() == 0 &&
         (!Enc::kHasScoreMod || flash_distance<Enc>() || flash_rowcol<Enc>());
}

// The narrow layout is needed where the wide one's shared memory for Enc exceeds what every
// claimed architecture allows a block (sm_86/89's 99 KiB: D = 128, 104-117 KiB; value rows' masses
// at D = 64 too): the launch then asks the device (attention_backward) and runs the wide layout
// where it fits (sm_80, 87, 90: 163-227 KiB), the narrow one elsewhere. Everywhere else only the
// wide one is compiled.
template <class Enc, class In, int D> constexpr bool flash_bwd_fallback() {
  return flash_bwd_bytes<Enc, BwdLayout<Enc, In, D, kBwdWide>>() > kSmemLimit;
}

// The diagonal sums of one warp's 16 x 8 kNT tile in the m16n8 accumulator layout (element
// (g + 8 h, 8 nt + 2 t + e) in v[nt][2 h + e] of lane 4 g + t), in registers and shuffles: the
// element's diagonal is o = c - r = 8 k + s with k = nt - h, s = 2 t + e - g. A lane adds its pairs
// (h = 0, nt = k) + (h = 1, nt = k + 1); lane (g, t) adds e = 1 of lane (g + 1, t) to its e = 0
// (shuffle by 4); the lanes of equal s = 2 t - g, (g + 2 m, t + m), add into their first lane (the
// chain's head, g < 2 or t = 0; shuffles by 9 and 18); lane (0, t)'s e = 1 sums (s = 2 t + 1) join
// head (1, t + 1), and lane (0, 3)'s (s = 7) stay. Each head writes its kNT + 1 sums to
// set0[o + xoff] (s >= 0) or set1[o + xoff] (s < 0), lane (0, 3) its s = 7 sums to set0: every
// slot has one writer, the same on every call, so the unwritten ones stay as they were (0), and
// the order of the additions is fixed.
// A step in sub-tiles (BwdTiles::kSubs) calls once per sub-tile, xoff 8 kNT on from the last: the
// last group of sums (k = kNT) of a sub-tile is the first (k = 0) of the next, in the same lanes.
// With carry_out it is not written but kept in `carry`, and the next call (carry_in) adds it to its
// first group: each slot still has one writer and a fixed order.
template <int kNT>
__device__ inline void diag_partials(const float (&v)[kNT][4], float *set0, float *set1, int xoff,
                                     float (&carry)[2], bool carry_in, bool carry_out) {
  const int lane = static_cast<int>(threadIdx.x % 32), g = lane / 4, t = lane % 4;
  float w0[kNT + 1], w1[kNT + 1];  // k + 1: e = 0, e = 1
  #pragma unroll
  for (int e = 0; e < 2; ++e) {
    float *w = e ? w1 : w0;
    w[0] = v[0][2 + e];
    #pragma unroll
    for (int k = 0; k + 1 < kNT; ++k) w[k + 1] = v[k][e] + v[k + 1][2 + e];
    w[kNT] = v[kNT - 1][e];
  }
  #pragma unroll
  for (int k = 0; k <= kNT; ++k) {
    const float r = __shfl_down_sync(0xffffffffu, w1[k], 4);
    if (g < 7) w0[k] += r;
  }
  #pragma unroll
  for (int k = 0; k <= kNT; ++k) {
    const float r = __shfl_down_sync(0xffffffffu, w0[k], 9);
    if (g <= 5 && t <= 2) w0[k] += r;
  }
  #pragma unroll
  for (int k = 0; k <= kNT; ++k) {
    const float r = __shfl_down_sync(0xffffffffu, w0[k], 18);
    if (g <= 3 && t <= 1) w0[k] += r;
  }
  #pragma unroll
  for (int k = 0; k <= kNT; ++k) {
    const float r = __shfl_up_sync(0xffffffffu, w1[k], 5);
    if (g == 1 && t >= 1) w0[k] += r;
  }
  if (carry_in) w0[0] += carry[0], w1[0] += carry[1];
  if (carry_out) carry[0] = w0[kNT], carry[1] = w1[kNT];
  const int s = 2 * t - g, n = carry_out ? kNT : kNT + 1;
  if (g < 2 || t == 0) {
    float *out = (s >= 0 ? set0 : set1) + s + xoff - 8;
    #pragma unroll
    for (int k = 0; k <= kNT; ++k)
      if (k < n) out[8 * k] = w0[k];
  }
  if (lane == 3) {
    #pragma unroll
    for (int k = 0; k <= kNT; ++k)
      if (k < n) set0[8 * k + 7 + xoff - 8] = w1[k];
  }
}

// ---- a distance bias's saturation ---------------------------------------------------------------
// Many distance biases stop depending on the distance past some point (T5's buckets: every
// distance >= 113 reads the last one). Where B's gradient is the same linear map of g for every
// d >= d_sat, the backward needs one sum of dS over those distances instead of one per distance.
// d_sat is found at run time, per slice, from the spec's own gradient: distance_bias_grad(d, 1)
// runs against sinks that fold every (sink, element, coefficient) they receive into a 64-bit
// fingerprint (FingerprintCtx, order-independent); d_sat is 1 + the last d whose fingerprint
// differs from that of T - 1 (dist_sat_kernel; 0 when all agree, T - 1 at most).
struct FpAcc {
  unsigned long long *h;
  int sink;
  __device__ static unsigned long long mix(unsigned long long x) {  // splitmix64's finaliser
    x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27, x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
  struct Ref {
    unsigned long long *h;
    unsigned long long key;
    __device__ void operator+=(float g) const {
      uint32_t bits;
      memcpy(&bits, &g, 4);
      *h += mix(key ^ mix(bits + 0x9e3779b97f4a7c15ull));
    }
  };
  __device__ Ref operator[](int64_t i) const {
    return Ref{h, mix(static_cast<unsigned long long>(i) * 0x100000001b3ull + static_cast<unsigned long long>(sink))};
  }
};
template <int N> struct FpSinks {
  unsigned long long *h;
  __device__ FpAcc operator[](int n) const { return FpAcc{h, n + 1}; }
};
template <class Enc> struct FingerprintCtx : DevCtx<Enc> {
  FpSinks<array_len(Enc::kNumParams)> dparams;  // shadows DevCtx's sinks
  FpAcc dtok;
};

template <class Enc, class In> __global__ void dist_fp_kernel(const Params<Enc, In> p) {
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= p.B * p.H * p.T) return;
  const int64_t bh = e / p.T, d = e % p.T;
  unsigned long long h = 0;
  FingerprintCtx<Enc> ctx;
  static_cast<DevCtx<Enc> &>(ctx) = make_ctx(p, bh, false);
  ctx.dparams.h = &h;
  ctx.dtok = FpAcc{&h, 0};
  if constexpr (!traits::BiasFixed<Enc>::value) Enc::distance_bias_grad(ctx, d, 1.f);
  p.dist_fp[e] = h;
}
template <class Enc, class In> __global__ void dist_sat_kernel(const Params<Enc, In> p) {
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= p.B * p.H * p.T) return;
  const int64_t bh = e / p.T, d = e % p.T;
  if (p.dist_fp[e] != p.dist_fp[bh * p.T + p.T - 1]) atomicMax(p.dist_sat + bh, static_cast<int>(d + 1));
}

// The flash backward's row statistics, one thread per (slice, row) of p.stats (rows past T too):
// lse' = lse log2 e (- log2 scale where the kernel computes P' = scale P, flash_scaled_p; - R(i) /
// scale times scale log2 e with a row/column bias, whose R folds into the row) and Delta (negated
// with P': the dP^T accumulators start at it); a row without a finite logit gets +inf (its P is 0).
template <class Enc> constexpr bool flash_scaled_p() {
  return (!Enc::kHasScoreMod && value_rows<Enc>() == 0) || flash_distance<Enc>() || flash_rowcol<Enc>();
}
// Whether Enc has relative rows of the queries (side 0) or of the keys (side 1).
template <class Enc> constexpr bool rel_rows_on(int side) {
  if constexpr (traits::NumRel<Enc>::value > 0)
    for (int n = 0; n < Enc::kNumRel; ++n)
      if (Enc::rel_side(n) == side) return true;
  return false;
}
// The flash backward writes dk itself (no fp32 dK', no mod pass) where dk = dK': no k mod and
// no relative rows of the keys (whose gradients add to dK' afterwards). dq likewise, from key
// tile 0, where also the scale was positive and the layout writes it so (Params::dq_direct, set
// by the host: launch.cuh's dq_direct_enabled; in the wgmma layout the conversion pass writes dq).
template <class Enc> constexpr bool flash_dk_direct() {
  return !Enc::kHasKMod && !rel_rows_on<Enc>(1);
}
template <class Enc> constexpr bool flash_dq_direct() {
  return !Enc::kHasQMod && !rel_rows_on<Enc>(0);
}
template <class Enc, class In> __global__ void row_stats_kernel(const Params<Enc, In> p) {
  constexpr float kLog2e = 1.44269504088896341f;
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= p.B * p.H * p.stats_ld) return;
  const int64_t bh = e / p.stats_ld, i = e % p.stats_ld;
  float *row = p.stats + 2 * bh * p.stats_ld + i;
  if (i >= p.T) {
    row[0] = kInf, row[p.stats_ld] = 0.f;
    return;
  }
  const float l = p.lse[bh * p.T + i], d = p.delta[bh * p.T + i];
  float lse2 = l * kLog2e;
  if constexpr (flash_scaled_p<Enc>()) lse2 -= p.log2_scale;
  if constexpr (flash_rowcol<Enc>()) lse2 -= p.rc[2 * bh * p.rc_ld + i] * (p.scale * kLog2e);
  row[0] = l == -kInf ? kInf : lse2;
  row[p.stats_ld] = flash_scaled_p<Enc>() ? -d : d;
}

// The row statistics of query rows [i0, i0 + BQ) of a slice (row_stats_kernel: `stats` points at
// the slice's lse row, `ld` on is its Delta row) into shared memory, 16-byte cp.async.
template <int BQ, int kThreads>
__device__ inline void load_row_stats(float *sLse, float *sDelta, const float *stats, int64_t ld,
                                      int64_t i0) {
  static_assert(BQ / 4 <= kThreads, "one chunk per thread");
  const int x = static_cast<int>(threadIdx.x);
  if (x < BQ / 4) {
    ptx::cp_async_16(sLse + 4 * x, stats + i0 + 4 * x);
    ptx::cp_async_16(sDelta + 4 * x, stats + ld + i0 + 4 * x);
  }
}

// kOrdered false: the kernel for dQ' in any order (Params::dq_ordered false), of the 128-key
// mma.sync layouts (kBwdWide, kBwdWideSub, kBwdSquare). The order's fence, present in a kernel, makes ptxas
// compile every reduction in it as a returning atomic (ATOMG) where the kernel without one issues
// fire-and-forget REDG (bench/results/gpu_h100.md, "The dQ' adds in compiled code"); the other
// layouts' kernels (kOrdered true) follow Params::dq_ordered at run time.
template <class Enc, class In, int D, bool kOrdered, int kLayout>
__global__ void __launch_bounds__(BwdTiles<In, D, kLayout>::kBlockThreads, BwdTiles<In, D, kLayout>::kMinBlocks)
    flash_backward_kernel(const __grid_constant__ Params<Enc, In> p, const __grid_constant__ BwdMaps maps) {
  using C = BwdLayout<Enc, In, D, kLayout>;
  constexpr bool kWg = C::kWgmma;       // the products on wgmma (sm_90a)
  constexpr bool kDqTma = C::kDqTma;    // dQ' by TMA reductions (sm_90a)
#ifndef APE_SM90A_CODE
  if constexpr (kWg || kDqTma) {
    __trap();  // sm_90a only (the launch asks hopper_device)
    return;
  }
#endif
  constexpr int BQ = C::BQ, BK = C::BK, kNT = C::kNT, kDT = C::kDT, kQDT = C::kQCols / 8;
  constexpr float kLog2e = 1.44269504088896341f;
  APE_DYNAMIC_SMEM(smem);
  In *sK = reinterpret_cast<In *>(smem + C::k), *sV = reinterpret_cast<In *>(smem + C::v);
  In *sQ = reinterpret_cast<In *>(smem + C::q), *sDO = reinterpret_cast<In *>(smem + C::dout);
  In *sDS = reinterpret_cast<In *>(smem + C::ds);
  float *sLse = reinterpret_cast<float *>(smem + C::lse);
  float *sDelta = reinterpret_cast<float *>(smem + C::delta);
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int g = lane / 4, t = lane % 4;
  // One slice's key tiles run together, highest first (blocks n_kt bh .. n_kt bh + n_kt - 1):
  // the blocks on the GPU at once share few slices, so the fp32 dQ' rows they add to stay in L2.
  const int64_t T = p.T, n_kt = (T + BK - 1) / BK, bh = int64_t(blockIdx.x) / n_kt, base = bh * T * D;
  const int kt = static_cast<int>(n_kt - 1 - int64_t(blockIdx.x) % n_kt);
  const int64_t j0 = int64_t(kt) * BK;
  constexpr bool kSq = C::kSquare;
  // This warp's keys in the tile (16, or kBwdSquare's 32: kKM m16 tiles, whose dK' and dV are
  // columns [dc0, dc0 + D / kKM), kKDT n8 tiles each; its S^T columns are queries [sc0, sc0 + 32)).
  const int kr0 = kSq ? 32 * (warp % 4) : 16 * warp;
  [[maybe_unused]] const int sc0 = kSq ? 32 * (warp / 4) : 0, dc0 = kSq ? (D / 2) * (warp / 4) : 0;
  constexpr int kKM = kSq ? 2 : 1, kKDT = kDT / kKM;
  const int qr0 = C::dq_row0(warp), qc0 = C::dq_col0(warp);  // its dQ' part
  const int64_t n_qt = (T + BQ - 1) / BQ, qt0 = j0 / BQ;
  int *sem = p.dq_sem + bh * n_qt;
  // dQ' in the semaphores' order (read from the parameters where used: no register held).
  auto ordered = [&p] { return kOrdered && p.dq_ordered; };
  // The block's barrier: with a producer warpgroup a named barrier of every thread (id 1), which the
  // roles reach from their own code: the unaligned barrier.sync (the aligned bar.sync, as
  // __syncthreads, wants one instruction for all its waiters; synccheck on the H200 reported every
  // round of bar.sync 1, 384 here as divergent, bench/results/gpu_h200.md). The emulator checks
  // each call's own line (APE_CALLER_SITE).
  auto block_sync = [](APE_CALLER_SITE) {
    if constexpr (C::kProducer) ptx::bar_sync_unaligned(1, C::kBlockThreads APE_PASS_SITE);
    else __syncthreads(APE_SITE_ONLY);
  };
  // The query tiles of the block's steps: [qt0, qt_plain) and [n_full, n_qt) masked (the diagonal,
  // a partial last tile), [qt_sat, n_full) saturated (a distance bias: every distance >= d_sat,
  // dist_sat_kernel).
  constexpr bool kSatSteps = flash_distance<Enc>() && !traits::BiasFixed<Enc>::value;
  // (A score mod over features: [qt_sat, n_full) its feature steps, flash_feature_steps.)
  constexpr bool kFeat = flash_feature_steps<Enc>();
  const int64_t n_full = T / BQ;
  int64_t qt_plain = (j0 + BK - 1 + BQ - 1) / BQ;  // first tile with i0 >= j0 + BK - 1
  if (qt_plain > n_full) qt_plain = n_full;
  int64_t qt_sat = n_full;
  if constexpr (kSatSteps || kFeat) {  // (feature steps turned off: no dist_sat)
    qt_sat = kFeat && !p.dist_sat ? n_full : (p.dist_sat[bh] + j0 + BK - 1 + BQ - 1) / BQ;
    qt_sat = qt_sat < qt_plain ? qt_plain : qt_sat > n_full ? n_full : qt_sat;
  }
  // Whether step qt (masked, saturated) opens with a block barrier. The first step does (a masked
  // one: its tile holds the diagonal, so the unmasked steps' code has no test of it): the
  // cp.async copies of every thread before it (K', V, the parameters, a row/column bias's
  // values) become everyone's there. The mma.sync layouts' every step does: their Q', dO and row
  // statistics are every thread's cp.async. With wgmma, a later step needs none of that (each
  // thread waits on the step's mbarrier for the producer's copies), and the barrier that ended
  // the step before orders its shared memory: but for the sums a step writes before its second
  // barrier and reads after its third (a trained distance bias's diagonal sums outside the
  // saturated steps, value rows' masses, the feature steps' row sums and features), whose next
  // writes must wait for every thread's reads.
  // So does a step after one that stored its dQ' tile with plain stores (the first key tile on
  // the query tile, first_on below: its consumers store after the step's last barrier), whose
  // turn releases that tile to the next key tile's TMA reduction: the stores must precede it.
  auto stored_before = [&](int64_t qt) {
    const int64_t i_end = qt * BQ < T ? qt * BQ : T;  // query tile qt - 1's end
    return qt > qt0 && ordered() && (i_end - 1) / BK == kt;
  };
  auto opens_with_barrier = [&](int64_t qt, bool masked, bool sat) {
    return !kWg || (masked && qt == qt0) || value_table_trains<Enc>() || (kSatSteps && !sat) || kFeat ||
           stored_before(qt);
  };
  // The block's turn on query tile qt (dQ' in the semaphores' order), taken by one thread before
  // the step's barrier before dQ' (the consumers' thread 0 after the step's first barrier, or the
  // producer's after the barrier that ended the step before): the last step's
  // TMA reduction waited for (kDqTma), the semaphore polled (`turn`: a value read before, or -1),
  // acquired, and qt - 1 released.
  auto take_turn = [&](int64_t qt, int turn) {
    // kDqTma: the last step's TMA reduction (issued a step's products ago) has read the dQ' rows
    // (the barrier below frees them for this step's) and, in order, added them: its sums then
    // precede the release of qt - 1 below.
    if constexpr (kDqTma) {
      if (ordered()) ptx::bulk_wait<0>(), ptx::fence_proxy_async_global();
      else ptx::bulk_wait_read<0>();
    }
    if (ordered()) {  // our turn for qt: the higher key tiles have added
      const int64_t i0 = qt * BQ, i_last = (i0 + BQ < T ? i0 + BQ : T) - 1;
      const int target = static_cast<int>(i_last / BK) - kt;
      while (turn != target) turn = ptx::ld_relaxed_gpu(sem + qt);
      // Acquire (their adds to qt before ours) and release: every thread's adds to qt - 1 came
      // before this step's first barrier, and they were issued a step ago, so the fence has
      // little to wait for. Releasing qt - 1 here rather than at the step's start delays the
      // block below by half a step, which the steps it trails by absorb.
      ptx::fence_acq_rel_gpu();
      if constexpr (kDqTma) ptx::fence_proxy_async_global();  // our TMA reduction after their adds
      if (qt > qt0) ptx::red_relaxed_gpu_add(sem + qt - 1, 1);
    }
  };
  // Whether a step adds its dQ' tile by a reduction (kDqTma: the staged tile's TMA reductions):
  // the first key tile to reach the query tile stores it instead, and key tile 0, the last, writes
  // dq itself where dq = dQ' (p.dq_direct); both in 16-byte chunks by every consumer thread. A
  // block is first on the query tiles of its diagonal only, masked steps.
  auto first_on = [&](int64_t qt, bool masked) {
    const int64_t i_end = qt * BQ + BQ < T ? qt * BQ + BQ : T;
    return masked && (i_end - 1) / BK == kt && ordered();
  };
  auto writes_dq = [&] { return kt == 0 && p.dq_direct; };
  // kDqTma: the staged dQ' tile of query tile qt added to dQ' (thread 0 of the consumers, or the
  // producer's): one TMA reduction per box of 32 columns (bulk reductions of whole 128-byte rows,
  // no per-thread atomics; rows past T are not written), waited on at the next step's turn or at
  // the kernel's end.
  [[maybe_unused]] float *sDQ = reinterpret_cast<float *>(smem + C::dqs);
  [[maybe_unused]] auto reduce_dq = [&](int64_t qt) {
    #pragma unroll
    for (int bx = 0; bx < D / 32; ++bx)
      ptx::tma_reduce_add_3d(&maps.dq, sDQ + bx * (BQ * 32), 32 * bx, static_cast<int>(qt * BQ), static_cast<int>(bh));
    ptx::bulk_commit();
  };
  // After the last step's barrier: its TMA reduction complete, the last query tile released.
  auto release_last = [&] {
    if constexpr (kDqTma) ptx::bulk_wait<0>(), ptx::fence_proxy_async_global();  // the last TMA reduction
    if (ordered()) {
      ptx::fence_acq_rel_gpu();
      ptx::red_relaxed_gpu_add(sem + n_qt - 1, 1);
    }
  };
  [[maybe_unused]] uint64_t *bars = reinterpret_cast<uint64_t *>(smem + C::bars);
  if constexpr (C::kProducer) {
    // kBwdWgmma's producer warpgroup (FlashAttention-3's form): its warp 0 loads each step's Q'
    // and dO tiles by TMA, its rows' lse and Delta (and a distance bias's window) by bulk copies,
    // into the double buffers (their mbarriers: phase the buffer's fills so far, mod 2), two
    // steps ahead; its warp 1 takes the block's turns on the query tiles and adds the staged dQ'
    // tiles by TMA reductions. The consumers keep their products and element-wise work only: the
    // copies' issue code, the semaphore's polls and fences and the reductions' waits leave their
    // instruction stream (thread 0 ran them there, and its warpgroup waited for it). All
    // four warps pass every block barrier with the consumers (two a step, three where a step
    // opens with one: opens_with_barrier; one before the saturated steps where a distance bias
    // has them, one after the last), which order the producer's work exactly as they ordered
    // thread 0's. It keeps 24 registers and gives the
    // rest to the consumers (setmaxnreg: 240 each).
    if (threadIdx.x == 0) {
      ptx::mbar_init(bars, 1);
      ptx::mbar_init(bars + 1, 1);
      ptx::mbar_init_fence();
    }
    block_sync();  // the mbarriers initialised before anyone uses them (the consumers wait before their first barrier)
    if (warp >= C::kWarps) {
      ptx::setmaxnreg_dec<24>();
      const int role = warp - C::kWarps;
      const bool lead = lane == 0;
      In *pQ = reinterpret_cast<In *>(smem + C::q), *pDO = reinterpret_cast<In *>(smem + C::dout);
      // A step's operands on the buffer's mbarrier: Q' and dO by TMA, the rows' lse and Delta
      // and (a distance bias) the step's window of B(d) / scale by bulk copies (16-byte aligned:
      // the rows' strides are multiples of 4 floats, i0 of BQ, j0 of BK).
      auto tma_q_dout = [&](int b, int64_t qt) {
        constexpr bool kDist = flash_distance<Enc>();
        constexpr unsigned kStats = 2u * sizeof(float) * BQ, kBias = kDist ? sizeof(float) * C::kDistLen : 0u;
        ptx::mbar_arrive_expect_tx(bars + b, 2u * sizeof(In) * BQ * D + kStats + kBias);
        hopper::tma_tile<BQ, D>(pQ + b * BQ * D, &maps.q, qt * BQ, bh, bars + b);
        hopper::tma_tile<BQ, D>(pDO + b * BQ * D, &maps.dout, qt * BQ, bh, bars + b);
        const float *stats = p.stats + 2 * bh * p.stats_ld + qt * BQ;
        ptx::bulk_copy(sLse + b * BQ, stats, kStats / 2, bars + b);
        ptx::bulk_copy(sDelta + b * BQ, stats + p.stats_ld, kStats / 2, bars + b);
        if constexpr (kDist)  // distances i0 - j0 - BK + x, x < BQ + BK (dist_table_kernel's pads)
          ptx::bulk_copy(reinterpret_cast<float *>(smem + C::dist) + b * C::kDistLen,
                         p.dist + bh * p.dist_ld + kDistPad + (qt * BQ - j0 - BK), kBias, bars + b);
      };
      if (role == 0 && lead) {  // both buffers at once
        tma_q_dout(0, qt0);
        if (qt0 + 1 < n_qt) tma_q_dout(1, qt0 + 1);
      }
      for (int64_t qt = qt0; qt < n_qt; ++qt) {
        if constexpr (kSatSteps)
          if (qt == qt_sat && qt_sat < n_full) block_sync();  // the consumers' before the saturated steps
        const bool masked = qt < qt_plain || qt >= n_full, sat = kSatSteps && qt >= qt_sat && !masked;
        if (opens_with_barrier(qt, masked, sat)) block_sync();  // the step's first
        if (role == 1 && lead) take_turn(qt, -1);
        block_sync();  // dS^T complete (the consumers' products read it after), the turn ours
        block_sync();  // the staged dQ' tile complete
        if (role == 1 && lead && !(first_on(qt, masked) || writes_dq())) reduce_dq(qt);
        // This step's buffer for step qt + 2: every product that reads it (S^T, dP^T, dV, dK')
        // completed before the barrier above, and so did every read of its lse, Delta and bias
        // window (P^T and dS^T, before the barrier before), so the copy runs under the rest of this
        // step and the next one.
        if (role == 0 && lead && qt + 2 < n_qt) tma_q_dout(static_cast<int>((qt - qt0) & 1), qt + 2);
      }
      block_sync();  // every consumer's adds to the last query tile
      if (role == 1 && lead) release_last();
      return;
    }
    ptx::setmaxnreg_inc<240>();
  }
  DevCtx<Enc> ctx = make_ctx(p, bh, true);
  static_assert(flash_bwd_bytes<Enc, C>() <= C::kLimit, "backward tiles exceed the shared memory of a block");
  // Value rows: the step's masses (flash_bwd_mass_bytes), zero between steps; then the cache.
  constexpr int64_t kVR = value_rows<Enc>();
  [[maybe_unused]] unsigned long long *sMass = reinterpret_cast<unsigned long long *>(smem + flash_smem_bytes<Enc, C>());
  if constexpr (value_table_trains<Enc>())  // used after the first step's barrier
    for (int x = static_cast<int>(threadIdx.x); x < 2 * BQ * kVR; x += C::kThreads) sMass[x] = 0;
  [[maybe_unused]] unsigned char *cache = smem + flash_bwd_bytes<Enc, C>();
  if constexpr (flash_param_cache<Enc>())  // used after the first step's barrier
    ParamCache<Enc>::stage(p, cache, ctx, true, C::kThreads);  // (the consumers)
  // A score mod of the general form (neither a distance nor a row/column bias) whose gradient
  // adds to per-token sums for each element (relative rows: Transformer-XL, DeBERTa; token sums:
  // K-Cable): every lane calls it at once and the sinks are warp collectives (WarpFixedRef), so
  // the lanes adding to one element (one query's sum: 8 lanes of a call; a key's: 4; a relative
  // row at a saturated distance) issue one pair of atomics. Not for parameters alone (FIRE's
  // MLP): those sum in shared memory (ParamCache), and the emulated suite would pay 20x its time
  // for the collectives (docs/cuda.md).
  // Value rows take this path too, with or without a score mod (their masses sum in shared memory).
  constexpr bool kWarpSinks = flash_warp_sinks<Enc>();
  using SinkCtx = std::conditional_t<kWarpSinks, WarpDevCtx<Enc>, DevCtx<Enc>>;
  [[maybe_unused]] const SinkCtx sink_ctx(ctx);
  // A score mod over features (flash_feature_steps): the features of the lane's keys kr0 + g + 8 h
  // (clamped into [0, T): a block with feature steps has all its keys there) and of the slice, in
  // registers, and the sums of their gradients over the block's feature steps; the row features
  // of a step's queries (sRF) and the warps' sums of their gradients (sRG) in shared memory, by
  // step parity; the value row of every saturated distance.
  constexpr int kRF = feat_count<Enc>(0), kCF = feat_count<Enc>(1), kSF = feat_count<Enc>(2);
  constexpr int kRV = feat_row_vals<Enc>(), kRS = feat_row_sums<Enc>();
  [[maybe_unused]] float cfv[2][kCF > 0 ? kCF : 1] = {}, cacc[2][kCF > 0 ? kCF : 1] = {};
  [[maybe_unused]] float sfv[kSF > 0 ? kSF : 1] = {}, sacc[kSF > 0 ? kSF : 1] = {};
  [[maybe_unused]] float *sRF = reinterpret_cast<float *>(smem + flash_smem_bytes<Enc, C>() + flash_bwd_mass_bytes<Enc, C>());
  [[maybe_unused]] float *sRG = sRF + 2 * BQ * kRV;
  [[maybe_unused]] int64_t vsat = 0;
  if constexpr (kFeat) {
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t j = j0 + kr0 + g + 8 * h;
      if constexpr (kCF > 0) Enc::col_features(ctx, j < T ? j : T - 1, T - 1, cfv[h]);
    }
    if constexpr (kSF > 0) Enc::slice_features(ctx, 0, T - 1, sfv);
    if constexpr (kVR > 0) vsat = Enc::value_row(ctx, T - 1, 0);
  }
  // Query tile qn's row features (and dO_i . table[r_sat]) into its buffer, by thread x < BQ.
  [[maybe_unused]] auto fill_rows = [&](int64_t qn, int x) {
    const int64_t i = qn * BQ + x;
    float *dst = sRF + ((qn - qt0) & 1) * BQ * kRV + x * kRV;
    if constexpr (kRF > 0) {
      float f[kRF > 0 ? kRF : 1];
      Enc::row_features(ctx, i, T - 1, f);
      #pragma unroll
      for (int a = 0; a < kRF; ++a) dst[a] = f[a];
    }
    if constexpr (kVR > 0) dst[kRF] = p.vdrow[(bh * T + i) * kVR + vsat];
  };
  // Feature step qp's sums for query x over the warps (in order), into the features' elements.
  [[maybe_unused]] auto flush_rows = [&](int64_t qp, int x) {
    const float *src = sRG + ((qp - qt0) & 1) * C::kWarps * BQ * kRS;
    float sum[kRS > 0 ? kRS : 1] = {};
    for (int w = 0; w < C::kWarps; ++w)
      #pragma unroll
      for (int a = 0; a < kRS; ++a) sum[a] += src[(w * BQ + x) * kRS + a];
    const int64_t i = qp * BQ + x;
    if constexpr (kRF > 0) Enc::row_features_grad(ctx, i, T - 1, static_cast<const float *>(sum));
    if constexpr (value_table_trains<Enc>()) ctx.vmass[i * kVR + vsat] += sum[kRF];
  };
  // Distance bias: B(i - j) / scale of query tile qt at x = c - kr + BK (i - j = i0 - j0 + c - kr)
  // in window (qt - qt0) & 1, copied from the slice's table ahead like Q' and dO (the
  // window starts at distance i0 - j0 - BK, a multiple of BQ); the initial value of the S^T
  // accumulators, as in the forward. 0 outside [0, T) (masked elements).
  constexpr bool kDist = flash_distance<Enc>();
  constexpr bool kRC = flash_rowcol<Enc>();
  constexpr bool kRaw = (!Enc::kHasScoreMod && kVR == 0) || kDist || kRC;  // S^T in raw-score units
  // Without a score mod of its own (kRaw, kRC) the kernel computes P' = scale P (the host
  // launches it with scale > 0: lse is kept as lse log2 e - log2 scale) and starts the dP^T
  // accumulators at -Delta, so that dS = P' (dP - Delta) is one FMUL; dV accumulates scale dV
  // (1 / scale at the end), the bias sums scale P (dP - Delta).
  constexpr bool kScaledP = kRaw;
  // With wgmma and no score mod of its own (kRaw), P^T = 2^(S^T kf - lse') is formed while the
  // tensor cores still compute dP^T.
  constexpr bool kEarlyP = kWg && kRaw;
  static_assert(kScaledP == flash_scaled_p<Enc>(), "row_stats_kernel's units");
  static_assert(!kSq || (kRaw && kVR == 0 && !kWg && C::kSubs == 1),
                "kBwdSquare: encodings without a score mod of their own, or with a distance or row/column "
                "bias, and without value rows (flash_bwd_square)");
  const float kf = p.scale * kLog2e;  // kRaw: P' = 2^(s kf - lse')
  float *sB = reinterpret_cast<float *>(smem + C::dist), *sG = reinterpret_cast<float *>(smem + C::gsum);
  [[maybe_unused]] float *sAcc = reinterpret_cast<float *>(smem + C::dacc);
  [[maybe_unused]] const float *dist_bh = p.dist + bh * p.dist_ld + kDistPad;
  auto fill_bias = [&](int64_t qt, int buf) {
    if constexpr (kDist) {
      static_assert(C::kDistLen % 4 == 0 && C::kDistLen / 4 <= C::kThreads, "one chunk per thread");
      const int x = static_cast<int>(threadIdx.x);
      if (x < C::kDistLen / 4)
        ptx::cp_async_16(sB + buf * C::kDistLen + 4 * x, dist_bh + (qt * BQ - j0 - BK) + 4 * x);
    }
  };
  if constexpr (kDist && !kWg) fill_bias(qt0, 0);
  // Row/column bias: C(j0 + kr) / scale at sC[kr] for the whole block, the initial value of S^T's
  // key rows; R(i) is a constant of query row i, so it goes into the row's lse (load_row_stats).
  // The query rows' sums of scale P (dP - Delta) over the block's keys are added to the rows' fp32
  // sums in p.row_g during the block's turn on the query tile (the dQ' order: deterministic
  // without fixed point; row_grad_kernel makes the calls). R's gradient is 0 in exact arithmetic,
  // but it carries the rounding of Delta that the key sums carry too, and the two cancel
  // downstream: it is summed like the rest. The key sums stay in an accumulator over the block's
  // steps (col_acc below).
  // A bias without a gradient (Enc::kBiasFixed: ALiBi's standard slopes) needs none of the sums.
  constexpr bool kBiasGrad = !traits::BiasFixed<Enc>::value;
  float *sC = reinterpret_cast<float *>(smem + C::rowcol);
  if constexpr (kRC && kBiasGrad)
    if (threadIdx.x < 4) {  // read after the first step's barrier
      const uint32_t one2 = flash::pack2<In>(1.f, 1.f);
      memcpy(smem + C::ones + 4 * threadIdx.x, &one2, 4);
    }
  static_assert(BK / 4 <= C::kThreads, "one chunk per thread");
  // The slice's fixed-point sum of distance d (formed where used: no pointers live in the loop).
  [[maybe_unused]] auto dist_g = [&](int64_t d) {
    return FixedRef{p.dist_g + 2 * (bh * p.T + d), p.status};
  };
  if constexpr (kDist && kBiasGrad) {
    for (int x = static_cast<int>(threadIdx.x); x < C::kDistAcc; x += C::kThreads) sAcc[x] = 0.f;
    for (int x = static_cast<int>(threadIdx.x); x < 2 * C::kWarps * C::kDiagLen; x += C::kThreads)
      sG[x] = 0.f;  // diag_partials' sets
  }
  // Row/column bias sums on the tensor cores: dS (rounded to In, as dQ' and dK' use it) times a
  // column of ones, an extra n8 tile of the dK' product (key sums, over the block's steps) and
  // of the dQ' product (query rows' sums over the block's keys, by the warps of the first column
  // slice).
  [[maybe_unused]] float col_acc[kKM][4] = {};  // (kBwdSquare: by the warps of the first column half)
  // The ones: every lane's ldmatrix row is the same 16 bytes (a fresh register pair per use, no
  // copies of one register into pairs).
  [[maybe_unused]] const ptx::SmemAddr lOnes = ptx::smem_addr_of(smem + C::ones);
  [[maybe_unused]] auto ones = [&](uint32_t (&b)[4]) { ptx::ldmatrix_at<4>(b, lOnes); };
  [[maybe_unused]] const float *rc_bh = p.rc + 2 * bh * p.rc_ld;
  if constexpr (kRC) {
    const int x = static_cast<int>(threadIdx.x);
    if (x < BK / 4) ptx::cp_async_16(sC + 4 * x, rc_bh + p.rc_ld + j0 + 4 * x);
  }

  // The tiles in mma.sync's swizzle (flash::Swizzle) or wgmma's canonical layout (hopper::).
  auto load_tile = [&](auto rows, In *tile, const In *g, int64_t row0) {
    constexpr int R = decltype(rows)::value;
    if constexpr (kWg) hopper::load_tile_async<R, D, C::kThreads>(tile, g, row0, T);
    else flash::load_tile_async<R, D, C::kThreads>(tile, g, row0, T);
  };
  using KRows = std::integral_constant<int, BK>;
  using QRows = std::integral_constant<int, BQ>;
  // wgmma: the producer warpgroup loads each step's Q' and dO tiles by TMA into the buffer's half,
  // completing on its mbarrier `bars` (phase: the buffer's fills so far, mod 2); everything else
  // is cp.async.
  // (k' and v of the slice's key head: bh / k_group, bh / v_group)
  load_tile(KRows{}, sK, p.km + bh / p.k_group * T * D, j0);
  load_tile(KRows{}, sV, p.v + bh / p.v_group * T * D, j0);
  if constexpr (!kWg) {
    load_tile(QRows{}, sQ, p.qm + base, qt0 * BQ);
    load_tile(QRows{}, sDO, p.dout + base, qt0 * BQ);
  }
  if constexpr (!kWg) load_row_stats<BQ, C::kThreads>(sLse, sDelta, p.stats + 2 * bh * p.stats_ld, p.stats_ld, qt0 * BQ);
  ptx::cp_async_commit();

  // ldmatrix lane bases (cuda/flash_tile.cuh); the other buffer is BQ D elements on.
  const ptx::SmemAddr lK = flash::lane_base<D, flash::kRowsByQuad>(sK);   // A of S^T, B of dQ
  const ptx::SmemAddr lV = flash::lane_base<D, flash::kRowsByQuad>(sV);   // A of dP^T
  const ptx::SmemAddr lQn = flash::lane_base<D, flash::kColsByQuad>(sQ);  // B of S^T
  const ptx::SmemAddr lDOn = flash::lane_base<D, flash::kColsByQuad>(sDO);
  const ptx::SmemAddr lQk = flash::lane_base<D, flash::kRowsByQuad>(sQ);  // B of dK
  const ptx::SmemAddr lDOk = flash::lane_base<D, flash::kRowsByQuad>(sDO);
  const ptx::SmemAddr lDS = flash::lane_base<BQ, flash::kColsByQuad>(sDS);
  // kBwdSquare: the lane bases with the warp's rows added and its columns XORed in (a row offset is
  // a multiple of 8 rows, which keeps the swizzle's phase, and adds whole rows; a column offset is
  // a multiple of the columns its fragment offsets span, so the XORs combine): every fragment
  // offset below is then a compile-time constant.
  [[maybe_unused]] ptx::SmemAddr sqK = 0, sqV = 0, sqQn = 0, sqDOn = 0, sqP = 0, sqDSk = 0, sqQk = 0, sqDOk = 0,
                                 sqDSt = 0, sqKq = 0;
  if constexpr (kSq) {
    const auto rows = [](ptx::SmemAddr l, int row_elems, int r0) {
      return l + static_cast<ptx::SmemAddr>(2 * row_elems * r0);
    };
    const auto cols = [](ptx::SmemAddr l, int c0) { return l ^ static_cast<ptx::SmemAddr>(2 * c0); };
    sqK = rows(lK, D, kr0), sqV = rows(lV, D, kr0);          // A of S^T, dP^T
    sqQn = rows(lQn, D, sc0), sqDOn = rows(lDOn, D, sc0);    // B of S^T, dP^T
    sqP = rows(flash::lane_base<BQ, flash::kRowsByQuad>(smem + C::ps), BQ, kr0);  // A of dV
    sqDSk = rows(flash::lane_base<BQ, flash::kRowsByQuad>(sDS), BQ, kr0);         // A of dK'
    sqQk = cols(lQk, dc0), sqDOk = cols(lDOk, dc0);          // B of dK', dV
    sqDSt = cols(lDS, qr0), sqKq = cols(lK, qc0);            // A, B of dQ'
  }
  float dk[kDT][4] = {}, dv[kDT][4] = {};
  // wgmma (kWg): warpgroup wg = warp / 4 owns keys [64 wg, 64 wg + 64) of the block, so that each
  // warp's accumulator rows are its 16 keys, as with mma.sync, and every element-wise step below
  // is shared. Descriptors of the operands, by role (the Q' and dO buffers are bo bytes on):
  //   S^T = K'_wg Q'^T, dP^T = V_wg dO^T      A K-major (the warpgroup's rows), B K-major
  //   dV += P^T dO, dK' += dS^T Q'            A from registers, B MN-major
  //   dQ'(:, half wg) = dS K'(:, half wg)     A = dS^T's tile read MN-major, B MN-major
  [[maybe_unused]] hopper::Desc wK, wV, wQk, wDOk, wQm, wDOm, wDS, wKm;
  if constexpr (kWg) {
    // Through a shuffle, so that the compiler knows it uniform across the warp: the descriptors
    // below then live in uniform registers, with no R2UR moves before each wgmma in the loop.
    // (At D = 128 this once moved 84-560 bytes of spills into the loop; since dS^T goes by
    // stmatrix it takes RoPE's loop from 731 to 686 instructions without spills.)
    const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);
    wK = hopper::desc_k<D>(ptx::smem_window_offset(sK) + uint32_t(64 * wg * 128));
    wV = hopper::desc_k<D>(ptx::smem_window_offset(sV) + uint32_t(64 * wg * 128));
    wQk = hopper::desc_k<D>(ptx::smem_window_offset(sQ));
    wDOk = hopper::desc_k<D>(ptx::smem_window_offset(sDO));
    wQm = hopper::desc_mn<BQ, D>(ptx::smem_window_offset(sQ));
    wDOm = hopper::desc_mn<BQ, D>(ptx::smem_window_offset(sDO));
    wDS = hopper::desc_mn<BK, BQ>(ptx::smem_window_offset(sDS));
    // Columns [wg D / 2, ...) of K': the second box at D = 128, 64 bytes into each row at D = 64.
    wKm = hopper::desc_mn<BK, D>(ptx::smem_window_offset(sK) + uint32_t(D == 128 ? wg * BK * 128 : wg * 64));
  }
  // The staging rows of a step's fp32 dQ' tile (BQ x D): rows [0, BQ/2) in the step's Q' buffer,
  // the rest in its dO buffer (each BQ D 16-bit elements: BQ/2 rows of D floats). 16-byte chunk k
  // of row r sits at chunk k ^ swz(r): the fragment stores (8 bytes, rows g of a quad's lanes) and
  // the chunk reads (one row per 8 lanes) are free of bank conflicts.
  static_assert(sizeof(In) == 2 && BQ % 16 == 0 && D >= 32, "staging rows in the 16-bit buffers");
  auto dq_stage = [&](int b, int r, int k) -> float * {
    In *half = (r < BQ / 2 ? sQ : sDO) + b * BQ * D;
    const int swz = ((r & 7) << 1) & (D / 4 - 1);
    return reinterpret_cast<float *>(half) + (r % (BQ / 2)) * D + 4 * (k ^ swz);
  };
  // kDqTma: element (r, c) of the step's fp32 dQ' tile in its own rows (BwdTiles::dqs), the boxes
  // of 32 columns that the TMA reduction reads (16-byte chunk k of row r at chunk k ^ (r mod 8)).
  [[maybe_unused]] auto dq_box = [&](int r, int c) -> float * {
    return sDQ + (c / 32) * (BQ * 32) + r * 32 + 4 * (((c % 32) / 4) ^ (r & 7)) + c % 4;
  };
  // kBwdSquare: acc[4 m + n] += A_m B_n over kK steps of 16 (a warp's 32 x 32 tile: m16 tiles m =
  // 0, 1, n8 tiles n = 0..3), load_a(a, m, kk) the A fragment of tile m, load_b(b, n, kk) the B
  // fragments of tiles n and n + 1 (n even).
  [[maybe_unused]] auto sq_product = [](float(&acc)[8][4], auto k_steps, auto load_a, auto load_b) {
    #pragma unroll
    for (int kk = 0; kk < decltype(k_steps)::value; ++kk) {
      uint32_t a[2][4];
      #pragma unroll
      for (int m = 0; m < 2; ++m) load_a(a[m], m, kk);
      #pragma unroll
      for (int n = 0; n < 4; n += 2) {
        uint32_t b[4];
        load_b(b, n, kk);
        #pragma unroll
        for (int m = 0; m < 2; ++m) {
          flash::mma<In>(acc[4 * m + n], a[m], b);
          flash::mma<In>(acc[4 * m + n + 1], a[m], b + 2);
        }
      }
    }
  };
  // A saturated step (kSat: every distance of the tile >= the slice's d_sat, unmasked) adds its
  // dS to one fp32 sum per thread instead of its diagonals' sums.
  auto step = [&](int64_t qt, auto masked, auto sat, [[maybe_unused]] float &sat_sum) {
    constexpr bool kMasked = decltype(masked)::value, kSat = decltype(sat)::value;
    const int buf = static_cast<int>((qt - qt0) & 1);
    const int64_t i0 = qt * BQ;
    ptx::cp_async_wait<0>();
    if constexpr (kWg) {
      ptx::mbar_wait(bars + buf, static_cast<unsigned>((qt - qt0) >> 1) & 1u);  // Q', dO, lse, Delta (B) of tile qt
      ptx::fence_proxy_async();  // the cp.async copies (K', V), for wgmma's reads
    }
    // Tile qt landed; every warp is done with the other buffers and with sDS. (The mma.sync
    // layouts' call apart: through the lambda, ptxas's allocation of their code moved.)
    if constexpr (!kWg) block_sync();
    else if (opens_with_barrier(qt, kMasked, kSat)) block_sync();
    // Thread 0 reads qt's semaphore now and uses the value at our turn, a step's GEMMs later: in
    // steady state the higher key tiles are steps ahead and the turn costs no round trip to L2.
    // (Not in the narrow layout, whose registers are spent: the register would spill there; nor
    // with a producer warpgroup, which takes the turns.)
    [[maybe_unused]] int turn = -1;
    if constexpr (C::kWarps == 8 && !C::kProducer)
      if (threadIdx.x == 0 && ordered()) turn = ptx::ld_relaxed_gpu(sem + qt);
    if constexpr (kFeat) {  // the sums of the step before and the next tile's features, if feature steps
      const int x = static_cast<int>(threadIdx.x);
      if (x < BQ) {
        if (qt - 1 >= qt_sat && qt - 1 < n_full) flush_rows(qt - 1, x);
        if (qt + 1 >= qt_sat && qt + 1 < n_full) fill_rows(qt + 1, x);
      }
    }
    if constexpr (!kWg) {  // (wgmma: the producer's copies)
      if (qt + 1 < n_qt) {
        const int nb = buf ^ 1;
        load_tile(QRows{}, sQ + nb * BQ * D, p.qm + base, i0 + BQ);
        load_tile(QRows{}, sDO + nb * BQ * D, p.dout + base, i0 + BQ);
        load_row_stats<BQ, C::kThreads>(sLse + nb * BQ, sDelta + nb * BQ,
                                         p.stats + 2 * bh * p.stats_ld, p.stats_ld, i0 + BQ);
        if constexpr (kDist) fill_bias(qt + 1, nb);
      }
      ptx::cp_async_commit();
    }
    const int bo = buf * 2 * BQ * D;  // the buffer's byte offset
    const float *cLse = sLse + buf * BQ, *cDelta = sDelta + buf * BQ;

    // B at c - kr + BK: this lane's base, plus 8 nt + e - 8 h (immediates).
    [[maybe_unused]] const float *tb = sB + buf * C::kDistLen + (2 * t - kr0 - g + BK);
    // S^T = K' Q'^T (+ B / scale), dP^T = V dO^T (- Delta with kScaledP: cDelta holds -Delta)
    // (this warp's 16 keys x the sub-tile's kSub queries: BQ but in kBwdWideSub).
    const int dlt = static_cast<int>(i0 - j0);  // >= 0: the first query tile starts at j0
    const int cols = static_cast<int>(T - i0 < BQ ? T - i0 : BQ);
    [[maybe_unused]] float cq[4] = {};  // C / scale of the thread's keys, as an accumulator
    if constexpr (kRC) cq[0] = cq[1] = sC[kr0 + g], cq[2] = cq[3] = sC[kr0 + g + 8];
    // kWg: read by the dV and dK' wgmmas until their wait (before the step's second barrier at D =
    // 128, after dQ' at 64).
    [[maybe_unused]] uint32_t pa[kNT / 2][4], dsa[kNT / 2][4];
    // The diagonal sums' group that a sub-tile shares with the next (diag_partials).
    [[maybe_unused]] float dcarry[2] = {};
    // The step's sub-tiles (C::kSubs of kSub queries, columns c0 ..; one, but in kBwdWideSub):
    // the arrays below hold one sub-tile's.
    if constexpr (kSq) {
      // kBwdSquare: S^T and dP^T for keys [kr0, kr0 + 32) x queries [sc0, sc0 + 32) (tile
      // 4 m + nt: m16 tile m, n8 tile nt), P^T and dS^T (no score mod of its own: kScaledP) into
      // their tiles in shared memory for the products after the barrier.
      // One product after the other (not interleaved as in the other layouts): the A fragments
      // of one in registers beside the 128 of dK' and dV. S^T starts at the bias (kDist: B / scale
      // at x = c - kr + BK of the window, kRC: C / scale of the key row), as in the wide layout.
      float s[8][4] = {}, dp[8][4];
      #pragma unroll
      for (int x = 0; x < 32; ++x) {
        [[maybe_unused]] const int m = x / 16, nt = x / 4 % 4, h = x % 4 / 2, e = x % 2;
        if constexpr (kDist) s[x / 4][x % 4] = tb[sc0 + 8 * nt + e - 8 * h - 16 * m];
        if constexpr (kRC) s[x / 4][x % 4] = sC[kr0 + 16 * m + g + 8 * h];
      }
      auto st_product = [&](float(&acc)[8][4], ptx::SmemAddr lA, ptx::SmemAddr lB) {
        sq_product(acc, std::integral_constant<int, D / 16>{},
                   [&](uint32_t(&a)[4], int m, int kk) { flash::ldsm_a(a, flash::frag_at<D>(lA, 16 * m, 16 * kk)); },
                   [&](uint32_t(&b)[4], int n, int kk) { flash::ldsm_b_nk(b, flash::frag_at<D>(lB, 8 * n, 16 * kk)); });
      };
      st_product(s, sqK, sqQn + bo);
      #pragma unroll
      for (int x = 0; x < 32; ++x) dp[x / 4][x % 4] = cDelta[sc0 + 8 * (x / 4 % 4) + 2 * t + x % 2];
      st_product(dp, sqV, sqDOn + bo);
      In *sP = reinterpret_cast<In *>(smem + C::ps);
      // P^T and dS^T of m16 tile m, rows g + 8 h, n8 tile nt: this lane's pair of each, packed.
      auto p_ds = [&](int m, int h, int nt, uint32_t &p2, uint32_t &ds2) {
        const int kr = kr0 + 16 * m + g + 8 * h;
        float pv[2], dsv[2];
        #pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = sc0 + 8 * nt + 2 * t + e;
          pv[e] = ptx::ex2(fmaf(s[4 * m + nt][2 * h + e], kf, -cLse[c]));
          if constexpr (kMasked) pv[e] = kr - c <= dlt && c < cols ? pv[e] : 0.f;
          dsv[e] = pv[e] * dp[4 * m + nt][2 * h + e];
          dp[4 * m + nt][2 * h + e] = dsv[e];  // for the distance sums
          if constexpr (kSat) sat_sum += dsv[e];
        }
        p2 = flash::pack2<In>(pv[0], pv[1]), ds2 = flash::pack2<In>(dsv[0], dsv[1]);
      };
      if (ptx::sm90_code(p.sm90)) {
        // sm_90: a 16 x 16 tile (m, n8 tiles 2 np and 2 np + 1) of each by one stmatrix: its four
        // 8 x 8 matrices are (h, nt) = (0, 2 np), (1, 2 np), (0, 2 np + 1), (1, 2 np + 1), and lane
        // l gives row l % 8 of matrix l / 8. 8 stores and 2 addresses where 32-bit stores take 32
        // and 16 addresses.
        const int sr = kr0 + lane % 8 + 8 * (lane / 8 % 2), scs = sc0 + 8 * (lane / 16);
        #pragma unroll
        for (int m = 0; m < 2; ++m)
          #pragma unroll
          for (int np = 0; np < 2; ++np) {
            uint32_t pr[4], dr[4];
            #pragma unroll
            for (int x = 0; x < 4; ++x) p_ds(m, x % 2, 2 * np + x / 2, pr[x], dr[x]);
            const int off = flash::Swizzle<BQ>::offset(sr + 16 * m, scs + 16 * np);
            ptx::stmatrix_x4(sP + off, pr);
            ptx::stmatrix_x4(sDS + off, dr);
          }
      } else {
        #pragma unroll
        for (int m = 0; m < 2; ++m)
          #pragma unroll
          for (int h = 0; h < 2; ++h)
            #pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
              uint32_t p2, ds2;
              p_ds(m, h, nt, p2, ds2);
              const int off = flash::Swizzle<BQ>::offset(kr0 + 16 * m + g + 8 * h, sc0 + 8 * nt + 2 * t);
              memcpy(sP + off, &p2, 4);
              memcpy(sDS + off, &ds2, 4);
            }
      }
      // The warp's diagonal sums of dS into its two sets: its 32 x 32 tile as one 16 x 48 tile of
      // the same diagonals (key row kr0 + 16 + r, query column c is on the diagonal of row kr0 + r
      // and column c - 16): n8 tile n of the 16 x 48 holds m16 tile 1's n8 tile n (n < 4) plus m16
      // tile 0's n8 tile n - 2 (n >= 2), its column 0 at query column sc0 - 16.
      if constexpr (kDist && kBiasGrad && !kSat) {
        float v[6][4];
        #pragma unroll
        for (int x = 0; x < 4; ++x) {
          v[0][x] = dp[4][x], v[1][x] = dp[5][x];
          v[2][x] = dp[6][x] + dp[0][x], v[3][x] = dp[7][x] + dp[1][x];
          v[4][x] = dp[2][x], v[5][x] = dp[3][x];
        }
        diag_partials<6>(v, sG + 2 * warp * C::kDiagLen, sG + (2 * warp + 1) * C::kDiagLen, BK - 1 - kr0 + sc0 - 16,
                         dcarry, false, false);
      }
    }
    #pragma unroll 1
    for (int sub = 0; sub < (kSq ? 0 : C::kSubs); ++sub) {
    const int c0 = sub * C::kSub;
    float s[kNT][4] = {}, dp[kNT][4] = {};
    #pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
      #pragma unroll
      for (int x = 0; x < 4; ++x) {
        if constexpr (kDist) s[nt][x] = tb[c0 + 8 * nt + x % 2 - 8 * (x / 2)];
        if constexpr (kRC && kWg) s[nt][x] = cq[x];
        if constexpr (kScaledP) dp[nt][x] = cDelta[c0 + 8 * nt + 2 * t + x % 2];
      }
    if constexpr (kWg) {
      float(&sf)[BQ / 2] = reinterpret_cast<float(&)[BQ / 2]>(s[0][0]);
      float(&dpf)[BQ / 2] = reinterpret_cast<float(&)[BQ / 2]>(dp[0][0]);
      // The initial values in their registers before the products (else the compiler may write
      // them between two wgmmas, and ptxas serialises the warpgroup around the write).
      ptx::fence_regs(sf);
      ptx::fence_regs(dpf);
      ptx::wgmma_fence();
      #pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ptx::wgmma_ss<In, BQ>(sf, wK.at(hopper::step_k<BK, D>(kk)), wQk.at(bo + hopper::step_k<BQ, D>(kk)),
                              kDist || kRC || kk > 0);
      ptx::wgmma_commit();
      #pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ptx::wgmma_ss<In, BQ>(dpf, wV.at(hopper::step_k<BK, D>(kk)), wDOk.at(bo + hopper::step_k<BQ, D>(kk)),
                              kScaledP || kk > 0);
      ptx::wgmma_commit();
      ptx::wgmma_wait<1>();  // S^T; dP^T may still run
      ptx::fence_regs(sf);
      if constexpr (kEarlyP) {  // P^T while the tensor cores form dP^T (FlashAttention-3's order)
        #pragma unroll
        for (int h = 0; h < 2; ++h)
          #pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
            #pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int c = c0 + 8 * nt + 2 * t + e;
              const float pv = ptx::ex2(fmaf(s[nt][2 * h + e], kf, -cLse[c]));
              s[nt][2 * h + e] = !kMasked || (kr0 + g + 8 * h - c <= dlt && c < cols) ? pv : 0.f;
            }
      }
      ptx::wgmma_wait<0>();
      ptx::fence_regs(dpf);
    } else {
      #pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t ak[4], av[4];
        flash::ldsm_a(ak, flash::frag_at<D>(lK, kr0, 16 * kk));
        flash::ldsm_a(av, flash::frag_at<D>(lV, kr0, 16 * kk));
        #pragma unroll
        for (int nt = 0; nt < kNT; nt += 2) {
          uint32_t b[4];
          flash::ldsm_b_nk(b, flash::frag_at<D>(lQn + bo, c0 + 8 * nt, 16 * kk));
          if (kRC && kk == 0) {  // the first step adds C / scale: one register quad for every tile
            ptx::mma_m16n8k16<In>(s[nt], ak, b, cq);
            ptx::mma_m16n8k16<In>(s[nt + 1], ak, b + 2, cq);
          } else {
            flash::mma<In>(s[nt], ak, b);
            flash::mma<In>(s[nt + 1], ak, b + 2);
          }
          flash::ldsm_b_nk(b, flash::frag_at<D>(lDOn + bo, c0 + 8 * nt, 16 * kk));
          flash::mma<In>(dp[nt], av, b);
          flash::mma<In>(dp[nt + 1], av, b + 2);
        }
      }
    }

    // P^T and dS^T in place of S^T and dP^T. Element (key row kr = kr0 + g + 8 h, query column
    // c = c0 + 8 nt + 2 t + e) is key j = j0 + kr, query i = i0 + c: visible iff kr - c <= dlt
    // (j <= i) and c < cols (i < T), in 32-bit tile coordinates; only masked steps test. Masked
    // elements are 0 and never reach the score mod (with one, the test is a branch; without, a
    // select).
    if constexpr (kFeat && kSat) {
      // A feature step (unmasked, every distance >= d_sat): the score mod on the features; their
      // gradients summed per query over the warp's 16 keys (lanes g, by shuffles in a fixed order)
      // into the warp's slot of sRG, per key and per block in registers.
      using FE = std::conditional_t<kSat, Enc, Enc>;  // (a name of the step's template: not checked for other Enc)
      const float *rfs = sRF + buf * BQ * kRV;
      float *rgs = sRG + (buf * C::kWarps + warp) * BQ * kRS;
      #pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
        #pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = c0 + 8 * nt + 2 * t + e;
          const int64_t i = i0 + c;
          float rf[kRF > 0 ? kRF : 1], rsum[kRS > 0 ? kRS : 1] = {};
          #pragma unroll
          for (int a = 0; a < kRF; ++a) rf[a] = rfs[c * kRV + a];
          #pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t j = j0 + kr0 + g + 8 * h;
            const float raw = p.scale * s[nt][2 * h + e];
            const float logit = FE::score_mod_features(ctx, static_cast<const float *>(rf), cfv[h], sfv, i, j, raw);
            const float pv = ptx::ex2(fmaf(logit, kLog2e, -cLse[c]));
            float dpv = dp[nt][2 * h + e];
            if constexpr (kVR > 0) dpv += rfs[c * kRV + kRF];
            float drf[kRF > 0 ? kRF : 1], dcf[kCF > 0 ? kCF : 1], dsf[kSF > 0 ? kSF : 1];
            const float dsv = p.scale * FE::score_mod_features_grad(ctx, static_cast<const float *>(rf), cfv[h], sfv, i, j,
                                                                     raw, pv * (dpv - cDelta[c]), drf, dcf, dsf);
            #pragma unroll
            for (int a = 0; a < kRF; ++a) rsum[a] += drf[a];
            if constexpr (value_table_trains<Enc>()) rsum[kRF] += pv;
            #pragma unroll
            for (int a = 0; a < kCF; ++a) cacc[h][a] += dcf[a];
            #pragma unroll
            for (int a = 0; a < kSF; ++a) sacc[a] += dsf[a];
            s[nt][2 * h + e] = pv;
            dp[nt][2 * h + e] = dsv;
          }
          #pragma unroll
          for (int a = 0; a < kRS; ++a) {
            #pragma unroll
            for (int o = 4; o < 32; o *= 2) rsum[a] += __shfl_xor_sync(0xffffffffu, rsum[a], o);
            if (g == 0) rgs[c * kRS + a] = rsum[a];
          }
        }
    } else {  // every other step: element by element
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int kr = kr0 + g + 8 * h;
      #pragma unroll
      #pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
        #pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = c0 + 8 * nt + 2 * t + e;
          [[maybe_unused]] const bool visible = !kMasked || (kr - c <= dlt && c < cols);  // (kEarlyP: tested then)
          float pv, dsv;
          if constexpr (kDist || kRC) {  // the bias is in S^T; its sums below
            if constexpr (kEarlyP) {
              pv = s[nt][2 * h + e];
            } else {
              pv = ptx::ex2(fmaf(s[nt][2 * h + e], kf, -cLse[c]));
              if constexpr (kMasked) pv = visible ? pv : 0.f;
            }
            dsv = pv * dp[nt][2 * h + e];
            if constexpr (kSat) sat_sum += dsv;
          } else if constexpr (kWarpSinks) {
            // Every lane calls: a masked element at a visible stand-in pair (i', j') with a zero
            // term, which adds nothing; its P and dS stay 0.
            const int64_t i = i0 + c, j = j0 + kr;
            const int64_t is = i < T ? i : T - 1, js = j < is ? j : is;
            const float raw = p.scale * s[nt][2 * h + e];
            float dpv = dp[nt][2 * h + e];
            pv = 0.f;
            if (visible) {  // the score mod's loads for visible elements only
              float logit = raw;
              if constexpr (Enc::kHasScoreMod) logit = Enc::score_mod(ctx, is, js, raw);
              pv = ptx::ex2(fmaf(logit, kLog2e, -cLse[c]));
            }
            if constexpr (kVR > 0)  // dP += dO_i . table[r(i, j)]; the block's masses
              if (visible) {
                const int64_t vr = Enc::value_row(ctx, i, j);
                dpv += p.vdrow[(bh * T + i) * kVR + vr];
                if constexpr (value_table_trains<Enc>()) FixedRef{sMass + 2 * (c * kVR + vr), p.status} += pv;
              }
            if constexpr (Enc::kHasScoreMod)
              dsv = p.scale * Enc::score_mod_grad(sink_ctx, is, js, raw, pv * (dpv - cDelta[c]));
            else
              dsv = p.scale * (pv * (dpv - cDelta[c]));
            dsv = visible ? dsv : 0.f;
          } else if constexpr (Enc::kHasScoreMod) {
            pv = 0.f, dsv = 0.f;
            if (visible) {
              const int64_t i = i0 + c, j = j0 + kr;
              const float raw = p.scale * s[nt][2 * h + e];
              pv = ptx::ex2(fmaf(Enc::score_mod(ctx, i, j, raw), kLog2e, -cLse[c]));
              dsv = p.scale * Enc::score_mod_grad(ctx, i, j, raw, pv * (dp[nt][2 * h + e] - cDelta[c]));
            }
          } else {  // the scale folded into the exponent: one FFMA
            if constexpr (kEarlyP) {
              pv = s[nt][2 * h + e];
            } else {
              pv = ptx::ex2(fmaf(s[nt][2 * h + e], kf, -cLse[c]));
              if constexpr (kMasked) pv = visible ? pv : 0.f;
            }
            dsv = pv * dp[nt][2 * h + e];
          }
          s[nt][2 * h + e] = pv;
          dp[nt][2 * h + e] = dsv;
        }
    }
    }  // (the element loop)

    // The warp's diagonal sums of dS (= scale P (dP - Delta)) into its two sets, by tile diagonal
    // x = c - kr + BK - 1.
    if constexpr (kDist && kBiasGrad && !kSat)
      diag_partials<kNT>(dp, sG + 2 * warp * C::kDiagLen, sG + (2 * warp + 1) * C::kDiagLen,
                         BK - 1 - kr0 + c0, dcarry, sub > 0, sub + 1 < C::kSubs);

    // dV += P^T dO, dK' += dS^T Q'.
    [[maybe_unused]] uint32_t ones_k[4];  // two B fragments of ones
    if constexpr (kRC && kBiasGrad) ones(ones_k);
    if constexpr (kWg) {
      float(&dvf)[D / 2] = reinterpret_cast<float(&)[D / 2]>(dv[0][0]);
      float(&dkf)[D / 2] = reinterpret_cast<float(&)[D / 2]>(dk[0][0]);
      #pragma unroll
      for (int kk = 0; kk < kNT / 2; ++kk) {
        flash::acc_to_a<In>(pa[kk], s[2 * kk], s[2 * kk + 1]);
        flash::acc_to_a<In>(dsa[kk], dp[2 * kk], dp[2 * kk + 1]);
        if constexpr (kRC && kBiasGrad) flash::mma<In>(col_acc[0], dsa[kk], ones_k + 2 * (kk & 1));  // key sums
      }
      // dS^T into shared memory for dQ' = dS K', before the dK' product takes dsa as its A operand
      // (a wgmma's A registers may not be touched until its wait): the packed registers dsa[kk]
      // are an m16n8k16 A fragment (rows kr0 + g + 8 (x % 2), columns 16 kk + 8 (x / 2) + 2 t),
      // which is stmatrix's layout of four 8 x 8 matrices: one store of 16 keys x 16 queries per
      // kk (lane l gives row l % 8 of matrix l / 8), where 32-bit stores take four and an address
      // register each.
      {
        const int sr = kr0 + lane % 8 + 8 * (lane / 8 % 2), sc = 8 * (lane / 16);
        #pragma unroll
        for (int kk = 0; kk < BQ / 16; ++kk)
          ptx::stmatrix_x4(sDS + flash::Swizzle<BQ>::offset(sr, 16 * kk + sc), dsa[kk]);
      }
      ptx::wgmma_fence();
      #pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk) ptx::wgmma_rs<In, D, 1>(dvf, pa[kk], wDOm.at(bo + hopper::step_mn<D>(kk)), 1);
      #pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk) ptx::wgmma_rs<In, D, 1>(dkf, dsa[kk], wQm.at(bo + hopper::step_mn<D>(kk)), 1);
      ptx::wgmma_commit();
      ptx::fence_proxy_async();  // dS^T's stores above, for the dQ' product's reads after the barrier
    } else {
      // dS^T into shared memory for dQ' = dS K': on sm_90 by stmatrix from the A fragments of the
      // dK' product (four 8 x 8 matrices: rows kr0 + 8 (x % 2), columns c0 + 16 kk + 8 (x / 2);
      // lane l gives row l % 8 of matrix l / 8), one store per 16 x 16 tile; before sm_90 by
      // 32-bit stores below.
      const bool stsm = ptx::sm90_code(p.sm90);
      #pragma unroll
      for (int kk = 0; kk < kNT / 2; ++kk) {
        uint32_t ap[4], ads[4];
        flash::acc_to_a<In>(ap, s[2 * kk], s[2 * kk + 1]);
        flash::acc_to_a<In>(ads, dp[2 * kk], dp[2 * kk + 1]);
        if (stsm)
          ptx::stmatrix_x4(sDS + flash::Swizzle<BQ>::offset(kr0 + lane % 8 + 8 * (lane / 8 % 2), c0 + 16 * kk + 8 * (lane / 16)),
                           ads);
        if constexpr (kRC && kBiasGrad) flash::mma<In>(col_acc[0], ads, ones_k + 2 * (kk & 1));  // key sums
        #pragma unroll
        for (int dt = 0; dt < kDT; dt += 2) {
          uint32_t b[4];
          flash::ldsm_b_kn(b, flash::frag_at<D>(lDOk + bo, c0 + 16 * kk, 8 * dt));
          flash::mma<In>(dv[dt], ap, b);
          flash::mma<In>(dv[dt + 1], ap, b + 2);
          flash::ldsm_b_kn(b, flash::frag_at<D>(lQk + bo, c0 + 16 * kk, 8 * dt));
          flash::mma<In>(dk[dt], ads, b);
          flash::mma<In>(dk[dt + 1], ads, b + 2);
        }
      }

      if (!stsm)
        #pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
          #pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t v2 = flash::pack2<In>(dp[nt][2 * h], dp[nt][2 * h + 1]);
            memcpy(sDS + flash::Swizzle<BQ>::offset(kr0 + g + 8 * h, c0 + 8 * nt + 2 * t), &v2, 4);
          }
    }
    }  // the sub-tiles
    if (!C::kProducer && threadIdx.x == 0) take_turn(qt, turn);
    // kWg at D = 128: dV and dK' complete here, before dQ': P^T and dS^T's registers are then free
    // for dQ's accumulators (their overlap with dQ' would spill: 120-270 bytes for ALiBi and
    // Cable, ptxas, sm_90a). (The producer takes the turn meanwhile: its waits, for the last
    // step's TMA reductions, the semaphore and the fence, run under these products.)
    if constexpr (kWg && D == 128) {
      ptx::wgmma_wait<0>();
      ptx::fence_regs(reinterpret_cast<float(&)[D / 2]>(dv[0][0]));
      ptx::fence_regs(reinterpret_cast<float(&)[D / 2]>(dk[0][0]));
    }
    block_sync();  // dS^T complete, and the turn is ours

    float dq[C::kQM * kQDT][4] = {};  // tile m kQDT + dt: rows qr0 + 16 m, columns qc0 + 8 dt
    [[maybe_unused]] uint32_t ones_q[4];
    if constexpr (kRC && kBiasGrad) ones(ones_q);
    [[maybe_unused]] float row_acc[C::kQM][4] = {};
    if constexpr (kWg) {
      // dQ'(rows, this warpgroup's columns) = dS K', dS read from dS^T's tile as an MN-major A.
      float(&dqf)[C::kQCols / 2] = reinterpret_cast<float(&)[C::kQCols / 2]>(dq[0][0]);
      ptx::fence_regs(dqf);  // its zeros written before the products (the first one ignores them)
      ptx::wgmma_fence();
      #pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)
        ptx::wgmma_ss<In, C::kQCols, 1, 1>(dqf, wDS.at(hopper::step_mn<BQ>(kk)), wKm.at(hopper::step_mn<D>(kk)),
                                           kk > 0);
      ptx::wgmma_commit();
      if constexpr (kRC && kBiasGrad) {  // the row sums on mma.sync meanwhile
        #pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
          uint32_t a[4];
          flash::ldsm_a_t(a, flash::frag_at<BQ>(lDS, 16 * kk, qr0));
          flash::mma<In>(row_acc[0], a, ones_q + 2 * (kk & 1));
        }
      }
      ptx::wgmma_wait<0>();  // dQ', and dV, dK' of this step: their operands are free
      ptx::fence_regs(dqf);
      ptx::fence_regs(reinterpret_cast<float(&)[D / 2]>(dv[0][0]));
      ptx::fence_regs(reinterpret_cast<float(&)[D / 2]>(dk[0][0]));
      #pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk) ptx::fence_regs(pa[kk]), ptx::fence_regs(dsa[kk]);
    } else if constexpr (kSq) {
      // dV += P^T dO, dK' += dS^T Q' (keys [kr0, kr0 + 32) x columns [dc0, dc0 + D / 2), from the
      // tiles every warp wrote), then dQ' = dS K' (queries [qr0, qr0 + 32) x columns [qc0, qc0 + D / 4)).
      #pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk) {
        uint32_t ap[2][4], ads[2][4];
        #pragma unroll
        for (int m = 0; m < 2; ++m) {
          flash::ldsm_a(ap[m], flash::frag_at<BQ>(sqP, 16 * m, 16 * kk));
          flash::ldsm_a(ads[m], flash::frag_at<BQ>(sqDSk, 16 * m, 16 * kk));
          if constexpr (kRC && kBiasGrad)  // the key sums, by the warps of the first column half
            if (dc0 == 0) flash::mma<In>(col_acc[m], ads[m], ones_q + 2 * (kk & 1));
        }
        #pragma unroll
        for (int dt = 0; dt < kKDT; dt += 2) {
          uint32_t b[4];
          flash::ldsm_b_kn(b, flash::frag_at<D>(sqDOk + bo, 16 * kk, 8 * dt));
          #pragma unroll
          for (int m = 0; m < 2; ++m) {
            flash::mma<In>(dv[kKDT * m + dt], ap[m], b);
            flash::mma<In>(dv[kKDT * m + dt + 1], ap[m], b + 2);
          }
          flash::ldsm_b_kn(b, flash::frag_at<D>(sqQk + bo, 16 * kk, 8 * dt));
          #pragma unroll
          for (int m = 0; m < 2; ++m) {
            flash::mma<In>(dk[kKDT * m + dt], ads[m], b);
            flash::mma<In>(dk[kKDT * m + dt + 1], ads[m], b + 2);
          }
        }
      }
      static_assert(kQDT == 4, "kBwdSquare: dQ' in 2 x 4 tiles per warp");
      sq_product(dq, std::integral_constant<int, BK / 16>{},
                 [&](uint32_t(&a)[4], int m, int kk) { flash::ldsm_a_t(a, flash::frag_at<BQ>(sqDSt, 16 * kk, 16 * m)); },
                 [&](uint32_t(&b)[4], int n, int kk) { flash::ldsm_b_kn(b, flash::frag_at<D>(sqKq, 16 * kk, 8 * n)); });
      if constexpr (kRC && kBiasGrad)  // the query rows' sums, by the warps of the first column quarter
        if (qc0 == 0) {
          #pragma unroll
          for (int kk = 0; kk < BK / 16; ++kk)
            #pragma unroll
            for (int m = 0; m < 2; ++m) {
              uint32_t a[4];
              flash::ldsm_a_t(a, flash::frag_at<BQ>(sqDSt, 16 * kk, 16 * m));
              flash::mma<In>(row_acc[m], a, ones_q + 2 * (kk & 1));
            }
        }
    } else {
      #pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        uint32_t a[4];
        flash::ldsm_a_t(a, flash::frag_at<BQ>(lDS, 16 * kk, qr0));
        if constexpr (kRC && kBiasGrad) flash::mma<In>(row_acc[0], a, ones_q + 2 * (kk & 1));  // row sums
        #pragma unroll
        for (int dt = 0; dt < kQDT; dt += 2) {
          uint32_t b[4];
          flash::ldsm_b_kn(b, flash::frag_at<D>(lK, 16 * kk, qc0 + 8 * dt));
          flash::mma<In>(dq[dt], a, b);
          flash::mma<In>(dq[dt + 1], a, b + 2);
        }
      }
    }
    // Our turn on the fp32 dQ' rows. The first key tile to reach the query tile stores them, and
    // key tile 0, the last, adds the sum so far and writes dq itself where dq = dQ'
    // (p.dq_direct): both through the staging rows (mma.sync: the current Q' and dO buffers, which
    // no warp reads again and the next step's prefetch does not fill; kDqTma: sDQ) in 16-byte
    // chunks, 512 contiguous bytes per warp instruction, with no memset before and no conversion
    // pass after. The other key tiles add their fragments by fp32 reductions, a lane's two
    // adjacent columns as one 8-byte reduction on sm_90 (ptx::red_add2: a warp's rows then fill
    // whole 32-byte sectors; the H100 counted 192 M sectors for 2.15 GB of adds with scalar ones),
    // or (kDqTma) by TMA reductions of the staged tile. The order of the adds is the semaphore's.
    const int64_t i_end = i0 + BQ < T ? i0 + BQ : T;
    // (In any order, !ordered(): every block reduces into the zeroed dQ'.) The unmasked steps
    // compile without the first block's path.
    const bool first = first_on(qt, kMasked);
    const bool to_dq = writes_dq();  // (once: read again, the compiler compiled rows_out twice)
    // The fragments into the staging rows (`frag(m, h, dt)`: where the lane's pair of rows h of
    // tile m kQDT + dt goes; `rc(at)` that of `at(r, c)`, element (r, c), c even, a lane's pair in
    // one 16-byte chunk), and the staged tile's rows < T to dQ' or dq in 16-byte chunks.
    auto stage_frags = [&](auto frag) {
      #pragma unroll
      for (int m = 0; m < C::kQM; ++m)
        #pragma unroll
        for (int h = 0; h < 2; ++h)
          #pragma unroll
          for (int dt = 0; dt < kQDT; ++dt) {
            const float(&v)[4] = dq[kQDT * m + dt];
            *reinterpret_cast<ptx::F2 *>(frag(m, h, dt)) = ptx::F2{v[2 * h], v[2 * h + 1]};
          }
    };
    auto stage_rows = [&](auto at) {
      stage_frags([&](int m, int h, int dt) { return at(qr0 + 16 * m + g + 8 * h, qc0 + 8 * dt + 2 * t); });
    };
    auto rows_out = [&](auto at) {
      static_assert(BQ * D / 4 % C::kThreads == 0, "whole chunks per thread");
      const int n_live = static_cast<int>(i_end - i0) * (D / 4);  // chunks of the rows < T
      float *gq = p.dqm + base + i0 * D;                         // the tile's rows, contiguous
      In *gd = p.dq + base + i0 * D;
      #pragma unroll 1  // a rare step (twice per query tile): few registers beside the loop's
      for (int u = 0; u < BQ * D / 4 / C::kThreads; ++u) {
        const int x = static_cast<int>(threadIdx.x) + u * C::kThreads;  // 16-byte chunk x
        if (kMasked && x >= n_live) break;
        ptx::F4 v = *reinterpret_cast<const ptx::F4 *>(at(x / (D / 4), 4 * (x % (D / 4))));
        if (!first) {
          const ptx::F4 a = ptx::ld_cg_16(gq + 4 * x);
          v = ptx::F4{a.x + v.x, a.y + v.y, a.z + v.z, a.w + v.w};
        }
        if (to_dq) {
          struct alignas(8) Four {
            uint32_t lo, hi;
          };
          *reinterpret_cast<Four *>(gd + 4 * x) = Four{flash::pack2<In>(v.x, v.y), flash::pack2<In>(v.z, v.w)};
        } else {
          ptx::st_cg_16(gq + 4 * x, v);
        }
      }
    };
    if constexpr (kDqTma) {
      // kDqTma (FlashAttention-3's form): every block stages its tile in sDQ; the first and the
      // last go on as below, the others add it by TMA reductions (reduce_dq: thread 0, or the
      // producer's after this barrier).
      if constexpr (C::kQCols % 32 == 0 && !kSq) {
        // The fragments' 16 8-byte stores from four addresses: with qc0 a multiple of 32 and
        // qr0 of 8, element (qr0 + 16 m + g + 8 h, qc0 + 8 dt + 2 t) is at box qc0 / 32 + dt / 4,
        // row qr0 + g + 16 m + 8 h, chunk (2 (dt % 4) + t / 2) ^ g = (2 (dt % 4) ^ (g & 6)) +
        // ((t / 2) ^ (g & 1)): a lane base, one of four lane offsets (dt % 4) and immediates.
        // (dq_box's expression, which the compiler kept as 16 registers, 7 of them spilled. Not
        // for kBwdSquareTma, whose spills it moved: 388 -> 420 bytes for NoPE.)
        float *lb = sDQ + (qc0 / 32) * (BQ * 32) + (qr0 + g) * 32 + 4 * ((t >> 1) ^ (g & 1)) + 2 * (t & 1);
        float *at[4];
        #pragma unroll
        for (int j = 0; j < 4; ++j) at[j] = lb + 4 * ((2 * j) ^ (g & 6));
        stage_frags([&](int m, int h, int dt) { return at[dt % 4] + (dt / 4) * (BQ * 32) + (16 * m + 8 * h) * 32; });
      } else {
        stage_rows(dq_box);
      }
      const bool bulk = !(first || to_dq);  // the same for every thread of the block
      if (bulk) ptx::fence_proxy_async();    // the rows, for the TMA's reads
      block_sync();                          // the staged tile is complete
      if (bulk) {
        if (!C::kProducer && threadIdx.x == 0) reduce_dq(qt);
      } else {
        rows_out(dq_box);
      }
    } else if (first || to_dq) {  // the same for every thread of the block
      auto at = [&](int r, int c) { return dq_stage(buf, r, c / 4) + c % 4; };
      if constexpr (kSq) __syncthreads();  // every warp's dV and dK' products have read Q' and dO
      stage_rows(at);
      __syncthreads();  // the staged tile is complete
      rows_out(at);
    } else {
      #pragma unroll
      for (int m = 0; m < C::kQM; ++m)
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t i = i0 + qr0 + 16 * m + g + 8 * h;
          if (kMasked && i >= T) continue;
          float *row = p.dqm + base + i * D + qc0 + 2 * t;
          #pragma unroll
          for (int dt = 0; dt < kQDT; ++dt)
            ptx::red_add2(row + 8 * dt, dq[kQDT * m + dt][2 * h], dq[kQDT * m + dt][2 * h + 1], p.sm90);
        }
    }
    if constexpr (kDist && kBiasGrad && !kSat) {  // diagonal c - kr = x - (BK - 1): the warps' sets, in order
      const int x = static_cast<int>(threadIdx.x), o = x - (BK - 1);
      if (x < BQ + BK - 1) {
        float sum = sG[x];
        #pragma unroll
        for (int u = 1; u < 2 * C::kWarps; ++u) sum += sG[u * C::kDiagLen + x];
        // Into the running sum of distance d; the lowest BQ distances of the step are seen by no
        // later step: they go to the slice's fixed-point sums (dist_grad_kernel reads them).
        const int64_t d = i0 - j0 + o;
        float &acc = sAcc[d & (C::kDistAcc - 1)];
        acc += sum;
        if (x < BQ) {
          const float v = acc;
          acc = 0.f;
          if (v != 0.f && d >= 0 && d < T) dist_g(d) += v;
        }
      }
    }
    if constexpr (kRC && kBiasGrad) {  // the rows' sums over the block's keys, in our turn
      const bool mine = qc0 == 0 && t == 0;
      #pragma unroll
      for (int m = 0; m < C::kQM; ++m) {
        const int rows_left = static_cast<int>(T - i0 < BQ ? T - i0 : BQ) - (qr0 + 16 * m + g);
        float *rg = p.row_g + bh * T + i0 + qr0 + 16 * m + g;
        if (mine && rows_left > 0) atomicAdd(rg, row_acc[m][0]);
        if (mine && rows_left > 8) atomicAdd(rg + 8, row_acc[m][2]);
      }
    }
    if constexpr (value_table_trains<Enc>()) {
      // The step's masses, complete since the barrier before dQ' (the next adds follow the next
      // step's first barrier): the non-zero ones to the slice's, and zero again. Rows past T
      // have none.
      uint32_t st = 0;
      unsigned long long *gm = p.vmass_fx + 2 * (bh * T + i0) * kVR;
      #pragma unroll 1
      for (int x = static_cast<int>(threadIdx.x); x < BQ * kVR; x += C::kThreads) {
        const long long hi = static_cast<long long>(sMass[2 * x]), lo = static_cast<long long>(sMass[2 * x + 1]);
        if (hi != 0 || lo != 0) {
          st |= fixed_atomic_add(gm + 2 * x, hi, lo);
          sMass[2 * x] = sMass[2 * x + 1] = 0;
        }
      }
      if (st) atomicOr(p.status, st);
    }
  };
  // Query tiles [qt_plain, n_full) see every key of the block and exist whole: no mask. The first
  // ones (the diagonal) and a partial last one test each element (qt_plain, qt_sat: above).
  static_assert(kSatSteps == (kDist && kBiasGrad), "the saturated steps");
  using Yes = std::true_type;
  using No = std::false_type;
  int64_t qt = qt0;
  float unused = 0.f;
  for (; qt < qt_plain; ++qt) step(qt, Yes{}, No{}, unused);
  for (; qt < qt_sat; ++qt) step(qt, No{}, No{}, unused);
  if constexpr (kDist && kBiasGrad) {
    if (qt_sat < n_full) {  // the running sums the last diagonal step left, before the others
      block_sync();
      const int x = static_cast<int>(threadIdx.x);
      const int64_t d = (qt_sat - 1) * BQ - j0 - (BK - 1) + x;
      if (x >= BQ && x < BQ + BK - 1) {
        float &acc = sAcc[d & (C::kDistAcc - 1)];
        const float v = acc;
        acc = 0.f;
        if (v != 0.f && d < T) dist_g(d) += v;
      }
    }
    float sat_sum = 0.f;
    for (; qt < n_full; ++qt) step(qt, No{}, Yes{}, sat_sum);
    // One term at distance T - 1 (saturated like every d >= d_sat) per warp, in fixed point.
    #pragma unroll
    for (int o = 16; o > 0; o /= 2) sat_sum += __shfl_xor_sync(0xffffffffu, sat_sum, o);
    if (lane == 0 && sat_sum != 0.f) dist_g(T - 1) += sat_sum;
  }
  // qt = n_full here (qt_sat <= n_full, and the saturated steps end there), so this third copy of
  // the unmasked step never runs. ptxas compiles it all the same, and its register allocation of
  // the whole kernel depends on it: without it RoPE's wide layout at D = 128 (sm_90a) spills 24
  // bytes and its live loop grows 623 -> 637 instructions, while kBwdSquare's loses 230 bytes of
  // spills. Kept but for kBwdSquare and the score mods over features, whose feature steps end at
  // n_full (their per-element step, with its loads and sinks per element, would double the copy's
  // compile time for nothing). (bench/cuda_sass_stats.py reports the shortest unmasked copy,
  // which can be this one: at D = 64 the live copy of RoPE's wide layout has 799 instructions per
  // step, this one 665.)
  if constexpr (kFeat)
    for (; qt < n_full; ++qt) step(qt, No{}, Yes{}, unused);
  if constexpr (!kSq && !kFeat)
    for (; qt < n_full; ++qt) step(qt, No{}, No{}, unused);
  for (; qt < n_qt; ++qt) step(qt, Yes{}, No{}, unused);
  ptx::cp_async_wait<0>();
  block_sync();  // every thread's adds to the last query tile, then their release
  if (!C::kProducer && threadIdx.x == 0) release_last();
  if constexpr (kFeat) {
    // The last step's row sums (a feature step where T is whole tiles), and the keys' and the
    // block's sums over its feature steps (lanes t, then every lane of the warp: shuffles).
    if (qt_sat < n_full) {
      const int x = static_cast<int>(threadIdx.x);
      if (x < BQ && n_qt - 1 >= qt_sat && n_qt - 1 < n_full) flush_rows(n_qt - 1, x);
      #pragma unroll
      for (int h = 0; h < 2; ++h) {
        #pragma unroll
        for (int a = 0; a < kCF; ++a)
          #pragma unroll
          for (int o = 1; o < 4; o *= 2) cacc[h][a] += __shfl_xor_sync(0xffffffffu, cacc[h][a], o);
        const int64_t j = j0 + kr0 + g + 8 * h;
        if constexpr (kCF > 0)
          if (t == 0 && j < T) Enc::col_features_grad(ctx, j, T - 1, static_cast<const float *>(cacc[h]));
      }
      #pragma unroll
      for (int a = 0; a < kSF; ++a)
        #pragma unroll
        for (int o = 1; o < 32; o *= 2) sacc[a] += __shfl_xor_sync(0xffffffffu, sacc[a], o);
      if constexpr (kSF > 0)
        if (lane == 0) Enc::slice_features_grad(ctx, 0, T - 1, static_cast<const float *>(sacc));
    }
  }
  if constexpr (flash_param_cache<Enc>()) ParamCache<Enc>::flush(p, cache, C::kThreads);  // every sink is in
  if constexpr (kDist && kBiasGrad) {  // the distances of the last step that earlier ones left
    const int x = static_cast<int>(threadIdx.x);
    const int64_t d = (n_qt - 1) * BQ - j0 - (BK - 1) + x;
    if (x >= BQ && x < BQ + BK - 1) {
      const float v = sAcc[d & (C::kDistAcc - 1)];
      if (v != 0.f && d < T) dist_g(d) += v;
    }
  }
  if constexpr (kRC && kBiasGrad) {  // one gradient call per key of the block
    for (int m = 0; m < kKM; ++m)
      for (int h = 0; h < 2; ++h) {
        const int64_t j = j0 + kr0 + 16 * m + g + 8 * h;
        const float sum = col_acc[m][2 * h];  // every lane of the quad holds it
        if (t == 0 && dc0 == 0 && sum != 0.f && j < T) Enc::col_bias_grad(ctx, j, sum * p.inv_scale);
      }
  }

  // dK' (fp32 scratch; dk itself where dk = dK': flash_dk_direct) and dV.
  // (Tile n: keys kr0 + 16 (n / kKDT), columns dc0 + 8 (n % kKDT).)
  for (int n = 0; n < kDT; ++n)
    for (int h = 0; h < 2; ++h) {
      const int64_t j = j0 + kr0 + 16 * (n / kKDT) + g + 8 * h;
      if (j >= T) continue;
      const int64_t off = base + j * D + dc0 + 8 * (n % kKDT) + 2 * t;
      if constexpr (flash_dk_direct<Enc>()) {
        p.dk[off] = from_float<In>(dk[n][2 * h]);
        p.dk[off + 1] = from_float<In>(dk[n][2 * h + 1]);
      } else {
        p.dkm[off] = dk[n][2 * h];
        p.dkm[off + 1] = dk[n][2 * h + 1];
      }
      p.dv[off] = from_float<In>(kScaledP ? dv[n][2 * h] * p.inv_scale : dv[n][2 * h]);
      p.dv[off + 1] = from_float<In>(kScaledP ? dv[n][2 * h + 1] * p.inv_scale : dv[n][2 * h + 1]);
    }
}

}  // namespace detail
APE_CUDA_ABI_END
}  // namespace ape::cuda
