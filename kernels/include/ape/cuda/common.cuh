// Common to the CUDA attention kernels (ape/cuda/attention.cuh): element types, the deterministic
// gradient sinks (fixed point), the device context of a functor call, the launch parameters
// (Params), the tile configuration and the wmma helpers of the general path.
#pragma once

#include "ape/cuda/platform.cuh"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ape/contract/enc_traits.h"
#include "ape/contract/vocabulary.h"
#include "ape/cuda/kernel_entry.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "ape/cuda/attention.cuh needs sm_80 or newer (bf16 tensor cores)"
#endif


namespace ape::cuda {
APE_CUDA_ABI_BEGIN
namespace detail {

constexpr int kThreads = 128;  // 4 warps per block
constexpr int kWarps = kThreads / 32;

constexpr int array_len(int n) { return n > 0 ? n : 1; }
constexpr size_t align_up(size_t n) { return (n + 127) / 128 * 128; }
constexpr float kInf = __builtin_huge_valf();
constexpr int kTokThreads = 1024;  // threads of the token program's block (one per slice)
constexpr int kTokItems = 8;      // tokens a thread of it loads at once (DevCtx::tok_map, tok_block_scan)
// A warp's tokens in a round of the scans (32 lanes x kTokItems): the chunks' sums are added one
// after another, so a scan may start at any chunk from the carry there (a decode step's token
// program: DevCtx::tok0, tok_carry).
constexpr int kTokChunk = 32 * kTokItems;
// Zeros before and after a slice's table of distance biases (dist_table_kernel): a flash tile's
// window reaches BQ + BK distances before 0 and past T at most.
constexpr int64_t kDistPad = 256;

// ---- element types -------------------------------------------------------------------------------
template <class In> __device__ inline float to_float(In x);
template <> __device__ inline float to_float<float>(float x) { return x; }
template <> __device__ inline float to_float<__half>(__half x) { return __half2float(x); }
template <> __device__ inline float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <class In> __device__ inline In from_float(float x);
template <> __device__ inline float from_float<float>(float x) { return x; }
template <> __device__ inline __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// ---- deterministic gradient sinks (fixed point, attention.cuh says why) -------------------------
// A sink element is a 128-bit fixed-point number kept as two 64-bit integers: a term g adds
// hi = round(g 2^32) to the first and lo = round((g 2^32 - hi) 2^32) to the second, so the sum
// is hi_sum 2^-32 + lo_sum 2^-64, exact to 2^-64 per term and the same for any order of the
// additions. What fixed point cannot hold is reported in the call's status word
// (cuda/kernel_entry.h): a non-finite term (kStatusNonFinite), a term of magnitude >= 2^31
// (kStatusRange: clamped), a sum leaving (-2^31, 2^31) (kStatusOverflow), a non-zero term below
// 2^-65 that rounds to nothing (kStatusDropped, for information). After any of the three errors
// every sink result of the call is NaN (fixed_to_float_kernel): a gradient that cannot be trusted
// is poisoned on the device, so no caller has to read the word before using the gradients.
constexpr double kFixedScale = 4294967296.0;  // 2^32

struct FixedTerm {
  long long hi, lo;
  uint32_t status;
};
APE_HD inline FixedTerm to_fixed(float g) {
  if (!(g == g) || g - g != 0.f) return {0, 0, kStatusNonFinite};
  const double x = static_cast<double>(g) * kFixedScale;  // exact
  if (x >= 9.2233720368547758e18 || x <= -9.2233720368547758e18) {
    const long long clamp = x > 0 ? 9223372036854775807LL : -9223372036854775807LL;
    return {clamp, 0, kStatusRange};
  }
  const long long hi = llrint(x);
  const long long lo = llrint((x - static_cast<double>(hi)) * kFixedScale);
  return {hi, lo, (g != 0.f && hi == 0 && lo == 0) ? kStatusDropped : 0u};
}
APE_HD inline float from_fixed(const unsigned long long *v) {
  return static_cast<float>(static_cast<double>(static_cast<long long>(v[0])) / kFixedScale +
                            static_cast<double>(static_cast<long long>(v[1])) /
                                (kFixedScale * kFixedScale));
}

// a + b in two's complement (no undefined behaviour), with `wrapped` set where the signed sum
// left the range of 64 bits.
APE_HD inline long long wrap_add(long long a, long long b, bool &wrapped) {
  const long long sum = static_cast<long long>(static_cast<unsigned long long>(a) + static_cast<unsigned long long>(b));
  wrapped = ((a ^ sum) & (b ^ sum)) < 0;
  return sum;
}

// Adds (hi, lo) to the element's two words; a wrap of the running sum is an overflow.
APE_HD inline uint32_t fixed_atomic_add(unsigned long long *p, long long hi, long long lo) {
#ifdef APE_DEVICE_CODE
  uint32_t st = 0;
  if (hi != 0) {
    bool wrapped;
    wrap_add(static_cast<long long>(atomicAdd(p, static_cast<unsigned long long>(hi))), hi, wrapped);
    if (wrapped) st |= kStatusOverflow;
  }
  if (lo != 0) atomicAdd(p + 1, static_cast<unsigned long long>(lo));
  return st;
#else
  (void)p, (void)hi, (void)lo;
  __builtin_trap();  // the sinks exist on the device only
#endif
}

// `sink[i] += g` adds g to element i (nothing when the sink is off).
struct FixedRef {
  unsigned long long *p;  // the element's two words
  uint32_t *status;
  APE_HD void operator+=(float g) const {
#ifdef APE_DEVICE_CODE
    if (!p) return;
    const FixedTerm t = to_fixed(g);
    const uint32_t st = t.status | fixed_atomic_add(p, t.hi, t.lo);
    if (st) atomicOr(status, st);
#else
    (void)g;
    __builtin_trap();  // the sinks exist on the device only
#endif
  }
};
// A sink over an array of fixed-point elements (two words each): sink[i] is element i's Ref (a
// FixedRef, or a WarpFixedRef below), a null array one that is off; SinksOf holds N of them.
template <class Ref> struct SinkOf {
  unsigned long long *data;
  uint32_t *status;
  APE_HD Ref operator[](int64_t i) const { return Ref{data ? data + 2 * i : nullptr, status}; }
};
template <class Ref, int N> struct SinksOf {
  unsigned long long *p[N];
  uint32_t *status;
  APE_HD SinkOf<Ref> operator[](int n) const { return SinkOf<Ref>{p[n], status}; }
};
using FixedSink = SinkOf<FixedRef>;
template <int N> using FixedSinks = SinksOf<FixedRef, N>;
template <int N> struct ParamPtrs {
  const float *p[N];
  APE_HD const float *operator[](int n) const { return p[n]; }
};

// `sink[i] += g` as a warp collective: every lane of the warp adds at once (one term each, 0 for
// none). Lanes adding to the same element sum their terms first, in a tree over the lanes
// (integers: exact, so the element's sum is the same as with one atomic per term), and the lowest
// of them adds the sum; a partial sum that leaves the range is an overflow, as a running one is.
// Where many lanes hit one element (a relative row at a saturated distance, a per-head
// parameter) this divides the L2 atomics by their number. Out of line: inlined at each of a
// step's 64 elements in every layout and copy of the step, its loop of shuffles took ptxas 750 s
// for K-Cable's bf16 variant at D 64 on sm_90a (46 s out of line, with fewer spills: the
// feature steps, which do not call it, are the same code).
struct WarpFixedRef {
  unsigned long long *p;
  uint32_t *status;
  APE_HD APE_NOINLINE void operator+=(float g) const {
#ifdef APE_DEVICE_CODE
    if (!p) return;  // the same for every lane: the sink is on or off for the whole call
    constexpr unsigned kAll = 0xffffffffu;
    const FixedTerm t = to_fixed(g);
    uint32_t st = t.status;
    long long hi = t.hi, lo = t.lo;
    const unsigned lane = threadIdx.x % 32u;
    unsigned peers = __match_any_sync(kAll, reinterpret_cast<unsigned long long>(p));
    const int first = __ffs(static_cast<int>(peers)) - 1;
    int rank = __popc(peers & ((1u << lane) - 1u));  // this lane's place among its peers
    peers &= 0xfffffffeu << lane;                     // the peers above it
    while (__any_sync(kAll, peers != 0)) {
      const int next = __ffs(static_cast<int>(peers));  // the next peer still summing, 1-based
      const long long h2 = __shfl_sync(kAll, hi, next ? next - 1 : static_cast<int>(lane));
      const long long l2 = __shfl_sync(kAll, lo, next ? next - 1 : static_cast<int>(lane));
      if (next) {
        bool wrapped, lo_wrapped;  // low words, as in the atomics, unchecked: |lo| < 2^31 per term
        hi = wrap_add(hi, h2, wrapped);
        lo = wrap_add(lo, l2, lo_wrapped);
        if (wrapped) st |= kStatusOverflow;
      }
      peers &= ~__ballot_sync(kAll, rank & 1);  // lanes at odd places are summed into others
      rank >>= 1;
    }
    if (static_cast<int>(lane) == first) st |= fixed_atomic_add(p, hi, lo);
    if (st) atomicOr(status, st);
#else
    (void)g;
    __builtin_trap();
#endif
  }
};
using WarpFixedSink = SinkOf<WarpFixedRef>;
template <int N> using WarpFixedSinks = SinksOf<WarpFixedRef, N>;

// The context the functors see on the GPU: the members of ape::HeadCtx, with sinks in place of
// the private accumulators.
// The token program's scans (DevCtx::tok_scan, tok_rscan_add), by every thread of the block
// (blockDim.x a multiple of 32): dst[t] = sum_{u <= t} src[u] (kReverse: dst[t] += sum_{u >= t}
// src[u]), accumulated in double. In chunks of kTokChunk tokens in scan order (t, or n - 1 - t
// with kReverse), a round of blockDim.x / 32 chunks at a time: thread k loads its kTokItems
// consecutive tokens of its warp's chunk at once, the lanes scan their sums by shuffles, warp 0
// adds the chunks' sums one after another to the carry (the sum of every chunk before), and each
// thread adds its tokens to its chunk's carry plus its lanes' offset. A token's sum depends on its
// chunk's tokens and the carry at the chunk's start only, each taken in one fixed order whatever
// the schedule: the result is bitwise the same at every run, and a call that starts at chunk
// `from` (a multiple of kTokChunk; forward only) with the carry there writes the same
// dst[t >= from] as one from 0. carry_io (or null): {the carry, the token it was taken at}, as the
// previous call left it; the call starts at `from` where that token is `from`, else at 0 (a call
// that failed after its token program, or a cache reused from its start: src[t < from] must still
// hold the sequence's values), and leaves {the carry at s, s}, s = floor(n / kTokChunk) * kTokChunk:
// what the next call, from there, takes.
template <bool kReverse, class T>
__device__ void tok_block_scan(const T *src, T *dst, int64_t n, int64_t from = 0, double *carry_io = nullptr) {
  // The warps' chunk sums, then their carries; [32]: the next round's carry; [33]: the first token.
  APE_STATIC_SMEM(double, part, 34);
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int nw = static_cast<int>(blockDim.x) / 32;
  const int64_t round = int64_t(blockDim.x) * kTokItems, save_at = n / kTokChunk * kTokChunk;
  if (tid == 0) {
    const bool resume = carry_io && from > 0 && carry_io[1] == static_cast<double>(from);
    part[32] = resume ? carry_io[0] : 0.0, part[33] = resume ? static_cast<double>(from) : 0.0;
  }
  __syncthreads();  // (part[32] is written again after the loop's first barrier only)
  double carry = part[32];  // the sum of the earlier chunks
  const int64_t first = static_cast<int64_t>(part[33]);
  for (int64_t e0 = first; e0 < n; e0 += round) {
    const int64_t e = e0 + int64_t(tid) * kTokItems;  // this thread's first token in scan order
    double x[kTokItems], sum = 0;
    [[maybe_unused]] T d[kTokItems];  // kReverse: what dst holds, loaded with src
#pragma unroll
    for (int u = 0; u < kTokItems; ++u) {
      const bool in = e + u < n;
      const int64_t t = kReverse ? n - 1 - (e + u) : e + u;
      x[u] = in ? static_cast<double>(src[t]) : 0.0;
      if constexpr (kReverse) d[u] = in ? dst[t] : T(0);
    }
#pragma unroll
    for (int u = 0; u < kTokItems; ++u) sum += x[u];
    double s = sum;  // inclusive over the warp's threads, then exclusive
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const double y = __shfl_up_sync(0xffffffffu, s, d);
      if (lane >= d) s += y;
    }
    if (lane == 31) part[warp] = s;
    s = __shfl_up_sync(0xffffffffu, s, 1);
    if (lane == 0) s = 0;
    __syncthreads();
    if (warp == 0) {  // the chunks' carries, in order (every lane adds the same chain)
      const double mine = lane < nw ? part[lane] : 0.0;
      double c = carry, at = 0.0;
      for (int w = 0; w < nw; ++w) {
        const double chunk = __shfl_sync(0xffffffffu, mine, w);
        if (lane == w) at = c;
        if (lane == 0 && carry_io && e0 + int64_t(w) * kTokChunk == save_at)
          carry_io[0] = c, carry_io[1] = static_cast<double>(save_at);
        c += chunk;
      }
      if (lane < nw) part[lane] = at;
      if (lane == 0) {
        part[32] = c;
        if (carry_io && e0 + round == save_at)  // n: a whole number of rounds
          carry_io[0] = c, carry_io[1] = static_cast<double>(save_at);
      }
    }
    __syncthreads();
    double acc = part[warp] + s;
#pragma unroll
    for (int u = 0; u < kTokItems; ++u) {
      acc += x[u];
      if (e + u < n) {
        const int64_t t = kReverse ? n - 1 - (e + u) : e + u;
        if constexpr (kReverse) dst[t] = d[u] + T(acc);
        else dst[t] = T(acc);
      }
    }
    carry = part[32];
    __syncthreads();  // `part` is free again
  }
}

template <class Enc> struct DevCtx {
  static constexpr int NR = array_len(traits::NumRel<Enc>::value);
  int64_t b, h, H, T, D;
  ParamPtrs<array_len(Enc::kNumParams)> params;
  const float *tok;                              // this slice: tok[n*tok_ld + t]
  int64_t tok_ld;                                // T, or a decode cache's capacity
  int64_t tok0;                                  // token_forward: its first token (Params::tok0)
  double *tok_carry;                             // token_forward: this slice's scans' {carry, token}, or null
  FixedSink dtok;                                // this slice, same layout
  FixedSinks<array_len(Enc::kNumParams)> dparams;  // global sums
  ParamPtrs<NR> rel;                             // this slice's relative rows n: (T, rows_n)
  FixedSinks<NR> drel;                           // their gradients, same layout
  FixedSink vmass;                               // value rows: sum_j P_ij per (i, row), (T, rows)

  // The generated code's stride between token sequences: ctx.tok[slot * tok_stride() + t].
  APE_HD int64_t tok_stride() const { return tok_ld; }
  // The token program's stages (emitEncFunctor), run by all threads of one block per slice
  // (token_forward_kernel, token_backward_kernel): tok_map and tok_map_add on every token from
  // tok0, a barrier (tok_sync) between the stages, and the scans (tok_block_scan), in double,
  // from tok0's chunk with the carries in tok_carry (a pair per slot = the scan's output sequence)
  // where set.
  __device__ static void tok_sync() { __syncthreads(); }
  // dst[t] = f(a[t]) (or f(a[t], b[t])) for t in [0, n); dst is none of the sources. Each thread
  // loads the sources of kTokItems tokens, a block's width apart, before it evaluates f on any
  // and stores: their loads are in flight together (with a load, its use and its store per token,
  // a stage took the latency of T / blockDim loads one after the other).
  template <class T, class F> __device__ void tok_map(T *dst, int64_t n, F f, const T *a) const {
    tok_batches<false>(dst, n, [&](T x, T) { return f(x); }, a, static_cast<const T *>(nullptr));
  }
  template <class T, class F> __device__ void tok_map(T *dst, int64_t n, F f, const T *a, const T *b) const {
    tok_batches<false>(dst, n, f, a, b);
  }
  // dst[t] += f(a[t], b[t]), in the same batches.
  template <class T, class F>
  __device__ void tok_map_add(T *dst, int64_t n, F f, const T *a, const T *b) const {
    tok_batches<true>(dst, n, f, a, b);
  }
  template <bool kAdd, class T, class F>
  __device__ void tok_batches(T *dst, int64_t n, F f, const T *a, const T *b) const {
    const int64_t step = blockDim.x;
    for (int64_t t0 = tok0 + threadIdx.x; t0 < n; t0 += kTokItems * step) {
      T xa[kTokItems], xb[kTokItems], xd[kTokItems];
#pragma unroll
      for (int u = 0; u < kTokItems; ++u) {
        const int64_t t = t0 + u * step;
        const bool in = t < n;
        xa[u] = in ? a[t] : T(0);
        xb[u] = in && b ? b[t] : T(0);
        if constexpr (kAdd) xd[u] = in ? dst[t] : T(0);
      }
#pragma unroll
      for (int u = 0; u < kTokItems; ++u) {
        const int64_t t = t0 + u * step;
        if (t < n) dst[t] = kAdd ? xd[u] + f(xa[u], xb[u]) : f(xa[u], xb[u]);
      }
    }
  }
  template <class T> __device__ void tok_scan(const T *src, T *dst, int64_t n) const {
    tok_block_scan<false>(src, dst, n, tok0, tok_carry ? tok_carry + 2 * ((dst - tok) / tok_ld) : nullptr);
  }
  template <class T> __device__ void tok_rscan_add(const T *src, T *dst, int64_t n) const {
    tok_block_scan<true>(src, dst, n);  // the backward's: every token (tok0 is 0 there)
  }
};

// ---- launch parameters (one plain struct, by value) -----------------------------------------------
template <class Enc, class In> struct Params {
  static constexpr int NF = array_len(Enc::kNumFeatures), NP = array_len(Enc::kNumParams);
  int64_t B, H, T, D;
  const In *q, *k, *v;
  In *o;
  float *lse;
  // Forward: o and lse hold rows [o_row0, T) of each slice, o_ld = T - o_row0 rows a slice
  // (CudaAttnArgs::o_from_first: o_row0 = first_row; else 0): out_row() places a row.
  int64_t o_row0, o_ld;
  const float *feat[NF];
  int64_t feat_ld;                  // forward: elements per slice of each feature (T, or
                                    // CudaAttnArgs::feat_ld where they are the caller's cache)
  const float *params[NP];
  float scale;
  float log2_scale, inv_scale;      // flash kernels (scale > 0 there: positive_scale)
  // The first tile of the launch's grid y: the forward's first query tile (from first_row / BQ),
  // the general backward's first key or query tile; a grid over more tiles than CUDA takes on y
  // goes in several launches (max_grid_y), each from its own.
  int64_t tile0;
  // The FlashAttention-2-class forward with its keys split (CudaAttnArgs::num_splits, FlashDecoding):
  // blockIdx.z of num_splits takes its share of each query tile's key tiles and writes, for rows
  // [part_row0, T), o / l and lse of its keys (fp32) to part_o (num_splits, B*H, part_rows, D) and
  // part_lse (num_splits, B*H, part_rows); split_combine_kernel adds them. num_splits 1: one
  // share, whose rows' o and lse the kernel writes itself (a call whose tiles' rows are mostly
  // idle: launch.cuh, attention_forward).
  int num_splits;
  int64_t part_row0, part_rows;
  float *part_o, *part_lse;
  const In *dout;
  In *dq, *dk, *dv;
  float *dfeat[NF];
  float *dparams[NP];
  // scratch
  float *tok;                       // (B*H, kNumTok, tok_ld)
  int64_t tok_ld;                   // T, or CudaAttnArgs::ld where tok is the caller's cache
  int64_t tok0;                     // forward: the first token the token program computes (a
                                    // multiple of kTokChunk; 0 but with a cache)
  double *tok_carry;                // forward: (B*H, kNumTok, 2) the scans' {carry, token}, or null
  const In *qm, *km;                // (B*H, T, D): q', k' (= q, k without a mod)
  int64_t ld_q, ld_k, ld_v;         // forward: rows per slice of qm, km and v (T, or
                                    // CudaAttnArgs::ld where they are the caller's buffers)
  int64_t k_group, v_group;         // slice bh reads km's slice bh / k_group and v's
                                    // bh / v_group (grouped-query attention, CudaAttnArgs::
                                    // kv_heads: the query heads a key head serves; else 1)
  int64_t q_row0;                   // forward: the first row of q' computed (prepare; 0 but
                                    // for a call with first_row)
  int64_t qm_row0;                  // forward: the row of q' stored first in each slice of qm
                                    // (q' in scratch from q_row0 on: q_row0; else 0)
  float *delta;                     // (B*H, T)
  float *dqm, *dkm;                 // (B*H, T, D) gradients w.r.t. q', k'
  unsigned long long *dtok_fx;      // (B*H, kNumTok, T) x 2 words
  float *dtok;                      // (B*H, kNumTok, T)
  unsigned long long *dparam_fx[NP];  // numel x 2 words each
  uint32_t *status;                 // CudaAttnArgs::status (backward)
  int *dq_sem;                      // (B*H, ceil(T / BQ)): the order of dQ' adds (flash backward)
  bool dq_direct;                   // flash backward: key tile 0 writes dq (flash_dq_direct)
  bool sm90;                        // flash backward: the device is sm_90+ (ptx::sm90_code: 8-byte dQ' reductions, stmatrix; compiled code follows its target, the emulator this)
  bool dq_ordered;                  // flash backward: dQ' adds in the semaphores' order
                                    // (CudaAttnArgs::deterministic); else all reductions
  bool pingpong;                    // Hopper forward: the consumer warpgroups take turns
                                    // issuing their products (hopper_pingpong_enabled)
  bool kv_split;                    // Hopper forward: K' released after its S product, not
                                    // with V (hopper_kv_split_enabled)
  int64_t n_qt;                     // Hopper forward: query tiles per slice (from tile0)
  int *sched;                       // Hopper forward: the tiles claimed after each block's first
                                    // (a zeroed counter), or null: a block per tile
  int tile_group;                   // Hopper forward: slices per group of the tile order (their
                                    // K' and V stay in L2 while the group's tiles run); B*H: one
  // distance biases in the flash kernels (flash_distance<Enc>())
  float *dist;                      // (B*H, dist_ld): B(d) / scale at kDistPad + d, 0 outside [0, T)
  int64_t dist_ld;
  unsigned long long *dist_g;       // (B*H, T) x 2 words: sum of scale P (dP - Delta) per distance
  unsigned long long *dist_fp;      // (B*H, T): fingerprints of B's gradient per distance
  int *dist_sat;                    // (B*H): distances >= it share one gradient (dist_sat_kernel)
  // row/column biases in the flash kernels (flash_rowcol<Enc>())
  float *rc;                        // (B*H, 2, rc_ld): R(i) / scale, then C(j) / scale; 0 past T
  int64_t rc_ld;
  float *row_g;                     // (B*H, T): sum of scale P (dP - Delta) per query row
  // the flash backward's row statistics (row_stats_kernel): (B*H, 2, stats_ld), the rows' lse in
  // the kernel's units, then their Delta (signed as it uses it); rows past T: +inf and 0
  float *stats;
  int64_t stats_ld;
  // relative rows (Enc::kNumRel) and the value-rows term (Enc::kHasValueRows)
  static constexpr int NR = array_len(traits::NumRel<Enc>::value);
  float *rel[NR];                   // (B*H, rel_ld[n], rows_n): (x' + bias_h) . table[r, h, :]
  int64_t rel_ld[NR];               // rows per slice of rel[n]: T, or CudaAttnArgs::ld where it is
                                    // the caller's cache of the key side's rows (krel)
  int64_t rel_row0[NR];             // forward: the token stored first in each slice of rel[n] (a
                                    // query side's from q_row0, T - q_row0 a slice; else 0)
  unsigned long long *drel_fx[NR];  // (B*H, T, rows_n) x 2 words
  float *drel[NR];                  // (B*H, T, rows_n)
  float *vdrow;                     // (B*H, T, kValueRows): dO_i . table[r, h, :]
  unsigned long long *vmass_fx;     // (B*H, T, kValueRows) x 2 words: sum_j P_ij [r(i, j) = r]
  float *vmass;                     // (B*H, T, kValueRows)
  // the parameters a flash kernel stages in shared memory (ParamCache): bit n for parameter n
  uint32_t param_cache;
};

// The place of row i of slice bh in o (times D) and lse: rows [o_row0, T) a slice (Params::o_row0);
// a row before o_row0 is not stored (out_stored).
template <class P> APE_HD inline int64_t out_row(const P &p, int64_t bh, int64_t i) {
  return bh * p.o_ld + i - p.o_row0;
}
template <class P> APE_HD inline bool out_stored(const P &p, int64_t i) { return i >= p.o_row0 && i < p.T; }

// Rows of the value-rows table (0 without one).
template <class Enc> constexpr int64_t value_rows() {
  if constexpr (traits::HasValueRows<Enc>::value) return Enc::kValueRows;
  else return 0;
}

template <class Enc, class In>
__device__ inline DevCtx<Enc> make_ctx(const Params<Enc, In> &p, int64_t bh, bool sinks) {
  DevCtx<Enc> c;
  c.b = bh / p.H, c.h = bh % p.H, c.H = p.H, c.T = p.T, c.D = p.D;
  for (int n = 0; n < Params<Enc, In>::NP; ++n) {
    c.params.p[n] = p.params[n];
    c.dparams.p[n] = sinks ? p.dparam_fx[n] : nullptr;
  }
  c.dparams.status = p.status;
  c.tok = p.tok ? p.tok + bh * Enc::kNumTok * p.tok_ld : nullptr;
  c.tok_ld = p.tok_ld, c.tok0 = p.tok0;
  c.tok_carry = p.tok_carry ? p.tok_carry + 2 * bh * Enc::kNumTok : nullptr;
  c.dtok.data = (sinks && p.dtok_fx) ? p.dtok_fx + 2 * bh * Enc::kNumTok * p.T : nullptr;
  c.dtok.status = p.status;
  if constexpr (traits::NumRel<Enc>::value > 0) {
    for (int n = 0; n < Enc::kNumRel; ++n) {
      const int64_t rows = Enc::rel_rows(n);
      // (rows [rel_row0, ...) of the slice stored: the functor reads no row before it)
      c.rel.p[n] = p.rel[n] + (bh * p.rel_ld[n] - p.rel_row0[n]) * rows;
      c.drel.p[n] = (sinks && p.drel_fx[n]) ? p.drel_fx[n] + 2 * bh * p.T * rows : nullptr;
    }
  }
  c.drel.status = p.status;
  c.vmass.data = (sinks && p.vmass_fx) ? p.vmass_fx + 2 * bh * p.T * value_rows<Enc>() : nullptr;
  c.vmass.status = p.status;
  return c;
}

// DevCtx with warp-collective sinks (WarpFixedRef): for a call every lane of the warp makes at
// once.
template <class Enc> struct WarpDevCtx : DevCtx<Enc> {
  WarpFixedSink dtok;                                  // shadow DevCtx's sinks
  WarpFixedSinks<array_len(Enc::kNumParams)> dparams;
  WarpFixedSinks<DevCtx<Enc>::NR> drel;
  explicit APE_HD WarpDevCtx(const DevCtx<Enc> &c) : DevCtx<Enc>(c) {
    dtok = WarpFixedSink{c.dtok.data, c.dtok.status};
    for (int n = 0; n < array_len(Enc::kNumParams); ++n) dparams.p[n] = c.dparams.p[n];
    dparams.status = c.dparams.status;
    for (int n = 0; n < DevCtx<Enc>::NR; ++n) drel.p[n] = c.drel.p[n];
    drel.status = c.drel.status;
  }
};

// Partner column under a pairing (Enc::kQPairing / kKPairing: ape_abi::Pairing's code, 0 none,
// 1 half, 2 interleaved): the rule of ape_abi::partner, shared with cpu/attention.h.
APE_HD inline int64_t partner(int pairing, double fraction, int64_t D, int64_t c) {
  return ::ape_abi::partner(static_cast<::ape_abi::Pairing>(pairing), fraction, D, c);
}

// ---- tiles -----------------------------------------------------------------------------------------
// Every kernel fits the smallest per-block shared memory of the architectures it claims (sm_80,
// 86, 89, 90): sm_86/89's 99 KiB (kSmemLimit), except the flash backward's wide layout at
// D = 128, which has a narrow twin for those two. Tensor-core tiles are 64 x 64 where that fits and
// 64 x 32 or 32 x 32 at D = 128; fp32 (SIMT, for testing) uses 32-row tiles, 16 at D = 128 in the
// backward.
constexpr size_t kSmemLimit = 101376;  // 99 KiB
// The flash backward's wide layout (FlashBwd) runs only where a block may have more: at most
// sm_80's 163 KiB (the launch checks the device's own limit first).
constexpr size_t kSmemLimitWide = 166912;
// sm_90's 227 KiB: the flash backward's wgmma layout (sm_90a only).
constexpr size_t kSmemLimitSm90 = 232448;
template <class In, int D> struct Cfg {
  static constexpr bool kTC = !std::is_same_v<In, float>;  // tensor cores
  static constexpr int kFwdBQ = kTC ? 64 : 32;
  static constexpr int kFwdBK = (kTC && D == 128) ? 32 : kFwdBQ;
  static constexpr int kBwdBQ = kTC ? (D == 128 ? 32 : 64) : (D == 128 ? 16 : 32);
  static constexpr int kBwdBK = kTC ? (D == 32 ? 64 : 32) : (D == 128 ? 16 : 32);
  static constexpr int kPadIn = kTC ? 8 : 4;  // 16 bytes: WMMA leading dims, fewer bank conflicts
  static constexpr int kLdIn = D + kPadIn;   // rows of q, k, v, dout tiles (In)
  static constexpr int kLdAcc = D + 4;       // rows of fp32 accumulators (o, dq, dk, dv)
};

// Rows [r0, r0 + R) of a (T, D) matrix into shared memory (leading dim ld); rows >= T are zero.
template <class In, int R, int D>
__device__ inline void load_rows(In *dst, int ld, const In *src, int64_t r0, int64_t T) {
  for (int e = threadIdx.x; e < R * D; e += kThreads) {
    const int r = e / D, c = e % D;
    dst[r * ld + c] = r0 + r < T ? src[(r0 + r) * D + c] : from_float<In>(0.f);
  }
}

template <int R, int C> __device__ inline void zero_acc(float *a, int ld) {
  for (int e = threadIdx.x; e < R * C; e += kThreads) a[(e / C) * ld + e % C] = 0.f;
}

namespace wmma = nvcuda::wmma;

// C(M, N) = A(M, K) B(N, K)^T; A, B row-major in shared memory, C fp32.
template <int M, int N, int K, class In>
__device__ inline void mm_abt(const In *A, int la, const In *B, int lb, float *C, int lc) {
  if constexpr (std::is_same_v<In, float>) {
    for (int e = threadIdx.x; e < M * N; e += kThreads) {
      const int r = e / N, c = e % N;
      float acc = 0.f;
      for (int k = 0; k < K; ++k) acc += A[r * la + k] * B[c * lb + k];
      C[r * lc + c] = acc;
    }
  } else {
    for (int f = threadIdx.x / 32; f < (M / 16) * (N / 16); f += kWarps) {
      const int fm = f / (N / 16), fn = f % (N / 16);
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
      for (int k = 0; k < K; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, In, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, In, wmma::col_major> b;  // B^T
        wmma::load_matrix_sync(a, A + fm * 16 * la + k, la);
        wmma::load_matrix_sync(b, B + fn * 16 * lb + k, lb);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(C + fm * 16 * lc + fn * 16, acc, lc, wmma::mem_row_major);
    }
  }
}

// C(M, N) += op(A) B(K, N) with op(A) = A (stored (M, K)) or, kTransA, A^T (stored (K, M)).
template <int M, int N, int K, bool kTransA, class In>
__device__ inline void mm_acc(const In *A, int la, const In *B, int lb, float *C, int lc) {
  if constexpr (std::is_same_v<In, float>) {
    for (int e = threadIdx.x; e < M * N; e += kThreads) {
      const int r = e / N, c = e % N;
      float acc = C[r * lc + c];
      for (int k = 0; k < K; ++k)
        acc += (kTransA ? A[k * la + r] : A[r * la + k]) * B[k * lb + c];
      C[r * lc + c] = acc;
    }
  } else {
    using LayoutA = std::conditional_t<kTransA, wmma::col_major, wmma::row_major>;
    for (int f = threadIdx.x / 32; f < (M / 16) * (N / 16); f += kWarps) {
      const int fm = f / (N / 16), fn = f % (N / 16);
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, C + fm * 16 * lc + fn * 16, lc, wmma::mem_row_major);
      for (int k = 0; k < K; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, In, LayoutA> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, In, wmma::row_major> b;
        wmma::load_matrix_sync(a, kTransA ? A + k * la + fm * 16 : A + fm * 16 * la + k, la);
        wmma::load_matrix_sync(b, B + k * lb + fn * 16, lb);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(C + fm * 16 * lc + fn * 16, acc, lc, wmma::mem_row_major);
    }
  }
}

}  // namespace detail
APE_CUDA_ABI_END
}  // namespace ape::cuda
