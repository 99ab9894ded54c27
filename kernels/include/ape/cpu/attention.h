// CPU flash-attention template for generated positional encodings (docs/internals.md §2).
//
// apec emits, per encoding, a functor struct `Enc` (token program, q/k mods, score mod and their
// gradients, all static) and instantiates attention_forward / attention_backward with it. This
// header is plain C++17: no MLIR, no LibTorch; OpenMP is used when the compiler enables it.
//
// Attention is causal (key j visible from query i iff j <= i). Both passes work per (b, h) slice
// on tiles of kTileQ queries x kTileK keys and never materialise a T x T matrix:
//   forward  : tok = token_forward(features), q' = q_mod(q), k' = k_mod(k),
//              s_ij = score_mod(scale * q'_i . k'_j), online softmax, o = softmax(s) v,
//              lse_i = log sum_j exp(s_ij).
//   backward : recompute tok, q', k' and P = exp(s - lse); dV = P^T dO; dP = dO V^T;
//              G = P o (dP - Delta) with Delta_i = dO_i . O_i; dS = score_mod_grad(G);
//              dQ' = scale dS K'; dK' = scale dS^T Q'; then back through the mods and the token
//              program. Every slice uses private buffers, parameter gradients are reduced in a
//              fixed (b, h) order: results are bitwise independent of the thread count.
//
// Names of shapes: B batch, H heads, T sequence length, D head dim, Tp = padded_row(T) (T rounded
// up to kTileK, plus 64 bytes).
//
// Members of Enc that a feature does not need are never used, so they may be omitted:
// kHasQMod == false: q_mod, q_mod_grad, kQPairing, kQFraction (k likewise); kHasScoreMod == false:
// score_mod, score_mod_grad; kNumTok == 0: token_forward, token_backward; kNumParams == 0:
// param_numel.
//
// Instruction-set levels (cpu/dispatch.h): the loops below are compiled once per level; they sit
// in a target region and in the level's namespace (ape::cpu_avx2::attention_forward, ...), which
// `inline` makes reachable as ape::attention_forward in every unit. AttnArgs and HeadCtx are
// plain data shared by all levels.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ape/contract/enc_traits.h"
#include "ape/contract/transition.h"
#include "ape/contract/value_rules.h"
#include "ape/contract/vocabulary.h"
#include "ape/cpu/dispatch.h"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>  // the AMX path's AVX-512 intrinsics (always inline, for the avx512 level)
#include <sys/syscall.h>
#include <unistd.h>
#define APE_CPU_AMX_OS 1  // AMX is requested from Linux (arch_prctl) and used by inline assembly
#else
#define APE_CPU_AMX_OS 0
#endif

#ifdef _OPENMP
#include <omp.h>
#define APE_PRAGMA(x) _Pragma(#x)
#else
#define APE_PRAGMA(x)
#endif
#define APE_SIMD APE_PRAGMA(omp simd)
#define APE_SIMD_REDUCE(clause) APE_PRAGMA(omp simd reduction(clause))

namespace ape {

// Tensors held as bfloat16 (the bits, (B, H, T, D) contiguous each): AttnArgs::bf16_io.
struct Bf16Io {
  const uint16_t *q = nullptr, *k = nullptr, *v = nullptr;
  uint16_t *o = nullptr;            // forward: written; backward: read
  const uint16_t *dout = nullptr;   // backward only
  uint16_t *dq = nullptr, *dk = nullptr, *dv = nullptr;  // backward only, overwritten
};

// The type parameter is named Real (not T as in the docs) because T is a member name.
template <typename Real> struct AttnArgs {
  int64_t B, H, T, D;
  const Real *q, *k, *v;           // (B, H, T, D) contiguous
  Real *o;                         // (B, H, T, D)
  Real *lse;                       // (B, H, T): log sum_j exp(l_ij) of the final logits
  const Real *const *features;     // Enc::kNumFeatures arrays, each (B, H, T)
  const Real *const *params;       // Enc::kNumParams arrays, flattened, shapes per manifest
  Real scale;                      // kappa
  // backward only
  const Real *dout;                // (B, H, T, D)
  Real *dq, *dk, *dv;              // (B, H, T, D), overwritten
  Real *const *dfeatures;          // (B, H, T) each, overwritten
  Real *const *dparams;            // shapes of params, overwritten
  // The layer this call computes (0-based) of a model of num_layers: read only by encodings with
  // an attention transition (contract/transition.h), which transform the rows of some layers;
  // num_layers = 0 (the default) transforms none.
  int64_t layer = 0, num_layers = 0;
  // The inputs were bf16 (float copies of them here): on a CPU with AMX (cpu_amx_bf16_usable; or
  // AVX512-BF16 when opted in, cpu_avx512_bf16_usable) the float kernels may then take the tile
  // products with bf16 operands and fp32 sums, as the CUDA kernels do on the tensor cores: q',
  // k', v, dO, P and dS rounded to bf16 (docs/internals.md §2c). false (the default): every
  // product in Real.
  bool bf16_products = false;
  // Real float only: q, k, v, o, dout, dq, dk, dv are bf16 tensors, read and written here (the
  // Real pointers of those eight unused). Each slice converts its rows to fp32 on the way in and
  // rounds its results to nearest even on the way out: the results equal those of fp32 copies
  // rounded afterwards, without the copies (a caller holding bf16 tensors, the operator library,
  // saves their memory and their passes). lse, features, params and their gradients stay Real.
  const Bf16Io *bf16_io = nullptr;
  // Grouped-query attention: k and v (and dk, dv) hold kv_heads heads, (B, kv_heads, T, D), each
  // shared by H / kv_heads consecutive query heads: query head h reads key head h / (H / kv_heads),
  // as PyTorch's scaled_dot_product_attention(enable_gqa=True) and FlashAttention group them. The
  // encoding stays per query head (its mods, features and params): slice (b, h) attends over
  // k_mod_h of its key head's rows, exactly as if k and v were repeated to H heads, and dk, dv are
  // the sums over each group (in head order: bitwise independent of the thread count). 0 (the
  // default): kv_heads = H. H must be a multiple of kv_heads (attention_forward/backward check).
  int64_t kv_heads = 0;
};

// Query heads per key head (AttnArgs::kv_heads): 1 without grouping.
template <typename Real> inline int64_t kv_group(const AttnArgs<Real> &a) {
  return a.kv_heads > 0 ? a.H / a.kv_heads : 1;
}

// Whether this process runs AMX bf16 tile products: the CPU has AMX-TILE and AMX-BF16 (cpuid), Linux
// grants the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, once per process, for every thread),
// and the environment variable APE_CPU_AMX is not "0". Decided once per process and library.
inline bool cpu_amx_bf16_usable() {
#if APE_CPU_AMX_OS
  static const bool usable = [] {
    const char *env = std::getenv("APE_CPU_AMX");
    if (env && std::string(env) == "0") return false;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool amx_bf16 = (edx >> 22) & 1u, amx_tile = (edx >> 24) & 1u;
    if (!amx_bf16 || !amx_tile) return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return usable;
#else
  return false;
#endif
}

// Whether this process takes the bf16 products with AVX512-BF16's VDPBF16PS where it has no AMX
// (AMD Zen 4 and later, Intel Cooper Lake): the environment variable APE_CPU_AVX512BF16 is "1"
// and cpuid leaf 7 subleaf 1 says AVX512_BF16. Opt-in: on the one CPU measured (the Intel Xeon of
// bench/results/cpu_peers_intel_bf16.md with AMX off, where VDPBF16PS issues once a cycle and the
// fp32 FMAs twice) the forward took 1.4x the fp32 products' time (NoPE, T 4096, d_h 128: 215 vs
// 162 ms); on a CPU whose VDPBF16PS runs at twice its fp32 FMA rate it should not: measure there
// before making it the default. Read only at the avx512 level, which runs only where the OS
// keeps the AVX-512 state. Decided once per process and library.
inline bool cpu_avx512_bf16_usable() {
#if APE_CPU_AMX_OS
  static const bool usable = [] {
    const char *env = std::getenv("APE_CPU_AVX512BF16");
    if (!env || std::string(env) != "1") return false;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) return false;
    return ((eax >> 5) & 1u) != 0;
  }();
  return usable;
#else
  return false;
#endif
}
// Whether AttnArgs::bf16_products are taken: on the AMX tiles, or else by VDPBF16PS.
inline bool cpu_bf16_products_usable() { return cpu_amx_bf16_usable() || cpu_avx512_bf16_usable(); }

// The kernels' large scratch blocks (a slice's rows, operands and accumulators), 64-byte aligned
// and kept per thread for the next slice or call: their sizes repeat slice after slice and call
// after call, and glibc returns a freed block above its mmap threshold to the system, so that
// every slice of every call faulted its pages in again, in some processes and not others (bf16
// RoPE, T 1024, d_h 128, forward+backward on the Intel Xeon: 7,000 page faults and 17.5 ms a step,
// against none and 12.9 ms). A freed block of at least kCacheMin bytes waits in its thread's cache
// (at most kCacheSlots blocks and kCacheBytes bytes, the oldest leaving first) for an allocation of
// exactly its size; a thread's cache is freed when the thread ends.
namespace memory {
constexpr std::size_t kCacheMin = std::size_t(64) << 10, kCacheBytes = std::size_t(32) << 20;
constexpr int kCacheSlots = 32;
struct BlockCache {
  void *ptr[kCacheSlots] = {};
  std::size_t bytes[kCacheSlots] = {};
  std::size_t total = 0;
  int next = 0;  // the slot that is emptied next when room is needed
  void evict(int i) {
    ::operator delete(ptr[i], std::align_val_t(64));
    total -= bytes[i], ptr[i] = nullptr, bytes[i] = 0;
  }
  ~BlockCache() {
    for (int i = 0; i < kCacheSlots; ++i)
      if (ptr[i]) evict(i);
  }
};
inline thread_local bool block_cache_gone = false;  // trivial: readable as long as the thread runs
struct BlockCacheOwner {
  BlockCache cache;
  ~BlockCacheOwner() { block_cache_gone = true; }  // blocks freed later go to the system
};
inline BlockCache *block_cache() {
  if (block_cache_gone) return nullptr;
  static thread_local BlockCacheOwner owner;
  return &owner.cache;
}
inline void *allocate(std::size_t bytes) {
  if (bytes >= kCacheMin)
    if (BlockCache *c = block_cache())
      for (int i = 0; i < kCacheSlots; ++i)
        if (c->ptr[i] && c->bytes[i] == bytes) {
          void *p = c->ptr[i];
          c->ptr[i] = nullptr, c->bytes[i] = 0, c->total -= bytes;
          return p;
        }
  return ::operator new(bytes, std::align_val_t(64));
}
inline void release(void *p, std::size_t bytes) {
  if (!p) return;
  if (bytes >= kCacheMin && bytes <= kCacheBytes)
    if (BlockCache *c = block_cache()) {
      int slot = -1;
      for (int i = 0; i < kCacheSlots && slot < 0; ++i)
        if (!c->ptr[i]) slot = i;
      while (slot < 0 || c->total + bytes > kCacheBytes) {  // room, the oldest slots first
        const int i = c->next;
        c->next = (c->next + 1) % kCacheSlots;
        if (c->ptr[i]) c->evict(i);
        if (slot < 0) slot = i;
      }
      c->ptr[slot] = p, c->bytes[slot] = bytes, c->total += bytes;
      return;
    }
  ::operator delete(p, std::align_val_t(64));
}
// The deleter of a cached block (ScratchPtr).
struct Release {
  std::size_t bytes = 0;
  void operator()(void *p) const { release(p, bytes); }
};
}  // namespace memory

// Storage aligned to 64 bytes (a cache line, and the row of an AMX tile: a tile load of rows that
// straddle lines reads twice the lines), from the thread's block cache (memory::allocate):
// std::vector<T, CacheAligned<T>>.
template <class T> struct CacheAligned {
  using value_type = T;
  CacheAligned() = default;
  template <class U> CacheAligned(const CacheAligned<U> &) {}
  T *allocate(std::size_t n) { return static_cast<T *>(memory::allocate(n * sizeof(T))); }
  void deallocate(T *p, std::size_t n) { memory::release(p, n * sizeof(T)); }
  template <class U> bool operator==(const CacheAligned<U> &) const { return true; }
  template <class U> bool operator!=(const CacheAligned<U> &) const { return false; }
};
template <class T> using AlignedVector = std::vector<T, CacheAligned<T>>;

template <typename Real> struct HeadCtx {  // one (b, h) slice, built by the template
  int64_t b, h, H, T, D;
  const Real *const *params;  // global
  Real *const *dparams;       // private accumulators of this (b, h), zeroed; null in forward
  const Real *tok;            // Enc::kNumTok arrays of length T: tok[n*T + t]
  Real *dtok;                 // gradient w.r.t. tok, zeroed, same layout; null in forward
  const Real *const *rel = nullptr;  // Enc::kNumRel arrays (T, rows_n): relative rows
  Real *const *drel = nullptr;       // their gradients, zeroed; null in forward

  // Decoding (cpu/decode.h) extends the token program by new tokens instead of recomputing it:
  // the stages start at token tok0 (the entries before it are already in tok) and each scan
  // continues from its running sum scan_carry[slot] (double; slot = the scan's output sequence,
  // (dst - tok) / T), which it updates. The full forward leaves them at 0 and null.
  int64_t tok0 = 0;
  double *scan_carry = nullptr;
  // Elements between a token sequence's slots in tok and dtok (the generated code's
  // ctx.tok[slot * tok_stride() + t]): T here; a CUDA decode cache's capacity in cuda/common.cuh.
  int64_t tok_stride() const { return T; }

  // The token program's stages (emitEncFunctor): every token from tok0, in order, by one thread.
  // dst[t] = f(a[t]) or f(a[t], b[t]) (dst is none of the sources); dst[t] += f(a[t], b[t]).
  template <class T, class F> void tok_map(T *dst, int64_t n, F f, const T *a) const {
    for (int64_t t = tok0; t < n; ++t) dst[t] = f(a[t]);
  }
  template <class T, class F> void tok_map(T *dst, int64_t n, F f, const T *a, const T *b) const {
    for (int64_t t = tok0; t < n; ++t) dst[t] = f(a[t], b[t]);
  }
  template <class T, class F> void tok_map_add(T *dst, int64_t n, F f, const T *a, const T *b) const {
    for (int64_t t = tok0; t < n; ++t) dst[t] += f(a[t], b[t]);
  }
  static void tok_sync() {}
  // dst[t] = sum_{u <= t} src[u] for t >= tok0, accumulated in double (from scan_carry when set).
  template <class T> void tok_scan(const T *src, T *dst, int64_t n) const {
    double *carry = scan_carry ? scan_carry + (dst - tok) / this->T : nullptr;
    double acc = carry ? *carry : 0;
    for (int64_t t = tok0; t < n; ++t) acc += src[t], dst[t] = T(acc);
    if (carry) *carry = acc;
  }
  // dst[t] += sum_{u >= t} src[u], accumulated in double (the scan's backward).
  template <class T> static void tok_rscan_add(const T *src, T *dst, int64_t n) {
    double acc = 0;
    for (int64_t t = n - 1; t >= 0; --t) acc += src[t], dst[t] += T(acc);
  }
};

}  // namespace ape

// Compiled for this unit's level (no #include inside the region, see cpu/dispatch.h).
APE_CPU_BEGIN
namespace ape {
inline namespace APE_CPU_NS {

namespace detail {

constexpr int64_t kTileQ = 64;  // queries per tile
constexpr int64_t kTileK = 64;  // keys per tile (also the padding unit of the transposed keys)

// Length of a std::array holding n entries (never zero-length).
constexpr std::size_t array_len(int n) { return n > 0 ? static_cast<std::size_t>(n) : 1; }

// ---- bf16 tensors (AttnArgs::bf16_io) ----------------------------------------------------------
// out[i] = the float of the bf16 bits in[i] (exact).
inline void bf16_to_float(const uint16_t *in, int64_t n, float *out) {
  APE_SIMD for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(in[i]) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    out[i] = f;
  }
}
// out[i] = in[i] rounded to bf16, to nearest even, a NaN to the quiet NaN 0x7fc0 (as PyTorch's
// conversion).
inline void float_to_bf16(const float *in, int64_t n, uint16_t *out) {
  APE_SIMD for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &in[i], sizeof u);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    out[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
  }
}
// Uninitialised scratch of n Reals (the slices' fp32 copies of bf16 rows: no zero fill), from
// the thread's block cache.
template <typename Real> using ScratchPtr = std::unique_ptr<Real[], memory::Release>;
template <typename Real> ScratchPtr<Real> scratch_of(int64_t n) {
  const std::size_t bytes = sizeof(Real) * static_cast<std::size_t>(n);
  return ScratchPtr<Real>(static_cast<Real *>(memory::allocate(bytes)), memory::Release{bytes});
}

template <typename Real> constexpr Real neg_inf() {
  return -std::numeric_limits<Real>::infinity();
}

// exp for the softmax, vectorisable (no libm call, branch free): Cephes' exp / expf. Range
// reduction x = n ln2 + r with |r| <= ln2/2 (n rounded by adding and subtracting 1.5 * 2^mantissa
// bits), a polynomial (float) or rational (double) approximation of exp(r), and 2^n built in the
// exponent bits. Relative error within 2 ulp; exactly 0 below the smallest normal (including -inf);
// NaN propagates. Arguments are <= ~0 here (logits minus their max or their lse).
constexpr float kExpLo = -87.3365447f, kExpHi = 88.0f;              // ln(FLT_MIN), < ln(FLT_MAX)
constexpr double kExpLoD = -708.39641853226408, kExpHiD = 709.0;    // ln(DBL_MIN), < ln(DBL_MAX)
constexpr float kRound = 12582912.0f;                               // 1.5 2^23
constexpr double kRoundD = 6755399441055744.0;                      // 1.5 2^52

// exp(r) of x = n ln2 + r (ln2 in two parts).
inline float exp_of_rest(float x, float n) {
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}
inline double exp_of_rest(double x, double n) {
  const double r = (x - n * 6.93145751953125e-1) - n * 1.42860682030941723212e-6;
  // exp(r) = 1 + 2 r P(r^2) / (Q(r^2) - r P(r^2))
  const double rr = r * r;
  const double p = r * ((1.26177193074810590878e-4 * rr + 3.02994407707441961300e-2) * rr +
                        9.99999999999999999910e-1);
  const double q = ((3.00198505138664455042e-6 * rr + 2.52448340349684104192e-3) * rr +
                    2.27265548208155028766e-1) * rr + 2.00000000000000000009e0;
  return 1.0 + 2.0 * p / (q - p);
}

inline float softmax_exp(float x) {
  const float xc = std::min(std::max(x, kExpLo), kExpHi);
  const float n = (xc * 1.44269504088896341f + kRound) - kRound;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float pow2n;
  std::memcpy(&pow2n, &bits, sizeof pow2n);
  return x < kExpLo ? 0.0f : exp_of_rest(xc, n) * pow2n;
}
inline double softmax_exp(double x) {
  const double xc = std::min(std::max(x, kExpLoD), kExpHiD);
  const double n = (xc * 1.4426950408889634073599 + kRoundD) - kRoundD;
  const int64_t bits = (static_cast<int64_t>(n) + 1023) << 52;
  double pow2n;
  std::memcpy(&pow2n, &bits, sizeof pow2n);
  return x < kExpLoD ? 0.0 : exp_of_rest(xc, n) * pow2n;
}

// softmax_exp for the arguments of a softmax, x <= kExpHi (a logit minus its max or its lse; -inf
// and NaN too): the same value bit for bit, without the clamps. Their compare-and-blend made the
// vectoriser compute the whole polynomial under masks (a third more instructions a vector, in the
// forward's hottest loop after its GEMMs). n is read from the bits of v = x log2(e) + kRound
// (whose low bits hold n exactly for |n| < 2^22, 2^51) instead of converted from a float, so an
// argument below the range (-inf included) gives defined garbage that the final select replaces
// with 0.
inline float softmax_exp_le(float x) {
  const float v = x * 1.44269504088896341f + kRound;
  uint32_t vbits, round_bits;
  std::memcpy(&vbits, &v, sizeof vbits);
  std::memcpy(&round_bits, &kRound, sizeof round_bits);
  const uint32_t bits = (vbits - round_bits + 127u) << 23;
  float pow2n;
  std::memcpy(&pow2n, &bits, sizeof pow2n);
  return x < kExpLo ? 0.0f : exp_of_rest(x, v - kRound) * pow2n;
}
inline double softmax_exp_le(double x) {
  const double v = x * 1.4426950408889634073599 + kRoundD;
  uint64_t vbits, round_bits;
  std::memcpy(&vbits, &v, sizeof vbits);
  std::memcpy(&round_bits, &kRoundD, sizeof round_bits);
  const uint64_t bits = (vbits - round_bits + 1023u) << 52;
  double pow2n;
  std::memcpy(&pow2n, &bits, sizeof pow2n);
  return x < kExpLoD ? 0.0 : exp_of_rest(x, v - kRoundD) * pow2n;
}

// ---- small GEMM kernels on tiles ---------------------------------------------------------------
// C(m, W) (+)= A(m, n) B(n, W): A(r, p) = a[r*a_rs + p*a_cs] (so A^T is a stride swap), B rows
// ldb apart, C rows ldc apart. MR rows of C are kept in local accumulators that the compiler holds
// in vector registers; the W columns are the vector dimension.
template <int MR, int W, typename Real>
inline void gemm_rows(int64_t n, const Real *a, int64_t a_rs, int64_t a_cs, const Real *b,
                      int64_t ldb, Real *c, int64_t ldc, bool accumulate) {
  Real acc[MR][W];
  for (int r = 0; r < MR; ++r) {
    if (accumulate) {
      APE_SIMD for (int w = 0; w < W; ++w) acc[r][w] = c[r * ldc + w];
    } else {
      APE_SIMD for (int w = 0; w < W; ++w) acc[r][w] = Real(0);
    }
  }
  for (int64_t p = 0; p < n; ++p) {
    const Real *bp = b + p * ldb;
    for (int r = 0; r < MR; ++r) {
      const Real ar = a[r * a_rs + p * a_cs];
      APE_SIMD for (int w = 0; w < W; ++w) acc[r][w] += ar * bp[w];
    }
  }
  for (int r = 0; r < MR; ++r)
    APE_SIMD for (int w = 0; w < W; ++w) c[r * ldc + w] = acc[r][w];
}

// All m rows of a block of W columns: MR rows at a time (as many as fit in registers).
template <int W, typename Real>
inline void gemm_block(int64_t m, int64_t n, const Real *a, int64_t a_rs, int64_t a_cs,
                       const Real *b, int64_t ldb, Real *c, int64_t ldc, bool accumulate) {
  constexpr int kMR = std::clamp<int>(1024 / (W * static_cast<int>(sizeof(Real))), 1, 8);
  int64_t r = 0;
  for (; r + kMR <= m; r += kMR)
    gemm_rows<kMR, W>(n, a + r * a_rs, a_rs, a_cs, b, ldb, c + r * ldc, ldc, accumulate);
  for (; r < m; ++r)
    gemm_rows<1, W>(n, a + r * a_rs, a_rs, a_cs, b, ldb, c + r * ldc, ldc, accumulate);
}

// Any width w: blocks of W columns while they fit, the rest with W/2, W/4, ..., 1.
template <int W = 64, typename Real>
inline void gemm(int64_t m, int64_t n, int64_t w, const Real *a, int64_t a_rs, int64_t a_cs,
                 const Real *b, int64_t ldb, Real *c, int64_t ldc, bool accumulate) {
  int64_t c0 = 0;
  for (; c0 + W <= w; c0 += W)
    gemm_block<W>(m, n, a, a_rs, a_cs, b + c0, ldb, c + c0, ldc, accumulate);
  if constexpr (W > 1) {
    if (c0 < w)
      gemm<W / 2>(m, n, w - c0, a, a_rs, a_cs, b + c0, ldb, c + c0, ldc, accumulate);
  }
}

// ---- bf16 tile products (AMX, or AVX512-BF16) --------------------------------------------------
// With AttnArgs::bf16_products on a CPU that runs them (cpu_bf16_products_usable), the float
// kernels of the avx512 level take their tile products with bf16 operands and fp32 sums: on the
// AMX units (cpu_amx_bf16_usable), where TDPBF16PS adds a 16 x 32 bf16 tile times a 32 x 16 one
// into a 16 x 16 fp32 tile, or else by AVX512-BF16's VDPBF16PS on the same layouts
// (gemm_avx512bf16). The A operand is bf16 rows; the B operand is the "pairs" layout: a 32-bit
// word per (row pair, column) holding the column's two rows (the even one in the low half). A
// slice's q', k', v (and dO) are converted once (amx::Operands); each tile's P and dS as they are
// made. The tile registers and VDPBF16PS are inline assembly (the tiles' with memory clobbered, so
// the compiler never moves a buffer's stores past the load that reads it): no target attribute
// is needed, and only the avx512 level compiles them (AMX and AVX512-BF16 CPUs run that level).
#if APE_KERNEL_LEVEL == 2 && APE_CPU_COMPILED && APE_CPU_AMX_OS
#define APE_CPU_AMX 1
#else
#define APE_CPU_AMX 0
#endif

#if APE_CPU_AMX
// GCC 12's avx512fintrin.h gives the unmasked forms of many intrinsics an uninitialised merge
// operand (`_mm512_undefined_*`: `__m512i __Y = __Y;`) that their all-ones mask never reads; inlined
// into exp_row and transpose16, -O2 and -O3 report it as -Wuninitialized / -Wmaybe-uninitialized
// (16 warnings a unit, in GCC's header, not in this code). Silenced around those two helpers only;
// lit's Codegen/gcc-optimised-warnings.test compiles the level at -O2 and -O3 with -Werror.
#if defined(__GNUC__) && !defined(__clang__)
#define APE_AVX512_UNDEFINED_BEGIN                              \
  _Pragma("GCC diagnostic push")                                \
  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")         \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define APE_AVX512_UNDEFINED_END _Pragma("GCC diagnostic pop")
#else
#define APE_AVX512_UNDEFINED_BEGIN
#define APE_AVX512_UNDEFINED_END
#endif

namespace amx {

#define APE_AMX_LOAD(t, base, stride) \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"(static_cast<long>(stride)) : "memory")
#define APE_AMX_STORE(t, base, stride) \
  __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"(static_cast<long>(stride)) : "memory")
#define APE_AMX_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define APE_AMX_DP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

// Tiles 0-7, each 16 rows of 64 bytes, for the lifetime of a scope (a slice's work on a thread):
// the configuration is the thread's; tilerelease frees the state at the end.
class TileScope {
 public:
  TileScope() {
    alignas(64) unsigned char cfg[64] = {};
    cfg[0] = 1;  // palette 1
    for (int t = 0; t < 8; ++t) {
      cfg[16 + 2 * t] = 64;  // bytes per row (little-endian uint16)
      cfg[48 + t] = 16;      // rows
    }
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg) : "memory");
  }
  ~TileScope() { __asm__ volatile("tilerelease" ::: "memory"); }
  TileScope(const TileScope &) = delete;
  TileScope &operator=(const TileScope &) = delete;
};

// bf16 of x, rounded to nearest even (NaN stays NaN).
inline uint32_t bf16_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return ((u & 0x7fffffffu) > 0x7f800000u ? (u | 0x400000u) : rounded) >> 16;
}
// The pairs word of (x, y): x in the low half.
inline uint32_t bf16_pair(float x, float y) { return bf16_of(x) | bf16_of(y) << 16; }

// Where the tiles of an operand lie: tile (r, x) of rows r .. r + 15 and the 32 (A: bf16) or 16
// (B: pair words; C: floats) columns from x starts at base + r * row + (x / width) * block
// elements, its rows `row` elements apart. Row-major (ld elements a row): {ld, width}; blocked,
// each `width` columns of the M (or K / 2) rows stored as one contiguous panel: {width, rows *
// width}. A panel's tile rows are 64 bytes apart, so a tile is one contiguous kilobyte: a
// row-major operand T columns wide puts its tile rows 4 T or 2 T bytes apart, 16 rows in one L1
// set for T a multiple of 1024 or 2048, and its loads miss.
struct Layout {
  int64_t row, block;
};
inline Layout row_major(int64_t ld, int64_t width) { return {ld, width}; }
inline Layout panels(int64_t rows, int64_t width) { return {width, rows * width}; }

// gemm's product by VDPBF16PS (AVX512-BF16), for CPUs without AMX: the same operands in the same
// layouts, C's rows in blocks of 8 x 32 columns held in 16 registers; for each pair row of B, its
// 32 columns' words (two vectors) meet each A row's pair word, broadcast from memory. The same
// arithmetic as the tiles' (each pair's products added to the fp32 sum in turn, rounded to
// nearest even, denormals read and written as zero); VDPBF16PS adds a pair's odd product first,
// so a sum may differ from the tiles' in its last bit. Out of line: inlined into the slice loops,
// its 16 accumulators went through the stack after every VDPBF16PS (forward 1.4x slower).
__attribute__((noinline)) inline void gemm_avx512bf16(int64_t M, int64_t N, int64_t K,
                                                      const uint16_t *a, Layout la, const uint32_t *b,
                                                      Layout lb, float *c, Layout lc, bool accumulate) {
  for (int64_t m = 0; m < M; m += 8)
    for (int64_t n = 0; n < N; n += 32) {
      float *c0 = c + m * lc.row + n / 16 * lc.block;  // columns n .. n + 15 (n + 16 ..: + lc.block)
      __m512 acc[8][2];
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        acc[r][0] = accumulate ? _mm512_loadu_ps(c0 + r * lc.row) : _mm512_setzero_ps();
        acc[r][1] = accumulate ? _mm512_loadu_ps(c0 + r * lc.row + lc.block) : _mm512_setzero_ps();
      }
      const uint32_t *bp = b + n / 16 * lb.block;
      for (int64_t k = 0; k < K; k += 2, bp += lb.row) {
        const __m512 b0 = _mm512_castsi512_ps(_mm512_loadu_si512(bp));
        const __m512 b1 = _mm512_castsi512_ps(_mm512_loadu_si512(bp + lb.block));
        const uint16_t *ap = a + m * la.row + k / 32 * la.block + k % 32;  // row m's pair k / 2
#pragma GCC unroll 8
        for (int r = 0; r < 8; ++r) {
          typedef uint32_t __attribute__((may_alias)) Word;  // the bf16 pair at ap + r * la.row
          const Word *w = reinterpret_cast<const Word *>(ap + r * la.row);
          __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc[r][0]) : "v"(b0), "m"(*w));
          __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc[r][1]) : "v"(b1), "m"(*w));
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        _mm512_storeu_ps(c0 + r * lc.row, acc[r][0]);
        _mm512_storeu_ps(c0 + r * lc.row + lc.block, acc[r][1]);
      }
    }
}

// C (M, N) (+)= A (M, K) B (K, N): A bf16 (tiles of 16 x 32), B pair words (row p holds rows 2p
// and 2p + 1 of B; tiles of 16 pair rows x 16), C fp32 (tiles of 16 x 16), each where its Layout
// says. M, N and K are multiples of 32 (2 x 2 blocks of C tiles). On the tiles, or by VDPBF16PS
// where the CPU has no AMX (gemm_avx512bf16).
inline void gemm(int64_t M, int64_t N, int64_t K, const uint16_t *a, Layout la, const uint32_t *b,
                 Layout lb, float *c, Layout lc, bool accumulate) {
  if (!cpu_amx_bf16_usable()) return gemm_avx512bf16(M, N, K, a, la, b, lb, c, lc, accumulate);
  const int64_t cs = lc.row * 4, as = la.row * 2, bs = lb.row * 4;
  for (int64_t m = 0; m < M; m += 32)
    for (int64_t n = 0; n < N; n += 32) {
      float *c00 = c + m * lc.row + n / 16 * lc.block, *c01 = c00 + lc.block;
      float *c10 = c00 + 16 * lc.row, *c11 = c10 + lc.block;
      if (accumulate) {
        APE_AMX_LOAD(0, c00, cs); APE_AMX_LOAD(1, c01, cs);
        APE_AMX_LOAD(2, c10, cs); APE_AMX_LOAD(3, c11, cs);
      } else {
        APE_AMX_ZERO(0); APE_AMX_ZERO(1); APE_AMX_ZERO(2); APE_AMX_ZERO(3);
      }
      for (int64_t k = 0; k < K; k += 32) {
        const uint16_t *a0 = a + m * la.row + k / 32 * la.block, *a1 = a0 + 16 * la.row;
        const uint32_t *b0 = b + k / 2 * lb.row + n / 16 * lb.block, *b1 = b0 + lb.block;
        APE_AMX_LOAD(4, a0, as); APE_AMX_LOAD(5, a1, as);
        APE_AMX_LOAD(6, b0, bs); APE_AMX_LOAD(7, b1, bs);
        APE_AMX_DP(0, 4, 6); APE_AMX_DP(1, 4, 7);
        APE_AMX_DP(2, 5, 6); APE_AMX_DP(3, 5, 7);
      }
      APE_AMX_STORE(0, c00, cs); APE_AMX_STORE(1, c01, cs);
      APE_AMX_STORE(2, c10, cs); APE_AMX_STORE(3, c11, cs);
    }
}

// out[0 .. 32 m) = bf16 of x[0 .. 32 m), rounded to nearest even (VCVTNE2PS2BF16, which every
// AMX CPU has: AVX512-BF16; by inline assembly, as the tiles, so that no function needs that
// target). Like the tiles' own arithmetic, it reads denormal floats as zero.
typedef float Vec16f __attribute__((vector_size(64)));
typedef short Vec32h __attribute__((vector_size(64)));
inline void bf16_chunks(const float *x, int64_t m, uint16_t *out) {
  for (int64_t u = 0; u < m; ++u) {
    Vec16f lo, hi;
    Vec32h h;
    std::memcpy(&lo, x + 32 * u, 64);
    std::memcpy(&hi, x + 32 * u + 16, 64);
    __asm__("vcvtne2ps2bf16 %1, %2, %0" : "=v"(h) : "v"(lo), "v"(hi));
    std::memcpy(out + 32 * u, &h, 64);
  }
}

APE_AVX512_UNDEFINED_BEGIN
// P = exp(s - r) of a tile row (kTileK logits, -inf for 0), for the bf16 products: exp(x) =
// 2^t, t = x log2(e), as 2^round(t) (VSCALEFPS, exact) times a degree-5 polynomial of t -
// round(t) in [-1/2, 1/2] (relative error 2.4e-7, a few float ulp: far below the bf16 rounding of
// P that follows); 0 for t <= -125, where the result would be denormal or nearly so (the tiles
// read a denormal as zero, and denormal sums in row_sum took microcode assists: the forward ran
// 3-6x slower on the rows of a falling bias). 11 instructions a vector where softmax_exp_le takes 19.
inline void exp_row(float *s, float r) {
  const __m512 log2e = _mm512_set1_ps(1.44269504f), rl = _mm512_set1_ps(r * 1.44269504f);
  const __m512 lo = _mm512_set1_ps(-150.f);
  for (int64_t c = 0; c < kTileK; c += 16) {
    const __m512 t = _mm512_max_ps(lo, _mm512_fmsub_ps(_mm512_loadu_ps(s + c), log2e, rl));  // NaN stays
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    const __mmask16 normal = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-125.f), _CMP_NLE_UQ);  // or NaN
    __m512 p = _mm512_set1_ps(0.00132764701f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.00967554189f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.0555071346f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.240221202f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.693146944f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.00000012f));
    _mm512_storeu_ps(s + c, _mm512_maskz_scalef_ps(normal, p, n));
  }
}
APE_AVX512_UNDEFINED_END

// Operand layouts of x, n rows of D (n <= Tp; what lies past row n is zero):
// rows: (Tp, D) bf16, row-major (D a multiple of 32).
inline void rows(const float *x, int64_t n, int64_t D, int64_t Tp, uint16_t *out) {
  bf16_chunks(x, n * D / 32, out);
  std::fill(out + n * D, out + Tp * D, uint16_t(0));
}
// x^T (D, Tp) bf16 in panels of 32 columns: element (c, t) at (t / 32) * 32 D + c * 32 + t % 32.
inline void col_panels(const float *x, int64_t n, int64_t D, int64_t Tp, uint16_t *out) {
  std::fill(out, out + D * Tp, uint16_t(0));
  for (int64_t t = 0; t < n; ++t) {
    uint16_t *o = out + t / 32 * 32 * D + t % 32;
    for (int64_t c = 0; c < D; ++c) o[c * 32] = static_cast<uint16_t>(bf16_of(x[t * D + c]));
  }
}
// pairs of rows: (Tp / 2, D) words, row-major, (r, c) = (x[2r][c], x[2r + 1][c]).
inline void row_pairs(const float *x, int64_t n, int64_t D, int64_t Tp, uint32_t *out) {
  std::fill(out + (n + 1) / 2 * D, out + Tp / 2 * D, 0u);  // the pairs past row n's
  for (int64_t r = 0; 2 * r < n; ++r) {
    const float *x0 = x + 2 * r * D;
    uint32_t *o = out + r * D;
    if (2 * r + 1 < n) {
      const float *x1 = x0 + D;
      APE_SIMD for (int64_t c = 0; c < D; ++c) o[c] = bf16_pair(x0[c], x1[c]);
    } else {
      APE_SIMD for (int64_t c = 0; c < D; ++c) o[c] = bf16_of(x0[c]);
    }
  }
}
// pairs of x^T's rows, (D / 2, Tp) words in panels of 16 columns: (p, t) = (x[t][2p], x[t][2p + 1])
// at (t / 16) * 8 D + p * 16 + t % 16.
inline void col_pair_panels(const float *x, int64_t n, int64_t D, int64_t Tp, uint32_t *out) {
  std::fill(out + n / 16 * 8 * D, out + D / 2 * Tp, 0u);  // the panels past row n's
  for (int64_t t = 0; t < n; ++t) {
    uint32_t *o = out + t / 16 * 8 * D + t % 16;
    const float *xt = x + t * D;
    for (int64_t p = 0; p < D / 2; ++p) o[p * 16] = bf16_pair(xt[2 * p], xt[2 * p + 1]);
  }
}

// The same layouts from bf16 rows x (the bits of a bf16 tensor; no mod between it and the
// products): copied and rearranged, never converted. The results equal the float versions' on
// x's floats (bf16 to float to bf16 is exact; a NaN keeps its payload here, and the tiles read
// denormals as zero either way).
inline void rows(const uint16_t *x, int64_t n, int64_t D, int64_t Tp, uint16_t *out) {
  std::memcpy(out, x, sizeof(uint16_t) * static_cast<std::size_t>(n * D));
  std::fill(out + n * D, out + Tp * D, uint16_t(0));
}
inline void row_pairs(const uint16_t *x, int64_t n, int64_t D, int64_t Tp, uint32_t *out) {
  std::fill(out + (n + 1) / 2 * D, out + Tp / 2 * D, 0u);
  for (int64_t r = 0; 2 * r < n; ++r) {
    const uint16_t *x0 = x + 2 * r * D;
    uint32_t *o = out + r * D;
    if (2 * r + 1 < n) {
      const uint16_t *x1 = x0 + D;
      APE_SIMD for (int64_t c = 0; c < D; ++c) o[c] = uint32_t(x0[c]) | uint32_t(x1[c]) << 16;
    } else {
      APE_SIMD for (int64_t c = 0; c < D; ++c) o[c] = x0[c];
    }
  }
}
APE_AVX512_UNDEFINED_BEGIN
// out[16 j + r] = word j of row r of a 16 x 16 block of 32-bit words (row r at in + r * ld bytes),
// the rows from nt on zero: unpacks of words and of word pairs within 128-bit lanes, then two
// rounds of lane shuffles.
inline void transpose16(const void *in, int64_t ld, int64_t nt, uint32_t *out) {
  __m512i r[16], a[16];
  for (int i = 0; i < 16; ++i)
    r[i] = i < nt ? _mm512_loadu_si512(static_cast<const char *>(in) + i * ld) : _mm512_setzero_si512();
  for (int i = 0; i < 16; i += 2) {  // lane L: rows i, i + 1 of words 4L, 4L + 1 / 4L + 2, 4L + 3
    a[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    a[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int g = 0; g < 16; g += 4) {  // r[g + c], lane L: rows g .. g + 3 of word 4L + c
    r[g] = _mm512_unpacklo_epi64(a[g], a[g + 2]);
    r[g + 1] = _mm512_unpackhi_epi64(a[g], a[g + 2]);
    r[g + 2] = _mm512_unpacklo_epi64(a[g + 1], a[g + 3]);
    r[g + 3] = _mm512_unpackhi_epi64(a[g + 1], a[g + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // word 4L + c: lane L of r[c], r[4 + c], r[8 + c], r[12 + c]
    const __m512i c0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88), c1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);
    const __m512i d0 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88), d1 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
    _mm512_storeu_si512(out + 16 * c, _mm512_shuffle_i32x4(c0, d0, 0x88));
    _mm512_storeu_si512(out + 16 * (4 + c), _mm512_shuffle_i32x4(c1, d1, 0x88));
    _mm512_storeu_si512(out + 16 * (8 + c), _mm512_shuffle_i32x4(c0, d0, 0xdd));
    _mm512_storeu_si512(out + 16 * (12 + c), _mm512_shuffle_i32x4(c1, d1, 0xdd));
  }
}
APE_AVX512_UNDEFINED_END
// A row of bf16 x is D / 2 pair words already: the panels are 16 x 16 transposes of them.
inline void col_pair_panels(const uint16_t *x, int64_t n, int64_t D, int64_t Tp, uint32_t *out) {
  const int64_t P = D / 2;  // pair words per row, a multiple of 16
  std::fill(out + n / 16 * 8 * D, out + P * Tp, 0u);
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    const int64_t nt = std::min<int64_t>(16, n - t0);
    const uint16_t *in = x + t0 * D;
    uint32_t *panel = out + t0 / 16 * 8 * D;
    for (int64_t p0 = 0; p0 < P; p0 += 16) transpose16(in + 2 * p0, 2 * D, nt, panel + p0 * 16);
  }
}

// A (kTileQ, kTileK) tile of P or dS, rows from nq on zero: as bf16 rows (an A operand), and as
// pairs of rows (a B operand: (kTileQ / 2, kTileK) words).
inline void tile_rows(const float *s, int64_t nq, uint16_t *out, int64_t ld = kTileK) {
  for (int64_t r = 0; r < kTileQ; ++r) {
    if (r < nq)
      bf16_chunks(s + r * kTileK, kTileK / 32, out + r * ld);
    else
      std::fill(out + r * ld, out + r * ld + kTileK, uint16_t(0));
  }
}
// The forward's batches of P V: up to kPvTiles key tiles, their P rows kPvLd apart.
constexpr int64_t kPvTiles = 4, kPvLd = kPvTiles * kTileK;
inline void tile_row_pairs(const float *s, int64_t nq, uint32_t *out) {
  // 16 columns of both rows to bf16 (one VCVTNE2PS2BF16: row 2r's in the low half), then the
  // halves interleaved (VPERMW), 16 pair words.
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                              23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const Vec16f zero = {};
  for (int64_t r = 0; r < kTileQ / 2; ++r) {
    const float *s0 = s + 2 * r * kTileK, *s1 = s0 + kTileK;
    uint32_t *o = out + r * kTileK;
    const bool in0 = 2 * r < nq, in1 = 2 * r + 1 < nq;
    for (int64_t c = 0; c < kTileK; c += 16) {
      Vec16f lo = zero, hi = zero;
      Vec32h h;
      if (in0) std::memcpy(&lo, s0 + c, 64);
      if (in1) std::memcpy(&hi, s1 + c, 64);
      __asm__("vcvtne2ps2bf16 %1, %2, %0" : "=v"(h) : "v"(lo), "v"(hi));
      __m512i w;
      std::memcpy(&w, &h, 64);
      _mm512_storeu_si512(o + c, _mm512_permutexvar_epi16(interleave, w));
    }
  }
}

// Cache-aligned storage whose elements start uninitialised (resize does not zero them): every
// operand below is written in full by the function that lays it out.
template <class T> struct Uninit : CacheAligned<T> {
  Uninit() = default;
  template <class U> Uninit(const Uninit<U> &) {}
  template <class U> struct rebind { using other = Uninit<U>; };
  template <class U> void construct(U *p) { ::new (static_cast<void *>(p)) U; }
};
template <class T> using Buffer = std::vector<T, Uninit<T>>;

// Where an operand's rows come from: fp32 rows (f: after a mod, or fp32 inputs), or the bits of
// bf16 rows (h: a bf16 tensor's own rows, no mod between them and the products).
struct Source {
  const float *f = nullptr;
  const uint16_t *h = nullptr;
  explicit operator bool() const { return f || h; }
};
template <class Out> void lay_out(const Source &x, int64_t n, int64_t D, int64_t Tp, Out *out,
                                  void (*from_f)(const float *, int64_t, int64_t, int64_t, Out *),
                                  void (*from_h)(const uint16_t *, int64_t, int64_t, int64_t, Out *)) {
  if (x.h) from_h(x.h, n, D, Tp, out);
  else from_f(x.f, n, D, Tp, out);
}

// A slice's operands and a tile's (sizes per use: forward or backward).
struct Operands {
  int64_t Tp = 0, D = 0;     // T rounded up to kTileK; the head dim
  Buffer<uint16_t> q;   // rows of q' (Tp, D): A of S = Q' K'^T
  Buffer<uint32_t> kt;  // pairs of k'^T's rows (D / 2, Tp), panels of 16 keys: B of S
  Buffer<uint32_t> v;   // pairs of v's rows (Tp / 2, D): B of O = P V (forward)
  Buffer<uint16_t> pf;  // P (forward) or dS (backward) rows of a batch of key tiles (kTileQ, kPvLd)
  // backward: dP = dO V^T, dV^T += dO^T P, dK'^T += Q'^T dS, dQ' += dS K'
  Buffer<uint16_t> dout;  // rows of dO (Tp, D)
  Buffer<uint32_t> vt;    // pairs of v^T's rows (D / 2, Tp), panels of 16 keys
  Buffer<uint16_t> doutt, qt;  // dO^T, q'^T (D, Tp), panels of 32 queries
  Buffer<uint32_t> k;     // pairs of k''s rows (Tp / 2, D)
  Buffer<uint32_t> pp, sp;  // a tile's P and dS as pairs of rows (kTileQ / 2, kTileK)

  // q', k' and v of a slice of T tokens: what the forward's products read (v: none for the backward).
  Operands(const Source &qm, const Source &km, const Source &vv, int64_t T, int64_t D_)
      : Tp((T + kTileK - 1) / kTileK * kTileK), D(D_), q(Tp * D), kt(D / 2 * Tp), pf(kTileQ * kPvLd) {
    lay_out<uint16_t>(qm, T, D, Tp, q.data(), rows, rows);
    lay_out<uint32_t>(km, T, D, Tp, kt.data(), col_pair_panels, col_pair_panels);
    if (vv) {
      v.resize(Tp / 2 * D);
      lay_out<uint32_t>(vv, T, D, Tp, v.data(), row_pairs, row_pairs);
    }
  }
  // ... and what the backward's read besides (v as v^T's pairs, not v's).
  void add_backward(const float *qm, const float *km, const float *vv, const float *g, int64_t T) {
    dout.resize(Tp * D), vt.resize(D / 2 * Tp), doutt.resize(D * Tp), qt.resize(D * Tp);
    k.resize(Tp / 2 * D), pp.resize(kTileQ / 2 * kTileK), sp.resize(kTileQ / 2 * kTileK);
    rows(g, T, D, Tp, dout.data());
    col_pair_panels(vv, T, D, Tp, vt.data());
    col_panels(g, T, D, Tp, doutt.data());
    col_panels(qm, T, D, Tp, qt.data());
    row_pairs(km, T, D, Tp, k.data());
  }
  // The tiles of S = Q' K'^T (or dP = dO V^T: rows = dout, cols = vt) of queries i0 and keys j0.
  void logits(const Buffer<uint16_t> &rows_, const Buffer<uint32_t> &cols_, int64_t i0,
              int64_t j0, float *s) const {
    gemm(kTileQ, kTileK, D, rows_.data() + i0 * D, row_major(D, 32), cols_.data() + j0 / 16 * 8 * D,
         panels(D / 2, 16), s, row_major(kTileK, 16), false);
  }
};

// Whether a call of head dim D takes the bf16 products (on the tiles or by VDPBF16PS).
template <typename Real> inline bool wanted(const AttnArgs<Real> &a) {
  return std::is_same_v<Real, float> && a.bf16_products && a.D % 32 == 0 && a.D > 0 &&
         cpu_bf16_products_usable();
}
// The tile state of a slice's work on this thread, where the products run on the tiles.
inline std::unique_ptr<TileScope> tile_scope() {
  return cpu_amx_bf16_usable() ? std::make_unique<TileScope>() : nullptr;
}

}  // namespace amx
#endif  // APE_CPU_AMX

// ---- reductions of a tile row -------------------------------------------------------------------
// A row of kTileK logits or probabilities is reduced as 64-byte vectors (GCC's and Clang's vector
// extensions: one register under AVX-512, two under AVX2, four on the baseline): the vectors
// pairwise, then the lanes by halving. The order is the code's, not the vectoriser's (which
// reduced an `omp simd` loop's lanes through the stack one scalar add after another: 16 dependent
// adds a row, a tenth of the forward on an Intel Xeon), so the full forward and decoding, which
// share attend_rows, sum every row in the same order. kTileK * sizeof(Real) is a multiple of 64.
template <typename Real, int kBytes> struct VecOf;
template <> struct VecOf<float, 64> { typedef float type __attribute__((vector_size(64))); };
template <> struct VecOf<float, 32> { typedef float type __attribute__((vector_size(32))); };
template <> struct VecOf<float, 16> { typedef float type __attribute__((vector_size(16))); };
template <> struct VecOf<float, 8> { typedef float type __attribute__((vector_size(8))); };
template <> struct VecOf<double, 64> { typedef double type __attribute__((vector_size(64))); };
template <> struct VecOf<double, 32> { typedef double type __attribute__((vector_size(32))); };
template <> struct VecOf<double, 16> { typedef double type __attribute__((vector_size(16))); };

// Vectors pass by reference only: a vector argument or result by value draws GCC's and Clang's
// -Wpsabi warning (its calling convention depends on the target), which pragmas do not silence.
template <bool kMax, class V> inline void combine(V &a, const V &b) {
  if constexpr (kMax) {
    a = a > b ? a : b;  // a NaN loses against a number, as in `x > m ? x : m`
  } else {
    a = a + b;
  }
}
template <class V, class H, std::size_t... I>
inline void halves(const V &v, H &lo, H &hi, std::index_sequence<I...>) {
  lo = __builtin_shufflevector(v, v, I...);
  hi = __builtin_shufflevector(v, v, (I + sizeof...(I))...);
}
template <bool kMax, typename Real, int kBytes, class V> inline Real fold_lanes(const V &v) {
  constexpr int kLanes = kBytes / static_cast<int>(sizeof(Real));
  if constexpr (kLanes == 2) {
    Real a = v[0];
    combine<kMax>(a, static_cast<Real>(v[1]));
    return a;
  } else {
    using H = typename VecOf<Real, kBytes / 2>::type;
    H lo, hi;
    halves(v, lo, hi, std::make_index_sequence<kLanes / 2>());
    combine<kMax>(lo, hi);
    return fold_lanes<kMax, Real, kBytes / 2>(lo);
  }
}
// The max (kMax) or the sum of s[0 .. kTileK).
template <bool kMax, typename Real> inline Real row_reduce(const Real *s) {
  using V = typename VecOf<Real, 64>::type;
  constexpr int kVecs = static_cast<int>(kTileK * sizeof(Real) / sizeof(V));
  static_assert(kVecs * sizeof(V) == kTileK * sizeof(Real), "a row is whole vectors");
  V v[kVecs];
  std::memcpy(v, s, sizeof v);
  for (int w = kVecs / 2; w >= 1; w /= 2)
    for (int k = 0; k < w; ++k) combine<kMax>(v[k], v[k + w]);
  return fold_lanes<kMax, Real, 64>(v[0]);
}
template <typename Real> inline Real row_sum(const Real *s) { return row_reduce<false>(s); }
template <typename Real> inline Real row_max(const Real *s) { return row_reduce<true>(s); }

// The row length of k'^T and v^T (D rows of keys): T rounded up to kTileK, so that every key tile
// up to the last query is readable, plus 64 bytes. The 64 bytes keep the rows from starting a
// multiple of 4 KiB apart, as they would for every T a multiple of 1024 floats: the tile GEMMs
// read one tile's 64 columns from each of D rows, and rows 4 KiB apart all fall in the same sets
// of the L1 cache, which then holds only a few of them (bench/results/cpu_peers_intel.md: about
// 10% of the forward and backward at T 4096 on an Intel Xeon). The arithmetic, and so the bits,
// are the same.
template <typename Real = float> constexpr int64_t padded_row(int64_t T) {
  return (T + kTileK - 1) / kTileK * kTileK + 64 / static_cast<int64_t>(sizeof(Real));
}

// xt(D, Tp) = x(T, D)^T with the columns t >= T zero.
template <typename Real>
void transpose_padded(const Real *x, int64_t T, int64_t D, int64_t Tp, Real *xt) {
  for (int64_t c = 0; c < D; ++c) {
    Real *row = xt + c * Tp;
    for (int64_t t = 0; t < T; ++t) row[t] = x[t * D + c];
    std::fill(row + T, row + Tp, Real(0));
  }
}

// ---- q / k mods ---------------------------------------------------------------------------------
// Partner columns under a pairing (Enc::kQPairing / kKPairing: ape_abi::Pairing's code, 0 none,
// 1 half, 2 interleaved), the rule of ape_abi::partner; a column paired with itself still calls the
// mod, with y = x.
inline std::vector<int64_t> partners(int pairing, double fraction, int64_t D) {
  std::vector<int64_t> p(static_cast<std::size_t>(D));
  for (int64_t c = 0; c < D; ++c)
    p[c] = ::ape_abi::partner(static_cast<::ape_abi::Pairing>(pairing), fraction, D, c);
  return p;
}

// Linear mods (traits::QModLinear / KModLinear, enc_traits.h: RoPE and its scalings, xPos):
// mod(x, y) = a(t, c) x + b(t, c) y with a, b independent of the head, the batch and the data.
// Their coefficients are evaluated once per call, a = mod(1, 0) and b = mod(0, 1), into a
// (T, D, 2) table that every (b, h) slice reads: T D evaluations of the mod (its pow, sin and
// cos) instead of B H T D, forward and backward. Empty when the side's mod is not linear.
template <class Enc, bool kIsQ> constexpr bool linear_mod() {
  if constexpr (kIsQ) return Enc::kHasQMod && traits::QModLinear<Enc>::value;
  else return Enc::kHasKMod && traits::KModLinear<Enc>::value;
}

// A side's table as the mods read it: (T, D, 2) a(t, c), b(t, c); or, in the half rotation's
// form (half), (T, 2, D/2): a(t, c) then b(t, c) for c < D/2, where the pairing is "half" (the
// partner of c is c + D/2) and the table says a(t, c + D/2) = a(t, c), b(t, c + D/2) = -b(t, c)
// (RoPE and its scalings): half the bytes, and the partners are the row's other half (no gather).
// Every slice reads the table of its call (B H times a call), at T 4096, d_h 128 4 MiB a side:
// its loads were most of a RoPE slice's mod time.
template <typename Real> struct LinearTable {
  const Real *ab = nullptr;  // null: not linear (the mod per element)
  bool half = false;
};

template <typename Real> struct ModCoefs {
  std::vector<Real> q, k;  // LinearTable's layouts
  bool q_half = false, k_half = false;
  LinearTable<Real> side(bool is_q) const {
    const std::vector<Real> &t = is_q ? q : k;
    return {t.empty() ? nullptr : t.data(), is_q ? q_half : k_half};
  }
};

// Whether the (T, D, 2) table ab of a side paired by `pairing` has the half rotation's form
// (LinearTable), and if so, ab in that form.
template <typename Real>
bool to_half_form(std::vector<Real> &ab, int pairing, double fraction, int64_t T, int64_t D) {
  const int64_t h = D / 2;
  if (D % 2 != 0 || ab.empty()) return false;
  const std::vector<int64_t> p = partners(pairing, fraction, D);
  for (int64_t c = 0; c < D; ++c)
    if (p[c] != (c < h ? c + h : c - h)) return false;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < h; ++c) {
      const Real *e = ab.data() + 2 * (t * D + c), *f = e + 2 * h;
      if (!(f[0] == e[0] && f[1] == -e[1])) return false;
    }
  std::vector<Real> out(static_cast<std::size_t>(T * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < h; ++c) {
      out[t * D + c] = ab[2 * (t * D + c)];
      out[t * D + h + c] = ab[2 * (t * D + c) + 1];
    }
  ab.swap(out);
  return true;
}

template <class Enc, bool kIsQ, typename Real>
void mod_coefs_side(const AttnArgs<Real> &a, std::vector<Real> &out) {
  if constexpr (linear_mod<Enc, kIsQ>()) {
    const int64_t T = a.T, D = a.D;
    out.resize(static_cast<std::size_t>(2 * T * D));
    // The coefficients read no head, batch, param or token value (the kernel's q_mod_linear /
    // k_mod_linear, recorded by -ape-classify: analysis/KernelFacts.h).
    const HeadCtx<Real> ctx{0, 0, a.H, T, D, a.params, nullptr, nullptr, nullptr};
    Real *ab = out.data();
    APE_PRAGMA(omp parallel for schedule(static))
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < D; ++c) {
        Real *e = ab + 2 * (t * D + c);
        if constexpr (kIsQ)
          e[0] = Enc::q_mod(ctx, t, c, Real(1), Real(0)), e[1] = Enc::q_mod(ctx, t, c, Real(0), Real(1));
        else
          e[0] = Enc::k_mod(ctx, t, c, Real(1), Real(0)), e[1] = Enc::k_mod(ctx, t, c, Real(0), Real(1));
      }
  } else {
    (void)a, (void)out;
  }
}

// The linear mods' tables of a call. Without params they read only (t, c) and the dims T, D and
// H, so the tables of the last two shapes are kept and shared: a training step calls the forward
// and the backward at one length, step after step, and building the tables (a pow, cos and sin
// per (t, c) for RoPE) cost about a tenth of RoPE's forward at T 4096 on two cores, more than the
// rotations themselves. With params (which a linear mod may read, KernelFacts.h) every call
// builds its own.
template <class Enc, typename Real>
std::shared_ptr<const ModCoefs<Real>> mod_coefs(const AttnArgs<Real> &a) {
  const auto build = [&a] {
    auto m = std::make_shared<ModCoefs<Real>>();
    mod_coefs_side<Enc, true>(a, m->q);
    mod_coefs_side<Enc, false>(a, m->k);
    m->q_half = to_half_form(m->q, Enc::kQPairing, Enc::kQFraction, a.T, a.D);
    m->k_half = to_half_form(m->k, Enc::kKPairing, Enc::kKFraction, a.T, a.D);
    return std::shared_ptr<const ModCoefs<Real>>(std::move(m));
  };
  if constexpr ((!linear_mod<Enc, true>() && !linear_mod<Enc, false>()) || Enc::kNumParams > 0) {
    return build();
  } else {
    struct Entry {
      int64_t T = -1, D = -1, H = -1;
      std::shared_ptr<const ModCoefs<Real>> coefs;
    };
    static std::mutex mu;
    static std::array<Entry, 2> cache;  // the most recent first
    {
      const std::lock_guard<std::mutex> lock(mu);
      for (const Entry &e : cache)
        if (e.coefs && e.T == a.T && e.D == a.D && e.H == a.H) return e.coefs;
    }
    std::shared_ptr<const ModCoefs<Real>> m = build();
    const std::lock_guard<std::mutex> lock(mu);
    cache[1] = std::move(cache[0]);
    cache[0] = Entry{a.T, a.D, a.H, m};
    return m;
  }
}

// xm(n, D) = mod(x) of the n rows x(n, D) at positions t0, t0 + 1, ... for the q side (kIsQ) or
// the k side; `tab`: the side's coefficient table of a linear mod (LinearTable), or none.
template <class Enc, bool kIsQ, typename Real>
void mod_rows(const HeadCtx<Real> &ctx, const Real *x, int64_t t0, int64_t n, Real *xm,
              LinearTable<Real> tab = {}) {
  const int64_t D = ctx.D;
  const Real *ab = tab.ab;
  if (ab && tab.half) {  // out = a x + b y on both halves, y the other half, b negated on the second
    const int64_t h = D / 2;
    for (int64_t r = 0; r < n; ++r) {
      const Real *x0 = x + r * D, *x1 = x0 + h, *e = ab + (t0 + r) * D, *b = e + h;
      Real *o0 = xm + r * D, *o1 = o0 + h;
      APE_SIMD for (int64_t c = 0; c < h; ++c) {
        o0[c] = e[c] * x0[c] + b[c] * x1[c];
        o1[c] = e[c] * x1[c] + (-b[c]) * x0[c];
      }
    }
    return;
  }
  const std::vector<int64_t> partner = kIsQ ? partners(Enc::kQPairing, Enc::kQFraction, D)
                                            : partners(Enc::kKPairing, Enc::kKFraction, D);
  std::vector<Real> xp(ab ? static_cast<std::size_t>(D) : 0);
  for (int64_t r = 0; r < n; ++r) {
    const Real *xt = x + r * D;
    const int64_t t = t0 + r;
    if (ab) {  // the row's partner values first, then vector code
      const Real *e = ab + 2 * t * D;
      for (int64_t c = 0; c < D; ++c) xp[c] = xt[partner[c]];
      Real *out = xm + r * D;
      const Real *y = xp.data();
      APE_SIMD for (int64_t c = 0; c < D; ++c) out[c] = e[2 * c] * xt[c] + e[2 * c + 1] * y[c];
      continue;
    }
    for (int64_t c = 0; c < D; ++c) {
      if constexpr (kIsQ)
        xm[r * D + c] = Enc::q_mod(ctx, t, c, xt[c], xt[partner[c]]);
      else
        xm[r * D + c] = Enc::k_mod(ctx, t, c, xt[c], xt[partner[c]]);
    }
  }
}

// out(T, D) = mod(x) rounded to bf16 (to nearest even) for bf16 rows x(T, D), a block of rows at a
// time (converted, modded, rounded): q' or k' for products that read bf16 operands, without fp32
// rows of the whole slice.
template <class Enc, bool kIsQ>
void mod_rows_bf16(const HeadCtx<float> &ctx, const uint16_t *x, LinearTable<float> ab, uint16_t *out) {
  const int64_t T = ctx.T, D = ctx.D;
  constexpr int64_t kRows = 32;
  std::vector<float> in(static_cast<std::size_t>(kRows * D)), res(in.size());
  for (int64_t t0 = 0; t0 < T; t0 += kRows) {
    const int64_t n = std::min(kRows, T - t0);
    bf16_to_float(x + t0 * D, n * D, in.data());
    mod_rows<Enc, kIsQ>(ctx, in.data(), t0, n, res.data(), ab);
    float_to_bf16(res.data(), n * D, out + t0 * D);
  }
}

// xm(T, D) = mod(x) for the q side (kIsQ) or the k side.
template <class Enc, bool kIsQ, typename Real>
void mod_forward(const HeadCtx<Real> &ctx, const Real *x, Real *xm, LinearTable<Real> ab = {}) {
  mod_rows<Enc, kIsQ>(ctx, x, 0, ctx.T, xm, ab);
}

// dx(T, D) = d mod(x) / dx applied to the gradient gm(T, D) w.r.t. the modded values; `tab` as
// in mod_rows (a linear mod's gradient: dx[c] += a g, dx[partner] += b g; in the half form the
// same two sums per column in the same order).
template <class Enc, bool kIsQ, typename Real>
void mod_backward(const HeadCtx<Real> &ctx, const Real *x, const Real *gm, Real *dx,
                  LinearTable<Real> tab = {}) {
  const int64_t T = ctx.T, D = ctx.D;
  const Real *ab = tab.ab;
  if (ab && tab.half) {
    const int64_t h = D / 2;
    for (int64_t t = 0; t < T; ++t) {
      const Real *g0 = gm + t * D, *g1 = g0 + h, *e = ab + t * D, *b = e + h;
      Real *d0 = dx + t * D, *d1 = d0 + h;
      APE_SIMD for (int64_t c = 0; c < h; ++c) {
        const Real u0 = e[c] * g0[c], u1 = b[c] * g0[c];  // column c's own terms come first
        d0[c] = u0 + (-b[c]) * g1[c];
        d1[c] = u1 + e[c] * g1[c];
      }
    }
    return;
  }
  const std::vector<int64_t> partner = kIsQ ? partners(Enc::kQPairing, Enc::kQFraction, D)
                                            : partners(Enc::kKPairing, Enc::kKFraction, D);
  std::fill(dx, dx + T * D, Real(0));
  for (int64_t t = 0; t < T; ++t) {
    const Real *xt = x + t * D;
    Real *dxt = dx + t * D;
    const Real *gt = gm + t * D;
    if (ab) {
      const Real *e = ab + 2 * t * D;
      for (int64_t c = 0; c < D; ++c) {
        dxt[c] += e[2 * c] * gt[c];
        dxt[partner[c]] += e[2 * c + 1] * gt[c];
      }
      continue;
    }
    for (int64_t c = 0; c < D; ++c) {
      const int64_t pc = partner[c];
      Real gx = 0, gy = 0;
      if constexpr (kIsQ)
        Enc::q_mod_grad(ctx, t, c, xt[c], xt[pc], gt[c], gx, gy);
      else
        Enc::k_mod_grad(ctx, t, c, xt[c], xt[pc], gt[c], gx, gy);
      dxt[c] += gx;
      dxt[pc] += gy;
    }
  }
}

// ---- relative rows ----------------------------------------------------------------------------------
// Enc::kNumRel (0 when the functor does not declare it) rel_rows values: for n < kNumRel,
// R_n(T, rows) = (x' + bias_h) table_h^T with x' = q' (rel_side(n) == 0) or k', table_h the
// (rows, D) slice of head h of the (rows, H, D) param rel_table(n), bias_h the (D) row of the
// optional (H, D) param rel_bias(n) (-1: none).
template <class Enc> using NumRel = traits::NumRel<Enc>;  // contract/enc_traits.h

// Enc::kHasValueRows: o_i += sum_j P_ij table[value_row(i, j), h, :] for the (kValueRows, H, D)
// param kValueTable (false when the functor does not declare it).
template <class Enc> using HasValueRows = traits::HasValueRows<Enc>;

// Enc::kDistanceBias: the score mod is s + B(i - j). Both passes evaluate B once per distance:
// the forward (attend_rows, also decoding) keeps B(d) in order and reads it backwards along a
// tile row; the backward keeps the slice's table reversed, rb[T - 1 - d] = B(d), so that B(i - j)
// for the keys j0 + jj of a tile is rb[T - 1 - i + j0 + jj], contiguous in jj, sums dS along each
// diagonal (gb, same layout) and calls distance_bias_grad once per distance: T evaluations of B
// and its gradient per slice instead of T^2 / 2. Encodings with value rows keep the per-element
// path.
template <class Enc> using DistanceBias = traits::DistanceBias<Enc>;
// Row/column biases (Enc::kRowColBias) where neither value rows nor a distance bias take the logits:
// the forward adds R(i) + C(j) from tables, the backward sums dS per row and column.
template <class Enc>
using RowColLogits = std::bool_constant<traits::RowColBias<Enc>::value && !HasValueRows<Enc>::value &&
                                        !DistanceBias<Enc>::value>;
template <class Enc, typename Real> std::vector<Real> distance_table(const HeadCtx<Real> &ctx) {
  std::vector<Real> rb;
  if constexpr (DistanceBias<Enc>::value) {
    rb.resize(static_cast<std::size_t>(ctx.T));
    for (int64_t d = 0; d < ctx.T; ++d) rb[ctx.T - 1 - d] = Enc::distance_bias(ctx, d);
  }
  return rb;
}

// rel_rows_forward for `count` rows x(count, D) (decoding: the new tokens), out (count, rows_n).
template <class Enc, typename Real>
void rel_rows_range(const HeadCtx<Real> &ctx, int n, const Real *x, int64_t count, Real *out) {
  const int64_t T = count, D = ctx.D, H = ctx.H, h = ctx.h, R = Enc::rel_rows(n);
  const Real *table = ctx.params[Enc::rel_table(n)];
  const Real *bias = Enc::rel_bias(n) >= 0 ? ctx.params[Enc::rel_bias(n)] + h * D : nullptr;
  std::vector<Real> xb(static_cast<std::size_t>(D));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < D; ++c) xb[c] = x[t * D + c] + (bias ? bias[c] : Real(0));
    for (int64_t r = 0; r < R; ++r) {
      const Real *row = table + (r * H + h) * D;
      Real d = 0;
      APE_SIMD_REDUCE(+ : d) for (int64_t c = 0; c < D; ++c) d += xb[c] * row[c];
      out[t * R + r] = d;
    }
  }
}

template <class Enc, typename Real>
void rel_rows_forward(const HeadCtx<Real> &ctx, int n, const Real *x, Real *out) {
  rel_rows_range<Enc>(ctx, n, x, ctx.T, out);
}

// dx(T, D) += dR table_h; the slice's private table / bias gradients += dR^T (x' + bias_h) / dR table_h.
template <class Enc, typename Real>
void rel_rows_backward(const HeadCtx<Real> &ctx, int n, const Real *x, const Real *drows,
                       Real *dx) {
  const int64_t T = ctx.T, D = ctx.D, H = ctx.H, h = ctx.h, R = Enc::rel_rows(n);
  const Real *table = ctx.params[Enc::rel_table(n)];
  const Real *bias = Enc::rel_bias(n) >= 0 ? ctx.params[Enc::rel_bias(n)] + h * D : nullptr;
  Real *dtable = Enc::rel_table_trainable(n) ? ctx.dparams[Enc::rel_table(n)] : nullptr;
  Real *dbias = Enc::rel_bias_trainable(n) ? ctx.dparams[Enc::rel_bias(n)] + h * D : nullptr;
  for (int64_t t = 0; t < T; ++t) {
    Real *dxt = dx + t * D;
    const Real *xt = x + t * D;
    for (int64_t r = 0; r < R; ++r) {
      const Real g = drows[t * R + r];
      if (g == Real(0)) continue;  // rows no key of this query used
      const Real *row = table + (r * H + h) * D;
      APE_SIMD for (int64_t c = 0; c < D; ++c) dxt[c] += g * row[c];
      if (dbias) {
        APE_SIMD for (int64_t c = 0; c < D; ++c) dbias[c] += g * row[c];
      }
      if (dtable) {
        Real *drow = dtable + (r * H + h) * D;
        APE_SIMD for (int64_t c = 0; c < D; ++c) drow[c] += g * (xt[c] + (bias ? bias[c] : Real(0)));
      }
    }
  }
}

// ---- one (b, h) slice -----------------------------------------------------------------------------
// The inputs of the tile loops of a slice: token arrays, q' and k' after the mods, k'^T.
template <class Enc, typename Real> struct SliceInputs {
  HeadCtx<Real> ctx;
  int64_t Tp;                                                  // padded_row(T)
  std::array<const Real *, array_len(Enc::kNumFeatures)> feat{};  // (T) row of each feature
  std::vector<Real> tok;                                       // (kNumTok, T)
  AlignedVector<Real> qm_buf, km_buf;                          // (T, D) when the mod exists
  const Real *q, *k, *v;                                       // (T, D) raw inputs
  const Real *qm, *km;                                         // (T, D) q', k' (raw without mod)
  AlignedVector<Real> kt;                                      // (D, Tp) k'^T, zero padded
  static constexpr int kNumRel = NumRel<Enc>::value;
  std::array<std::vector<Real>, array_len(kNumRel)> rel;       // (T, rows_n) relative rows
  std::array<const Real *, array_len(kNumRel)> rel_ptr{};
  ScratchPtr<Real> io;                                         // (<= 3, T, D) q, k, v of bf16 inputs
  AlignedVector<uint16_t> qm16, km16;  // `direct` with a mod: q', k' rounded to bf16 (T, D)

  // Whether fp32 rows of q, k, q' and k' are read when the products take bf16 rows (`direct`
  // below): by the relative rows only. A mod then runs a block of rows at a time from the
  // tensor's bf16 rows to q' (k') in bf16 (mod_rows_bf16), what the products read.
  static constexpr bool kFp32Rows = kNumRel > 0;

  SliceInputs(const SliceInputs &) = delete;  // ctx.tok points into tok
  SliceInputs &operator=(const SliceInputs &) = delete;
  // `coefs`: the linear mods' coefficient tables of the call (mod_coefs). with_kt: whether kt is
  // made (not when the products read the bf16 operands instead, amx::Operands). direct (bf16
  // tensors, AttnArgs::bf16_io; the AMX forward): the products read bf16 rows, the tensors' own
  // where no mod stands between, else qm16 / km16; q, k and v are then converted to fp32 only
  // where kFp32Rows says (v never), and q, k, v, qm, km are null where they are not.
  SliceInputs(const AttnArgs<Real> &a, int64_t b, int64_t h, const ModCoefs<Real> &coefs,
              bool with_kt = true, bool direct = false)
      : ctx{b, h, a.H, a.T, a.D, a.params, nullptr, nullptr, nullptr},
        Tp(padded_row<Real>(a.T)) {
    const int64_t T = a.T, D = a.D, row = b * a.H + h;  // row of (B*H, T) arrays
    const int64_t krow = row / kv_group(a);              // k's and v's row (AttnArgs::kv_heads)
    q = k = v = nullptr;
    if (a.bf16_io) {  // AttnArgs::bf16_io (Real float: attention_forward/backward check)
      if constexpr (std::is_same_v<Real, float>) {
        const bool cq = !direct || kFp32Rows, ck = !direct || kFp32Rows, cv = !direct;
        io = scratch_of<Real>((cq + ck + cv) * T * D);
        Real *next = io.get();
        auto convert = [&](bool wanted, const uint16_t *x, int64_t r) -> const Real * {
          if (!wanted) return nullptr;
          Real *out = next;
          bf16_to_float(x + r * T * D, T * D, out);
          next += T * D;
          return out;
        };
        q = convert(cq, a.bf16_io->q, row), k = convert(ck, a.bf16_io->k, krow);
        v = convert(cv, a.bf16_io->v, krow);
      }
    } else {
      q = a.q + row * T * D;
      k = a.k + krow * T * D;
      v = a.v + krow * T * D;
    }
    for (int n = 0; n < Enc::kNumFeatures; ++n) feat[n] = a.features[n] + row * T;
    if constexpr (Enc::kNumTok > 0) {
      tok.assign(static_cast<std::size_t>(Enc::kNumTok * T), Real(0));
      ctx.tok = tok.data();
      Enc::token_forward(ctx, feat.data(), tok.data());
    }
    // q' (kIsQ) or k' of the slice: in fp32 into buf, or (direct, no fp32 rows wanted) in bf16
    // into buf16, straight from the tensor's bf16 rows. Returns q' (k') in fp32, or x when the
    // side has no mod, or null when only the bf16 rows were made.
    const bool mod16 = direct && a.bf16_io && !kFp32Rows;
    auto side = [&](auto is_q, const Real *x, AlignedVector<Real> &buf,
                    AlignedVector<uint16_t> &buf16) -> const Real * {
      constexpr bool kIsQ = decltype(is_q)::value;
      if constexpr (kIsQ ? Enc::kHasQMod : Enc::kHasKMod) {
        const LinearTable<Real> ab = coefs.side(kIsQ);
        if (mod16) {
          if constexpr (std::is_same_v<Real, float>) {
            buf16.resize(static_cast<std::size_t>(T * D));
            const uint16_t *x16 = kIsQ ? a.bf16_io->q + row * T * D : a.bf16_io->k + krow * T * D;
            mod_rows_bf16<Enc, kIsQ>(ctx, x16, ab, buf16.data());
          }
          return nullptr;
        }
        buf.resize(static_cast<std::size_t>(T * D));
        mod_forward<Enc, kIsQ>(ctx, x, buf.data(), ab);
        return buf.data();
      } else {
        return x;
      }
    };
    qm = side(std::true_type{}, q, qm_buf, qm16);
    km = side(std::false_type{}, k, km_buf, km16);
    if (with_kt) {
      kt.resize(static_cast<std::size_t>(D * Tp));
      transpose_padded(km, T, D, Tp, kt.data());
    }
    if constexpr (kNumRel > 0) {
      for (int n = 0; n < kNumRel; ++n) {
        rel[n].resize(static_cast<std::size_t>(T * Enc::rel_rows(n)));
        rel_rows_forward<Enc>(ctx, n, Enc::rel_side(n) == 0 ? qm : km, rel[n].data());
        rel_ptr[n] = rel[n].data();
      }
      ctx.rel = rel_ptr.data();
    }
  }
};

// Number of keys of the tile starting at j0 visible from query i (causal: j <= i), at most nk.
inline int64_t visible(int64_t i, int64_t j0, int64_t nk) {
  return std::clamp<int64_t>(i - j0 + 1, 0, nk);
}

// Scratch of attend_rows: one query tile's logits, output accumulator and softmax state.
template <class Enc, typename Real> struct AttendScratch {
  AlignedVector<Real> st;        // (kTileQ, kTileK): logits, then probabilities
  AlignedVector<Real> acc;       // (kTileQ, D): unnormalised output
  std::array<Real, kTileQ> m{}, l{};  // running max and sum of each query
  std::array<Real, kTileQ> ref{}, alpha{};  // per key tile: exp's reference, rescale of m and l
  int64_t R = 0;                 // value rows: unnormalised probability mass of each row, per query
  std::vector<Real> mass;        // (kTileQ, R)
  std::vector<Real> bias;        // logit_tables: B(d) for d < bias.size(), or C(j) for j < size()
#if APE_CPU_AMX
  amx::Operands *amx = nullptr;  // the slice's bf16 operands: the products on AMX (Real float)
#endif
  explicit AttendScratch(int64_t D) : st(kTileQ * kTileK), acc(static_cast<std::size_t>(kTileQ * D)) {
    if constexpr (HasValueRows<Enc>::value) R = Enc::kValueRows;
    mass.resize(static_cast<std::size_t>(kTileQ * R));
  }
};

// Whether the scratch holds the slice's bf16 operands (w.amx: the products on AMX).
template <class Enc, typename Real> inline bool amx_operands(const AttendScratch<Enc, Real> &w) {
#if APE_CPU_AMX
  return w.amx != nullptr;
#else
  (void)w;
  return false;
#endif
}

// The tables final_logits reads, for the keys j < nkeys (extended on demand; a scratch serves one
// slice, whose tokens do not change): the distance bias B(d), d < nkeys, and the row/column
// biases' C(j) (Enc::kRowColBias: the score mod is s + R(i) + C(j), Cable's cumulative biases).
template <class Enc, typename Real>
inline void logit_tables(const HeadCtx<Real> &ctx, int64_t nkeys, AttendScratch<Enc, Real> &w) {
  if constexpr (DistanceBias<Enc>::value && !HasValueRows<Enc>::value) {
    for (int64_t d = static_cast<int64_t>(w.bias.size()); d < nkeys; ++d)
      w.bias.push_back(Enc::distance_bias(ctx, d));
  } else if constexpr (RowColLogits<Enc>::value) {
    for (int64_t j = static_cast<int64_t>(w.bias.size()); j < nkeys; ++j)
      w.bias.push_back(Enc::col_bias(ctx, j));
  }
}

// The final logits s[jj] = score_mod(scale * s[jj]) of query i against the nv visible keys
// j0 + jj of a tile row holding q'_i . k'_j, from logit_tables' w.bias where the score mod has one.
// Row/column biases: scale s + (R(i) + C(j)), the order of the backward's P (cpu and CUDA).
template <class Enc, typename Real>
inline void final_logits(const HeadCtx<Real> &ctx, Real scale, int64_t i, int64_t j0, int64_t nv,
                         const AttendScratch<Enc, Real> &w, Real *s) {
  if constexpr (DistanceBias<Enc>::value && !HasValueRows<Enc>::value) {
    const Real *bi = w.bias.data() + (i - j0);  // B(i - j0 - jj) = bi[-jj]
    APE_SIMD for (int64_t jj = 0; jj < nv; ++jj) s[jj] = scale * s[jj] + bi[-jj];
  } else if constexpr (RowColLogits<Enc>::value) {
    const Real ri = Enc::row_bias(ctx, i), *cj = w.bias.data() + j0;
    APE_SIMD for (int64_t jj = 0; jj < nv; ++jj) s[jj] = scale * s[jj] + (ri + cj[jj]);
  } else if constexpr (Enc::kHasScoreMod) {
    for (int64_t jj = 0; jj < nv; ++jj) s[jj] = Enc::score_mod(ctx, i, j0 + jj, scale * s[jj]);
  } else {
    (void)ctx, (void)i, (void)j0, (void)w;
    APE_SIMD for (int64_t jj = 0; jj < nv; ++jj) s[jj] *= scale;
  }
}

// The causal online-softmax attention of nq <= kTileQ queries at positions i0, ..., i0 + nq - 1
// (qm: their (nq, D) rows after the q mod) over the keys j <= i: kt (D, ldk) holds k'^T, zero
// padded so that every key tile of kTileK columns up to the last query is readable; v (., D) the
// values. Writes o (nq, D) and lse (nq). The full forward runs it on every query tile of a slice,
// decoding (cpu/decode.h) on the new queries against the cache: the same arithmetic in the same
// order, key tile by key tile from the one holding the last query's diagonal down to j = 0 (a tile
// a query cannot see changes nothing of its row, so a row's sums do not depend on the tile of
// queries it came in). The diagonal first: under a bias that falls with distance (ALiBi, Cable,
// KERPLE, the forget gate) a row's running max is set by its first tile and rarely moves again,
// which keeps the bf16 path's P V batches whole (a moved max flushes a batch and rescales acc).
template <class Enc, typename Real>
void attend_rows(const HeadCtx<Real> &ctx, Real scale, const Real *qm, int64_t i0, int64_t nq,
                 const Real *kt, int64_t ldk, const Real *v, Real *o, Real *lse,
                 AttendScratch<Enc, Real> &w) {
  const int64_t D = ctx.D;
  constexpr bool kValue = HasValueRows<Enc>::value;
  const int64_t R = w.R;
  Real *st = w.st.data(), *acc = w.acc.data();
  w.m.fill(neg_inf<Real>());
  w.l.fill(Real(0));
  std::fill(w.acc.begin(), w.acc.end(), Real(0));
  std::fill(w.mass.begin(), w.mass.end(), Real(0));
  const int64_t nkeys = i0 + nq;  // keys visible from the last query
  logit_tables(ctx, nkeys, w);  // B(d) or C(j) once per call (not per (i, j))
  std::array<Real, kTileQ> &ref = w.ref, &alpha = w.alpha;
  // bf16 products (w.amx): P V is added into acc on the tiles (acc's rows go through the tiles
  // only), and a row's reference w.m moves only when a tile's max passes it by more than
  // kLazyRescale (so P <= e^8; its rescale of acc, vector code, is rare after the first tiles).
  // Each key tile t: the softmax of S_t and P_t's bf16 rows, then S_{t+1} (the tile below) on the
  // tiles (and the batch's P V when it is full), so that P_t's vector stores have completed when
  // a tile load reads them.
  const bool bf16 = amx_operands(w);
  constexpr Real kLazyRescale = 8;
  const int64_t last = (nkeys - 1) / kTileK * kTileK;  // the first key tile taken
  // P V of up to amx::kPvTiles key tiles at once (from key pend0 up; their P side by side in
  // w.amx->pf, filled from its last tile down, as the key tiles come), added when the batch is
  // full, before a rescale of acc, and at the end: acc's tiles are loaded and stored once a batch
  // instead of once a key tile.
  int64_t pend0 = 0, npend = 0;
  (void)pend0, (void)npend;  // used only with AMX
  auto flush = [&] {
#if APE_CPU_AMX
    if constexpr (std::is_same_v<Real, float>) {
      if (npend > 0) {
        amx::Operands &x = *w.amx;
        amx::gemm(kTileQ, D, npend * kTileK, x.pf.data() + (amx::kPvTiles - npend) * kTileK,
                  amx::row_major(amx::kPvLd, 32),
                  x.v.data() + pend0 / 2 * D, amx::row_major(D, 16), acc, amx::row_major(D, 16), true);
      }
    }
#endif
    npend = 0;
  };
#if APE_CPU_AMX
  if constexpr (std::is_same_v<Real, float>)
    if (bf16) w.amx->logits(w.amx->q, w.amx->kt, i0, last, st);  // every row (q' has Tp rows)
#endif
  for (int64_t j0 = last; j0 >= 0; j0 -= kTileK) {  // tiles above the diagonal skipped
    const int64_t nk = std::min(kTileK, nkeys - j0);
    if (!bf16) gemm<kTileK>(nq, D, kTileK, qm, D, 1, kt + j0, ldk, st, kTileK, false);
    // The final logits, the keys past the causal edge -inf, and each query's new running max.
    bool moved = false;
    for (int64_t ii = 0; ii < nq; ++ii) {
      const int64_t i = i0 + ii, nv = visible(i, j0, nk);
      Real *s = st + ii * kTileK;
      final_logits<Enc>(ctx, scale, i, j0, nv, w, s);
      std::fill(s + nv, s + kTileK, neg_inf<Real>());
      const Real tile_max = row_max(s);
      const Real mx = !(tile_max > w.m[ii] + (bf16 ? kLazyRescale : Real(0))) ? w.m[ii] : tile_max;
      // All logits so far -inf (a score_mod mask): keep exp finite, the row stays zero.
      ref[ii] = mx == neg_inf<Real>() ? Real(0) : mx;
      alpha[ii] = mx == w.m[ii] ? Real(0) : w.m[ii] - ref[ii];  // exp: 1 when unmoved
      moved = moved || mx != w.m[ii];
      w.m[ii] = mx;
    }
    if (bf16 && moved) flush();  // the batch's P is relative to the old references
    APE_SIMD for (int64_t ii = 0; ii < nq; ++ii) alpha[ii] = softmax_exp_le(alpha[ii]);
    for (int64_t ii = 0; ii < nq; ++ii) {
      Real *s = st + ii * kTileK;
      const Real r = ref[ii];
      bool exps_done = false;
#if APE_CPU_AMX
      if constexpr (std::is_same_v<Real, float>)
        if (bf16) amx::exp_row(s, r), exps_done = true;  // P is rounded to bf16 next
#endif
      if (!exps_done) {
        APE_SIMD for (int64_t jj = 0; jj < kTileK; ++jj) s[jj] = softmax_exp_le(s[jj] - r);  // -inf: 0
      }
      w.l[ii] = w.l[ii] * alpha[ii] + row_sum(s);
      Real *accr = acc + ii * D;
      const Real al = alpha[ii];
      if (!bf16 || al != Real(1)) {
        APE_SIMD for (int64_t c = 0; c < D; ++c) accr[c] *= al;
      }
      if constexpr (kValue) {
        const int64_t i = i0 + ii, nv = visible(i, j0, nk);
        Real *mr = w.mass.data() + ii * R;
        for (int64_t r = 0; r < R; ++r) mr[r] *= al;
        for (int64_t jj = 0; jj < nv; ++jj) mr[Enc::value_row(ctx, i, j0 + jj)] += s[jj];
      }
    }
    if (bf16) {  // P into the batch, S_{t+1}, a full batch's P V (above); P's rows from nq on are zero
#if APE_CPU_AMX
      if constexpr (std::is_same_v<Real, float>) {
        amx::Operands &x = *w.amx;
        pend0 = j0;
        ++npend;
        amx::tile_rows(st, nq, x.pf.data() + (amx::kPvTiles - npend) * kTileK, amx::kPvLd);
        if (j0 > 0) x.logits(x.q, x.kt, i0, j0 - kTileK, st);
        if (npend == amx::kPvTiles) flush();
      }
#endif
    } else {
      gemm(nq, nk, D, st, kTileK, 1, v + j0 * D, D, acc, D, true);
    }
  }
  flush();

  for (int64_t ii = 0; ii < nq; ++ii) {
    const Real inv = w.l[ii] > 0 ? Real(1) / w.l[ii] : Real(0);
    const Real *accr = acc + ii * D;
    Real *orow = o + ii * D;
    APE_SIMD for (int64_t c = 0; c < D; ++c) orow[c] = accr[c] * inv;
    if constexpr (kValue) {
      const Real *table = ctx.params[Enc::kValueTable];
      for (int64_t r = 0; r < R; ++r) {
        const Real wr = w.mass[ii * R + r] * inv;
        if (wr == Real(0)) continue;
        const Real *row = table + (r * ctx.H + ctx.h) * D;
        APE_SIMD for (int64_t c = 0; c < D; ++c) orow[c] += wr * row[c];
      }
    }
    lse[ii] = w.m[ii] + std::log(w.l[ii]);
  }
}

// The attention transition (contract/transition.h) of the rows [lo, hi) of this layer that a
// T-key call transforms, on top of attend_rows' outputs: o and lse hold the ordinary forward of
// every row (pass 1: lse is the row's log-sum-exp), and the rows of `rows` get o rewritten. Per
// block of kTileQ rows, two passes over their keys, tile by tile, recomputing the logits:
//   pass 2: A = exp(s - lse); kept mass K_r = Σ_c transition_kept(A) and, over the window
//           W = [s - 2I, s), the mask sum N_r; avg_r = beta (1 - K_r) / N_r;
//   pass 3: the weights w_rc = transition_weight(A, ...) and o_r = Σ_c w_rc v_c (a tile GEMM).
// Only (kTileQ, kTileK) logits are ever held. Arguments as attend_rows (qm: the rows of all T
// queries; kt (D, ldk); v (T, D); o (T, D); lse (T)).
template <class Enc, typename Real>
void transition_rows(const HeadCtx<Real> &ctx, Real scale, const TransitionRows &rows,
                     const Real *qm, const Real *kt, int64_t ldk, const Real *v, Real *o,
                     const Real *lse, AttendScratch<Enc, Real> &w) {
  static_assert(!HasValueRows<Enc>::value, "the transition does not combine with value rows");
  constexpr TransitionAttrs kAttrs = Enc::kTransition;
  const int64_t D = ctx.D, I = rows.I;
  Real *st = w.st.data(), *acc = w.acc.data();
  std::array<Real, kTileQ> kept{}, nmask{}, avg{}, bound{};
  std::array<int64_t, kTileQ> start{};
  for (int64_t i0 = rows.lo; i0 < rows.hi; i0 += kTileQ) {
    const int64_t nq = std::min(kTileQ, rows.hi - i0), nkeys = i0 + nq;
    logit_tables(ctx, nkeys, w);
    for (int64_t ii = 0; ii < nq; ++ii) {
      start[ii] = rows.start(i0 + ii);
      bound[ii] = Real(kAttrs.alpha) / Real(start[ii] + I);  // 1. alpha / e
      kept[ii] = nmask[ii] = Real(0);
    }
    for (int pass = 2; pass <= 3; ++pass) {
      if (pass == 3) {
        for (int64_t ii = 0; ii < nq; ++ii)
          avg[ii] = Real(kAttrs.beta) * (Real(1) - kept[ii]) / nmask[ii];  // N_r >= 2I * 0.01
        std::fill(w.acc.begin(), w.acc.begin() + nq * D, Real(0));
      }
      for (int64_t j0 = 0; j0 < nkeys; j0 += kTileK) {
        const int64_t nk = std::min(kTileK, nkeys - j0);
        gemm<kTileK>(nq, D, kTileK, qm + i0 * D, D, 1, kt + j0, ldk, st, kTileK, false);
        for (int64_t ii = 0; ii < nq; ++ii) {
          const int64_t i = i0 + ii, nv = visible(i, j0, nk), s0 = start[ii];
          Real *s = st + ii * kTileK;
          final_logits<Enc>(ctx, scale, i, j0, nv, w, s);
          // A row whose every key a score mod masked (lse = -inf) has A = 0 (attend_rows wrote
          // o = 0): subtracting +inf makes every exp 0 instead of NaN; the steps then apply to
          // that zero row as to any other.
          const Real l = lse[i] == neg_inf<Real>() ? -neg_inf<Real>() : lse[i], bd = bound[ii];
          if (pass == 2) {
            Real km = 0, nm = 0;
            for (int64_t jj = 0; jj < nv; ++jj) {
              const int64_t c = j0 + jj;
              const Real kc = transition_kept(softmax_exp(s[jj] - l), c, bd);
              km += kc;
              if (c >= s0 - 2 * I && c < s0) nm += transition_mask(kc, bd);
            }
            kept[ii] += km, nmask[ii] += nm;
          } else {
            const Real a = avg[ii];
            for (int64_t jj = 0; jj < nv; ++jj)
              s[jj] = transition_weight(softmax_exp(s[jj] - l), j0 + jj, s0, I, bd, a);
            std::fill(s + nv, s + kTileK, Real(0));
          }
        }
        if (pass == 3) gemm(nq, nk, D, st, kTileK, 1, v + j0 * D, D, acc, D, true);
      }
    }
    std::copy(acc, acc + nq * D, o + i0 * D);  // the weights are not renormalised
  }
}

template <class Enc, typename Real>
void forward_slice(const AttnArgs<Real> &a, int64_t b, int64_t h, const ModCoefs<Real> &coefs) {
  constexpr bool kTransition = traits::HasTransition<Enc>::value;
  bool bf16 = false;
#if APE_CPU_AMX
  if constexpr (std::is_same_v<Real, float>) bf16 = amx::wanted(a);
#endif
  // bf16 tensors on the tiles: the products read the tensors' rows themselves (SliceInputs'
  // `direct`), except for the transition's passes, which take the Real products (kt, v).
  const bool direct = bf16 && a.bf16_io && !kTransition;
  const SliceInputs<Enc, Real> in(a, b, h, coefs, !bf16 || kTransition, direct);
  const int64_t T = a.T, D = a.D, row = b * a.H + h;
  // bf16 output (AttnArgs::bf16_io): each query tile's rows rounded as they are done, or (the
  // transition rewrites rows afterwards) the slice's at the end.
  ScratchPtr<Real> o_buf;
  if (a.bf16_io) o_buf = scratch_of<Real>(kTransition ? T * D : kTileQ * D);
  Real *o = a.bf16_io ? o_buf.get() : a.o + row * T * D;  // (T, D), or the tile's (kTileQ, D)
  const bool tile_out = a.bf16_io && !kTransition;
  Real *lse = a.lse + row * T;  // (T)
  AttendScratch<Enc, Real> scratch(D);
#if APE_CPU_AMX
  std::unique_ptr<amx::Operands> operands;
  std::unique_ptr<amx::TileScope> tiles;
  if constexpr (std::is_same_v<Real, float>) {
    if (bf16) {
      amx::Source qs{in.qm}, ks{in.km}, vs{in.v};
      if (direct) {
        const int64_t off = row * T * D, koff = row / kv_group(a) * T * D;
        qs = {nullptr, Enc::kHasQMod ? (in.qm16.empty() ? nullptr : in.qm16.data()) : a.bf16_io->q + off};
        ks = {nullptr, Enc::kHasKMod ? (in.km16.empty() ? nullptr : in.km16.data()) : a.bf16_io->k + koff};
        if (!qs.h) qs = {in.qm};  // the relative rows' fp32 q' (SliceInputs::kFp32Rows)
        if (!ks.h) ks = {in.km};
        vs = {nullptr, a.bf16_io->v + koff};
      }
      operands = std::make_unique<amx::Operands>(qs, ks, vs, T, D);
      tiles = amx::tile_scope();
      scratch.amx = operands.get();
    }
  }
#endif
  for (int64_t i0 = 0; i0 < T; i0 += kTileQ) {
    const int64_t nq = std::min(kTileQ, T - i0);
    Real *orows = tile_out ? o : o + i0 * D;
    attend_rows<Enc>(in.ctx, a.scale, in.qm ? in.qm + i0 * D : nullptr, i0, nq, in.kt.data(),
                     in.Tp, in.v, orows, lse + i0, scratch);
    if constexpr (std::is_same_v<Real, float>)
      if (tile_out) float_to_bf16(orows, nq * D, a.bf16_io->o + row * T * D + i0 * D);
  }
  if constexpr (kTransition) {
    const TransitionRows rows = transition_rows_of(Enc::kTransition, T, a.num_layers, a.layer);
    if (!rows.empty())
      transition_rows<Enc>(in.ctx, a.scale, rows, in.qm, in.kt.data(), in.Tp, in.v, o, lse, scratch);
    if constexpr (std::is_same_v<Real, float>)
      if (a.bf16_io) float_to_bf16(o, T * D, a.bf16_io->o + row * T * D);
  }
}

// dparams: this slice's private accumulators, parameter n at dparams + poff[n], zeroed.
// head_dkv (grouped queries, AttnArgs::kv_heads): the (wave, T, D) arrays of each query head's
// dk and dv in Real from slice `wave0` on, which attention_backward sums per group; null: dk, dv
// are the outputs'.
template <class Enc, typename Real>
void backward_slice(const AttnArgs<Real> &a, int64_t b, int64_t h, Real *dparams,
                    const std::array<int64_t, array_len(Enc::kNumParams)> &poff,
                    const ModCoefs<Real> &coefs, Real *const *head_dkv, int64_t wave0) {
  // bf16 products on AMX (amx::wanted): the products read the slice's bf16 operands (below), not
  // k'^T and v^T in Real.
  bool bf16 = false;
#if APE_CPU_AMX
  if constexpr (std::is_same_v<Real, float>) bf16 = amx::wanted(a);
#endif
  SliceInputs<Enc, Real> in(a, b, h, coefs, !bf16);
  HeadCtx<Real> &ctx = in.ctx;
  const int64_t T = a.T, D = a.D, row = b * a.H + h;
  const Real scale = a.scale;
  // bf16 tensors (AttnArgs::bf16_io): o and dO converted, dq, dk, dv rounded at the end.
  ScratchPtr<Real> in_buf, grad_buf;
  if constexpr (std::is_same_v<Real, float>) {
    if (a.bf16_io) {
      in_buf = scratch_of<Real>(2 * T * D);
      bf16_to_float(a.bf16_io->o + row * T * D, T * D, in_buf.get());
      bf16_to_float(a.bf16_io->dout + row * T * D, T * D, in_buf.get() + T * D);
      grad_buf = scratch_of<Real>((head_dkv ? 1 : 3) * T * D);  // dq (and dk, dv)
    }
  }
  const Real *o = a.bf16_io ? in_buf.get() : a.o + row * T * D;                // (T, D)
  const Real *lse = a.lse + row * T;                                            // (T)
  const Real *dout = a.bf16_io ? in_buf.get() + T * D : a.dout + row * T * D;  // (T, D)
  Real *dq = a.bf16_io ? grad_buf.get() : a.dq + row * T * D;
  Real *dk = head_dkv ? head_dkv[0] + (row - wave0) * T * D : a.bf16_io ? grad_buf.get() + T * D : a.dk + row * T * D;
  Real *dv = head_dkv ? head_dkv[1] + (row - wave0) * T * D : a.bf16_io ? grad_buf.get() + 2 * T * D : a.dv + row * T * D;

  std::array<Real *, array_len(Enc::kNumParams)> dparam_ptrs{};
  for (int n = 0; n < Enc::kNumParams; ++n) dparam_ptrs[n] = dparams + poff[n];
  ctx.dparams = dparam_ptrs.data();
  std::vector<Real> dtok(static_cast<std::size_t>(Enc::kNumTok * T), Real(0));  // (kNumTok, T)
  ctx.dtok = dtok.data();
  constexpr int kNumRel = NumRel<Enc>::value;
  std::array<std::vector<Real>, array_len(kNumRel)> drel;  // (T, rows_n) each, zeroed
  std::array<Real *, array_len(kNumRel)> drel_ptr{};
  if constexpr (kNumRel > 0) {
    for (int n = 0; n < kNumRel; ++n) {
      drel[n].assign(static_cast<std::size_t>(T * Enc::rel_rows(n)), Real(0));
      drel_ptr[n] = drel[n].data();
    }
    ctx.drel = drel_ptr.data();
  }

  AlignedVector<Real> vt(bf16 ? 0 : static_cast<std::size_t>(D * in.Tp));  // (D, Tp) v^T, zero padded
  if (!bf16) transpose_padded(in.v, T, D, in.Tp, vt.data());
  std::vector<Real> delta(static_cast<std::size_t>(T));  // (T): Delta_i = dO_i . O_i
  for (int64_t t = 0; t < T; ++t) {
    Real d = 0;
    APE_SIMD_REDUCE(+ : d) for (int64_t c = 0; c < D; ++c) d += dout[t * D + c] * o[t * D + c];
    delta[t] = d;
  }
  // Gradients w.r.t. q', k' (T, D): straight into dq / dk when there is no mod.
  AlignedVector<Real> dqm_buf(Enc::kHasQMod ? static_cast<std::size_t>(T * D) : 0);
  AlignedVector<Real> dkm_buf(Enc::kHasKMod ? static_cast<std::size_t>(T * D) : 0);
  Real *dqm = Enc::kHasQMod ? dqm_buf.data() : dq;
  Real *dkm = Enc::kHasKMod ? dkm_buf.data() : dk;
  std::fill(dqm, dqm + T * D, Real(0));
  std::fill(dkm, dkm + T * D, Real(0));
  std::fill(dv, dv + T * D, Real(0));

  AlignedVector<Real> st(kTileQ * kTileK);  // (kTileQ, kTileK): logits, then P
  AlignedVector<Real> dp(kTileQ * kTileK);  // (kTileQ, kTileK): dO V^T, then scale * dS
  // Value rows: dP_ij also gets dO_i . table[r(i, j)] (drow, (T, R)); mass (T, R) collects
  // sum_j P_ij per row for the table's gradient.
  constexpr bool kValue = HasValueRows<Enc>::value;
  int64_t R = 0;
  if constexpr (kValue) R = Enc::kValueRows;
  std::vector<Real> drow(static_cast<std::size_t>(T * R)), mass(static_cast<std::size_t>(T * R));
  constexpr bool kDist = DistanceBias<Enc>::value && !kValue;
  const std::vector<Real> rb = kDist ? distance_table<Enc>(ctx) : std::vector<Real>();
  std::vector<Real> gb(rb.size(), Real(0));  // diagonal sums of dS / scale, reversed like rb
  // Enc::kRowColBias: the score mod is s + R(i) + C(j) (Cable's cumulative biases). R and C once
  // per token, P from scale s + (R(i) + C(j)) (the score mod's own order of the sums: its bias is
  // the difference of two token values), and the bias's gradients as one sum of dS / scale per
  // query row and per key column, handed to row_bias_grad / col_bias_grad once per token: the
  // per-element path's two read-modify-writes of token gradients per element ran serially.
  constexpr bool kRowCol = RowColLogits<Enc>::value;
  constexpr bool kRowColSums = kRowCol && !traits::BiasFixed<Enc>::value;
  std::vector<Real> rcb(kRowCol ? static_cast<std::size_t>(2 * T) : 0);  // R(0..T), then C(0..T)
  std::vector<Real> rcg(kRowColSums ? static_cast<std::size_t>(2 * T) : 0, Real(0));  // their sums
  if constexpr (kRowCol) {
    for (int64_t t = 0; t < T; ++t) rcb[t] = Enc::row_bias(ctx, t), rcb[T + t] = Enc::col_bias(ctx, t);
  }
  if constexpr (kValue) {
    const Real *table = a.params[Enc::kValueTable];
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < R; ++r) {
        const Real *row = table + (r * a.H + h) * D;
        Real d = 0;
        APE_SIMD_REDUCE(+ : d) for (int64_t c = 0; c < D; ++c) d += dout[t * D + c] * row[c];
        drow[t * R + r] = d;
      }
  }

  // bf16 products: the slice's operands, and dQ' (Tp, D), dV^T and dK'^T (D, Tp) accumulated in
  // fp32 over whole tiles, copied out after the last. dQ' adds the dS K' of up to
  // amx::kPvTiles key tiles at once (their dS side by side in x->pf, from key dpend0).
  int64_t dpend0 = 0, ndpend = 0;
  (void)dpend0, (void)ndpend;
#if APE_CPU_AMX
  std::unique_ptr<amx::Operands> x;
  std::unique_ptr<amx::TileScope> tiles;
  AlignedVector<float> dq_acc, dvt_acc, dkt_acc;
  if constexpr (std::is_same_v<Real, float>) {
    if (bf16) {
      x = std::make_unique<amx::Operands>(amx::Source{in.qm}, amx::Source{in.km}, amx::Source{}, T, D);
      x->add_backward(in.qm, in.km, in.v, dout, T);
      dq_acc.assign(static_cast<std::size_t>(x->Tp * D), 0.f);
      dvt_acc.assign(static_cast<std::size_t>(D * x->Tp), 0.f);
      dkt_acc.assign(static_cast<std::size_t>(D * x->Tp), 0.f);
      tiles = amx::tile_scope();
    }
  }
#endif

  for (int64_t i0 = 0; i0 < T; i0 += kTileQ) {
    const int64_t nq = std::min(kTileQ, T - i0);
    for (int64_t j0 = 0; j0 < i0 + nq; j0 += kTileK) {
      const int64_t nk = std::min(kTileK, T - j0);
      if (bf16) {  // every row of the tiles (the operands have Tp rows)
#if APE_CPU_AMX
        if constexpr (std::is_same_v<Real, float>) {
          x->logits(x->q, x->kt, i0, j0, st.data());
          x->logits(x->dout, x->vt, i0, j0, dp.data());
        }
#endif
      } else {
        gemm<kTileK>(nq, D, kTileK, in.qm + i0 * D, D, 1, in.kt.data() + j0, in.Tp, st.data(),
                     kTileK, false);
        gemm<kTileK>(nq, D, kTileK, dout + i0 * D, D, 1, vt.data() + j0, in.Tp, dp.data(), kTileK,
                     false);
      }
      for (int64_t ii = 0; ii < nq; ++ii) {
        const int64_t i = i0 + ii, nv = visible(i, j0, nk);
        // A row without any finite logit (lse = -inf) has P = 0. Every logit is <= its row's lse
        // (the forward's max plus log l, l >= 1), so P's exps take softmax_exp_le.
        const Real lse_i = lse[i] == neg_inf<Real>() ? std::numeric_limits<Real>::infinity()
                                                      : lse[i];
        const Real delta_i = delta[i];
        Real *s = st.data() + ii * kTileK, *g = dp.data() + ii * kTileK;
        if constexpr (kValue) {
          for (int64_t jj = 0; jj < nv; ++jj) {
            const int64_t r = Enc::value_row(ctx, i, j0 + jj);
            const Real raw = scale * s[jj];
            Real logit = raw;
            if constexpr (Enc::kHasScoreMod) logit = Enc::score_mod(ctx, i, j0 + jj, raw);
            const Real p = softmax_exp_le(logit - lse_i);
            const Real gp = p * (g[jj] + drow[i * R + r] - delta_i);
            s[jj] = p;
            mass[i * R + r] += p;
            if constexpr (Enc::kHasScoreMod)
              g[jj] = scale * Enc::score_mod_grad(ctx, i, j0 + jj, raw, gp);
            else
              g[jj] = scale * gp;
          }
        } else if constexpr (kDist) {
          const Real *bi = rb.data() + (T - 1 - i + j0);
          Real *gi = gb.data() + (T - 1 - i + j0);
          APE_SIMD for (int64_t jj = 0; jj < nv; ++jj) {
            const Real p = softmax_exp_le(scale * s[jj] + bi[jj] - lse_i);
            const Real gp = p * (g[jj] - delta_i);
            s[jj] = p;
            gi[jj] += gp;
            g[jj] = scale * gp;
          }
        } else if constexpr (kRowCol) {
          const Real ri = rcb[i], *cj = rcb.data() + T + j0;
          if constexpr (kRowColSums) {
            Real *cg = rcg.data() + T + j0, rsum = 0;
            APE_SIMD_REDUCE(+ : rsum) for (int64_t jj = 0; jj < nv; ++jj) {
              const Real p = softmax_exp_le(scale * s[jj] + (ri + cj[jj]) - lse_i);
              const Real gp = p * (g[jj] - delta_i);
              s[jj] = p;
              cg[jj] += gp;
              rsum += gp;
              g[jj] = scale * gp;
            }
            rcg[i] += rsum;
          } else {
            APE_SIMD for (int64_t jj = 0; jj < nv; ++jj) {
              const Real p = softmax_exp_le(scale * s[jj] + (ri + cj[jj]) - lse_i);
              s[jj] = p;
              g[jj] = scale * p * (g[jj] - delta_i);
            }
          }
        } else if constexpr (Enc::kHasScoreMod) {
          for (int64_t jj = 0; jj < nv; ++jj) {
            const Real raw = scale * s[jj];
            const Real p = softmax_exp_le(Enc::score_mod(ctx, i, j0 + jj, raw) - lse_i);
            s[jj] = p;
            g[jj] = scale * Enc::score_mod_grad(ctx, i, j0 + jj, raw, p * (g[jj] - delta_i));
          }
        } else {
          APE_SIMD for (int64_t jj = 0; jj < nv; ++jj) {
            const Real p = softmax_exp_le(scale * s[jj] - lse_i);
            s[jj] = p;
            g[jj] = scale * p * (g[jj] - delta_i);
          }
        }
        std::fill(s + nv, s + kTileK, Real(0));
        std::fill(g + nv, g + kTileK, Real(0));
      }
      // dV[j] += P^T dO, dK'[j] += scale dS^T Q', dQ'[i] += scale dS K'.
      if (bf16) {  // as dV^T += dO^T P and dK'^T += Q'^T dS; P's and dS's rows from nq on zero
#if APE_CPU_AMX
        if constexpr (std::is_same_v<Real, float>) {
          amx::tile_row_pairs(st.data(), nq, x->pp.data());
          amx::tile_row_pairs(dp.data(), nq, x->sp.data());
          if (ndpend == 0) dpend0 = j0;
          amx::tile_rows(dp.data(), nq, x->pf.data() + ndpend * kTileK, amx::kPvLd);
          ++ndpend;
          const amx::Layout t_panels = amx::panels(D, 32), acc_panels = amx::panels(D, 16);
          const amx::Layout tile_pairs = amx::row_major(kTileK, 16);
          const int64_t a0 = i0 / 32 * 32 * D, c0 = j0 / 16 * 16 * D;  // panels of i0, j0
          amx::gemm(D, kTileK, kTileQ, x->doutt.data() + a0, t_panels, x->pp.data(), tile_pairs,
                    dvt_acc.data() + c0, acc_panels, true);
          amx::gemm(D, kTileK, kTileQ, x->qt.data() + a0, t_panels, x->sp.data(), tile_pairs,
                    dkt_acc.data() + c0, acc_panels, true);
          if (ndpend == amx::kPvTiles || j0 + kTileK >= i0 + nq) {  // a full batch, or the last
            amx::gemm(kTileQ, D, ndpend * kTileK, x->pf.data(), amx::row_major(amx::kPvLd, 32),
                      x->k.data() + dpend0 / 2 * D, amx::row_major(D, 16), dq_acc.data() + i0 * D,
                      amx::row_major(D, 16), true);
            ndpend = 0;
          }
        }
#endif
      } else {
        gemm(nk, nq, D, st.data(), 1, kTileK, dout + i0 * D, D, dv + j0 * D, D, true);
        gemm(nk, nq, D, dp.data(), 1, kTileK, in.qm + i0 * D, D, dkm + j0 * D, D, true);
        gemm(nq, nk, D, dp.data(), kTileK, 1, in.km + j0 * D, D, dqm + i0 * D, D, true);
      }
    }
  }
#if APE_CPU_AMX
  if constexpr (std::is_same_v<Real, float>) {
    if (bf16) {
      tiles.reset();
      std::copy(dq_acc.begin(), dq_acc.begin() + T * D, dqm);
      for (int64_t t = 0; t < T; ++t) {  // dV^T, dK'^T in panels of 16 keys (amx::panels(D, 16))
        const float *vt_t = dvt_acc.data() + t / 16 * 16 * D + t % 16;
        const float *kt_t = dkt_acc.data() + t / 16 * 16 * D + t % 16;
        for (int64_t c = 0; c < D; ++c) dv[t * D + c] = vt_t[c * 16], dkm[t * D + c] = kt_t[c * 16];
      }
    }
  }
#endif

  if constexpr (kDist) {  // B's gradients, one call per distance with its diagonal's sum
    for (int64_t d = 0; d < T; ++d)
      if (const Real gd = gb[T - 1 - d]; gd != Real(0)) Enc::distance_bias_grad(ctx, d, gd);
  }
  if constexpr (kRowColSums) {  // R's and C's gradients, one call per token with its row's or column's sum
    for (int64_t t = 0; t < T; ++t) {
      if (const Real gr = rcg[t]; gr != Real(0)) Enc::row_bias_grad(ctx, t, gr);
      if (const Real gc = rcg[T + t]; gc != Real(0)) Enc::col_bias_grad(ctx, t, gc);
    }
  }
  if constexpr (kValue) {  // table[r] gradient: sum_i mass_i[r] dO_i
    if constexpr (Enc::kValueTableTrainable) {
      Real *dtable = ctx.dparams[Enc::kValueTable];
      for (int64_t t = 0; t < T; ++t)
        for (int64_t r = 0; r < R; ++r) {
          const Real w = mass[t * R + r];
          if (w == Real(0)) continue;
          Real *drow_t = dtable + (r * a.H + h) * D;
          APE_SIMD for (int64_t c = 0; c < D; ++c) drow_t[c] += w * dout[t * D + c];
        }
    }
  }
  if constexpr (kNumRel > 0) {  // the rows' gradients into dq', dk' and the tables
    for (int n = 0; n < kNumRel; ++n) {
      const bool q_side = Enc::rel_side(n) == 0;
      rel_rows_backward<Enc>(ctx, n, q_side ? in.qm : in.km, drel[n].data(), q_side ? dqm : dkm);
    }
  }
  if constexpr (Enc::kHasQMod)
    mod_backward<Enc, true>(ctx, in.q, dqm, dq, coefs.side(true));
  if constexpr (Enc::kHasKMod)
    mod_backward<Enc, false>(ctx, in.k, dkm, dk, coefs.side(false));
  if constexpr (Enc::kNumTok > 0) {
    std::array<Real *, array_len(Enc::kNumFeatures)> dfeat{};
    for (int n = 0; n < Enc::kNumFeatures; ++n) dfeat[n] = a.dfeatures[n] + row * T;
    Enc::token_backward(ctx, in.feat.data(), in.tok.data(), dtok.data(), dfeat.data());
  } else {
    for (int n = 0; n < Enc::kNumFeatures; ++n)  // features without tokens have no effect
      std::fill(a.dfeatures[n] + row * T, a.dfeatures[n] + (row + 1) * T, Real(0));
  }
  if constexpr (std::is_same_v<Real, float>) {
    if (a.bf16_io) {
      float_to_bf16(dq, T * D, a.bf16_io->dq + row * T * D);
      if (!head_dkv) {  // else rounded after the group's sum
        float_to_bf16(dk, T * D, a.bf16_io->dk + row * T * D);
        float_to_bf16(dv, T * D, a.bf16_io->dv + row * T * D);
      }
    }
  }
}

}  // namespace detail

template <typename Real> void check_bf16_io(const AttnArgs<Real> &a) {
  if (a.bf16_io && !std::is_same_v<Real, float>)
    throw std::invalid_argument("AttnArgs::bf16_io needs the fp32 kernels (Real float)");
}

namespace detail {
// f(s) for every slice s in [0, n), on OpenMP's threads. An exception must not leave an OpenMP
// region (the runtime ends the process: an allocation refused in one slice killed the caller, never
// reaching the C ABI's APE_ERROR_OUT_OF_MEMORY or PyTorch's error), so each slice catches its own:
// the first is rethrown after the region, and the slices not yet begun are skipped.
template <class F> void each_slice(int64_t n, F &&f) {
  std::exception_ptr first;
  std::atomic<bool> failed{false};
  APE_PRAGMA(omp parallel for schedule(dynamic, 1))
  for (int64_t s = 0; s < n; ++s) {
    if (failed.load(std::memory_order_relaxed)) continue;
    try {
      f(s);
    } catch (...) {
      if (!failed.exchange(true)) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}
}  // namespace detail

template <typename Real> void check_kv_heads(const AttnArgs<Real> &a) {
  if (std::string why = ape_rules::check_kv_heads(a.kv_heads, a.H); !why.empty())
    throw std::invalid_argument("AttnArgs: " + why);
}

template <class Enc, typename Real> void attention_forward(const AttnArgs<Real> &a) {
  check_bf16_io(a);
  check_kv_heads(a);
  const int64_t slices = a.B * a.H;
  if (slices == 0 || a.T == 0) return;  // nothing to write (B H T rows of o and lse)
  const auto coefs = detail::mod_coefs<Enc>(a);
  detail::each_slice(slices, [&](int64_t s) { detail::forward_slice<Enc>(a, s / a.H, s % a.H, *coefs); });
}

template <class Enc, typename Real> void attention_backward(const AttnArgs<Real> &a) {
  static_assert(!traits::HasTransition<Enc>::value,
                "an attention transition is inference-only: its encoding has no backward");
  check_bf16_io(a);
  check_kv_heads(a);
  const int64_t slices = a.B * a.H;
  // Private parameter-gradient accumulators: (B*H, sum_n numel_n), parameter n at offset poff[n].
  std::array<int64_t, detail::array_len(Enc::kNumParams)> poff{}, numel{};
  int64_t per_slice = 0;
  if constexpr (Enc::kNumParams > 0) {
    for (int n = 0; n < Enc::kNumParams; ++n) {
      poff[n] = per_slice;
      numel[n] = Enc::param_numel(n, a.H, a.D);
      per_slice += numel[n];
    }
  }
  if (slices == 0 || a.T == 0) {  // no rows: the params' gradients are zero
    for (int n = 0; n < Enc::kNumParams; ++n) std::fill(a.dparams[n], a.dparams[n] + numel[n], Real(0));
    return;
  }
  const int64_t group = kv_group(a), TD = a.T * a.D;
  const auto coefs = detail::mod_coefs<Enc>(a);
  // The slices run in waves of `wave` with one accumulator each, added to the gradients in (b, h)
  // order after the wave: every element's sum is 0 + slice 0 + slice 1 + ... in that order,
  // bitwise reproducible for any thread count and wave. A wave holds as many slices as fit in
  // kParamScratch bytes of accumulators, at least one per thread: the scratch does not grow with
  // B H (a [R, H, D] table's per-slice copies were B H^2 R D floats).
  constexpr int64_t kParamScratch = int64_t(64) << 20;
  int64_t threads = 1;
#ifdef _OPENMP
  threads = omp_get_max_threads();
#endif
  const int64_t fit = per_slice > 0 ? kParamScratch / (per_slice * int64_t(sizeof(Real))) : slices;
  int64_t wave = std::min(slices, std::max({fit, threads, int64_t(1)}));
  // Grouped queries (AttnArgs::kv_heads): each query head's dk and dv (Real, (wave, T, D) each),
  // summed per group after each wave. A group's heads are consecutive slices, so a wave of whole
  // groups (a multiple of `group`, B H is one) holds every term of its sums; at most about four
  // slices per thread (and one group) keeps the scratch from growing with B H.
  detail::ScratchPtr<Real> head_grads;
  std::array<Real *, 2> head_dkv{};
  if (group > 1) {
    wave = std::min(wave, std::max(4 * threads, group));
    wave = std::min(slices, (wave + group - 1) / group * group);
    head_grads = detail::scratch_of<Real>(2 * wave * TD);
    head_dkv = {head_grads.get(), head_grads.get() + wave * TD};
  }
  std::vector<Real> priv(static_cast<std::size_t>(wave * per_slice));
  for (int n = 0; n < Enc::kNumParams; ++n) std::fill(a.dparams[n], a.dparams[n] + numel[n], Real(0));
  for (int64_t s0 = 0; s0 < slices; s0 += wave) {
    const int64_t count = std::min(wave, slices - s0);
    std::fill(priv.begin(), priv.end(), Real(0));
    detail::each_slice(count, [&](int64_t i) {
      const int64_t s = s0 + i;
      detail::backward_slice<Enc>(a, s / a.H, s % a.H, priv.data() + i * per_slice, poff, *coefs,
                                  group > 1 ? head_dkv.data() : nullptr, s0);
    });
    if (group > 1) {  // dk, dv of key head r = the sum of its group's, in head order
      detail::each_slice(count / group * 2, [&](int64_t j) {
        const int64_t r = s0 / group + j / 2;  // the key head's row of (B*kv_heads, T)
        const bool is_v = j % 2 == 1;
        const Real *src = head_dkv[is_v] + (j / 2) * group * TD;
        detail::ScratchPtr<Real> sum_buf;
        if (a.bf16_io) sum_buf = detail::scratch_of<Real>(TD);
        Real *sum = a.bf16_io ? sum_buf.get() : (is_v ? a.dv : a.dk) + r * TD;
        std::copy(src, src + TD, sum);
        for (int64_t i = 1; i < group; ++i) {
          const Real *x = src + i * TD;
          APE_SIMD
          for (int64_t e = 0; e < TD; ++e) sum[e] += x[e];
        }
        if constexpr (std::is_same_v<Real, float>)
          if (a.bf16_io) detail::float_to_bf16(sum, TD, (is_v ? a.bf16_io->dv : a.bf16_io->dk) + r * TD);
      });
    }
    for (int n = 0; n < Enc::kNumParams; ++n) {
      Real *dst = a.dparams[n];
      for (int64_t i = 0; i < count; ++i) {
        const Real *src = priv.data() + i * per_slice + poff[n];
        for (int64_t e = 0; e < numel[n]; ++e) dst[e] += src[e];
      }
    }
  }
}

}  // namespace APE_CPU_NS
}  // namespace ape
APE_CPU_END
