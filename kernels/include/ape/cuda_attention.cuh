// CUDA flash-attention template for generated positional encodings (docs/cuda.md).
//
// The sibling of cpu_attention.h: apec emits, per encoding, the same `Enc` functor (token
// program, q/k mods, score mod and their gradients; members declared APE_HD and templated on the
// context type) and explicit instantiations of attention_forward / attention_backward below, one
// per (input dtype, head dim). Plain CUDA C++17: no MLIR, no LibTorch. Build with nvcc
// --expt-relaxed-constexpr (the functors call std::max / std::clamp in device code), sm_80+.
//
// Attention is causal (key j visible from query i iff j <= i). Per (b, h) slice:
//   forward : tok = token_forward(features)           one block per slice (block-parallel scans)
//             q' = q_mod(q), k' = k_mod(k)            16-byte runs, fp32, stored in the input dtype
//             per query tile: s_ij = score_mod(scale q'_i.k'_j), online softmax, o = P v,
//             lse_i = log sum_j exp(s_ij)             16-bit inputs: flash_forward_kernel
//                                                     (mma.sync, docs/cuda.md); f32 inputs and
//                                                     value rows: forward_kernel
//   backward: recompute tok, q', k'; Delta_i = dO_i . O_i; P = exp(s - lse) recomputed;
//             dS = scale score_mod_grad(P (dP - Delta)) with dP = dO V^T;
//             16-bit inputs: flash_backward_kernel, one pass over the key tiles (dV = P^T dO,
//             dK' = dS^T Q' in registers, dQ' = dS K' added in a fixed order; dq, dk written
//             there in the input dtype where no mod or relative rows follow); otherwise
//             dkdv_kernel per key tile and dq_kernel per query tile;
//             then back through the mods (16-byte runs, where the kernel did not write dq, dk)
//             and the token program (one block per slice, reverse scans).
// Deterministic: every float sum has a fixed order. The gradients that the functors accumulate
// into token slots (row/column sums of the score mod) and into params (head sums, scatters,
// token sums of the q/k mods) are added as 128-bit fixed-point integers (two 64-bit words;
// integer atomicAdd is order independent), then converted to float: bitwise reproducible for
// any schedule; what fixed point cannot hold is reported in the status word. Each (i, j)
// contributes once (in the two-kernel backward, dq_kernel's sinks are off).
//
// Shapes: B batch, H heads, T sequence length, D head dim (32, 64 or 128); q, k, v, o, dout, dq,
// dk, dv (B, H, T, D) in the input dtype; lse (B, H, T), features (B, H, T), params: float32.
#pragma once

#include "cuda_platform.cuh"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "abi.h"
#include "cuda_flash_tile.cuh"
#include "cuda_kernel_entry.h"
#include "enc_traits.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "ape/cuda_attention.cuh needs sm_80 or newer (bf16 tensor cores)"
#endif

namespace ape::cuda {
APE_CUDA_ABI_BEGIN
namespace detail {

constexpr int kThreads = 128;  // 4 warps per block
constexpr int kWarps = kThreads / 32;

constexpr int array_len(int n) { return n > 0 ? n : 1; }
constexpr size_t align_up(size_t n) { return (n + 127) / 128 * 128; }
constexpr float kInf = __builtin_huge_valf();
constexpr int kTokThreads = 256;  // threads of the token program's block (one per slice)
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

// ---- deterministic gradient sinks (fixed point, see the header comment) ---------------------------
// A sink element is a 128-bit fixed-point number kept as two 64-bit integers: a term g adds
// hi = round(g 2^32) to the first and lo = round((g 2^32 - hi) 2^32) to the second, so the sum
// is hi_sum 2^-32 + lo_sum 2^-64, exact to 2^-64 per term and the same for any order of the
// additions. What fixed point cannot hold is reported in the call's status word
// (cuda_kernel_entry.h): a non-finite term (kStatusNonFinite), a term of magnitude >= 2^31
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

// `sink[i] += g` adds g to element i (nothing when the sink is off).
struct FixedRef {
  unsigned long long *p;  // the element's two words
  uint32_t *status;
  APE_HD void operator+=(float g) const {
#ifdef APE_DEVICE_CODE
    if (!p) return;
    const FixedTerm t = to_fixed(g);
    uint32_t st = t.status;
    if (t.hi != 0) {
      const long long old = static_cast<long long>(atomicAdd(p, static_cast<unsigned long long>(t.hi)));
      const long long sum = static_cast<long long>(static_cast<unsigned long long>(old) +
                                                   static_cast<unsigned long long>(t.hi));
      if (((old ^ sum) & (t.hi ^ sum)) < 0) st |= kStatusOverflow;  // signed wrap
    }
    if (t.lo != 0) atomicAdd(p + 1, static_cast<unsigned long long>(t.lo));
    if (st) atomicOr(status, st);
#else
    (void)g;
    __builtin_trap();  // the sinks exist on the device only
#endif
  }
};
struct FixedSink {
  unsigned long long *data;
  uint32_t *status;
  APE_HD FixedRef operator[](int64_t i) const {
    return FixedRef{data ? data + 2 * i : nullptr, status};
  }
};
template <int N> struct FixedSinks {
  unsigned long long *p[N];
  uint32_t *status;
  APE_HD FixedSink operator[](int n) const { return FixedSink{p[n], status}; }
};
template <int N> struct ParamPtrs {
  const float *p[N];
  APE_HD const float *operator[](int n) const { return p[n]; }
};

// The context the functors see on the GPU: the members of ape::HeadCtx, with sinks in place of
// the private accumulators.
template <class Enc> struct DevCtx {
  static constexpr int NR = array_len(traits::NumRel<Enc>::value);
  int64_t b, h, H, T, D;
  ParamPtrs<array_len(Enc::kNumParams)> params;
  const float *tok;                              // this slice: tok[n*T + t]
  FixedSink dtok;                                // this slice, same layout
  FixedSinks<array_len(Enc::kNumParams)> dparams;  // global sums
  ParamPtrs<NR> rel;                             // this slice's relative rows n: (T, rows_n)
  FixedSinks<NR> drel;                           // their gradients, same layout
  FixedSink vmass;                               // value rows: sum_j P_ij per (i, row), (T, rows)

  // The token program's stages (emitEncFunctor), run by all threads of one block per slice
  // (token_forward_kernel, token_backward_kernel): each thread takes every blockDim-th token,
  // a barrier separates the stages, and the scans are block-parallel in double.
  __device__ static int64_t tok_first() { return threadIdx.x; }
  __device__ static int64_t tok_step() { return blockDim.x; }
  __device__ static void tok_sync() { __syncthreads(); }
  // dst[t] = sum_{u <= t} src[u] (kReverse: dst[t] += sum_{u >= t} src[u]), in double. Thread k
  // sums a contiguous chunk, thread 0 scans the block's chunk sums (a fixed order: the result
  // does not depend on the schedule), then each thread rescans its chunk from its offset.
  template <bool kReverse, class T>
  __device__ static void block_scan(const T *__restrict__ src, T *__restrict__ dst, int64_t n) {
    APE_STATIC_SMEM(double, part, kTokThreads);
    const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
    const int64_t chunk = (n + nt - 1) / nt;
    const int64_t a = tid * chunk < n ? tid * chunk : n, b = a + chunk < n ? a + chunk : n;
    double sum = 0;
    for (int64_t t = a; t < b; ++t) sum += src[t];
    part[tid] = sum;
    __syncthreads();
    if (tid == 0) {  // exclusive prefix (suffix) sums of the chunks
      double acc = 0;
      for (int k = 0; k < nt; ++k) {
        const int c = kReverse ? nt - 1 - k : k;
        const double v = part[c];
        part[c] = acc;
        acc += v;
      }
    }
    __syncthreads();
    double acc = part[tid];
    if constexpr (kReverse)
      for (int64_t t = b - 1; t >= a; --t) acc += src[t], dst[t] += T(acc);
    else
      for (int64_t t = a; t < b; ++t) acc += src[t], dst[t] = T(acc);
    __syncthreads();  // `part` is free again
  }
  template <class T> __device__ static void tok_scan(const T *src, T *dst, int64_t n) {
    block_scan<false>(src, dst, n);
  }
  template <class T> __device__ static void tok_rscan_add(const T *src, T *dst, int64_t n) {
    block_scan<true>(src, dst, n);
  }
};

// ---- launch parameters (one plain struct, by value) -----------------------------------------------
template <class Enc, class In> struct Params {
  static constexpr int NF = array_len(Enc::kNumFeatures), NP = array_len(Enc::kNumParams);
  int64_t B, H, T, D;
  const In *q, *k, *v;
  In *o;
  float *lse;
  const float *feat[NF];
  const float *params[NP];
  float scale;
  float log2_scale, inv_scale;      // flash kernels (scale > 0 there: positive_scale)
  int64_t tile0;                    // forward: the first query tile computed (first_row / BQ)
  const In *dout;
  In *dq, *dk, *dv;
  float *dfeat[NF];
  float *dparams[NP];
  // scratch
  float *tok;                       // (B*H, kNumTok, T)
  const In *qm, *km;                // (B*H, T, D): q', k' (= q, k without a mod)
  float *delta;                     // (B*H, T)
  float *dqm, *dkm;                 // (B*H, T, D) gradients w.r.t. q', k'
  unsigned long long *dtok_fx;      // (B*H, kNumTok, T) x 2 words
  float *dtok;                      // (B*H, kNumTok, T)
  unsigned long long *dparam_fx[NP];  // numel x 2 words each
  uint32_t *status;                 // CudaAttnArgs::status (backward)
  int *dq_sem;                      // (B*H, ceil(T / BQ)): the order of dQ' adds (flash backward)
  bool dq_direct;                   // flash backward: key tile 0 writes dq (flash_dq_direct)
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
  float *rel[NR];                   // (B*H, T, rows_n): (x' + bias_h) . table[r, h, :]
  unsigned long long *drel_fx[NR];  // (B*H, T, rows_n) x 2 words
  float *drel[NR];                  // (B*H, T, rows_n)
  float *vdrow;                     // (B*H, T, kValueRows): dO_i . table[r, h, :]
  unsigned long long *vmass_fx;     // (B*H, T, kValueRows) x 2 words: sum_j P_ij [r(i, j) = r]
  float *vmass;                     // (B*H, T, kValueRows)
};

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
  c.tok = p.tok ? p.tok + bh * Enc::kNumTok * p.T : nullptr;
  c.dtok.data = (sinks && p.dtok_fx) ? p.dtok_fx + 2 * bh * Enc::kNumTok * p.T : nullptr;
  c.dtok.status = p.status;
  if constexpr (traits::NumRel<Enc>::value > 0) {
    for (int n = 0; n < Enc::kNumRel; ++n) {
      const int64_t rows = Enc::rel_rows(n);
      c.rel.p[n] = p.rel[n] + bh * p.T * rows;
      c.drel.p[n] = (sinks && p.drel_fx[n]) ? p.drel_fx[n] + 2 * bh * p.T * rows : nullptr;
    }
  }
  c.drel.status = p.status;
  c.vmass.data = (sinks && p.vmass_fx) ? p.vmass_fx + 2 * bh * p.T * value_rows<Enc>() : nullptr;
  c.vmass.status = p.status;
  return c;
}

// Partner column under a pairing (Enc::kQPairing / kKPairing: ape_abi::Pairing's code, 0 none,
// 1 half, 2 interleaved): the rule of ape_abi::partner, shared with cpu_attention.h.
APE_HD inline int64_t partner(int pairing, double fraction, int64_t D, int64_t c) {
  return ::ape_abi::partner(static_cast<::ape_abi::Pairing>(pairing), fraction, D, c);
}

// ---- tiles -----------------------------------------------------------------------------------------
// Every kernel fits the smallest per-block shared memory of the architectures it claims (sm_80,
// 86, 89, 90): sm_86/89's 99 KiB (kSmemLimit). Tensor-core tiles are 64 x 64 where that fits and
// 64 x 32 or 32 x 32 at D = 128; fp32 (SIMT, for testing) uses 32-row tiles, 16 at D = 128 in the
// backward.
constexpr size_t kSmemLimit = 101376;  // 99 KiB
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

// ---- token program and mods ------------------------------------------------------------------------
// One block of kTokThreads per slice (grid B*H): the stages of the token program cooperatively.
template <class Enc, class In>
__global__ void __launch_bounds__(kTokThreads) token_forward_kernel(const Params<Enc, In> p) {
  const int64_t bh = blockIdx.x;
  const DevCtx<Enc> ctx = make_ctx(p, bh, false);
  const float *feat[Params<Enc, In>::NF];
  for (int n = 0; n < Enc::kNumFeatures; ++n) feat[n] = p.feat[n] + bh * p.T;
  Enc::token_forward(ctx, feat, p.tok + bh * Enc::kNumTok * p.T);
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
  Enc::token_backward(ctx, feat, p.tok + off, p.dtok + off, dfeat);
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
template <class X, int kV> __device__ inline void store_run(X *r, const X (&v)[kV]) {
  static_assert(kV * sizeof(X) % 16 == 0, "whole 16-byte chunks");
  constexpr int kPer = 16 / static_cast<int>(sizeof(X));
  #pragma unroll
  for (int k = 0; k < kV / kPer; ++k) {
    ptx::F4 w;
    memcpy(&w, v + k * kPer, 16);
    *reinterpret_cast<ptx::F4 *>(r + k * kPer) = w;
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

// xm = mod(x) (kIsQ: q_mod, else k_mod), computed in fp32: a thread per run of kV elements, or
// per pair of partner runs (partner_run), in 16-byte loads and stores: each byte read and
// written once.
template <class Enc, class In, bool kIsQ, int D>
__global__ void mod_forward_kernel(const Params<Enc, In> p, const In *x, In *xm) {
  constexpr int kV = run_len<In>();
  constexpr int kPairing = kIsQ ? Enc::kQPairing : Enc::kKPairing;
  constexpr double kFraction = kIsQ ? Enc::kQFraction : Enc::kKFraction;
  static_assert(D % kV == 0, "whole runs per row");
  const int64_t e = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * kV;
  if (e >= p.B * p.H * p.T * D) return;
  const int64_t c0 = e % D, row = e / D, t = row % p.T, bh = row / p.T;
  const int64_t p0 = partner_run<kV, D>(kPairing, kFraction, c0);
  if (p0 >= 0 && p0 < c0) return;  // the thread of run p0 does this one
  const DevCtx<Enc> ctx = make_ctx(p, bh, false);
  auto mod = [&](int64_t c, In xv, In yv) {
    if constexpr (kIsQ) return from_float<In>(Enc::q_mod(ctx, t, c, to_float(xv), to_float(yv)));
    else return from_float<In>(Enc::k_mod(ctx, t, c, to_float(xv), to_float(yv)));
  };
  const In *xr = x + row * D;
  In own[kV], part[kV], out[kV];
  load_run<In, kV>(xr, c0, own);
  if (p0 >= 0) {
    load_run<In, kV>(xr, p0, part);
    In outp[kV];
    #pragma unroll
    for (int u = 0; u < kV; ++u) out[u] = mod(c0 + u, own[u], part[u]), outp[u] = mod(p0 + u, part[u], own[u]);
    store_run<In, kV>(xm + row * D + p0, outp);
  } else {
    gather_partners<In, kV, D>(kPairing, kFraction, xr, c0, own, part);
    #pragma unroll
    for (int u = 0; u < kV; ++u) out[u] = mod(c0 + u, own[u], part[u]);
  }
  store_run<In, kV>(xm + e, out);
}

// dx = (d mod / dx)^T gm, a thread per run of kV elements (or pair of partner runs), in 16-byte
// loads and stores. Without a mod dx = gm. With one, column c sums its own term's d/dx and its
// partner's term's d/dy (ape_abi::partner pairs columns, so the partner's partner is c; a column
// paired with itself adds both of its own): the same two additions as a row-wise sum, in either
// order. Each term's param gradients go to the sinks once: a pair of runs computes each of its
// terms once; a lone run computes its partners' terms again without sinks.
template <class Enc, class In, bool kIsQ, int D>
__global__ void mod_backward_kernel(const Params<Enc, In> p, const In *x, const float *gm, In *dx) {
  constexpr bool kHasMod = kIsQ ? Enc::kHasQMod : Enc::kHasKMod;
  constexpr int kV = run_len<In>();
  static_assert(D % kV == 0, "whole runs per row");
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
    constexpr int kPairing = kIsQ ? Enc::kQPairing : Enc::kKPairing;
    constexpr double kFraction = kIsQ ? Enc::kQFraction : Enc::kKFraction;
    const int64_t p0 = partner_run<kV, D>(kPairing, kFraction, c0);
    if (p0 >= 0 && p0 < c0) return;  // the thread of run p0 does this one
    const int64_t t = row % p.T, bh = row / p.T;
    const In *xr = x + row * D;
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

// ---- relative rows and the value-rows term ----------------------------------------------------------
// R_n[bh, t, r] = (x'_t + bias_h) . table[r, h, :] with x' = q' (rel_side 0) or k', for every
// slice, row and table row: one thread each, the dot product in fp32 in column order.
template <class Enc, class In>
__global__ void rel_rows_kernel(const Params<Enc, In> p, int n) {
  const int64_t rows = Enc::rel_rows(n), D = p.D;
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= p.B * p.H * p.T * rows) return;
  const int64_t r = e % rows, t = (e / rows) % p.T, bh = e / (rows * p.T), h = bh % p.H;
  const In *x = (Enc::rel_side(n) == 0 ? p.qm : p.km) + (bh * p.T + t) * D;
  const float *table = p.params[Enc::rel_table(n)] + (r * p.H + h) * D;
  const float *bias = Enc::rel_bias(n) >= 0 ? p.params[Enc::rel_bias(n)] + h * D : nullptr;
  float acc = 0.f;
  for (int64_t c = 0; c < D; ++c) acc += (to_float(x[c]) + (bias ? bias[c] : 0.f)) * table[c];
  p.rel[n][e] = acc;
}

// dx'[bh, t, c] += sum_r dR_n[bh, t, r] table[r, h, c] (into dq' or dk', after the attention
// kernels wrote them).
template <class Enc, class In>
__global__ void rel_rows_dx_kernel(const Params<Enc, In> p, int n) {
  const int64_t rows = Enc::rel_rows(n), D = p.D;
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= p.B * p.H * p.T * D) return;
  const int64_t c = e % D, bht = e / D, h = (bht / p.T) % p.H;
  const float *dr = p.drel[n] + bht * rows;
  const float *table = p.params[Enc::rel_table(n)] + h * D + c;
  float acc = 0.f;
  for (int64_t r = 0; r < rows; ++r) acc += dr[r] * table[r * p.H * D];
  (Enc::rel_side(n) == 0 ? p.dqm : p.dkm)[e] += acc;
}

// The table's and the bias's gradients, one thread per element, summed over (b, t) (and r for
// the bias) in a fixed order, added to the parameter gradients the sinks wrote.
template <class Enc, class In>
__global__ void rel_rows_dparams_kernel(const Params<Enc, In> p, int n) {
  const int64_t rows = Enc::rel_rows(n), D = p.D, H = p.H, T = p.T;
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int tab = Enc::rel_table(n), bi = Enc::rel_bias(n);
  const float *bias = bi >= 0 ? p.params[bi] : nullptr;
  const In *xs = Enc::rel_side(n) == 0 ? p.qm : p.km;
  if (e < rows * H * D && Enc::rel_table_trainable(n)) {  // dtable[r, h, c]
    const int64_t c = e % D, h = (e / D) % H, r = e / (D * H);
    float acc = 0.f;
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t bht = (b * H + h) * T + t;
        acc += p.drel[n][bht * rows + r] * (to_float(xs[bht * D + c]) + (bias ? bias[h * D + c] : 0.f));
      }
    p.dparams[tab][e] += acc;
  }
  if (bi >= 0 && Enc::rel_bias_trainable(n) && e < H * D) {  // dbias[h, c]
    const int64_t c = e % D, h = e / D;
    const float *table = p.params[tab];
    float acc = 0.f;
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const float *dr = p.drel[n] + ((b * H + h) * T + t) * rows;
        for (int64_t r = 0; r < rows; ++r) acc += dr[r] * table[(r * H + h) * D + c];
      }
    p.dparams[bi][e] += acc;
  }
}

// Value rows, backward inputs: vdrow[bh, i, r] = dO_i . table[r, h, :].
template <class Enc, class In>
__global__ void value_drow_kernel(const Params<Enc, In> p) {
  constexpr int64_t R = value_rows<Enc>();
  const int64_t D = p.D, e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= p.B * p.H * p.T * R) return;
  const int64_t r = e % R, bht = e / R, h = (bht / p.T) % p.H;
  const In *dout = p.dout + bht * D;
  const float *table = p.params[Enc::kValueTable] + (r * p.H + h) * D;
  float acc = 0.f;
  for (int64_t c = 0; c < D; ++c) acc += to_float(dout[c]) * table[c];
  p.vdrow[e] = acc;
}

// dtable[r, h, c] += sum_{b, i} mass[b, h, i, r] dO[b, h, i, c], one thread per element.
template <class Enc, class In>
__global__ void value_dtable_kernel(const Params<Enc, In> p) {
  constexpr int64_t R = value_rows<Enc>();
  const int64_t D = p.D, H = p.H, T = p.T, e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= R * H * D) return;
  const int64_t c = e % D, h = (e / D) % H, r = e / (D * H);
  float acc = 0.f;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t i = 0; i < T; ++i) {
      const int64_t bhi = (b * H + h) * T + i;
      acc += p.vmass[bhi * R + r] * to_float(p.dout[bhi * D + c]);
    }
  p.dparams[Enc::kValueTable][e] += acc;
}

// ---- forward ---------------------------------------------------------------------------------------
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
  if (t < p.T) {
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

// One block per (query tile, slice): grid (B*H, ceil(T / BQ) - tile0), query tiles from tile0
// (CudaAttnArgs::first_row; 0 but for a decode step). With value rows, each query row
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
  const int64_t base = bh * T * D;
  const DevCtx<Enc> ctx = make_ctx(p, bh, false);

  load_rows<In, BQ, D>(sQ, L::LI, p.qm + base, i0, T);
  zero_acc<BQ, D>(sO, L::LO);
  for (int r = threadIdx.x; r < BQ; r += kThreads) sM[r] = -kInf, sL[r] = 0.f;
  for (int64_t e = threadIdx.x; e < BQ * R; e += kThreads) sMass[e] = 0.f;
  __syncthreads();

  const int64_t i_end = i0 + BQ < T ? i0 + BQ : T;  // queries of this tile: [i0, i_end)
  for (int64_t j0 = 0; j0 < i_end; j0 += BK) {     // causal: keys < i_end
    load_rows<In, BK, D>(sK, L::LI, p.km + base, j0, T);
    load_rows<In, BK, D>(sV, L::LI, p.v + base, j0, T);
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
      p.o[base + (i0 + r) * D + c] = from_float<In>(o);
    }
  }
  for (int r = threadIdx.x; r < BQ; r += kThreads)
    if (i0 + r < T) p.lse[bh * T + i0 + r] = sM[r] + logf(sL[r]);
}

// ---- forward, FlashAttention-2 class (16-bit inputs) ----------------------------------------------
// One block of 4 warps per (query tile of BQ = 128 rows, slice); each warp owns 32 query rows
// (two m16 tiles) for the whole loop. Q stays in shared memory (ldmatrix per k-step), K and V
// tiles of BK = 64 keys are prefetched with 16-byte cp.async into double buffers one tile ahead;
// S = Q'K'^T and O += P V on mma.sync.m16n8k16 with fp32 accumulators; S, P and O never leave
// registers: the score mod and the causal mask are applied to the accumulator elements, the
// online softmax reduces each row over its quad of lanes (shuffles) and uses exp2 with log2 e
// folded into one FMA, and P, rounded to the input dtype, is the A operand of P V as it stands.
// One barrier per tile (after the wait that lands it), which also frees the buffer the next
// prefetch overwrites.
template <class In, int D> struct FlashFwd {
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kMT = D == 128 ? 1 : 2;   // m16 tiles per warp (registers at D = 128)
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

// Distance biases (Enc::kDistanceBias, enc_traits.h: the score mod is s + B(i - j)): the flash
// kernels evaluate B once per distance of a tile pair into shared memory (BQ + BK - 1 values
// instead of BQ BK), the forward adds it with one FFMA per element, and the backward sums
// P (dP - Delta) along each diagonal of the tile in a fixed order and calls distance_bias_grad
// once per distance: the sinks see BQ + BK - 1 terms per tile pair instead of BQ BK.
template <class Enc> constexpr bool flash_distance() {
  return traits::DistanceBias<Enc>::value && value_rows<Enc>() == 0;
}

// Row/column biases (Enc::kRowColBias, enc_traits.h: the score mod is s + R(i) + C(j), Cable's
// S_i - S_j): the flash kernels evaluate R once per query and C once per key of a tile into
// shared memory, the forward adds R + C with one FFMA per element, and the backward sums
// P (dP - Delta) along each query row of the tile and each key column (over all the block's
// query tiles) in a fixed order and calls row_bias_grad / col_bias_grad once per row and column:
// the sinks see BQ terms per tile and BK per block instead of 2 BQ BK per tile.
template <class Enc> constexpr bool flash_rowcol() {
  return traits::RowColBias<Enc>::value && !flash_distance<Enc>() && value_rows<Enc>() == 0;
}

// Dynamic shared memory of a flash kernel (FlashFwd or FlashBwd layout F) for Enc.
template <class Enc, class F> constexpr size_t flash_smem_bytes() {
  return flash_distance<Enc>() ? F::bytes_dist : flash_rowcol<Enc>() ? F::bytes_rowcol : F::bytes;
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
template <class Enc, bool kMasked, bool kRaw, int kMT, int kNT>
__device__ __forceinline__ void flash_softmax_alpha(float (&s)[kMT][kNT][4], float (&alpha_out)[kMT][2],
                                              float (&m)[kMT][2], float (&l)[kMT][2],
                                              const DevCtx<Enc> &ctx, float scale, float kf,
                                              int64_t i0, int64_t j0, int r0, int g, int t,
                                              int64_t T) {
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
            if (visible) x = Enc::score_mod(ctx, i0 + rr, j0 + cc, x);
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
template <class Enc, bool kMasked, bool kRaw, int kMT, int kNT, int kDT>
__device__ __forceinline__ void flash_softmax(float (&s)[kMT][kNT][4], float (&o)[kMT][kDT][4],
                                              float (&m)[kMT][2], float (&l)[kMT][2],
                                              const DevCtx<Enc> &ctx, float scale, float kf,
                                              int64_t i0, int64_t j0, int r0, int g, int t,
                                              int64_t T) {
  float alpha[kMT][2];
  flash_softmax_alpha<Enc, kMasked, kRaw>(s, alpha, m, l, ctx, scale, kf, i0, j0, r0, g, t, T);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
      for (int x = 0; x < 4; ++x) o[mt][dt][x] *= alpha[mt][x / 2];
}

template <class Enc, class In, int D>
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
  const int64_t base = bh * T * D;
  const int r0 = warp * 16 * kMT;  // this warp's first row in the tile
  const DevCtx<Enc> ctx = make_ctx(p, bh, false);

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
  flash::load_tile_async<BQ, D, C::kThreads>(sQ, p.qm + base, i0, T);
  flash::load_tile_async<BK, D, C::kThreads>(sK, p.km + base, 0, T);
  flash::load_tile_async<BK, D, C::kThreads>(sV, p.v + base, 0, T);
  fill_bias(0);  // and the column window
  ptx::cp_async_commit();

  // ldmatrix lane bases (cuda_flash_tile.cuh); the other buffer is BK D elements on.
  const ptx::SmemAddr lQ = flash::lane_base<D, flash::kRowsByQuad>(sQ);
  const ptx::SmemAddr lK = flash::lane_base<D, flash::kColsByQuad>(sK);
  const ptx::SmemAddr lV = flash::lane_base<D, flash::kRowsByQuad>(sV);
  float o[kMT][kDT][4] = {};
  float m[kMT][2], l[kMT][2];
  for (int mt = 0; mt < kMT; ++mt)
    for (int h = 0; h < 2; ++h) m[mt][h] = -kInf, l[mt][h] = 0.f;

  const int64_t i_end = i0 + BQ < T ? i0 + BQ : T;
  const int n_tiles = static_cast<int>((i_end + BK - 1) / BK);  // causal: keys < i_end
  // Tiles [0, n_plain) lie below the diagonal for every row of the block (and the block's rows
  // exist): they run without a mask; the rest test each element. Two copies of the step, so the
  // steady state carries no masking code.
  const int n_plain = i0 + BQ <= T ? static_cast<int>((i0 + 1) / BK) : 0;
  // The softmax in base 2: p = 2^(x kf - m kf). With a score mod, x and m are logits and kf =
  // log2 e; without one (or with a distance or row/column bias, in S) they are raw scores
  // q'.k' (+ the bias / scale) and kf = scale log2 e (one FFMA per element; the host launches the
  // flash kernels with scale > 0, positive_scale, so the max of the raw scores is the max of the
  // logits).
  const float kf = kRaw ? p.scale * kLog2e : kLog2e;
  const float mscale = kRaw ? p.scale : 1.f;  // m in logit units
  auto step = [&](int kt, auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    ptx::cp_async_wait<0>();
    __syncthreads();  // tile kt landed; every warp is done with buffer (kt + 1) % 2
    if (kt + 1 < n_tiles) {
      flash::load_tile_async<BK, D, C::kThreads>(sK + ((kt + 1) & 1) * BK * D, p.km + base,
                                                 int64_t(kt + 1) * BK, T);
      flash::load_tile_async<BK, D, C::kThreads>(sV + ((kt + 1) & 1) * BK * D, p.v + base,
                                                 int64_t(kt + 1) * BK, T);
      fill_bias(kt + 1);
    }
    ptx::cp_async_commit();
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

    flash_softmax<Enc, kMasked, kRaw>(s, o, m, l, ctx, p.scale, kf, i0, j0, r0, g, t, T);

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
  for (int kt = 0; kt < n_plain; ++kt) step(kt, std::false_type{});
  for (int kt = n_plain; kt < n_tiles; ++kt) step(kt, std::true_type{});
  ptx::cp_async_wait<0>();

  // o = O / l, lse = m + log l (natural log); a row without a finite logit: o = 0, lse = -inf.
  for (int mt = 0; mt < kMT; ++mt)
    for (int h = 0; h < 2; ++h) {
      const int64_t i = i0 + r0 + 16 * mt + g + 8 * h;
      const float lt = flash::quad_sum(l[mt][h]);
      if (i >= T) continue;
      const float inv = lt > 0.f ? 1.f / lt : 0.f;
      In *orow = p.o + base + i * D;
      for (int dt = 0; dt < kDT; ++dt) {
        orow[8 * dt + 2 * t] = from_float<In>(o[mt][dt][2 * h] * inv);
        orow[8 * dt + 2 * t + 1] = from_float<In>(o[mt][dt][2 * h + 1] * inv);
      }
      if (t == 0) p.lse[bh * T + i] = m[mt][h] * mscale + logf(lt);
    }
}

// ---- forward, Hopper (sm_90a: TMA, mbarriers, wgmma) -------------------------------------------------
// One block of three warpgroups per (query tile of BQ = 128 rows, slice), FlashAttention-3's
// structure: warpgroup 0 is the producer, warpgroups 1 and 2 the consumers.
//   Producer: one thread issues every copy by TMA (cp.async.bulk.tensor, boxes of the [B·H, T, D]
//     tensors, zeros past T): the Q tile once, then per key tile K' and V into stage kt % 2 of a
//     two-stage ring, each stage with a "full" mbarrier per operand that the copies complete
//     (arrive.expect_tx announces the bytes) and an "empty" mbarrier the consumers arrive on when
//     they are done with the stage; a distance or column bias's window comes with K' by a bulk
//     copy. The warpgroup gives its registers back (setmaxnreg.dec) and the consumers take them
//     (setmaxnreg.inc 240).
//   Consumers: consumer warpgroup c owns rows 64 c .. 64 c + 63 (each warp 16) for the whole loop;
//     per key tile it waits for K', runs S = Q'K'^T on wgmma.m64n128k16 (Q and K' read from their
//     tiles, both K-major), the softmax of the FA2 path (flash_softmax) on the accumulators,
//     waits for V, runs O += P V on wgmma.m64nDk16 (P from registers, the S accumulators rounded
//     to In as they stand; V read MN-major, i.e. transposed by the tensor core) and releases the
//     stage. No block barrier after the start: the producer runs up to two tiles ahead, and while
//     one consumer warpgroup is in its softmax the other's products keep the tensor cores busy.
// Tiles are stored in the canonical layout wgmma reads, which is the layout a TMA box with the
// same swizzle writes: 8-row groups of swizzle rows (128 bytes; 64 at D = 32) whose 16-byte chunks
// are XOR-permuted by the row, a box per 64 columns.
namespace hopper {
// Bytes per swizzle row of a tile of D 16-bit columns (the TMA boxes' and the descriptors' mode).
template <int D> constexpr int swizzle_bytes() { return 2 * D < 128 ? 2 * D : 128; }
// A matrix descriptor kept as its two words. The high word (stride offset, swizzle) is a constant
// of the tile's layout; the low word holds the start address >> 4 (bits 0-13) and the leading
// offset. Moving the operand by a multiple of 16 bytes adds to the low word alone: the block's
// shared window ends below 256 KiB, so the address field never carries into the leading offset.
// Built once per kernel, a descriptor then costs one uniform add per wgmma (the stage's offset,
// then each 16-deep step's, are constants of the loop), as CUTLASS's descriptor iterators do,
// instead of rebuilding the fields from an address every time.
struct Desc {
  uint32_t lo, hi;
  __device__ Desc plus(uint32_t bytes) const { return Desc{lo + (bytes >> 4), hi}; }
  __device__ uint64_t at(uint32_t bytes) const { return (uint64_t(hi) << 32) | (lo + (bytes >> 4)); }
};
__device__ inline Desc split(uint64_t d) { return Desc{uint32_t(d), uint32_t(d >> 32)}; }
// Canonical tiles of R rows at shared-window offset `base`, kAtomCols boxes of R rows each:
// K-major (the k of the product runs along the row: Q, K'), and MN-major (the k runs down the
// rows: V, whose columns are the product's n). step_*(kk): the byte offset of the 16-deep step kk.
template <int D> __device__ inline Desc desc_k(uint32_t base) {
  return split(ptx::smem_desc(base, swizzle_bytes<D>(), 16, 8 * swizzle_bytes<D>()));
}
template <int R, int D> constexpr uint32_t step_k(int kk) {
  constexpr int kSw = swizzle_bytes<D>();
  return uint32_t(32 * kk / kSw) * R * kSw + uint32_t(32 * kk % kSw);
}
template <int R, int D> __device__ inline Desc desc_mn(uint32_t base) {
  return split(ptx::smem_desc(base, swizzle_bytes<D>(), R * swizzle_bytes<D>(), 8 * swizzle_bytes<D>()));
}
template <int D> constexpr uint32_t step_mn(int kk) { return uint32_t(16 * kk) * swizzle_bytes<D>(); }
// The R-row tile at `tile` from rows row0.. of slice bh, one box per 64 (32 at D = 32) columns.
template <int R, int D, class In>
__device__ inline void tma_tile(In *tile, const CUtensorMap *map, int64_t row0, int64_t bh, uint64_t *bar) {
  constexpr int kCols = swizzle_bytes<D>() / 2;
#pragma unroll
  for (int a = 0; a < D / kCols; ++a)
    ptx::tma_load_3d(tile + a * R * kCols, map, a * kCols, static_cast<int>(row0), static_cast<int>(bh), bar);
}
}  // namespace hopper

template <class In, int D> struct HopperFwd {
  static constexpr int kConsumers = 2, kThreads = 128 * (kConsumers + 1);
  static constexpr int BQ = 64 * kConsumers, BK = 128, kStages = 2;
  static constexpr int kNT = BK / 8, kDT = D / 8;
  static constexpr int kSwizzle = hopper::swizzle_bytes<D>();
  static constexpr int kRowElems = kSwizzle / 2, kAtomCols = D / kRowElems;
  static constexpr int kDistLen = BQ + BK;
  // mbarriers (q, full_k[2], full_v[2], empty[2]), the bias windows, then the 1024-byte aligned
  // tiles.
  static constexpr size_t bars = 0, bias = 1024, q = 3072, k = q + sizeof(In) * BQ * D;
  static constexpr size_t v = k + kStages * sizeof(In) * BK * D;
  static constexpr size_t bytes = v + kStages * sizeof(In) * BK * D;
  static constexpr size_t dist = bias, rowcol = bias, bytes_dist = bytes, bytes_rowcol = bytes;
  static_assert(kStages * sizeof(float) * kDistLen <= q - bias, "bias windows fit");
  static_assert(bytes <= 227 * 1024, "forward tiles exceed sm_90's 227 KiB of shared memory");
  static constexpr unsigned kTileBytes = sizeof(In) * BK * D;
};

// TMA descriptors of q', k', v as [B·H, T, D] tensors (host: make_hopper_maps).
struct HopperMaps {
  CUtensorMap q, k, v;
};

template <class Enc, class In, int D>
__global__ void __launch_bounds__(HopperFwd<In, D>::kThreads, 1)
    hopper_forward_kernel(const __grid_constant__ Params<Enc, In> p, const __grid_constant__ HopperMaps maps) {
#ifndef APE_SM90A_CODE
  (void)p, (void)maps;
  __trap();  // sm_90a only (hopper_device)
#else
  using C = HopperFwd<In, D>;
  constexpr int BQ = C::BQ, BK = C::BK, kNT = C::kNT, kDT = C::kDT;
  constexpr float kLog2e = 1.44269504088896341f;
  APE_DYNAMIC_SMEM(smem);
  In *sQ = reinterpret_cast<In *>(smem + C::q), *sK = reinterpret_cast<In *>(smem + C::k);
  In *sV = reinterpret_cast<In *>(smem + C::v);
  uint64_t *bar_q = reinterpret_cast<uint64_t *>(smem + C::bars);
  uint64_t *full_k = bar_q + 1, *full_v = bar_q + 3, *empty = bar_q + 5;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int g = lane / 4, t = lane % 4, wg = warp / 4;
  const int64_t bh = blockIdx.x, T = p.T;
  const int64_t i0 = (p.tile0 + int64_t(gridDim.y - 1 - blockIdx.y)) * BQ;
  const int64_t i_end = i0 + BQ < T ? i0 + BQ : T;
  const int n_tiles = static_cast<int>((i_end + BK - 1) / BK);
  constexpr bool kDist = flash_distance<Enc>(), kRC = flash_rowcol<Enc>();
  constexpr bool kRaw = !Enc::kHasScoreMod || kDist || kRC;
  float *sB = reinterpret_cast<float *>(smem + C::bias);  // distance or column windows
  if (threadIdx.x == 0) {
    ptx::mbar_init(bar_q, 1);
    for (int s = 0; s < C::kStages; ++s) {
      ptx::mbar_init(full_k + s, 1);
      ptx::mbar_init(full_v + s, 1);
      ptx::mbar_init(empty + s, 128 * C::kConsumers);
    }
    ptx::mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {  // ---- producer
    ptx::setmaxnreg_dec<24>();
    if (threadIdx.x != 0) return;
    ptx::mbar_arrive_expect_tx(bar_q, sizeof(In) * BQ * D);
    hopper::tma_tile<BQ, D>(sQ, &maps.q, i0, bh, bar_q);
    constexpr unsigned kBiasBytes = kDist ? sizeof(float) * C::kDistLen : kRC ? sizeof(float) * BK : 0;
    for (int kt = 0; kt < n_tiles; ++kt) {
      const int s = kt & 1;
      if (kt >= C::kStages) ptx::mbar_wait(empty + s, ((kt >> 1) - 1) & 1);
      const int64_t j0 = int64_t(kt) * BK;
      ptx::mbar_arrive_expect_tx(full_k + s, C::kTileBytes + kBiasBytes);
      hopper::tma_tile<BK, D>(sK + s * BK * D, &maps.k, j0, bh, full_k + s);
      if constexpr (kDist)  // distances i0 - j0 - BK + x, x < BQ + BK (dist_table_kernel's pads)
        ptx::bulk_copy(sB + s * C::kDistLen, p.dist + bh * p.dist_ld + kDistPad + (i0 - j0 - BK),
                       kBiasBytes, full_k + s);
      if constexpr (kRC)
        ptx::bulk_copy(sB + s * BK, p.rc + 2 * bh * p.rc_ld + p.rc_ld + j0, kBiasBytes, full_k + s);
      ptx::mbar_arrive_expect_tx(full_v + s, C::kTileBytes);
      hopper::tma_tile<BK, D>(sV + s * BK * D, &maps.v, j0, bh, full_v + s);
    }
    return;
  }

  // ---- consumers
  ptx::setmaxnreg_inc<240>();
  const int cw = wg - 1;           // consumer warpgroup: rows 64 cw ..
  const int r0 = 16 * (warp - 4);  // this warp's first row in the tile
  const DevCtx<Enc> ctx = make_ctx(p, bh, false);
  [[maybe_unused]] float rb[2];  // R / scale of the thread's rows
  if constexpr (kRC) {
    const float *rc_bh = p.rc + 2 * bh * p.rc_ld;
    for (int h = 0; h < 2; ++h) rb[h] = rc_bh[i0 + r0 + g + 8 * h];
  }
  const hopper::Desc dQ = hopper::desc_k<D>(ptx::smem_window_offset(sQ) + uint32_t(64 * cw) * C::kSwizzle);
  const hopper::Desc dK = hopper::desc_k<D>(ptx::smem_window_offset(sK));
  const hopper::Desc dV = hopper::desc_mn<BK, D>(ptx::smem_window_offset(sV));
  float o[1][kDT][4] = {};
  float m[1][2] = {{-kInf, -kInf}}, l[1][2] = {{0.f, 0.f}};
  float(&of)[D / 2] = reinterpret_cast<float(&)[D / 2]>(o[0][0][0]);
  const int n_plain = i0 + BQ <= T ? static_cast<int>((i0 + 1) / BK) : 0;
  const float kf = kRaw ? p.scale * kLog2e : kLog2e;
  const float mscale = kRaw ? p.scale : 1.f;
  ptx::mbar_wait(bar_q, 0);
  // The softmax of tile kt overlaps the P V product of tile kt - 1 (FlashAttention-3's pipelining
  // inside a warpgroup): issue S_kt, issue O += P_{kt-1} V_{kt-1}, wait for S_kt only, run the
  // softmax, then wait for the product, release stage kt - 1, rescale O and pack P_kt (its
  // registers, the A operand of the next product, are free once the product completed).
  float s_acc[1][kNT][4];
  float(&sf)[BK / 2] = reinterpret_cast<float(&)[BK / 2]>(s_acc[0][0][0]);
  uint32_t a[BK / 16][4];  // P of the previous tile
  auto issue_s = [&](int kt) {
    const int s = kt & 1;
    ptx::mbar_wait(full_k + s, (kt >> 1) & 1);
    // S = Q' K'^T (+ B / scale, or + (R + C) / scale, as its initial value)
    [[maybe_unused]] const float *tb = sB + s * C::kDistLen + (r0 + g - 2 * t + BK);
    [[maybe_unused]] const float *cwin = sB + s * BK + 2 * t;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        if constexpr (kDist) s_acc[0][nt][x] = tb[8 * (x / 2) - 8 * nt - x % 2];
        else if constexpr (kRC) s_acc[0][nt][x] = rb[x / 2] + cwin[8 * nt + x % 2];
        else s_acc[0][nt][x] = 0.f;
      }
    const hopper::Desc cK = dK.plus(s * C::kTileBytes);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      ptx::wgmma_ss<In, BK>(sf, dQ.at(hopper::step_k<BQ, D>(kk)), cK.at(hopper::step_k<BK, D>(kk)),
                            kDist || kRC || kk > 0);
    ptx::wgmma_commit();
  };
  auto issue_pv = [&](int kt) {  // O += P_kt V_kt
    const int s = kt & 1;
    ptx::mbar_wait(full_v + s, (kt >> 1) & 1);
    const hopper::Desc cV = dV.plus(s * C::kTileBytes);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) ptx::wgmma_rs<In, D, 1>(of, a[kk], cV.at(hopper::step_mn<D>(kk)), 1);
    ptx::wgmma_commit();
  };
  auto pack_p = [&] {
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) flash::acc_to_a<In>(a[kk], s_acc[0][2 * kk], s_acc[0][2 * kk + 1]);
  };
  auto step = [&](int kt, auto masked) {  // kt >= 1
    constexpr bool kMasked = decltype(masked)::value;
    issue_s(kt);
    issue_pv(kt - 1);
    ptx::wgmma_wait<1>();  // S_kt (the product of tile kt - 1 may still run)
    ptx::fence_regs(sf);
    float alpha[1][2];
    flash_softmax_alpha<Enc, kMasked, kRaw>(s_acc, alpha, m, l, ctx, p.scale, kf, i0,
                                            int64_t(kt) * BK, r0, g, t, T);
    ptx::wgmma_wait<0>();
    ptx::fence_regs(of);
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) ptx::fence_regs(a[kk]);
    ptx::mbar_arrive(empty + ((kt - 1) & 1));  // this thread is done with stage kt - 1
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
      for (int x = 0; x < 4; ++x) o[0][dt][x] *= alpha[0][x / 2];
    pack_p();
  };
  // Tile 0 (O is 0: no product to wait for), the steady state, the masked tiles, the last product.
  issue_s(0);
  ptx::wgmma_wait<0>();
  ptx::fence_regs(sf);
  if (n_plain > 0) flash_softmax<Enc, false, kRaw>(s_acc, o, m, l, ctx, p.scale, kf, i0, 0, r0, g, t, T);
  else flash_softmax<Enc, true, kRaw>(s_acc, o, m, l, ctx, p.scale, kf, i0, 0, r0, g, t, T);
  pack_p();
  int kt = 1;
  for (; kt < n_plain; ++kt) step(kt, std::false_type{});
  for (; kt < n_tiles; ++kt) step(kt, std::true_type{});
  issue_pv(n_tiles - 1);
  ptx::wgmma_wait<0>();
  ptx::fence_regs(of);
#pragma unroll
  for (int kk = 0; kk < BK / 16; ++kk) ptx::fence_regs(a[kk]);
  ptx::mbar_arrive(empty + ((n_tiles - 1) & 1));

  const int64_t base = bh * T * D;
  for (int h = 0; h < 2; ++h) {
    const int64_t i = i0 + r0 + g + 8 * h;
    const float lt = flash::quad_sum(l[0][h]);
    if (i >= T) continue;
    const float inv = lt > 0.f ? 1.f / lt : 0.f;
    In *orow = p.o + base + i * D;
    for (int dt = 0; dt < kDT; ++dt) {
      orow[8 * dt + 2 * t] = from_float<In>(o[0][dt][2 * h] * inv);
      orow[8 * dt + 2 * t + 1] = from_float<In>(o[0][dt][2 * h + 1] * inv);
    }
    if (t == 0) p.lse[bh * T + i] = m[0][h] * mscale + logf(lt);
  }
#endif
}

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

// Kernel 1, one block per (key tile, slice): grid (B*H, ceil(T / BK)). dV = P^T dO and
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

  const int64_t bh = blockIdx.x, T = p.T, j0 = int64_t(blockIdx.y) * BK, base = bh * T * D;
  const DevCtx<Enc> ctx = make_ctx(p, bh, true);
  load_rows<In, BK, D>(sK, L::LI, p.km + base, j0, T);
  load_rows<In, BK, D>(sV, L::LI, p.v + base, j0, T);
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

// Kernel 2, one block per (query tile, slice): grid (B*H, ceil(T / BQ)). dQ' = dS K' over the
// visible key tiles; the score mod's load gradients are kernel 1's (sinks off here).
template <class Enc, class In, int D>
__global__ void __launch_bounds__(kThreads) dq_kernel(const Params<Enc, In> p) {
  using L = BwdSmem<In, D>;
  constexpr int BQ = L::BQ, BK = L::BK;
  APE_DYNAMIC_SMEM(smem);
  In *sK = reinterpret_cast<In *>(smem + L::k), *sV = reinterpret_cast<In *>(smem + L::v);
  const In *sDS = reinterpret_cast<const In *>(smem + L::ds);
  float *sDQ = reinterpret_cast<float *>(smem + L::acc1);

  const int64_t bh = blockIdx.x, T = p.T, i0 = int64_t(blockIdx.y) * BQ, base = bh * T * D;
  const DevCtx<Enc> ctx = make_ctx(p, bh, false);
  bwd_load_rows<Enc, In, D>(p, smem, bh, i0);
  zero_acc<BQ, D>(sDQ, L::LA);
  const int64_t i_end = i0 + BQ < T ? i0 + BQ : T;
  for (int64_t j0 = 0; j0 < i_end; j0 += BK) {
    load_rows<In, BK, D>(sK, L::LI, p.km + base, j0, T);
    load_rows<In, BK, D>(sV, L::LI, p.v + base, j0, T);
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

// ---- FlashAttention-2-class backward (16-bit inputs) ---------------------------------------------
// One pass over the key tiles: a block owns 64 keys (16 per warp) and walks the query tiles that
// see them, from the diagonal down. Per query tile, on mma.sync m16n8k16 with ldmatrix operands:
//   S^T = K' Q'^T and dP^T = V dO^T            (keys are the M dimension: rows of this warp)
//   P^T = exp2(S^T log2e - lse log2e), dS^T = scale * mod_grad(P^T (dP^T - Delta))   (registers)
//   dV += P^T dO,  dK' += dS^T Q'               (P^T, dS^T reused from registers as A operands)
//   dQ'(tile) += dS K'                          (dS^T through shared memory, ldmatrix.trans)
// so 5 GEMMs per tile pair (the two-kernel backward recomputed S and dP: 7), with dK', dV in
// registers until the end. Q', dO of the next query tile are prefetched by cp.async into the
// other half of double buffers.
//
// dQ is deterministic: the blocks of one slice add their dQ' tiles into the fp32 dQ' in a fixed
// order, highest key tile first, by a semaphore per (slice, query tile): the block of key tile kt
// adds to query tile qt once the last(qt) - kt blocks of higher key tiles have (last(qt) is the
// last key tile that qt sees), then releases it. While it holds the turn the rows are its own, so
// the add is a plain read-modify-write of 16-byte chunks through L2 (the tile staged in shared
// memory first), not atomics; the first block stores, and key tile 0, the last, can write dq. The
// grid is 1-D and slice-major, highest key tile first within a slice, so a block waits only on
// blocks that started before it, in steady state each block trails its neighbour by one query
// tile, and the blocks resident at once touch the dQ' rows of a few slices (L2, not DRAM). Cost:
// one spin per tile by one thread and a start-up skew of one step per key tile; the sums are
// identical run to run.
template <class In, int D> struct FlashBwd {
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int BK = 16 * kWarps;          // keys per block, 16 per warp
  static constexpr int BQ = D == 128 ? 32 : 64;   // queries per step (registers at D = 128)
  static constexpr int kNT = BQ / 8, kDT = D / 8;
  // The dQ' tile (BQ x D) over the warps: kQW warps per 16 rows, kQCols columns each.
  static constexpr int kQW = kWarps / (BQ / 16), kQCols = D / kQW;
  static constexpr size_t k = 0, v = k + sizeof(In) * BK * D, q = v + sizeof(In) * BK * D;
  static constexpr size_t dout = q + 2 * sizeof(In) * BQ * D;
  static constexpr size_t ds = dout + 2 * sizeof(In) * BQ * D;
  static constexpr size_t lse = ds + sizeof(In) * BK * BQ;
  static constexpr size_t delta = lse + 2 * sizeof(float) * BQ;
  static constexpr size_t bytes = delta + 2 * sizeof(float) * BQ;
  static_assert(bytes <= kSmemLimit, "backward tiles exceed sm_86/89's 99 KiB of shared memory");
  // Distance biases: two windows of the slice's table of B(d) / scale (BQ + BK distances: those of
  // a tile pair and one before), each warp's two sets of partial diagonal sums of the tile's
  // scale P (dP - Delta) (kDiagLen slots per set, by tile diagonal; flash_diag_partials), and
  // kDistAcc running sums per distance (slot d mod kDistAcc) that carry a distance over the steps
  // that see it.
  static constexpr int kDistLen = BQ + BK, kDistAcc = 128, kDiagLen = BQ + BK;
  static_assert(BQ + BK - 1 <= kThreads, "one diagonal per thread");
  static_assert(BQ + BK - 1 <= kDistAcc, "a step's distances in distinct slots");
  static constexpr size_t dist = bytes, gsum = dist + 2 * sizeof(float) * kDistLen;
  static constexpr size_t dacc = gsum + sizeof(float) * 2 * kWarps * kDiagLen;
  static constexpr size_t bytes_dist = dacc + sizeof(float) * kDistAcc;
  static_assert(bytes_dist <= kSmemLimit, "backward tiles exceed sm_86/89's 99 KiB of shared memory");
  // Row/column biases: C(j) / scale of the block's BK keys (R(i) goes into the rows' lse), and a
  // 16-byte row of 16-bit ones: the B fragment of the sums' products, by ldmatrix.
  static constexpr size_t rowcol = bytes, ones = rowcol + sizeof(float) * BK;
  static constexpr size_t bytes_rowcol = ones + 16;
  static_assert(bytes_rowcol <= kSmemLimit, "backward tiles exceed sm_86/89's 99 KiB of shared memory");
};

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
template <int kNT>
__device__ inline void diag_partials(const float (&v)[kNT][4], float *set0, float *set1, int xoff) {
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
  const int s = 2 * t - g;
  if (g < 2 || t == 0) {
    float *out = (s >= 0 ? set0 : set1) + s + xoff - 8;
    #pragma unroll
    for (int k = 0; k <= kNT; ++k) out[8 * k] = w0[k];
  }
  if (lane == 3) {
    #pragma unroll
    for (int k = 0; k <= kNT; ++k) set0[8 * k + 7 + xoff - 8] = w1[k];
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
  return !Enc::kHasScoreMod || flash_distance<Enc>() || flash_rowcol<Enc>();
}
// The flash backward writes dk itself (no fp32 dK', no mod pass) where dk = dK': no k mod and
// no relative rows (whose gradients add to dK' afterwards). dq likewise, from key tile 0, where
// also the scale was positive (Params::dq_direct, set by the host).
template <class Enc> constexpr bool flash_dk_direct() {
  return !Enc::kHasKMod && traits::NumRel<Enc>::value == 0;
}
template <class Enc> constexpr bool flash_dq_direct() {
  return !Enc::kHasQMod && traits::NumRel<Enc>::value == 0;
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

template <class Enc, class In, int D>
__global__ void __launch_bounds__(FlashBwd<In, D>::kThreads) flash_backward_kernel(const Params<Enc, In> p) {
  using C = FlashBwd<In, D>;
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
  const int kr0 = 16 * warp;                                    // this warp's keys in the tile
  const int qr0 = 16 * (warp / C::kQW), qc0 = (warp % C::kQW) * C::kQCols;  // its dQ' part
  const int64_t n_qt = (T + BQ - 1) / BQ, qt0 = j0 / BQ;
  int *sem = p.dq_sem + bh * n_qt;
  const DevCtx<Enc> ctx = make_ctx(p, bh, true);
  // Distance bias: B(i - j) / scale of query tile qt at x = c - kr + BK (i - j = i0 - j0 + c - kr)
  // in window (qt - qt0) & 1, copied from the slice's table a step ahead like Q' and dO (the
  // window starts at distance i0 - j0 - BK, a multiple of BQ); the initial value of the S^T
  // accumulators, as in the forward. 0 outside [0, T) (masked elements).
  constexpr bool kDist = flash_distance<Enc>();
  constexpr bool kRC = flash_rowcol<Enc>();
  constexpr bool kRaw = !Enc::kHasScoreMod || kDist || kRC;  // S^T in raw-score units
  // Without a score mod of its own (kRaw, kRC) the kernel computes P' = scale P (the host
  // launches it with scale > 0: lse is kept as lse log2 e - log2 scale) and starts the dP^T
  // accumulators at -Delta, so that dS = P' (dP - Delta) is one FMUL; dV accumulates scale dV
  // (1 / scale at the end), the bias sums scale P (dP - Delta).
  constexpr bool kScaledP = kRaw;
  static_assert(kScaledP == flash_scaled_p<Enc>(), "row_stats_kernel's units");
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
  if constexpr (kDist) fill_bias(qt0, 0);
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
  [[maybe_unused]] float col_acc[4] = {};
  // The ones: every lane's ldmatrix row is the same 16 bytes (a fresh register pair per use, no
  // copies of one register into pairs).
  [[maybe_unused]] const ptx::SmemAddr lOnes = ptx::smem_addr_of(smem + C::ones);
  [[maybe_unused]] auto ones = [&](uint32_t (&b)[4]) { ptx::ldmatrix_at<4>(b, lOnes); };
  [[maybe_unused]] const float *rc_bh = p.rc + 2 * bh * p.rc_ld;
  if constexpr (kRC) {
    const int x = static_cast<int>(threadIdx.x);
    if (x < BK / 4) ptx::cp_async_16(sC + 4 * x, rc_bh + p.rc_ld + j0 + 4 * x);
  }

  flash::load_tile_async<BK, D, C::kThreads>(sK, p.km + base, j0, T);
  flash::load_tile_async<BK, D, C::kThreads>(sV, p.v + base, j0, T);
  flash::load_tile_async<BQ, D, C::kThreads>(sQ, p.qm + base, qt0 * BQ, T);
  flash::load_tile_async<BQ, D, C::kThreads>(sDO, p.dout + base, qt0 * BQ, T);
  load_row_stats<BQ, C::kThreads>(sLse, sDelta, p.stats + 2 * bh * p.stats_ld, p.stats_ld, qt0 * BQ);
  ptx::cp_async_commit();

  // ldmatrix lane bases (cuda_flash_tile.cuh); the other buffer is BQ D elements on.
  const ptx::SmemAddr lK = flash::lane_base<D, flash::kRowsByQuad>(sK);   // A of S^T, B of dQ
  const ptx::SmemAddr lV = flash::lane_base<D, flash::kRowsByQuad>(sV);   // A of dP^T
  const ptx::SmemAddr lQn = flash::lane_base<D, flash::kColsByQuad>(sQ);  // B of S^T
  const ptx::SmemAddr lDOn = flash::lane_base<D, flash::kColsByQuad>(sDO);
  const ptx::SmemAddr lQk = flash::lane_base<D, flash::kRowsByQuad>(sQ);  // B of dK
  const ptx::SmemAddr lDOk = flash::lane_base<D, flash::kRowsByQuad>(sDO);
  const ptx::SmemAddr lDS = flash::lane_base<BQ, flash::kColsByQuad>(sDS);
  float dk[kDT][4] = {}, dv[kDT][4] = {};
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
  // A saturated step (kSat: every distance of the tile >= the slice's d_sat, unmasked) adds its
  // dS to one fp32 sum per thread instead of its diagonals' sums.
  auto step = [&](int64_t qt, auto masked, auto sat, [[maybe_unused]] float &sat_sum) {
    constexpr bool kMasked = decltype(masked)::value, kSat = decltype(sat)::value;
    const int buf = static_cast<int>((qt - qt0) & 1);
    const int64_t i0 = qt * BQ;
    ptx::cp_async_wait<0>();
    __syncthreads();  // tile qt landed; every warp is done with the other buffers and with sDS
    if (qt > qt0 && threadIdx.x == 0) atomicAdd(sem + qt - 1, 1);  // release qt - 1 (fenced)
    if (qt + 1 < n_qt) {
      const int nb = buf ^ 1;
      flash::load_tile_async<BQ, D, C::kThreads>(sQ + nb * BQ * D, p.qm + base, i0 + BQ, T);
      flash::load_tile_async<BQ, D, C::kThreads>(sDO + nb * BQ * D, p.dout + base, i0 + BQ, T);
      load_row_stats<BQ, C::kThreads>(sLse + nb * BQ, sDelta + nb * BQ,
                                       p.stats + 2 * bh * p.stats_ld, p.stats_ld, i0 + BQ);
      if constexpr (kDist) fill_bias(qt + 1, nb);
    }
    ptx::cp_async_commit();
    const int bo = buf * 2 * BQ * D;  // the buffer's byte offset
    const float *cLse = sLse + buf * BQ, *cDelta = sDelta + buf * BQ;

    // B at c - kr + BK: this lane's base, plus 8 nt + e - 8 h (immediates).
    [[maybe_unused]] const float *tb = sB + buf * C::kDistLen + (2 * t - kr0 - g + BK);
    // S^T = K' Q'^T (+ B / scale), dP^T = V dO^T (- Delta with kScaledP: cDelta holds -Delta)
    // (this warp's 16 keys x BQ queries).
    [[maybe_unused]] float cq[4] = {};  // C / scale of the thread's keys, as an accumulator
    if constexpr (kRC) cq[0] = cq[1] = sC[kr0 + g], cq[2] = cq[3] = sC[kr0 + g + 8];
    float s[kNT][4] = {}, dp[kNT][4] = {};
    #pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
      #pragma unroll
      for (int x = 0; x < 4; ++x) {
        if constexpr (kDist) s[nt][x] = tb[8 * nt + x % 2 - 8 * (x / 2)];
        if constexpr (kScaledP) dp[nt][x] = cDelta[8 * nt + 2 * t + x % 2];
      }
    #pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ak[4], av[4];
      flash::ldsm_a(ak, flash::frag_at<D>(lK, kr0, 16 * kk));
      flash::ldsm_a(av, flash::frag_at<D>(lV, kr0, 16 * kk));
      #pragma unroll
      for (int nt = 0; nt < kNT; nt += 2) {
        uint32_t b[4];
        flash::ldsm_b_nk(b, flash::frag_at<D>(lQn + bo, 8 * nt, 16 * kk));
        if (kRC && kk == 0) {  // the first step adds C / scale: one register quad for every tile
          ptx::mma_m16n8k16<In>(s[nt], ak, b, cq);
          ptx::mma_m16n8k16<In>(s[nt + 1], ak, b + 2, cq);
        } else {
          flash::mma<In>(s[nt], ak, b);
          flash::mma<In>(s[nt + 1], ak, b + 2);
        }
        flash::ldsm_b_nk(b, flash::frag_at<D>(lDOn + bo, 8 * nt, 16 * kk));
        flash::mma<In>(dp[nt], av, b);
        flash::mma<In>(dp[nt + 1], av, b + 2);
      }
    }

    // P^T and dS^T in place of S^T and dP^T. Element (key row kr = kr0 + g + 8 h, query column
    // c = 8 nt + 2 t + e) is key j = j0 + kr, query i = i0 + c: visible iff kr - c <= dlt
    // (j <= i) and c < cols (i < T), in 32-bit tile coordinates; only masked steps test. Masked
    // elements are 0 and never reach the score mod (with one, the test is a branch; without, a
    // select).
    const int dlt = static_cast<int>(i0 - j0);  // >= 0: the first query tile starts at j0
    const int cols = static_cast<int>(T - i0 < BQ ? T - i0 : BQ);
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int kr = kr0 + g + 8 * h;
      #pragma unroll
      #pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
        #pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = 8 * nt + 2 * t + e;
          const bool visible = !kMasked || (kr - c <= dlt && c < cols);
          float pv, dsv;
          if constexpr (kDist || kRC) {  // the bias is in S^T; its sums below
            pv = ptx::ex2(fmaf(s[nt][2 * h + e], kf, -cLse[c]));
            if constexpr (kMasked) pv = visible ? pv : 0.f;
            dsv = pv * dp[nt][2 * h + e];
            if constexpr (kSat) sat_sum += dsv;
          } else if constexpr (Enc::kHasScoreMod) {
            pv = 0.f, dsv = 0.f;
            if (visible) {
              const int64_t i = i0 + c, j = j0 + kr;
              const float raw = p.scale * s[nt][2 * h + e];
              pv = ptx::ex2(fmaf(Enc::score_mod(ctx, i, j, raw), kLog2e, -cLse[c]));
              dsv = p.scale * Enc::score_mod_grad(ctx, i, j, raw, pv * (dp[nt][2 * h + e] - cDelta[c]));
            }
          } else {  // the scale folded into the exponent: one FFMA
            pv = ptx::ex2(fmaf(s[nt][2 * h + e], kf, -cLse[c]));
            if constexpr (kMasked) pv = visible ? pv : 0.f;
            dsv = pv * dp[nt][2 * h + e];
          }
          s[nt][2 * h + e] = pv;
          dp[nt][2 * h + e] = dsv;
        }
    }

    // The warp's diagonal sums of dS (= scale P (dP - Delta)) into its two sets, by tile diagonal
    // x = c - kr + BK - 1.
    if constexpr (kDist && kBiasGrad && !kSat)
      diag_partials<kNT>(dp, sG + 2 * warp * C::kDiagLen, sG + (2 * warp + 1) * C::kDiagLen,
                         BK - 1 - kr0);

    // dV += P^T dO, dK' += dS^T Q'.
    [[maybe_unused]] uint32_t ones_k[4];  // two B fragments of ones
    if constexpr (kRC && kBiasGrad) ones(ones_k);
    #pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) {
      uint32_t ap[4], ads[4];
      flash::acc_to_a<In>(ap, s[2 * kk], s[2 * kk + 1]);
      flash::acc_to_a<In>(ads, dp[2 * kk], dp[2 * kk + 1]);
      if constexpr (kRC && kBiasGrad) flash::mma<In>(col_acc, ads, ones_k + 2 * (kk & 1));  // key sums
      #pragma unroll
      for (int dt = 0; dt < kDT; dt += 2) {
        uint32_t b[4];
        flash::ldsm_b_kn(b, flash::frag_at<D>(lDOk + bo, 16 * kk, 8 * dt));
        flash::mma<In>(dv[dt], ap, b);
        flash::mma<In>(dv[dt + 1], ap, b + 2);
        flash::ldsm_b_kn(b, flash::frag_at<D>(lQk + bo, 16 * kk, 8 * dt));
        flash::mma<In>(dk[dt], ads, b);
        flash::mma<In>(dk[dt + 1], ads, b + 2);
      }
    }

    // dS^T into shared memory for dQ' = dS K'.
    #pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
      #pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint32_t v2 = flash::pack2<In>(dp[nt][2 * h], dp[nt][2 * h + 1]);
        memcpy(sDS + flash::Swizzle<BQ>::offset(kr0 + g + 8 * h, 8 * nt + 2 * t), &v2, 4);
      }
    if (threadIdx.x == 0) {  // our turn for query tile qt: the higher key tiles have added
      const int64_t i_last = (i0 + BQ < T ? i0 + BQ : T) - 1;
      const int target = static_cast<int>(i_last / BK) - kt;
      while (atomicAdd(sem + qt, 0) != target) {
      }
    }
    __syncthreads();  // dS^T complete, and the turn is ours

    float dq[kQDT][4] = {};
    [[maybe_unused]] uint32_t ones_q[4];
    if constexpr (kRC && kBiasGrad) ones(ones_q);
    [[maybe_unused]] float row_acc[4] = {};
    #pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t a[4];
      flash::ldsm_a_t(a, flash::frag_at<BQ>(lDS, 16 * kk, qr0));
      if constexpr (kRC && kBiasGrad) flash::mma<In>(row_acc, a, ones_q + 2 * (kk & 1));  // row sums
      #pragma unroll
      for (int dt = 0; dt < kQDT; dt += 2) {
        uint32_t b[4];
        flash::ldsm_b_kn(b, flash::frag_at<D>(lK, 16 * kk, qc0 + 8 * dt));
        flash::mma<In>(dq[dt], a, b);
        flash::mma<In>(dq[dt + 1], a, b + 2);
      }
    }
    // Our turn on the fp32 dQ' rows. The first key tile to reach the query tile stores them, and
    // key tile 0, the last, adds the sum so far and writes dq itself where dq = dQ'
    // (p.dq_direct): both through the staging rows (the current Q' and dO buffers, which no warp
    // reads again and the next step's prefetch does not fill) in 16-byte chunks, 512 contiguous
    // bytes per warp instruction, with no memset before and no conversion pass after. The other
    // key tiles add their fragments by fp32 reductions. The order of the adds is the semaphore's.
    const int64_t i_end = i0 + BQ < T ? i0 + BQ : T;
    const bool first = (i_end - 1) / BK == kt, to_dq = kt == 0 && p.dq_direct;
    if (first || to_dq) {  // the same for every thread of the block
      #pragma unroll
      for (int h = 0; h < 2; ++h)
        #pragma unroll
        for (int dt = 0; dt < kQDT; ++dt) {
          const int c = qc0 + 8 * dt + 2 * t;
          *reinterpret_cast<ptx::F2 *>(dq_stage(buf, qr0 + g + 8 * h, c / 4) + c % 4) =
              ptx::F2{dq[dt][2 * h], dq[dt][2 * h + 1]};
        }
      __syncthreads();  // the staged tile is complete
      static_assert(BQ * D / 4 % C::kThreads == 0, "whole chunks per thread");
      const int n_live = static_cast<int>(i_end - i0) * (D / 4);  // chunks of the rows < T
      float *gq = p.dqm + base + i0 * D;                         // the tile's rows, contiguous
      In *gd = p.dq + base + i0 * D;
      #pragma unroll 1  // a rare step (twice per query tile): few registers beside the loop's
      for (int u = 0; u < BQ * D / 4 / C::kThreads; ++u) {
        const int x = static_cast<int>(threadIdx.x) + u * C::kThreads;  // 16-byte chunk x
        if (kMasked && x >= n_live) break;
        ptx::F4 v = *reinterpret_cast<const ptx::F4 *>(dq_stage(buf, x / (D / 4), x % (D / 4)));
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
    } else {
      #pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t i = i0 + qr0 + g + 8 * h;
        if (kMasked && i >= T) continue;
        float *row = p.dqm + base + i * D + qc0 + 2 * t;
        #pragma unroll
        for (int dt = 0; dt < kQDT; ++dt) {
          atomicAdd(row + 8 * dt, dq[dt][2 * h]);
          atomicAdd(row + 8 * dt + 1, dq[dt][2 * h + 1]);
        }
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
      const int rows_left = static_cast<int>(T - i0 < BQ ? T - i0 : BQ) - (qr0 + g);
      float *rg = p.row_g + bh * T + i0 + qr0 + g;
      if (mine && rows_left > 0) atomicAdd(rg, row_acc[0]);
      if (mine && rows_left > 8) atomicAdd(rg + 8, row_acc[2]);
    }
    __threadfence();  // our adds are visible before the release (after the next barrier)
  };
  // Query tiles [qt_plain, n_full) see every key of the block and exist whole: no mask. The first
  // ones (the diagonal) and a partial last one test each element.
  const int64_t n_full = T / BQ;
  int64_t qt_plain = (j0 + BK - 1 + BQ - 1) / BQ;  // first tile with i0 >= j0 + BK - 1
  if (qt_plain > n_full) qt_plain = n_full;
  // Saturated query tiles [qt_sat, n_full): every distance >= d_sat (dist_sat_kernel).
  int64_t qt_sat = n_full;
  if constexpr (kDist && kBiasGrad) {
    qt_sat = (p.dist_sat[bh] + j0 + BK - 1 + BQ - 1) / BQ;
    qt_sat = qt_sat < qt_plain ? qt_plain : qt_sat > n_full ? n_full : qt_sat;
  }
  using Yes = std::true_type;
  using No = std::false_type;
  int64_t qt = qt0;
  float unused = 0.f;
  for (; qt < qt_plain; ++qt) step(qt, Yes{}, No{}, unused);
  for (; qt < qt_sat; ++qt) step(qt, No{}, No{}, unused);
  if constexpr (kDist && kBiasGrad) {
    if (qt_sat < n_full) {  // the running sums the last diagonal step left, before the others
      __syncthreads();
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
  for (; qt < n_full; ++qt) step(qt, No{}, No{}, unused);
  for (; qt < n_qt; ++qt) step(qt, Yes{}, No{}, unused);
  ptx::cp_async_wait<0>();
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(sem + n_qt - 1, 1);
  if constexpr (kDist && kBiasGrad) {  // the distances of the last step that earlier ones left
    const int x = static_cast<int>(threadIdx.x);
    const int64_t d = (n_qt - 1) * BQ - j0 - (BK - 1) + x;
    if (x >= BQ && x < BQ + BK - 1) {
      const float v = sAcc[d & (C::kDistAcc - 1)];
      if (v != 0.f && d < T) dist_g(d) += v;
    }
  }
  if constexpr (kRC && kBiasGrad) {  // one gradient call per key of the block
    for (int h = 0; h < 2; ++h) {
      const int64_t j = j0 + kr0 + g + 8 * h;
      const float sum = col_acc[2 * h];  // every lane of the quad holds it
      if (t == 0 && sum != 0.f && j < T) Enc::col_bias_grad(ctx, j, sum * p.inv_scale);
    }
  }

  // dK' (fp32 scratch; dk itself where dk = dK': flash_dk_direct) and dV.
  for (int h = 0; h < 2; ++h) {
    const int64_t j = j0 + kr0 + g + 8 * h;
    if (j >= T) continue;
    for (int dt = 0; dt < kDT; ++dt) {
      const int64_t off = base + j * D + 8 * dt + 2 * t;
      if constexpr (flash_dk_direct<Enc>()) {
        p.dk[off] = from_float<In>(dk[dt][2 * h]);
        p.dk[off + 1] = from_float<In>(dk[dt][2 * h + 1]);
      } else {
        p.dkm[off] = dk[dt][2 * h];
        p.dkm[off + 1] = dk[dt][2 * h + 1];
      }
      p.dv[off] = from_float<In>(kScaledP ? dv[dt][2 * h] * p.inv_scale : dv[dt][2 * h]);
      p.dv[off + 1] = from_float<In>(kScaledP ? dv[dt][2 * h + 1] * p.inv_scale : dv[dt][2 * h + 1]);
    }
  }
}

// ---- host side -------------------------------------------------------------------------------------
// Scratch memory of one call, stream ordered, freed when the call returns (the frees are queued
// behind the kernels).
class Scratch {
 public:
  explicit Scratch(cudaStream_t s) : stream_(s) {}
  Scratch(const Scratch &) = delete;
  Scratch &operator=(const Scratch &) = delete;
  ~Scratch() {
    for (int n = 0; n < count_; ++n) cudaFreeAsync(ptrs_[n], stream_);
  }
  template <class X> X *take(int64_t n, cudaError_t &err) {
    if (err != cudaSuccess || n <= 0 || count_ == kMax) {
      if (count_ == kMax) err = cudaErrorMemoryAllocation;
      return nullptr;
    }
    void *ptr = nullptr;
    err = cudaMallocAsync(&ptr, sizeof(X) * static_cast<size_t>(n), stream_);
    if (err != cudaSuccess) return nullptr;
    ptrs_[count_++] = ptr;
    return static_cast<X *>(ptr);
  }

 private:
  static constexpr int kMax = 16 + 2 * 64;
  cudaStream_t stream_;
  void *ptrs_[kMax] = {};
  int count_ = 0;
};

inline unsigned blocks_for(int64_t n, int per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

// The arguments of one call checked against the encoding: every pointer the call reads or
// writes is present (a null dfeatures / dparams with features or params would be dereferenced).
template <class Enc>
cudaError_t check_args(const CudaAttnArgs &a, int64_t kD, bool backward) {
  if (a.D != kD || a.B < 0 || a.H < 0 || a.T < 0) return cudaErrorInvalidValue;
  if (!std::isfinite(a.scale)) return cudaErrorInvalidValue;
  if (a.first_row < 0 || (a.T > 0 && a.first_row >= a.T) || (backward && a.first_row != 0))
    return cudaErrorInvalidValue;
  if (a.B * a.H * a.T == 0) return cudaSuccess;
  if (!a.q || !a.k || !a.v || !a.o || !a.lse) return cudaErrorInvalidValue;
  if (Enc::kNumFeatures > 0 && !a.features) return cudaErrorInvalidValue;
  if (Enc::kNumParams > 0 && !a.params) return cudaErrorInvalidValue;
  for (int n = 0; n < Enc::kNumFeatures; ++n)
    if (!a.features[n]) return cudaErrorInvalidValue;
  for (int n = 0; n < Enc::kNumParams; ++n)
    if (!a.params[n] && Enc::param_numel(n, a.H, a.D) > 0) return cudaErrorInvalidValue;
  if (!backward) return cudaSuccess;
  if (!a.dout || !a.dq || !a.dk || !a.dv) return cudaErrorInvalidValue;
  if (Enc::kNumFeatures > 0 && !a.dfeatures) return cudaErrorInvalidValue;
  if (Enc::kNumParams > 0 && !a.dparams) return cudaErrorInvalidValue;
  for (int n = 0; n < Enc::kNumFeatures; ++n)
    if (!a.dfeatures[n]) return cudaErrorInvalidValue;
  for (int n = 0; n < Enc::kNumParams; ++n)
    if (!a.dparams[n] && Enc::param_numel(n, a.H, a.D) > 0) return cudaErrorInvalidValue;
  if ((Enc::kNumTok > 0 || Enc::kNumParams > 0) && !a.status) return cudaErrorInvalidValue;
  return cudaSuccess;
}

template <class Enc, class In>
Params<Enc, In> make_params(const CudaAttnArgs &a) {
  Params<Enc, In> p{};
  p.B = a.B, p.H = a.H, p.T = a.T, p.D = a.D;
  p.q = static_cast<const In *>(a.q), p.k = static_cast<const In *>(a.k);
  p.v = static_cast<const In *>(a.v), p.o = static_cast<In *>(a.o), p.lse = a.lse;
  for (int n = 0; n < Enc::kNumFeatures; ++n) p.feat[n] = a.features[n];
  for (int n = 0; n < Enc::kNumParams; ++n) p.params[n] = a.params[n];
  p.scale = a.scale;
  p.dout = static_cast<const In *>(a.dout);
  p.dq = static_cast<In *>(a.dq), p.dk = static_cast<In *>(a.dk), p.dv = static_cast<In *>(a.dv);
  if (a.dfeatures)
    for (int n = 0; n < Enc::kNumFeatures; ++n) p.dfeat[n] = a.dfeatures[n];
  if (a.dparams)
    for (int n = 0; n < Enc::kNumParams; ++n) p.dparams[n] = a.dparams[n];
  p.qm = p.q, p.km = p.k;
  p.status = a.status;
  return p;
}

// tok, q', k' of every slice (the forward's inputs; the backward recomputes them).
template <class Enc, class In, int kModD>
cudaError_t prepare(Params<Enc, In> &p, Scratch &scratch, cudaStream_t st) {
  cudaError_t err = cudaSuccess;
  const int64_t BH = p.B * p.H, n = BH * p.T * p.D;
  if constexpr (Enc::kNumTok > 0) {
    p.tok = scratch.take<float>(BH * Enc::kNumTok * p.T, err);
    if (err != cudaSuccess) return err;
    if ((err = launch(token_forward_kernel<Enc, In>, static_cast<unsigned>(BH), kTokThreads, 0, st,
                      p)) != cudaSuccess)
      return err;
  }
  if constexpr (Enc::kHasQMod) {
    In *qm = scratch.take<In>(n, err);
    if (err != cudaSuccess) return err;
    if ((err = launch(mod_forward_kernel<Enc, In, true, kModD>, blocks_for(n / run_len<In>(), 256), 256, 0, st, p, p.q,
                      qm)) != cudaSuccess)
      return err;
    p.qm = qm;
  }
  if constexpr (Enc::kHasKMod) {
    In *km = scratch.take<In>(n, err);
    if (err != cudaSuccess) return err;
    if ((err = launch(mod_forward_kernel<Enc, In, false, kModD>, blocks_for(n / run_len<In>(), 256), 256, 0, st, p, p.k,
                      km)) != cudaSuccess)
      return err;
    p.km = km;
  }
  if constexpr (traits::NumRel<Enc>::value > 0) {
    for (int r = 0; r < Enc::kNumRel; ++r) {
      const int64_t m = BH * p.T * Enc::rel_rows(r);
      p.rel[r] = scratch.take<float>(m, err);
      if (err != cudaSuccess ||
          (err = launch(rel_rows_kernel<Enc, In>, blocks_for(m, 256), 256, 0, st, p, r)) != cudaSuccess)
        return err;
    }
  }
  return cudaSuccess;
}

// y = c x elementwise (x, y of n elements; y may be x).
template <class X> __global__ void scale_kernel(const X *x, X *y, int64_t n, float c) {
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e < n) y[e] = from_float<X>(c * to_float<X>(x[e]));
}

// The flash kernels take the max of raw scores and keep lse - log2 scale: they need scale > 0. A
// call with scale <= 0 runs them on q'' = sign(scale) q' (0 for scale 0) with scale |scale| (1 for
// 0): the same logits, and dq' = sign(scale) dq'' (dk' and the rest are unchanged). `qsign` gets
// sign(scale) (1 when nothing changed).
template <class Enc, class In>
cudaError_t positive_scale(Params<Enc, In> &p, Scratch &scratch, cudaStream_t st, float &qsign) {
  qsign = 1.f;
  if (p.scale > 0) {
    p.log2_scale = std::log2(p.scale), p.inv_scale = 1.f / p.scale;
    return cudaSuccess;
  }
  qsign = p.scale < 0 ? -1.f : 0.f;
  p.scale = p.scale < 0 ? -p.scale : 1.f;
  p.log2_scale = std::log2(p.scale), p.inv_scale = 1.f / p.scale;
  cudaError_t err = cudaSuccess;
  const int64_t n = p.B * p.H * p.T * p.D;
  In *qs = scratch.take<In>(n, err);
  if (err != cudaSuccess) return err;
  if ((err = launch(scale_kernel<In>, blocks_for(n, 256), 256, 0, st, p.qm, qs, n, qsign)))
    return err;
  p.qm = qs;
  return cudaSuccess;
}

// The slice tables of distance biases of the flash kernels (dist_table_kernel; scale > 0).
template <class Enc, class In>
cudaError_t make_dist_table(Params<Enc, In> &p, Scratch &scratch, cudaStream_t st) {
  cudaError_t err = cudaSuccess;
  p.dist_ld = (p.T + 3) / 4 * 4 + 2 * kDistPad;  // rows 16-byte aligned
  const int64_t m = p.B * p.H * p.dist_ld;
  p.dist = scratch.take<float>(m, err);
  if (err != cudaSuccess) return err;
  return launch(dist_table_kernel<Enc, In>, blocks_for(m, 256), 256, 0, st, p);
}

// The slice tables of row/column biases of the flash kernels (rowcol_table_kernel; scale > 0).
template <class Enc, class In>
cudaError_t make_rowcol_table(Params<Enc, In> &p, Scratch &scratch, cudaStream_t st) {
  cudaError_t err = cudaSuccess;
  p.rc_ld = (p.T + 127) / 128 * 128;  // whole forward query tiles (and backward tiles)
  const int64_t m = 2 * p.B * p.H * p.rc_ld;
  p.rc = scratch.take<float>(m, err);
  if (err != cudaSuccess) return err;
  return launch(rowcol_table_kernel<Enc, In>, blocks_for(m, 256), 256, 0, st, p);
}

// True when the current device runs the sm_90a (wgmma) kernels: compute capability 9.0 and a
// build with sm_90a code (APE_CUDA_SM90A, set with an sm_90a target; always under the emulator,
// which poses as sm_90 with APE_SIMT_ARCH=90 or ape::simt::set_arch(90)).
inline bool hopper_device() {
#if defined(APE_SIMT) || defined(APE_CUDA_SM90A)
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
#else
  return false;
#endif
}

template <class Kernel> cudaError_t allow_smem(Kernel kernel, size_t bytes) {
  return bytes > 48 * 1024
             ? cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(bytes))
             : cudaSuccess;
}

}  // namespace detail

// Forward: o, lse from q, k, v, features, params (CudaAttnArgs, D == kD).
template <class Enc, class In, int kD> cudaError_t attention_forward(const CudaAttnArgs &a) {
  using namespace detail;
  static_assert(kD == 32 || kD == 64 || kD == 128, "head_dim 32, 64 or 128");
  cudaError_t err = check_args<Enc>(a, kD, false);
  if (err != cudaSuccess || a.B * a.H * a.T == 0) return err;
  const cudaStream_t st = a.stream;
  Params<Enc, In> p = make_params<Enc, In>(a);
  Scratch scratch(st);
  if ((err = prepare<Enc, In, kD>(p, scratch, st)) != cudaSuccess) return err;
  // The flash kernels: 16-bit inputs without value rows (wgmma on sm_90 where the build has
  // sm_90a code, mma.sync elsewhere); the general kernel otherwise.
  if constexpr (!std::is_same_v<In, float> && value_rows<Enc>() == 0) {
    using F = FlashFwd<In, kD>;
    float qsign;
    if ((err = positive_scale(p, scratch, st, qsign)) != cudaSuccess) return err;
    if constexpr (flash_distance<Enc>())
      if ((err = make_dist_table(p, scratch, st)) != cudaSuccess) return err;
    if constexpr (flash_rowcol<Enc>())
      if ((err = make_rowcol_table(p, scratch, st)) != cudaSuccess) return err;
    if (hopper_device()) {
      using H = HopperFwd<In, kD>;
      HopperMaps maps;
      const uint64_t dims[3] = {uint64_t(kD), uint64_t(a.T), uint64_t(a.B * a.H)};
      const uint64_t strides[2] = {sizeof(In) * kD, sizeof(In) * kD * uint64_t(a.T)};
      const uint32_t box_q[3] = {uint32_t(H::kRowElems), uint32_t(H::BQ), 1};
      const uint32_t box_kv[3] = {uint32_t(H::kRowElems), uint32_t(H::BK), 1};
      if ((err = make_tensor_map_16(&maps.q, p.qm, 3, dims, strides, box_q, H::kSwizzle)) != cudaSuccess ||
          (err = make_tensor_map_16(&maps.k, p.km, 3, dims, strides, box_kv, H::kSwizzle)) != cudaSuccess ||
          (err = make_tensor_map_16(&maps.v, p.v, 3, dims, strides, box_kv, H::kSwizzle)) != cudaSuccess)
        return err;
      constexpr size_t bytes = H::bytes;
      if ((err = allow_smem(hopper_forward_kernel<Enc, In, kD>, bytes)) != cudaSuccess) return err;
      p.tile0 = a.first_row / H::BQ;
      const dim3 grid(static_cast<unsigned>(a.B * a.H), blocks_for(a.T, H::BQ) - unsigned(p.tile0));
      return launch(hopper_forward_kernel<Enc, In, kD>, grid, H::kThreads, bytes, st, p, maps);
    }
    constexpr size_t bytes = flash_smem_bytes<Enc, F>();
    if ((err = allow_smem(flash_forward_kernel<Enc, In, kD>, bytes)) != cudaSuccess) return err;
    p.tile0 = a.first_row / F::BQ;
    const dim3 grid(static_cast<unsigned>(a.B * a.H), blocks_for(a.T, F::BQ) - unsigned(p.tile0));
    return launch(flash_forward_kernel<Enc, In, kD>, grid, F::kThreads, bytes, st, p);
  } else {
    using L = FwdSmem<In, kD>;
    constexpr size_t bytes = fwd_smem_bytes<Enc, In, kD>();
    if ((err = allow_smem(forward_kernel<Enc, In, kD>, bytes)) != cudaSuccess) return err;
    p.tile0 = a.first_row / L::BQ;
    const dim3 grid(static_cast<unsigned>(a.B * a.H), blocks_for(a.T, L::BQ) - unsigned(p.tile0));
    return launch(forward_kernel<Enc, In, kD>, grid, kThreads, bytes, st, p);
  }
}

// Backward: dq, dk, dv, dfeatures, dparams from q, k, v, o, lse, dout, features, params.
template <class Enc, class In, int kD> cudaError_t attention_backward(const CudaAttnArgs &a) {
  using namespace detail;
  static_assert(kD == 32 || kD == 64 || kD == 128, "head_dim 32, 64 or 128");
  cudaError_t err = check_args<Enc>(a, kD, true);
  if (err != cudaSuccess) return err;
  const cudaStream_t st = a.stream;
  Params<Enc, In> p = make_params<Enc, In>(a);
  const int64_t BH = a.B * a.H, T = a.T, n = BH * T * kD;
  // Param gradients are global sums: zero them even when there is nothing to sum.
  for (int k = 0; k < Enc::kNumParams; ++k) {
    const int64_t numel = Enc::param_numel(k, a.H, a.D);
    if (numel > 0 && (err = cudaMemsetAsync(a.dparams[k], 0, sizeof(float) * numel, st)) != cudaSuccess)
      return err;
  }
  if (n == 0) return cudaSuccess;
  Scratch scratch(st);
  if ((err = prepare<Enc, In, kD>(p, scratch, st)) != cudaSuccess) return err;
  constexpr int kNumRel = traits::NumRel<Enc>::value;
  constexpr int64_t kValueRows = value_rows<Enc>();
  constexpr bool kFlash = !std::is_same_v<In, float> && kValueRows == 0;
  // The flash backward writes dk itself where dk = dK' (and dq, where dq = dQ' and scale > 0).
  constexpr bool kDirectK = kFlash && flash_dk_direct<Enc>();
  bool direct_q = false;
  p.delta = scratch.take<float>(BH * T, err);
  p.dqm = scratch.take<float>(n, err);
  if constexpr (!kDirectK) p.dkm = scratch.take<float>(n, err);
  if constexpr (Enc::kNumTok > 0) {
    p.dtok_fx = scratch.take<unsigned long long>(2 * BH * Enc::kNumTok * T, err);
    p.dtok = scratch.take<float>(BH * Enc::kNumTok * T, err);
    if (err == cudaSuccess)
      err = cudaMemsetAsync(p.dtok_fx, 0, 2 * sizeof(unsigned long long) * BH * Enc::kNumTok * T, st);
  }
  for (int k = 0; k < Enc::kNumParams; ++k) {
    const int64_t numel = Enc::param_numel(k, a.H, a.D);
    p.dparam_fx[k] = scratch.take<unsigned long long>(2 * numel, err);
    if (err == cudaSuccess && numel > 0)
      err = cudaMemsetAsync(p.dparam_fx[k], 0, 2 * sizeof(unsigned long long) * numel, st);
  }
  if constexpr (kNumRel > 0) {
    for (int r = 0; r < kNumRel; ++r) {
      const int64_t m = BH * T * Enc::rel_rows(r);
      p.drel_fx[r] = scratch.take<unsigned long long>(2 * m, err);
      p.drel[r] = scratch.take<float>(m, err);
      if (err == cudaSuccess) err = cudaMemsetAsync(p.drel_fx[r], 0, 2 * sizeof(unsigned long long) * m, st);
    }
  }
  if constexpr (kValueRows > 0) {
    const int64_t m = BH * T * kValueRows;
    p.vdrow = scratch.take<float>(m, err);
    p.vmass_fx = scratch.take<unsigned long long>(2 * m, err);
    p.vmass = scratch.take<float>(m, err);
    if (err == cudaSuccess) err = cudaMemsetAsync(p.vmass_fx, 0, 2 * sizeof(unsigned long long) * m, st);
    if (err == cudaSuccess)
      err = launch(value_drow_kernel<Enc, In>, blocks_for(m, 256), 256, 0, st, p);
  }
  if (err != cudaSuccess) return err;

  const unsigned ubh = static_cast<unsigned>(BH);
  if ((err = launch(delta_kernel<Enc, In, kD>, blocks_for(BH * T, kDeltaRows), kDeltaThreads, 0, st, p)))
    return err;
  // The flash backward: 16-bit inputs without value rows; the two-kernel backward otherwise.
  if constexpr (kFlash) {
    using F = FlashBwd<In, kD>;
    const In *qm = p.qm;  // the kernels after this one read q' and the scale as given
    float qsign;
    if ((err = positive_scale(p, scratch, st, qsign)) != cudaSuccess) return err;
    constexpr size_t bytes = flash_smem_bytes<Enc, F>();
    const int64_t n_qt = (T + F::BQ - 1) / F::BQ;
    p.dq_sem = scratch.take<int>(BH * n_qt, err);
    if constexpr (flash_distance<Enc>()) {
      if (err == cudaSuccess) err = make_dist_table(p, scratch, st);
      if constexpr (!traits::BiasFixed<Enc>::value) {
        p.dist_g = scratch.take<unsigned long long>(2 * BH * T, err);
        p.dist_fp = scratch.take<unsigned long long>(BH * T, err);
        p.dist_sat = scratch.take<int>(BH, err);
        if (err == cudaSuccess)
          err = cudaMemsetAsync(p.dist_g, 0, 2 * sizeof(unsigned long long) * BH * T, st);
        if (err == cudaSuccess) err = cudaMemsetAsync(p.dist_sat, 0, sizeof(int) * BH, st);
        if (err == cudaSuccess)
          err = launch(dist_fp_kernel<Enc, In>, blocks_for(BH * T, 256), 256, 0, st, p);
        if (err == cudaSuccess)
          err = launch(dist_sat_kernel<Enc, In>, blocks_for(BH * T, 256), 256, 0, st, p);
      }
    }
    if constexpr (flash_rowcol<Enc>()) {
      if (err == cudaSuccess) err = make_rowcol_table(p, scratch, st);
      if constexpr (!traits::BiasFixed<Enc>::value) {
        p.row_g = scratch.take<float>(BH * T, err);
        if (err == cudaSuccess) err = cudaMemsetAsync(p.row_g, 0, sizeof(float) * BH * T, st);
      }
    }
    p.stats_ld = (T + 63) / 64 * 64;  // a whole number of query tiles, 16-byte rows
    p.stats = scratch.take<float>(2 * BH * p.stats_ld, err);
    if (err == cudaSuccess)
      err = launch(row_stats_kernel<Enc, In>, blocks_for(BH * p.stats_ld, 256), 256, 0, st, p);
    direct_q = flash_dq_direct<Enc>() && qsign == 1.f;
    p.dq_direct = direct_q;
    // 1-D, slice-major (flash_backward_kernel): B H ceil(T / BK) blocks.
    const int64_t blocks = BH * blocks_for(T, F::BK);
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    if (err != cudaSuccess ||
        (err = cudaMemsetAsync(p.dq_sem, 0, sizeof(int) * BH * n_qt, st)) != cudaSuccess ||
        (err = allow_smem(flash_backward_kernel<Enc, In, kD>, bytes)) != cudaSuccess ||
        (err = launch(flash_backward_kernel<Enc, In, kD>, static_cast<unsigned>(blocks),
                      F::kThreads, bytes, st, p)) != cudaSuccess)
      return err;
    if constexpr (flash_distance<Enc>() && !traits::BiasFixed<Enc>::value)
      if ((err = launch(dist_grad_kernel<Enc, In>, blocks_for(BH * T, 256), 256, 0, st, p)))
        return err;
    if constexpr (flash_rowcol<Enc>() && !traits::BiasFixed<Enc>::value)
      if ((err = launch(row_grad_kernel<Enc, In>, blocks_for(BH * T, 256), 256, 0, st, p)))
        return err;
    if (qsign != 1.f &&
        (err = launch(scale_kernel<float>, blocks_for(n, 256), 256, 0, st, p.dqm, p.dqm, n, qsign)))
      return err;
    p.qm = qm, p.scale = a.scale;
  } else {
    using L = BwdSmem<In, kD>;
    if ((err = allow_smem(dkdv_kernel<Enc, In, kD>, L::bytes_dkdv)) ||
        (err = allow_smem(dq_kernel<Enc, In, kD>, L::bytes_dq)) ||
        (err = launch(dkdv_kernel<Enc, In, kD>, dim3(ubh, blocks_for(T, L::BK)), kThreads,
                      L::bytes_dkdv, st, p)) ||
        (err = launch(dq_kernel<Enc, In, kD>, dim3(ubh, blocks_for(T, L::BQ)), kThreads,
                      L::bytes_dq, st, p)))
      return err;
  }
  if constexpr (kNumRel > 0) {
    for (int r = 0; r < kNumRel; ++r) {  // the relative rows' gradients into dq', dk'
      const int64_t m = BH * T * Enc::rel_rows(r);
      if ((err = launch(fixed_to_float_kernel<>, blocks_for(m, 256), 256, 0, st,
                        static_cast<const unsigned long long *>(p.drel_fx[r]), p.drel[r], m,
                        static_cast<const uint32_t *>(p.status))) ||
          (err = launch(rel_rows_dx_kernel<Enc, In>, blocks_for(n, 256), 256, 0, st, p, r)))
        return err;
    }
  }
  // dq, dk from dQ', dK' (mod_backward_kernel), where the flash backward did not write them.
  const unsigned mod_blocks = blocks_for(n / run_len<In>(), 256);
  if (!direct_q && (err = launch(mod_backward_kernel<Enc, In, true, kD>, mod_blocks, 256, 0, st, p,
                                 p.q, p.dqm, p.dq)))
    return err;
  if constexpr (!kDirectK)
    if ((err = launch(mod_backward_kernel<Enc, In, false, kD>, mod_blocks, 256, 0, st, p, p.k, p.dkm,
                      p.dk)))
      return err;
  if constexpr (Enc::kNumTok > 0) {
    const int64_t nt = BH * Enc::kNumTok * T;
    if ((err = launch(fixed_to_float_kernel<>, blocks_for(nt, 256), 256, 0, st,
                      static_cast<const unsigned long long *>(p.dtok_fx), p.dtok, nt,
                      static_cast<const uint32_t *>(p.status))) ||
        (err = launch(token_backward_kernel<Enc, In>, static_cast<unsigned>(BH), kTokThreads, 0,
                      st, p)))
      return err;
  } else {
    for (int k = 0; k < Enc::kNumFeatures; ++k)  // features without tokens have no effect
      if ((err = cudaMemsetAsync(a.dfeatures[k], 0, sizeof(float) * BH * T, st)) != cudaSuccess)
        return err;
  }
  for (int k = 0; k < Enc::kNumParams; ++k) {
    const int64_t numel = Enc::param_numel(k, a.H, a.D);
    if (numel > 0 &&
        (err = launch(fixed_to_float_kernel<>, blocks_for(numel, 256), 256, 0, st,
                      static_cast<const unsigned long long *>(p.dparam_fx[k]), a.dparams[k], numel,
                      static_cast<const uint32_t *>(p.status))))
      return err;
  }
  // Tables of relative rows and value rows: their gradients add to what the sinks summed.
  if constexpr (kNumRel > 0) {
    for (int r = 0; r < kNumRel; ++r) {
      const int64_t m = Enc::rel_rows(r) * a.H * kD;
      if ((err = launch(rel_rows_dparams_kernel<Enc, In>, blocks_for(m, 256), 256, 0, st, p, r)))
        return err;
    }
  }
  if constexpr (kValueRows > 0) {
    const int64_t m = BH * T * kValueRows, tab = kValueRows * a.H * kD;
    if (Enc::kValueTableTrainable &&
        ((err = launch(fixed_to_float_kernel<>, blocks_for(m, 256), 256, 0, st,
                       static_cast<const unsigned long long *>(p.vmass_fx), p.vmass, m,
                       static_cast<const uint32_t *>(p.status))) ||
         (err = launch(value_dtable_kernel<Enc, In>, blocks_for(tab, 256), 256, 0, st, p))))
      return err;
  }
  return cudaSuccess;
}

APE_CUDA_ABI_END
}  // namespace ape::cuda

// The two functions of one (encoding, dtype, head dim) variant, for the generated entry:
//   APE_CUDA_INSTANTIATE(ns::Enc, __nv_bfloat16, 64, forward_bf16_hd64, backward_bf16_hd64)
#define APE_CUDA_INSTANTIATE(ENC, IN, D, FWD, BWD)                                         \
  cudaError_t FWD(const ::ape::cuda::CudaAttnArgs &a) {                                    \
    return ::ape::cuda::attention_forward<ENC, IN, D>(a);                                  \
  }                                                                                        \
  cudaError_t BWD(const ::ape::cuda::CudaAttnArgs &a) {                                    \
    return ::ape::cuda::attention_backward<ENC, IN, D>(a);                                 \
  }
