// The host side of the CUDA attention (ape/cuda/attention.cuh): scratch memory, the launch
// sequences of attention_forward and attention_backward, and APE_CUDA_INSTANTIATE.
#pragma once

#include "ape/contract/value_rules.h"
#include "ape/cuda/backward.cuh"
#include "ape/cuda/flash_backward.cuh"
#include "ape/cuda/hopper_forward.cuh"
#include "ape/cuda/packed_decode.cuh"
#include "ape/cuda/side_kernels.cuh"
#include "ape/cuda/transition.cuh"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

namespace ape::cuda {
APE_CUDA_ABI_BEGIN
namespace detail {

// Whether a decode cache may keep k' (CudaAttnArgs::km, CudaKernelEntry::caches_k_mod): the
// encoding has a k mod, and neither it nor the token sequences it may read depend on the length.
template <class Enc> constexpr bool caches_k_mod() {
  return Enc::kHasKMod && !traits::KModReadsLength<Enc>::value && !traits::TokensReadLength<Enc>::value;
}

// Token sequences a decode cache may keep (CudaAttnArgs::tok, tok_carry; CudaKernelEntry::
// tok_seqs): Enc::kNumTok where the token program does not read the length (a token's entries
// then stay as the sequence grows, and a step reruns the program from its first new token's chunk
// on from the scans' carries there), else 0.
template <class Enc> constexpr int64_t tok_seqs() {
  return traits::TokensReadLength<Enc>::value ? 0 : Enc::kNumTok;
}

// Floats per token of the key side's relative rows ((k'_j + bias) . table^T, ape.rel_rows "k":
// Transformer-XL's u . k, DeBERTa's p2c) that a decode cache may keep (CudaAttnArgs::krel,
// CudaKernelEntry::key_rel_floats): they read k' and the params only, so they stay valid as the
// sequence grows wherever k' does (no k mod, or one that caches_k_mod allows). 0: none to keep.
template <class Enc> constexpr int64_t key_rel_floats() {
  if constexpr (traits::NumRel<Enc>::value > 0) {
    if (Enc::kHasKMod && !caches_k_mod<Enc>()) return 0;
    int64_t n = 0;
    for (int r = 0; r < Enc::kNumRel; ++r)
      if (Enc::rel_side(r) == 1) n += Enc::rel_rows(r);
    return n;
  } else {
    return 0;
  }
}

// ---- host side -------------------------------------------------------------------------------------
// Scratch memory of one call, stream ordered, freed when the call returns (the frees are queued
// behind the kernels): from the caller's allocator (CudaAttnArgs::scratch), else cudaMallocAsync.
class Scratch {
 public:
  Scratch(cudaStream_t s, const CudaScratchAllocator *alloc) : stream_(s), alloc_(alloc) {}
  Scratch(const Scratch &) = delete;
  Scratch &operator=(const Scratch &) = delete;
  ~Scratch() {
    for (int n = 0; n < count_; ++n) {
      if (alloc_) alloc_->free(alloc_->ctx, ptrs_[n], stream_);
      else cudaFreeAsync(ptrs_[n], stream_);
    }
  }
  template <class X> X *take(int64_t n, cudaError_t &err) {
    if (err != cudaSuccess || n <= 0 || count_ == kMax) {
      if (count_ == kMax) err = cudaErrorMemoryAllocation;
      return nullptr;
    }
    const size_t bytes = sizeof(X) * static_cast<size_t>(n);
    void *ptr = nullptr;
    if (alloc_) {
      ptr = alloc_->alloc(alloc_->ctx, bytes, stream_);
      if (!ptr) {
        err = cudaErrorMemoryAllocation;
      } else if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) {  // the kernels move 16-byte chunks
        alloc_->free(alloc_->ctx, ptr, stream_);
        err = cudaErrorInvalidValue;
      }
    } else if ((err = cudaMallocAsync(&ptr, bytes, stream_)) != cudaSuccess) {
      (void)cudaGetLastError();  // returned here: not left for the next launch to report as its own
    }
    if (err != cudaSuccess) return nullptr;
    ptrs_[count_++] = ptr;
    return static_cast<X *>(ptr);
  }

 private:
  static constexpr int kMax = 16 + 2 * 64;
  cudaStream_t stream_;
  const CudaScratchAllocator *alloc_;
  void *ptrs_[kMax] = {};
  int count_ = 0;
};

inline unsigned blocks_for(int64_t n, int per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

// Lets `kernel` launch with `bytes` of dynamic shared memory on the current device. The limit is a
// property of the function and device that every host thread shares and a launch is checked
// against when it is queued, so it is only ever raised (a call that set it lower, for a smaller
// param cache, failed the launch of another thread that had just set it higher): the highest
// value set per (kernel, device) is kept, under a lock.
inline std::mutex &smem_limit_mutex() {
  static std::mutex m;
  return m;
}
template <class Kernel> cudaError_t allow_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  static std::map<std::pair<const void *, int>, size_t> *set = new std::map<std::pair<const void *, int>, size_t>();
  const std::lock_guard<std::mutex> lock(smem_limit_mutex());
  size_t &have = (*set)[{reinterpret_cast<const void *>(kernel), device}];
  if (bytes <= have) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (err == cudaSuccess) have = bytes;
  return err;
}

// Params::param_cache for a flash kernel whose tiles take `bytes` of shared memory (ParamCache,
// flash_forward.cuh): the backward stages what fits in what the device gives a block beyond them;
// the forward, whose occupancy the cache must not lower, at most kParamCacheFwdMax. `extra` is
// the bytes the cache adds to the launch.
constexpr size_t kParamCacheFwdMax = 8 * 1024;
// The shared memory the current device gives a block (opting in).
inline cudaError_t device_smem_optin(int &optin) {
  int dev = 0;
  optin = 0;
  cudaError_t err = cudaGetDevice(&dev);
  return err == cudaSuccess ? cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) : err;
}
template <class Enc, class In>
cudaError_t plan_param_cache(Params<Enc, In> &p, size_t bytes, bool grads, size_t &extra) {
  p.param_cache = 0, extra = 0;
  if constexpr (flash_param_cache<Enc>()) {
    int optin = 0;
    if (cudaError_t err = device_smem_optin(optin); err != cudaSuccess) return err;
    size_t budget = static_cast<size_t>(optin) > bytes ? static_cast<size_t>(optin) - bytes : 0;
    if (!grads && budget > kParamCacheFwdMax) budget = kParamCacheFwdMax;
    p.param_cache = param_cache_mask<Enc>(p.H, p.D, budget, grads);
    extra = param_cache_bytes(param_cache_elems<Enc>(p.param_cache, p.H, p.D), grads);
  }
  return cudaSuccess;
}

// The arguments of one call checked against the encoding: every pointer the call reads or
// writes is present (a null dfeatures / dparams with features or params would be dereferenced).
// In words, the first rule the call breaks (CudaVariant::refusal, ape::cuda::refusal), or nullptr.
template <class Enc>
const char *args_problem(const CudaAttnArgs &a, int64_t kD, bool backward) {
  if (a.D != kD) return "D is not the variant's head dim";
  if (a.B < 0 || a.H < 0 || a.T < 0) return "B, H or T is negative";
  if (a.scratch && (!a.scratch->alloc || !a.scratch->free)) return "the scratch allocator lacks alloc or free";
  // Sizes whose products fit int64 (B·H·T·D elements): 2^32 x 2^32 x 16 wrapped to 0, an "empty"
  // call that returned success and wrote nothing. B·H slices at most 2^31 - 1: a grid's x.
  constexpr int64_t kMaxDim = int64_t(1) << 31;
  if (a.B >= kMaxDim || a.H >= kMaxDim || a.T >= kMaxDim) return "B, H or T is 2^31 or more";
  if (a.B > 0 && a.H > 0 && a.B * a.H >= kMaxDim) return "B·H is 2^31 slices or more";
  if (a.B > 0 && a.H > 0 && a.T > 0 && a.B * a.H > INT64_MAX / (a.T * kD)) return "B·H·T·D overflows int64";
  if (!::ape_rules::check_call_scale(a.scale).empty()) return "scale is not finite, nor 0 or at least 2^-64 in magnitude";
  if (!::ape_rules::kv_heads_fit(a.kv_heads, a.H)) return ::ape_rules::kKvHeadsRule;
  if (a.first_row < 0 || (a.T > 0 && a.first_row >= a.T)) return "first_row is not in [0, T)";
  if (backward && a.first_row != 0) return "the backward needs first_row 0";
  if (a.num_splits < 0) return "num_splits is negative";
  if (backward && a.num_splits > 1) return "the backward needs num_splits 0 or 1";
  if (a.num_layers < 0 || (a.num_layers > 0 && (a.layer < 0 || a.layer >= a.num_layers)))
    return "layer is not in [0, num_layers)";
  if (a.o_from_first && backward) return "o_from_first is for the forward only";
  if (a.o_from_first && a.num_layers > 0) return "o_from_first is refused with num_layers > 0";
  // Inputs in a longer buffer (CudaAttnArgs::ld) and a cached k' (km): the forward's kernels, the
  // mods and the relative rows' tables take them; the backward and the transition read q', k' and
  // v as (B, H, T, D).
  if (a.ld != 0 && a.ld != a.T) {
    if (a.ld < a.T || a.ld >= kMaxDim) return "ld is below T or 2^31 or more";
    if (backward || a.num_layers > 0) return "ld other than T is for the forward without num_layers only";
    if (a.B > 0 && a.H > 0 && a.B * a.H > INT64_MAX / (a.ld * kD)) return "B·H·ld·D overflows int64";
  }
  if (a.feat_ld != 0 && a.feat_ld != a.T) {
    if (a.feat_ld < a.T || a.feat_ld >= kMaxDim) return "feat_ld is below T or 2^31 or more";
    if (backward || a.num_layers > 0) return "feat_ld other than T is for the forward without num_layers only";
    if (a.B > 0 && a.H > 0 && a.B * a.H > INT64_MAX / a.feat_ld) return "B·H·feat_ld overflows int64";
  }
  // q from row q_row0, q_ld rows a slice (CudaAttnArgs::q_row0): every row the forward reads.
  if (a.q_row0 != 0 || a.q_ld != 0) {
    if (backward || a.num_layers > 0) return "q_row0 and q_ld are for the forward without num_layers only";
    if (a.q_row0 < 0 || a.q_row0 > a.first_row / kQueryWindow * kQueryWindow)
      return "q_row0 is not in [0, first_row rounded down to a multiple of kQueryWindow]";
    const int64_t q_rows = a.q_ld != 0 ? a.q_ld : a.ld != 0 ? a.ld : a.T;
    if (a.q_ld < 0 || a.q_ld >= kMaxDim || a.q_row0 + q_rows < a.T) return "q_ld is below T - q_row0 or 2^31 or more";
    if (a.B > 0 && a.H > 0 && a.q_ld > 0 && a.B * a.H > INT64_MAX / (a.q_ld * kD)) return "B·H·q_ld·D overflows int64";
  }
  if (a.km || a.krel || a.tok || a.tok_carry || a.km_rows != 0) {
    if (backward) return "km, krel, tok and km_rows are for the forward only";
    if (a.km && !caches_k_mod<Enc>()) return "km is given but the encoding does not cache its k mod";
    if (a.krel && key_rel_floats<Enc>() == 0) return "krel is given but the encoding has no key-side relative rows";
    if (!a.tok != !a.tok_carry) return "tok and tok_carry go together";
    if (a.tok && tok_seqs<Enc>() == 0) return "tok is given but the encoding's token program cannot be cached";
    if (!a.km && !a.krel && !a.tok) return "km_rows is given without km, krel or tok";
    if (a.ld == 0) return "km, krel and tok need ld (their rows per slice)";
    if (a.km_rows < 0 || a.km_rows > a.T) return "km_rows is not in [0, T]";
    if (reinterpret_cast<uintptr_t>(a.km) % 16 != 0) return "km is not 16-byte aligned";
    if (reinterpret_cast<uintptr_t>(a.krel) % alignof(float) != 0 ||
        reinterpret_cast<uintptr_t>(a.tok) % alignof(float) != 0 ||
        reinterpret_cast<uintptr_t>(a.tok_carry) % alignof(double) != 0)
      return "krel, tok or tok_carry is misaligned for its type";
  }
  if (a.B * a.H * a.T == 0) {
    // Nothing to compute, but the backward zeroes the param gradients (global sums): those only.
    if (backward && Enc::kNumParams > 0) {
      if (!a.dparams) return "dparams is null (an empty backward still zeroes the param gradients)";
      for (int n = 0; n < Enc::kNumParams; ++n)
        if (!a.dparams[n] && Enc::param_numel(n, a.H, a.D) > 0) return "a dparams pointer is null";
    }
    return nullptr;
  }
  if (!a.q || !a.k || !a.v || !a.o || !a.lse) return "q, k, v, o or lse is null";
  // Rows move in 16-byte chunks (cp.async, TMA, vector stores): a misaligned address would end the
  // launch with a sticky misaligned-address error, which no later call on the context survives.
  auto aligned = [](const void *x) { return reinterpret_cast<uintptr_t>(x) % 16 == 0; };
  if (!aligned(a.q) || !aligned(a.k) || !aligned(a.v) || !aligned(a.o))
    return "q, k, v or o is not 16-byte aligned";
  if (Enc::kNumFeatures > 0 && !a.features) return "features is null";
  if (Enc::kNumParams > 0 && !a.params) return "params is null";
  for (int n = 0; n < Enc::kNumFeatures; ++n)
    if (!a.features[n]) return "a features pointer is null";
  for (int n = 0; n < Enc::kNumParams; ++n)
    if (!a.params[n] && Enc::param_numel(n, a.H, a.D) > 0) return "a params pointer is null";
  if (!backward) return nullptr;
  if (!a.dout || !a.dq || !a.dk || !a.dv) return "dout, dq, dk or dv is null";
  if (!aligned(a.dout) || !aligned(a.dq) || !aligned(a.dk) || !aligned(a.dv))
    return "dout, dq, dk or dv is not 16-byte aligned";
  if (Enc::kNumFeatures > 0 && !a.dfeatures) return "dfeatures is null";
  if (Enc::kNumParams > 0 && !a.dparams) return "dparams is null";
  for (int n = 0; n < Enc::kNumFeatures; ++n)
    if (!a.dfeatures[n]) return "a dfeatures pointer is null";
  for (int n = 0; n < Enc::kNumParams; ++n)
    if (!a.dparams[n] && Enc::param_numel(n, a.H, a.D) > 0) return "a dparams pointer is null";
  if ((Enc::kNumTok > 0 || Enc::kNumParams > 0) && !a.status)
    return "status is null (the encoding has token or param gradients)";
  return nullptr;
}
template <class Enc>
cudaError_t check_args(const CudaAttnArgs &a, int64_t kD, bool backward) {
  return args_problem<Enc>(a, kD, backward) ? cudaErrorInvalidValue : cudaSuccess;
}
// CudaVariant::refusal of the generated variants (apec's entry file).
template <class Enc>
const char *args_refusal(const CudaAttnArgs &a, bool backward) {
  return args_problem<Enc>(a, a.D, backward);
}

template <class Enc, class In>
Params<Enc, In> make_params(const CudaAttnArgs &a) {
  Params<Enc, In> p{};
  p.B = a.B, p.H = a.H, p.T = a.T, p.D = a.D;
  p.ld_q = p.ld_k = p.ld_v = a.ld != 0 ? a.ld : a.T;
  if (a.q_ld != 0) p.ld_q = a.q_ld;
  // k and v of kv_heads heads: slice bh reads key head bh / group (prepare keeps k' per key head,
  // or computes it per query head: k_group 1).
  p.k_group = p.v_group = a.kv_heads > 0 ? a.H / a.kv_heads : 1;
  p.qm_row0 = a.q_row0;  // q holds the rows from q_row0 (q' = q where there is no q mod)
  p.num_splits = 1;
  p.q = static_cast<const In *>(a.q), p.k = static_cast<const In *>(a.k);
  p.v = static_cast<const In *>(a.v), p.o = static_cast<In *>(a.o), p.lse = a.lse;
  p.o_row0 = a.o_from_first ? a.first_row : 0, p.o_ld = a.T - p.o_row0;
  for (int n = 0; n < Enc::kNumFeatures; ++n) p.feat[n] = a.features[n];
  p.feat_ld = a.feat_ld != 0 ? a.feat_ld : a.T;
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

// The grid of the linear mods' kernels: x over a slice's runs, y (then z, past 65,535: slice_blocks)
// over groups of kLinBh slices.
template <class In, class P> dim3 linear_mod_grid(const P &p, int64_t D, int64_t row0 = 0, int64_t slices = 0) {
  const int64_t S = slices > 0 ? slices : p.B * p.H;
  return slice_blocks(blocks_for((p.T - row0) * D / run_len<In>(), 256), (S + kLinBh - 1) / kLinBh);
}

// y[bh, t, r] = (x[bh, t, :] + bias[h, :]) . table[r, h, :] (side_kernels.cuh, table_rows_kernel)
// for the rows t from row0 (x with ld_x rows a slice from row x_row0, y with ld_y (0: T) from y_row0).
template <class In, int D, class P>
cudaError_t launch_table_rows(const In *x, int64_t ld_x, const float *bias, const float *table, int64_t rows,
                              const P &p, float *y, cudaStream_t st, int64_t row0 = 0, int64_t ld_y = 0,
                              int64_t x_row0 = 0, int64_t y_row0 = 0, int64_t x_group = 1) {
  constexpr size_t bytes = table_rows_smem<D>();
  cudaError_t err = allow_smem(table_rows_kernel<In, D>, bytes);
  if (err != cudaSuccess || row0 >= p.T) return err;
  return launch(table_rows_kernel<In, D>, slice_blocks(blocks_for(p.T - row0, kTabTok), p.B * p.H),
                kTabThreads, bytes, st, x, bias, table, rows, p.H, p.T, y, ld_x, ld_y > 0 ? ld_y : p.T, row0,
                p.B * p.H, x_row0, y_row0, x_group);
}

// Every forward kernel's query tile (32, 64, 128 or 192 rows: FwdSmem, FlashFwd, HopperFwd with 2
// or 3 consumers) divides this, so the tile holding first_row starts at or after first_row rounded
// down to it: the first q' row a forward reads (static_asserts at the launches).
constexpr int64_t kFwdRowAlign = kQueryWindow;
// The rows of one warp of the FlashAttention-2-class forward, at most (16 kMT: 16 at d_h 128, 32
// below): its split kernel reads q' and the query side's relative rows from first_row's warp on.
constexpr int64_t kFwdWarpRows = 32;

// tok, q', k' of every slice (the forward's inputs; the backward recomputes them). A forward call
// (`a`) may narrow them: q' of the rows from q_row0 only (the query tiles it computes); k', the
// key side's relative rows and the token sequences into the caller's caches (CudaAttnArgs::km,
// krel, tok) for its rows from km_rows only (the token program from that row's chunk); the
// backward passes none.
template <class Enc, class In, int kModD>
cudaError_t prepare(Params<Enc, In> &p, Scratch &scratch, cudaStream_t st, const CudaAttnArgs *a = nullptr,
                    int64_t q_from = -1) {
  cudaError_t err = cudaSuccess;
  const int64_t BH = p.B * p.H;
  const int64_t ld = a && a->ld != 0 ? a->ld : p.T;  // rows per slice of the caller's buffers
  if constexpr (Enc::kNumTok > 0) {
    if (a && a->tok) {  // the caller's cache (check_args: tok_seqs): from km_rows' chunk on
      p.tok = a->tok, p.tok_ld = ld, p.tok0 = a->km_rows / kTokChunk * kTokChunk, p.tok_carry = a->tok_carry;
    } else {
      p.tok = scratch.take<float>(BH * Enc::kNumTok * p.T, err), p.tok_ld = p.T, p.tok0 = 0, p.tok_carry = nullptr;
      if (err != cudaSuccess) return err;
    }
    if ((err = launch(token_forward_kernel<Enc, In>, static_cast<unsigned>(BH), kTokThreads, 0, st,
                      p)) != cudaSuccess)
      return err;
  }
  // A linear mod (side_kernels.cuh): its coefficients once per position and run for kLinBh slices.
  // Rows [row0, T) of every slice, x with ld_x rows per slice, xm with ld_xm.
  // Grouped keys (ModRows): slice bh of xm reads x's bh / x_group; a k' shared per key head runs
  // over the key heads' slices, each in its group's first query head's context.
  struct Grouping {
    int64_t x_group = 1, slices = 0, ctx_group = 1;
  };
  auto mod = [&](auto is_q, const In *x, int64_t ld_x, In *xm, int64_t ld_xm, int64_t row0, int64_t xm_row0 = 0,
                 int64_t x_row0 = 0, Grouping g = {}) -> cudaError_t {
    constexpr bool kIsQ = decltype(is_q)::value;
    if (row0 >= p.T) return cudaSuccess;
    const ModRows rows{row0, ld_x, ld_xm, xm_row0, x_row0, g.x_group, g.slices, g.ctx_group};
    const int64_t slices = g.slices > 0 ? g.slices : BH;
    if constexpr (linear_mod<Enc, kIsQ>())
      return launch(mod_forward_linear_kernel<Enc, In, kIsQ, kModD>, linear_mod_grid<In>(p, kModD, row0, slices),
                    256, 0, st, p, x, xm, rows);
    else
      return launch(mod_forward_kernel<Enc, In, kIsQ, kModD>,
                    blocks_for(slices * (p.T - row0) * p.D / run_len<In>(), 256), 256, 0, st, p, x, xm, rows);
  };
  // The query tiles a forward computes start at first_row's tile (kFwdRowAlign): q' and the query
  // side's relative rows of the rows from there, or from q_from (>= 0: the forward reads no row
  // before it).
  const int64_t q_row0 = q_from >= 0 ? q_from : a ? a->first_row / kFwdRowAlign * kFwdRowAlign : 0;
  p.q_row0 = q_row0;
  if constexpr (Enc::kHasQMod) {
    // q' of the rows from q_row0 only, T - q_row0 a slice (Params::qm_row0): a decode step's
    // scratch is its tile's, not the sequence's.
    const int64_t q_rows = p.T - q_row0;
    In *qm = scratch.take<In>(BH * q_rows * p.D, err);
    if (err != cudaSuccess) return err;
    if ((err = mod(std::true_type{}, p.q, p.ld_q, qm, q_rows, q_row0, q_row0, p.qm_row0)) != cudaSuccess) return err;
    p.qm = qm, p.ld_q = q_rows, p.qm_row0 = q_row0;
  }
  if constexpr (Enc::kHasKMod) {
    // Grouped keys (k_group > 1): k' of each key head where the group shares it (shares_k_mod:
    // the mod over the key heads' slices), else of each query head from its key head's k.
    Grouping g;
    if constexpr (traits::KModShared<Enc>::value)
      g.slices = BH / p.k_group, g.ctx_group = p.k_group;
    else
      g.x_group = p.k_group, p.k_group = 1;
    const int64_t km_elems = (g.slices > 0 ? g.slices : BH) * p.T * p.D;
    if (a && a->km) {  // the caller's cache of k' (check_args: caches_k_mod)
      In *km = static_cast<In *>(a->km);
      if ((err = mod(std::false_type{}, p.k, p.ld_k, km, p.ld_k, a->km_rows, 0, 0, g)) != cudaSuccess) return err;
      p.km = km;
    } else {
      In *km = scratch.take<In>(km_elems, err);
      if (err != cudaSuccess) return err;
      if ((err = mod(std::false_type{}, p.k, p.ld_k, km, p.T, 0, 0, 0, g)) != cudaSuccess) return err;
      p.km = km, p.ld_k = p.T;
    }
  }
  if constexpr (traits::NumRel<Enc>::value > 0) {
    // The key side's rows into the caller's cache (CudaAttnArgs::krel: each such table's
    // (B*H, ld, rows) in turn) from row km_rows, or every row into scratch; the query side's from
    // q_row0.
    float *krel = a ? a->krel : nullptr;
    for (int r = 0; r < Enc::kNumRel; ++r) {
      const bool key = Enc::rel_side(r) == 1, cached = key && krel;
      int64_t row0 = key ? 0 : q_row0;
      if (cached) {
        p.rel[r] = krel, p.rel_ld[r] = ld, row0 = a->km_rows;
        krel += BH * ld * Enc::rel_rows(r);
      } else {
        // (the query side's rows from q_row0 only: a decode step's, not the sequence's)
        p.rel_row0[r] = row0, p.rel_ld[r] = p.T - row0;
        p.rel[r] = scratch.take<float>(BH * p.rel_ld[r] * Enc::rel_rows(r), err);
        if (err != cudaSuccess) return err;
      }
      if ((err = launch_table_rows<In, kModD>(key ? p.km : p.qm, key ? p.ld_k : p.ld_q,
                                              Enc::rel_bias(r) >= 0 ? p.params[Enc::rel_bias(r)] : nullptr,
                                              p.params[Enc::rel_table(r)], Enc::rel_rows(r), p, p.rel[r], st,
                                              row0, p.rel_ld[r], key ? 0 : p.qm_row0, p.rel_row0[r],
                                              key ? p.k_group : 1)) != cudaSuccess)
        return err;
    }
  }
  return cudaSuccess;
}

// *record |= *status, atomically (CudaAttnArgs::status_record): one thread. A template, as every
// kernel of these headers, so that the variants' translation units may each hold a copy.
template <class Word> __global__ void status_or_kernel(Word *record, const Word *status) {
  if (*status) atomicOr(record, *status);
}

// y = c x elementwise (x, y of n elements; y may be x).
template <class X> __global__ void scale_kernel(const X *x, X *y, int64_t n, float c) {
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e < n) y[e] = from_float<X>(c * to_float<X>(x[e]));
}

// y = c x on rows [row0, row0 + rows) of each of S slices, x with ld_x rows a slice, y with ld_y.
template <class X>
__global__ void scale_rows_kernel(const X *x, int64_t ld_x, int64_t x_row0, X *y, int64_t S, int64_t row0,
                                  int64_t rows, int64_t D, float c) {
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= S * rows * D) return;
  const int64_t col = e % D, r = e / D % rows, s = e / D / rows;  // y: rows [row0, row0 + rows), `rows` a slice
  y[(s * rows + r) * D + col] = from_float<X>(c * to_float<X>(x[(s * ld_x + row0 + r - x_row0) * D + col]));
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
  // q'' of the rows the forward reads (from q_row0, prepare) into a (B H, T - q_row0, D) buffer.
  const int64_t BH = p.B * p.H, rows = p.T - p.q_row0, n = BH * rows * p.D;
  In *qs = scratch.take<In>(n, err);
  if (err != cudaSuccess) return err;
  if (n > 0 && (err = launch(scale_rows_kernel<In>, blocks_for(n, 256), 256, 0, st, p.qm, p.ld_q, p.qm_row0, qs,
                             BH, p.q_row0, rows, p.D, qsign)))
    return err;
  p.ld_q = rows, p.qm_row0 = p.q_row0;
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

// Whether environment variable `name` is exactly the one character `value` (the opt-ins below:
// "1" turns one on, "0" one off; any other value leaves the default).
inline bool env_is(const char *name, char value) {
  const char *v = std::getenv(name);
  return v != nullptr && v[0] == value && v[1] == '\0';
}

// Whether the 16-bit forward takes the Hopper kernel on sm_90 (hopper_device): yes unless
// APE_CUDA_HOPPER_FORWARD=0, which runs the FlashAttention-2-class forward there instead: the GPU
// check times both per head dim (issue 30 measured the latter faster at D = 64, before the Hopper
// forward's descriptor rework), so the choice per head dim can follow a measurement.
inline bool hopper_forward_enabled() {
  return !env_is("APE_CUDA_HOPPER_FORWARD", '0');
}

// Whether a decode step of grouped keys packs each group's rows into one block
// (packed_decode_kernel): on unless APE_CUDA_PACK_GQA is 0 (the flash kernels' rows, a query head
// a block, for a side-by-side timing and the tests of those kernels).
inline bool pack_gqa_enabled() {
  return !env_is("APE_CUDA_PACK_GQA", '0');
}

// Whether the backward of a mod whose gradient adds to parameters sums those gradients over rows
// in registers (mod_backward_params_kernel): on unless APE_CUDA_MOD_PARAM_SUMS is 0 (one pair of
// atomics per term, mod_backward_kernel: the same sums, for the tests and a side-by-side timing).
inline bool mod_param_sums_enabled() {
  return !env_is("APE_CUDA_MOD_PARAM_SUMS", '0');
}

// The Hopper forward's and the backward's defaults on sm_90 follow the H200's timings of
// bench/results/gpu_h200.md (2026-11-30, bench/gpu_bench.py in one process, bf16, causal; NoPE and
// RoPE at d_h 64 and 128, K-Cable at d_h 128): each setting below is on by default there, and
// its variable set to 0 turns it off for a side-by-side timing (the GPU check's settings).

// Whether the Hopper forward's two consumer warpgroups take turns issuing their products
// (Params::pingpong, FlashAttention-3's scheduling): yes unless APE_CUDA_PINGPONG=0. With the
// persistent grid, 1.09-1.11x the free-running consumers' forward at d_h 64 and 128 on the H200.
inline bool hopper_pingpong_enabled() {
  return !env_is("APE_CUDA_PINGPONG", '0');
}

// Whether the Hopper forward's consumers release a stage's K' once its S product completes
// (Params::kv_split, FlashAttention-3's separate K and V pipelines: the next K' loads a step
// ahead): yes unless APE_CUDA_KV_SPLIT=0, which releases it with V after the P V product, as the
// forward did before, so that the GPU check times both in one process.
inline bool hopper_kv_split_enabled() {
  return !env_is("APE_CUDA_KV_SPLIT", '0');
}

// The Hopper forward's consumer warpgroups at head dim kD: 3 (query tiles of 192 rows,
// FlashAttention-3's tile at d_h 64) where APE_CUDA_HOPPER_CONSUMERS=3 and kD <= 64, else 2 (128
// rows). Two by default: the H200 timed three at 0.99x two's forward at d_h 64 (NoPE and RoPE,
// B 1, H 32, T 4096; bench/results/gpu_h200.md, 2026-12-04). The idea: at d_h 64 a key tile's products are half those of d_h 128 and its softmax the
// same, so the exponentials weigh twice as much against the tensor cores; with three consumers in
// rotation two compute their softmax while one's products run, and a K' and V tile serves 1.5x
// the rows (2/3 of the L2 bytes per FLOP). At d_h 128 the consumers' 240 registers leave no room
// for a third.
inline int hopper_consumers(int kD) {
  return kD <= 64 && env_is("APE_CUDA_HOPPER_CONSUMERS", '3') ? 3 : 2;
}

// Slices per group of the Hopper forward's tile order (Params::tile_group), of bh slices of t rows
// at head dim d in elem-byte elements: with APE_CUDA_TILE_GROUP=auto, as many as keep their K' and
// V (2 t d elements a slice) within 32 MiB of L2 (FlashAttention-3's grouping for long sequences:
// the blocks at work then share a few slices' keys, instead of reading every slice's from DRAM
// at once): the default, and APE_CUDA_TILE_GROUP=auto; a number N, N (tests); 0 or anything else,
// all bh (one group: the order before the grouping), as the other settings here treat a value
// they do not know. The H200 timed the grouping's forward at 1.22x (NoPE) and 1.13x (RoPE) at
// B 8, H 16, T 2048, d_h 128, at 1.03-1.05x (RoPE, Cable, K-Cable) and 0.94x (NoPE) at B 2, H 16,
// T 8192, and 1.00x at d_h 64, B 1, H 32, T 4096, where one group holds every slice
// (bench/results/gpu_h200.md, 2026-12-04).
inline int64_t hopper_tile_group(int64_t bh, int64_t t, int64_t d, int64_t elem) {
  const char *v = std::getenv("APE_CUDA_TILE_GROUP");
  int64_t g = bh;
  if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0) {
    const int64_t slice = 2 * t * d * elem;
    g = slice > 0 ? std::max<int64_t>(1, (int64_t(32) << 20) / slice) : bh;
  } else {
    char *end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    if (end != nullptr && *end == '\0' && n > 0) g = n;
  }
  return g < bh ? g : bh;
}

// Whether the Hopper forward runs a block per SM that claims its tiles, heaviest first, from a
// counter (Params::sched, FlashAttention-3's persistent scheduling: the next tile's Q, K' and V
// load while the block finishes the last) instead of a block per tile: yes unless
// APE_CUDA_PERSISTENT=0.
inline bool hopper_persistent_enabled() {
  return !env_is("APE_CUDA_PERSISTENT", '0');
}

// Whether the flash backward takes its wgmma layout on sm_90 (kBwdWgmma) at head dim kD:
// at D 64 and 128 unless APE_CUDA_WGMMA_BACKWARD=0. The H200 timed it at 2.35-2.37x the mma.sync
// layout's backward at D 128 (NoPE and RoPE, T 8192) and 1.15x (K-Cable, T 4096), at 1.56x (NoPE)
// and 1.48x (RoPE) at D 64 (B 1, H 32, T 4096; bench/results/gpu_h200.md, 2026-12-04).
inline bool hopper_backward_enabled(int kD) {
  if (env_is("APE_CUDA_WGMMA_BACKWARD", '0')) return false;
  return kD == 64 || kD == 128;
}

// Whether key tile 0 of the flash backward writes dq itself where dq = dQ' (Params::dq_direct;
// flash_dq_direct, in the semaphores' order) instead of adding its tile like the other key tiles
// and leaving dq to the conversion pass (mod_backward_kernel, as FlashAttention-2 and -3 convert
// their dQ accumulators): APE_CUDA_DQ_DIRECT=1 or 0, else in the mma.sync layouts and not in the
// wgmma layout. Writing dq adds, to every step of key tile 0, a read of the dQ' rows the higher key
// tiles summed (a round trip to L2 per 16-byte chunk and thread: eight a step in the wgmma layout
// at D 128), in the block that is its slice's longest and its last to start. On the H200
// (2026-12-04, wgmma layout) the order cost 1.09x of the backward where key tile 0 wrote dq (NoPE,
// Cable) and 1.02x where it did not (RoPE, whose dq the mod's pass writes); bench/bwd_schedule.py's
// model of the grid gives 1.085x for key tile 0's steps at 1.6x the others' (docs/cuda.md, "What
// the order costs"). The pass costs a read of dQ' and a write of dq (6 bytes an element) at memory
// speed. The mma.sync layouts keep the direct write until a GPU times both there.
inline bool dq_direct_enabled(bool wgmma) {
  if (env_is("APE_CUDA_DQ_DIRECT", '1')) return true;
  if (env_is("APE_CUDA_DQ_DIRECT", '0')) return false;
  return !wgmma;
}

// Whether the flash backward's wide layout on sm_90 (hopper_device) adds its dQ' tiles by TMA
// reductions from shared memory (kBwdWideTma, the wgmma layout's way) instead of per-thread fp32
// reductions: APE_CUDA_DQ_TMA set to 1, at D 64 and 128. Off by default: the H200 timed it at
// 1.02x the wide layout at D 128 (where the wgmma layout, the default there, is 2.35x); the
// emulated suite checks both.
inline bool dq_tma_enabled() {
  return env_is("APE_CUDA_DQ_TMA", '1');
}

// Whether the flash backward takes FlashAttention-2's tiling of its products (kBwdSquare: 32 x 32
// warp tiles of S^T, P^T and dS^T through shared memory; flash_bwd_square) where it applies, in the
// wide layout's place: APE_CUDA_BWD_SQUARE set to 1. Off by default: on the H200 at D 128 it ran
// 1.21-1.22x the wide layout (1.27-1.28x with APE_CUDA_DQ_TMA=1), under the wgmma layout's
// 2.35x; sm_80 and D 64 untimed. The emulated suite checks both.
inline bool bwd_square_enabled() {
  return env_is("APE_CUDA_BWD_SQUARE", '1');
}

// Whether the flash backward takes feature steps where a score mod over features saturates
// (flash_feature_steps): yes unless APE_CUDA_FEATURE_STEPS=0, which keeps every step on the
// per-element path (for a side-by-side timing; the emulated suite checks both).
inline bool feature_steps_enabled() {
  return !env_is("APE_CUDA_FEATURE_STEPS", '0');
}

// Whether the flash backward's wide layout at D = 128 runs in steps of 64 queries formed in two
// sub-tiles of 32 (kBwdWideSub: half the barriers and dQ' turns per query of the 32-query steps,
// with their registers) instead of steps of 32: APE_CUDA_BWD_SUBTILES set to 1. Off by default:
// 1.10-1.11x the wide layout on the H200, under the wgmma layout; the emulated suite checks both.
inline bool bwd_subtiles_enabled() {
  return env_is("APE_CUDA_BWD_SUBTILES", '1');
}

// The shares of a split forward's keys (CudaAttnArgs::num_splits) for `blocks` blocks of query
// tiles whose longest has `key_tiles` key tiles: the caller's n, else (first_row > 0 only)
// APE_CUDA_NUM_SPLITS=N, else the n that finishes first by a count of rounds: the split kernel's
// blocks run in ceil(blocks n / (SMs x per_sm)) rounds (per_sm(int &): the blocks an SM holds,
// cudaOccupancyMaxActiveBlocksPerMultiprocessor), each as long as a share's ceil(key_tiles / n)
// key tiles plus one for its fixed part (the query tile, the partial row), the fewest shares on a
// tie, at most one share per kFwdSplitMinTiles key tiles, none where the query tiles alone fill the
// SMs; then at most key_tiles and kFwdSplitMax.
// (A share past a whole round costs a round: at B 1, H 16 on 132 SMs holding one block each, 17
// shares take 3 rounds of 8 tiles where 8 take one of 16.)
constexpr int64_t kFwdSplitMinTiles = 4, kFwdSplitMax = 128;
constexpr int kMaxDevices = 64;  // devices whose answers a process keeps (num_splits_for's per_sm)
// A kernel's blocks an SM holds (`query(held)`: its occupancy), asked once per device and kept in
// `known` (blocks + 1 per device; 0: not asked); under the emulator, whose device changes
// architecture in a process, asked every time. 1 where the query fails.
template <class Query> void blocks_per_sm(std::atomic<int> (&known)[kMaxDevices], const Query &query, int &held) {
#ifdef APE_SIMT
  constexpr bool kKeep = false;
#else
  constexpr bool kKeep = true;
#endif
  int dev = -1;
  const bool has_dev = kKeep && cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < kMaxDevices;
  if (!has_dev) (void)cudaGetLastError();  // (not the next launch's error)
  if (has_dev && known[dev].load() > 0) {
    held = known[dev].load() - 1;
    return;
  }
  if (query(held) != cudaSuccess) {
    (void)cudaGetLastError();  // (likewise)
    held = 1;
  }
  if (has_dev) known[dev].store(held + 1);
}
template <class PerSm>
cudaError_t num_splits_for(const CudaAttnArgs &a, int64_t blocks, int64_t key_tiles, const PerSm &per_sm,
                           int &splits) {
  int64_t n = a.num_splits;
  splits = 1;
  if (n == 0) {
    if (a.first_row == 0) return cudaSuccess;
    const char *env = std::getenv("APE_CUDA_NUM_SPLITS");
    char *end = nullptr;
    const long v = env ? std::strtol(env, &end, 10) : 0;
    if (env && end != env && *end == '\0' && v > 0) {
      n = v;
    } else {
      const int64_t most = std::min(key_tiles / kFwdSplitMinTiles, kFwdSplitMax);
      if (blocks <= 0 || most < 2) return cudaSuccess;
      int dev = 0, sms = 0, held = 0;
      cudaError_t err = cudaGetDevice(&dev);
      if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
      if (err == cudaSuccess) err = per_sm(held);
      if (err != cudaSuccess) return err;
      const int64_t slots = int64_t(sms > 0 ? sms : 1) * (held > 0 ? held : 1);
      if (blocks >= slots) return cudaSuccess;  // the tiles alone fill every SM
      int64_t best = 0;
      n = 1;
      for (int64_t c = 1; c <= most; ++c) {
        const int64_t rounds = (blocks * c + slots - 1) / slots, t = rounds * ((key_tiles + c - 1) / c + 1);
        if (c == 1 || t < best) best = t, n = c;
      }
    }
  }
  if (n > key_tiles) n = key_tiles;
  if (n > kFwdSplitMax) n = kFwdSplitMax;
  splits = n > 1 ? static_cast<int>(n) : 1;
  return cudaSuccess;
}

// The current device's compute capability major (0 when it cannot be read).
inline int device_major() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return 0;
  return major;
}


// A decode step of grouped keys packed (packed_decode_kernel): q' of the new row and k' of the new
// keys (prepare), then one block per key head and share of the keys, the shares as the split
// forward's (num_splits_for, by key tiles of kPackShareKeys; its split_combine_kernel adds them).
constexpr int64_t kPackShareKeys = 64;
template <class Enc, class In, int kD>
cudaError_t packed_decode(const CudaAttnArgs &a, Params<Enc, In> &p, Scratch &scratch, cudaStream_t st) {
  cudaError_t err = prepare<Enc, In, kD>(p, scratch, st, &a, a.first_row);
  if (err != cudaSuccess) return err;
  const int group = static_cast<int>(a.H / a.kv_heads);
  const int64_t slices = a.B * a.kv_heads, key_tiles = blocks_for(a.T, kPackShareKeys);
  const auto kernel = packed_decode_kernel<Enc, In, kD>;
  const auto per_sm = [&](int &held) -> cudaError_t {  // (its shared memory is static)
    static std::atomic<int> known[kMaxDevices];
    blocks_per_sm(known, [&](int &h) { return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&h, kernel, kPackThreads, 0); },
                  held);
    return cudaSuccess;
  };
  int splits = 1;
  if ((err = num_splits_for(a, slices, key_tiles, per_sm, splits)) != cudaSuccess) return err;
  const int64_t per_tiles = blocks_for(key_tiles, splits), per_share = per_tiles * kPackShareKeys;
  splits = static_cast<int>(blocks_for(key_tiles, per_tiles));  // (none empty)
  const float kf = p.scale * 1.44269504088896341f;
  if (slices > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(splits));
  if (splits == 1) return launch(kernel, grid, kPackThreads, 0, st, p, group, per_share, kf);
  const int64_t S = a.B * a.H;
  p.num_splits = splits, p.part_row0 = a.first_row, p.part_rows = 1;
  p.part_o = scratch.take<float>(splits * S * kD, err);
  if (err == cudaSuccess) p.part_lse = scratch.take<float>(splits * S, err);
  if (err != cudaSuccess || (err = launch(kernel, grid, kPackThreads, 0, st, p, group, per_share, kf)) != cudaSuccess)
    return err;
  return launch(split_combine_kernel<In>, blocks_for(S * (kD / 4), 256), 256, 0, st, p.part_o, p.part_lse, splits, S,
                int64_t(1), p.part_row0, p.o_row0, p.o_ld, int64_t(kD), p.o, p.lse);
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
  Scratch scratch(st, a.scratch);
  // A decode step of grouped keys (one new row per query head, kv_heads a divisor of H below it)
  // of an encoding whose scores are scale q'·k' alone: each group's rows in one block, which reads
  // k' and v once for the group (packed_decode_kernel), up to kPackMaxGroup query heads a group.
  // (num_splits 1 asks for the full forward's rows bit for bit: the flash kernels'.)
  if constexpr (pack_gqa<Enc>())
    if (a.kv_heads > 0 && a.kv_heads < a.H && a.H / a.kv_heads <= kPackMaxGroup && a.T - a.first_row == 1 &&
        a.num_splits != 1 && pack_gqa_enabled())
      return packed_decode<Enc, In, kD>(a, p, scratch, st);
  // Which kernel computes the rows (before prepare, which computes q' of the rows it reads): the
  // flash forward where the device has its shared memory (else the general one); the Hopper one
  // on sm_90 unless the keys split; the FlashAttention-2-class one otherwise, unsplit, or split
  // (num_splits_for) or as one share where its tiles' rows are mostly idle (the warps that hold a
  // row from first_row compute: q' of the rows from the first such warp's, kFwdWarpRows).
  bool flash = false, use_hopper = false, rows_only = false;
  int splits = 1;
  if constexpr (flash_forward_runs<Enc, In, kD>()) {
    using F = FlashFwd<In, kD>;
    flash = true;
    if constexpr (!flash_forward_everywhere<Enc, In, kD>()) {  // the device decides
      int optin = 0;
      if ((err = device_smem_optin(optin)) != cudaSuccess) return err;
      flash = static_cast<size_t>(optin) >= flash_fwd_bytes<Enc, In, kD>();
    }
    if (flash) {
      static_assert(kFwdRowAlign % F::BQ == 0, "q' from first_row's tile (prepare)");
      const int64_t n_qt = blocks_for(a.T, F::BQ) - a.first_row / F::BQ;
      if constexpr (value_rows<Enc>() == 0) {  // (value rows: never split, never the Hopper forward)
        // The split kernel's blocks an SM holds (by its tiles' bytes; a parameter cache's are not
        // counted), asked once per device (under the emulator, whose device changes architecture
        // in a process, every time): 1 where the query fails.
        const auto per_sm = [&](int &held) -> cudaError_t {
          static std::atomic<int> known[kMaxDevices];
          blocks_per_sm(known, [&](int &h) {
            const auto kernel = flash_forward_kernel<Enc, In, kD, true>;
            const size_t tiles = flash_fwd_bytes<Enc, In, kD>();
            cudaError_t e = allow_smem(kernel, tiles);
            return e != cudaSuccess ? e : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&h, kernel, F::kThreads, tiles);
          }, held);
          return cudaSuccess;
        };
        if ((err = num_splits_for(a, a.B * a.H * n_qt, blocks_for(a.T, F::BK), per_sm, splits)) != cudaSuccess)
          return err;
        use_hopper = splits == 1 && hopper_device() && hopper_forward_enabled();
      }
      // Unsplit with at least half of the computed tiles' rows before first_row or past T (a
      // decode step's tile: one new row of 128): the split kernel as one share.
      const bool idle_rows = a.first_row > 0 && 2 * (a.T - a.first_row) <= n_qt * F::BQ;
      rows_only = !use_hopper && (splits > 1 || idle_rows);
      static_assert(kFwdWarpRows % (16 * F::kMT) == 0, "a warp's rows (the split kernel's idle warps)");
    }
  }
  static_assert(kFwdRowAlign % kFwdWarpRows == 0, "a warp's rows within a tile");
  const int64_t q_from = rows_only && a.num_layers == 0 ? a.first_row / kFwdWarpRows * kFwdWarpRows : -1;
  if ((err = prepare<Enc, In, kD>(p, scratch, st, &a, q_from)) != cudaSuccess) return err;
  // The attention itself: the flash kernels for 16-bit inputs (wgmma on sm_90 where the build has
  // sm_90a code, mma.sync elsewhere and with value rows: flash_forward_runs), the general kernel
  // otherwise; p as the kernel read it (q', k' and the scale that go together) for the transition
  // after it.
  auto general = [&]() -> cudaError_t {
    if constexpr (!flash_forward_everywhere<Enc, In, kD>()) {
      using L = FwdSmem<In, kD>;
      constexpr size_t bytes = fwd_smem_bytes<Enc, In, kD>();
      if ((err = allow_smem(forward_kernel<Enc, In, kD>, bytes)) != cudaSuccess) return err;
      static_assert(kFwdRowAlign % L::BQ == 0, "q' from first_row's tile (prepare)");
      // Query tiles from first_row's, max_grid_y() a launch.
      Params<Enc, In> g = p;
      const int64_t n_tiles = blocks_for(a.T, L::BQ), step = max_grid_y();
      for (g.tile0 = a.first_row / L::BQ; g.tile0 < n_tiles; g.tile0 += step) {
        const dim3 grid(static_cast<unsigned>(a.B * a.H), static_cast<unsigned>(std::min(step, n_tiles - g.tile0)));
        if ((err = launch(forward_kernel<Enc, In, kD>, grid, kThreads, bytes, st, g)) != cudaSuccess) return err;
      }
      return cudaSuccess;
    } else {
      return cudaErrorNotSupported;  // not called: the flash forward runs everywhere
    }
  };
  auto attend = [&]() -> cudaError_t {
    if constexpr (flash_forward_runs<Enc, In, kD>()) {
      using F = FlashFwd<In, kD>;
      if (!flash) return general();
      float qsign;
      if ((err = positive_scale(p, scratch, st, qsign)) != cudaSuccess) return err;
      if constexpr (flash_distance<Enc>())
        if ((err = make_dist_table(p, scratch, st)) != cudaSuccess) return err;
      if constexpr (flash_rowcol<Enc>())
        if ((err = make_rowcol_table(p, scratch, st)) != cudaSuccess) return err;
      if constexpr (flash_feature_steps<Enc>()) {  // the feature tiles' distance (feat_sat_kernel)
        p.dist_sat = feature_steps_enabled() ? scratch.take<int>(a.B * a.H, err) : nullptr;  // null: none
        if (err == cudaSuccess && p.dist_sat) err = cudaMemsetAsync(p.dist_sat, 0, sizeof(int) * a.B * a.H, st);
        if (err == cudaSuccess && p.dist_sat)
          err = launch(feat_sat_kernel<Enc, In>, blocks_for(a.B * a.H * a.T, 256), 256, 0, st, p);
        if (err != cudaSuccess) return err;
      }
      const int64_t tile0 = a.first_row / F::BQ, n_qt = blocks_for(a.T, F::BQ) - tile0;
      if constexpr (value_rows<Enc>() == 0)  // (value rows: never the Hopper forward)
      if (use_hopper) {
        auto hopper = [&](auto cons) -> cudaError_t {
          constexpr int kCons = decltype(cons)::value;
          using H = HopperFwd<In, kD, kCons>;
          const auto kernel = hopper_forward_kernel<Enc, In, kD, kCons>;
          HopperMaps maps;
          const uint32_t box_q[3] = {uint32_t(H::kRowElems), uint32_t(H::BQ), 1};
          const uint32_t box_kv[3] = {uint32_t(H::kRowElems), uint32_t(H::BK), 1};
          // Slices of ld rows (Params::ld_q, ld_k, ld_v): rows T..ld - 1 lie outside the map; q'
          // holds the rows from qm_row0 (the kernel's coordinates are i - qm_row0).
          // (k' and v: the slices of their heads, B·H / k_group and B·H / v_group)
          auto map = [&](CUtensorMap *m, const void *x, int64_t ld, int64_t row0, const uint32_t *box,
                         int64_t group = 1) {
            const uint64_t dims[3] = {uint64_t(kD), uint64_t(a.T - row0), uint64_t(a.B * a.H / group)};
            const uint64_t strides[2] = {sizeof(In) * kD, sizeof(In) * kD * uint64_t(ld)};
            return make_tensor_map_16(m, x, 3, dims, strides, box, H::kSwizzle);
          };
          if ((err = map(&maps.q, p.qm, p.ld_q, p.qm_row0, box_q)) != cudaSuccess ||
              (err = map(&maps.k, p.km, p.ld_k, 0, box_kv, p.k_group)) != cudaSuccess ||
              (err = map(&maps.v, p.v, p.ld_v, 0, box_kv, p.v_group)) != cudaSuccess)
            return err;
          size_t bytes = H::bytes + hopper_fwd_feature_bytes<Enc, In, kD, kCons>(), extra = 0;
          if ((err = plan_param_cache(p, bytes, false, extra)) != cudaSuccess) return err;
          bytes += extra;
          if ((err = allow_smem(kernel, bytes)) != cudaSuccess) return err;
          static_assert(kFwdRowAlign % H::BQ == 0, "q' from first_row's tile (prepare)");
          p.tile0 = a.first_row / H::BQ;
          p.pingpong = hopper_pingpong_enabled();
          p.kv_split = hopper_kv_split_enabled();
          p.n_qt = blocks_for(a.T, H::BQ) - p.tile0;
          // A block per tile, or (APE_CUDA_PERSISTENT=1) a block per SM, each claiming tiles from
          // a zeroed counter after its first (hopper_forward_kernel).
          const int64_t tiles = a.B * a.H * p.n_qt;
          constexpr int64_t kIntMax = std::numeric_limits<int>::max();
          if (tiles > kIntMax / 2 || a.T > kIntMax - H::BQ) return cudaErrorInvalidValue;  // the kernel's ints
          p.tile_group = static_cast<int>(hopper_tile_group(a.B * a.H, a.T, kD, sizeof(In)));  // <= B·H
          int64_t blocks = tiles;
          p.sched = nullptr;
          if (hopper_persistent_enabled()) {
            int dev = 0, sms = 0;
            if ((err = cudaGetDevice(&dev)) != cudaSuccess ||
                (err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
              return err;
            if (sms > 0 && sms < tiles) {
              blocks = sms;
              p.sched = scratch.take<int>(1, err);
              if (err != cudaSuccess || (err = cudaMemsetAsync(p.sched, 0, sizeof(int), st)) != cudaSuccess)
                return err;
            }
          }
          return launch(kernel, dim3(static_cast<unsigned>(blocks)), H::kThreads, bytes, st, p, maps);
        };
        if constexpr (kD <= 64)
          if (hopper_consumers(kD) == 3) return hopper(std::integral_constant<int, 3>{});
        return hopper(std::integral_constant<int, 2>{});
      }
      size_t bytes = flash_fwd_bytes<Enc, In, kD>(), extra = 0;
      if ((err = plan_param_cache(p, bytes, false, extra)) != cudaSuccess) return err;
      bytes += extra;
      // The query tiles from tile0, max_grid_y() a launch, the last (longest rows) first.
      auto tiles = [&](auto kernel) -> cudaError_t {
        Params<Enc, In> g = p;
        const int64_t step = max_grid_y();
        for (int64_t hi = tile0 + n_qt; hi > tile0; hi = g.tile0) {
          g.tile0 = std::max(tile0, hi - step);
          const dim3 grid(static_cast<unsigned>(a.B * a.H), static_cast<unsigned>(hi - g.tile0),
                          static_cast<unsigned>(splits));
          if ((err = launch(kernel, grid, F::kThreads, bytes, st, g)) != cudaSuccess) return err;
        }
        return cudaSuccess;
      };
      // Unsplit, or the split kernel (rows_only): as one share (its warps without a row from
      // first_row compute nothing; the same bits in rows [first_row, T)) or its shares' sum.
      if (!rows_only) {
        if ((err = allow_smem(flash_forward_kernel<Enc, In, kD>, bytes)) != cudaSuccess) return err;
        return tiles(flash_forward_kernel<Enc, In, kD>);
      }
      const auto kernel = flash_forward_kernel<Enc, In, kD, true>;
      if ((err = allow_smem(kernel, bytes)) != cudaSuccess) return err;
      p.num_splits = splits, p.part_row0 = a.first_row, p.part_rows = a.T - a.first_row;
      if (splits == 1) return tiles(kernel);  // o and lse written
      if constexpr (value_rows<Enc>() == 0) {
        // The shares of rows [first_row, T), then their sum into o and lse.
        const int64_t S = a.B * a.H;
        p.part_o = scratch.take<float>(splits * S * p.part_rows * kD, err);
        if (err == cudaSuccess) p.part_lse = scratch.take<float>(splits * S * p.part_rows, err);
        if (err != cudaSuccess || (err = tiles(kernel)) != cudaSuccess) return err;
        return launch(split_combine_kernel<In>, blocks_for(S * p.part_rows * (kD / 4), 256), 256, 0, st, p.part_o,
                      p.part_lse, splits, S, p.part_rows, p.part_row0, p.o_row0, p.o_ld, int64_t(kD), p.o,
                      p.lse);
      } else {
        return cudaErrorNotSupported;  // not reached: num_splits_for is not asked with value rows
      }
    } else {
      return general();
    }
  };
  if ((err = attend()) != cudaSuccess) return err;
  if constexpr (traits::HasTransition<Enc>::value)  // an attention transition: its rows, after
    return launch_transition<Enc, In, kD>(p, a, st);
  return cudaSuccess;
}

namespace detail {
template <class Enc, class In, int kD> cudaError_t attention_backward_impl(const CudaAttnArgs &a);
}  // namespace detail

// Backward: dq, dk, dv, dfeatures, dparams from q, k, v, o, lse, dout, features, params.
// An inference-only encoding (an attention transition: no derivative) has none: it returns
// cudaErrorNotSupported and writes nothing.
template <class Enc, class In, int kD> cudaError_t attention_backward(const CudaAttnArgs &a) {
  if constexpr (traits::HasTransition<Enc>::value) {
    return cudaErrorNotSupported;
  } else {
    const cudaError_t err = detail::attention_backward_impl<Enc, In, kD>(a);
    // Only the fixed-point sums of token and param gradients set bits (none: nothing to OR).
    if constexpr (Enc::kNumTok == 0 && Enc::kNumParams == 0) {
      return err;
    } else {
      if (err != cudaSuccess || !a.status || !a.status_record) return err;
      return launch(detail::status_or_kernel<uint32_t>, 1, 1, 0, a.stream, a.status_record,
                    static_cast<const uint32_t *>(a.status));
    }
  }
}

namespace detail {
template <class Enc, class In, int kD> cudaError_t attention_backward_impl(const CudaAttnArgs &a) {
  static_assert(kD == 32 || kD == 64 || kD == 128, "head_dim 32, 64 or 128");
  cudaError_t err = check_args<Enc>(a, kD, true);
  if (err != cudaSuccess) return err;
  const cudaStream_t st = a.stream;
  const int64_t BH = a.B * a.H, T = a.T, n = BH * T * kD;
  // Param gradients are global sums: zero them even when there is nothing to sum.
  for (int k = 0; k < Enc::kNumParams; ++k) {
    const int64_t numel = Enc::param_numel(k, a.H, a.D);
    if (numel > 0 && (err = cudaMemsetAsync(a.dparams[k], 0, sizeof(float) * numel, st)) != cudaSuccess)
      return err;
  }
  if (n == 0) return cudaSuccess;  // (the pointers an empty call leaves null are not read below)
  Params<Enc, In> p = make_params<Enc, In>(a);
  Scratch scratch(st, a.scratch);
  // Grouped keys (CudaAttnArgs::kv_heads), as FlashAttention-2: every kernel reads k, k' and v of
  // the slice's key head in place (Params::k_group, v_group; prepare keeps k' per key head where
  // the group shares it, else computes it per query head: k_group 1), and writes dk and dv of
  // each query head into scratch (in In); each group's sum in head order then gives dk, dv (in
  // fp32, the sum rounded once: deterministic). Costs 2 (B, H, T, D) buffers of scratch.
  const int64_t group = p.k_group;  // (k's heads; prepare may set k_group to km's)
  In *const dk_out = p.dk, *const dv_out = p.dv;
  if (group > 1) {
    p.dk = scratch.take<In>(n, err), p.dv = scratch.take<In>(n, err);
    if (err != cudaSuccess) return err;
  }
  if ((err = prepare<Enc, In, kD>(p, scratch, st)) != cudaSuccess) return err;
  constexpr int kNumRel = traits::NumRel<Enc>::value;
  constexpr int64_t kValueRows = value_rows<Enc>();
  constexpr bool kFlash = !std::is_same_v<In, float>;
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
    if (err == cudaSuccess)  // vdrow = dO table^T
      err = launch_table_rows<In, kD>(p.dout, p.T, nullptr, p.params[Enc::kValueTable], kValueRows, p, p.vdrow, st);
  }
  if (err != cudaSuccess) return err;

  const unsigned ubh = static_cast<unsigned>(BH);
  if ((err = launch(delta_kernel<Enc, In, kD>, blocks_for(BH * T, kDeltaRows), kDeltaThreads, 0, st, p)))
    return err;
  // The flash backward: 16-bit inputs; the two-kernel backward for f32.
  if constexpr (kFlash) {
    using F = BwdLayout<Enc, In, kD, kBwdWide>;  // the wide layout; BQ is both mma.sync layouts'
    static_assert(F::BQ == BwdLayout<Enc, In, kD, kBwdNarrow>::BQ, "one query tiling for the semaphores");
    using S = BwdLayout<Enc, In, kD, kBwdWideSub>;  // the wide layout in sub-tiles (D = 128)
    static_assert(S::kSubs == 1 || flash_bwd_fallback<Enc, In, kD>(), "the device is asked for its shared memory");
    const In *qm = p.qm;  // the kernels after this one read q' and the scale as given
    float qsign;
    if ((err = positive_scale(p, scratch, st, qsign)) != cudaSuccess) return err;
    // The wide layout where the device gives a block its shared memory (flash_bwd_fallback).
    [[maybe_unused]] bool wide = true, sub_fits = true;
    if constexpr (flash_bwd_fallback<Enc, In, kD>()) {
      int optin = 0;
      if ((err = device_smem_optin(optin)) != cudaSuccess) return err;
      wide = static_cast<size_t>(optin) >= flash_bwd_bytes<Enc, F>();
      sub_fits = static_cast<size_t>(optin) >= flash_bwd_bytes<Enc, S>();
    }
    // The wgmma layout on sm_90 where the build has sm_90a code, at D 64 and 128 unless
    // APE_CUDA_WGMMA_BACKWARD=0 (hopper_backward_enabled).
    const bool wg = kD >= 64 && hopper_device() && hopper_backward_enabled(kD);
    // The wide layout in sub-tiles (steps of 64 queries at D = 128) in the wide one's place where
    // it is asked for (bwd_subtiles_enabled) and the device gives a block its shared memory.
    const bool sub = S::kSubs > 1 && !wg && wide && sub_fits && bwd_subtiles_enabled();
    // The wide layout with dQ' by TMA reductions in its place where it is asked for (dq_tma_enabled)
    // on sm_90 (hopper_device), at D 64 and 128.
    const bool tma = kD >= 64 && !wg && !sub && wide && hopper_device() && dq_tma_enabled();
    // FlashAttention-2's tiling (kBwdSquare) in the others' place where it is asked for
    // (bwd_square_enabled), applies (flash_bwd_square) and the device gives a block its shared
    // memory, but under the wgmma layout; with its dQ' by TMA reductions (kBwdSquareTma) where
    // those are asked for too (dq_tma_enabled) on sm_90.
    [[maybe_unused]] bool square = false, square_tma = false;
    if constexpr (flash_bwd_square<Enc, In, kD>()) {
      if (!wg && bwd_square_enabled()) {
        int optin = 0;
        if ((err = device_smem_optin(optin)) != cudaSuccess) return err;
        using Q = BwdLayout<Enc, In, kD, kBwdSquare>;
        using QT = BwdLayout<Enc, In, kD, kBwdSquareTma>;
        square = static_cast<size_t>(optin) >= flash_bwd_bytes<Enc, Q>();
        square_tma = square && hopper_device() && dq_tma_enabled() &&
                     static_cast<size_t>(optin) >= flash_bwd_bytes<Enc, QT>();
      }
    }
    int bq = sub ? S::BQ : F::BQ;  // the queries per step of the layout that runs (its semaphores)
    if constexpr (kD >= 64) {
      if (wg) bq = BwdLayout<Enc, In, kD, kBwdWgmma>::BQ;
      if (tma) bq = BwdLayout<Enc, In, kD, kBwdWideTma>::BQ;
    }
    if constexpr (flash_bwd_square<Enc, In, kD>()) {
      static_assert(BwdLayout<Enc, In, kD, kBwdSquare>::BQ == BwdLayout<Enc, In, kD, kBwdSquareTma>::BQ,
                    "one query tiling for both square layouts");
      if (square) bq = BwdLayout<Enc, In, kD, kBwdSquare>::BQ;
    }
    const int64_t n_qt = (T + bq - 1) / bq;
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
    if constexpr (flash_feature_steps<Enc>()) {  // the feature steps' distance (feat_sat_kernel)
      p.dist_sat = feature_steps_enabled() ? scratch.take<int>(BH, err) : nullptr;  // null: none
      if (err == cudaSuccess && p.dist_sat) err = cudaMemsetAsync(p.dist_sat, 0, sizeof(int) * BH, st);
      if (err == cudaSuccess && p.dist_sat)
        err = launch(feat_sat_kernel<Enc, In>, blocks_for(BH * T, 256), 256, 0, st, p);
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
    // In order (deterministic), key tile 0 writes dq where dq = dQ' and dq_direct_enabled; else
    // (and in any order, where every block reduces into a zeroed dQ') the conversion pass below
    // writes dq.
    p.dq_ordered = a.deterministic;
    direct_q = flash_dq_direct<Enc>() && qsign == 1.f && p.dq_ordered && dq_direct_enabled(wg);
    p.dq_direct = direct_q;
    p.sm90 = device_major() >= 9;  // ptx::sm90_code
    if (err == cudaSuccess) err = cudaMemsetAsync(p.dq_sem, 0, sizeof(int) * BH * n_qt, st);
    if (err == cudaSuccess && !p.dq_ordered) err = cudaMemsetAsync(p.dqm, 0, sizeof(float) * n, st);
    if (err != cudaSuccess) return err;
    // 1-D, slice-major (flash_backward_kernel): B H ceil(T / BK) blocks.
    auto run = [&](auto layout) -> cudaError_t {
      constexpr int kLayout = decltype(layout)::value;
      using L = BwdLayout<Enc, In, kD, kLayout>;
      size_t bytes = flash_bwd_bytes<Enc, L>(), extra = 0;
      const int64_t blocks = BH * blocks_for(T, L::BK);
      if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
      cudaError_t e = plan_param_cache(p, bytes, true, extra);
      if (e != cudaSuccess) return e;
      bytes += extra;
      // The wgmma layout's Q' and dO tiles come by TMA (boxes of BQ rows as its buffers hold them),
      // and its dQ' tiles (kBwdWideTma's too) go by TMA reductions (boxes of 32 fp32 columns and BQ
      // rows, as sDQ holds them).
      BwdMaps maps{};
      if constexpr (L::kDqTma) {
        const uint64_t dims[3] = {uint64_t(kD), uint64_t(T), uint64_t(BH)};
        if (T > 0x7fffffff - L::BQ || BH > 0x7fffffff) return cudaErrorInvalidValue;  // TMA's int coordinates
        cudaError_t m = cudaSuccess;
        if constexpr (L::kWgmma) {
          constexpr int kRowElems = hopper::swizzle_bytes<kD>() / 2;
          const uint64_t strides[2] = {sizeof(In) * kD, sizeof(In) * kD * uint64_t(T)};
          const uint32_t box[3] = {uint32_t(kRowElems), uint32_t(L::BQ), 1};
          m = make_tensor_map_16(&maps.q, p.qm, 3, dims, strides, box, hopper::swizzle_bytes<kD>());
          if (m == cudaSuccess) m = make_tensor_map_16(&maps.dout, p.dout, 3, dims, strides, box, hopper::swizzle_bytes<kD>());
        }
        const uint64_t dq_strides[2] = {sizeof(float) * kD, sizeof(float) * kD * uint64_t(T)};
        const uint32_t dq_box[3] = {32, uint32_t(L::BQ), 1};
        if (m == cudaSuccess) m = make_tensor_map(&maps.dq, 4, p.dqm, 3, dims, dq_strides, dq_box, 128);
        if (m != cudaSuccess) return m;
      }
      auto go = [&](auto kernel) {
        const cudaError_t x = allow_smem(kernel, bytes);
        return x != cudaSuccess ? x : launch(kernel, static_cast<unsigned>(blocks), L::kBlockThreads, bytes, st, p, maps);
      };
      // dQ' in any order: the 128-key mma.sync layouts' kernels without the order's fence
      // (kOrdered).
      if constexpr (kLayout == kBwdWide || kLayout == kBwdWideSub || kLayout == kBwdSquare)
        if (!p.dq_ordered) return go(flash_backward_kernel<Enc, In, kD, false, kLayout>);
      return go(flash_backward_kernel<Enc, In, kD, true, kLayout>);
    };
    using Narrow = std::integral_constant<int, kBwdNarrow>;
    using Wide = std::integral_constant<int, kBwdWide>;
    if constexpr (kD >= 64) {
      if (wg) err = run(std::integral_constant<int, kBwdWgmma>{});
      else if (square) {
        if constexpr (flash_bwd_square<Enc, In, kD>())
          err = square_tma ? run(std::integral_constant<int, kBwdSquareTma>{})
                           : run(std::integral_constant<int, kBwdSquare>{});
      } else if (sub) {
        if constexpr (S::kSubs > 1) err = run(std::integral_constant<int, kBwdWideSub>{});
      } else if (tma) err = run(std::integral_constant<int, kBwdWideTma>{});
      else if constexpr (flash_bwd_fallback<Enc, In, kD>()) err = wide ? run(Wide{}) : run(Narrow{});
      else err = run(Wide{});
    } else {
      err = run(Wide{});
    }
    if (err != cudaSuccess) return err;
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
    // Key tiles, then query tiles, max_grid_y() a launch (Params::tile0).
    auto tiles = [&](auto kernel, int64_t n_tiles, size_t bytes) -> cudaError_t {
      Params<Enc, In> g = p;
      const int64_t step = max_grid_y();
      cudaError_t e = cudaSuccess;
      for (g.tile0 = 0; g.tile0 < n_tiles && e == cudaSuccess; g.tile0 += step)
        e = launch(kernel, dim3(ubh, static_cast<unsigned>(std::min(step, n_tiles - g.tile0))), kThreads, bytes,
                   st, g);
      return e;
    };
    if ((err = allow_smem(dkdv_kernel<Enc, In, kD>, L::bytes_dkdv)) ||
        (err = allow_smem(dq_kernel<Enc, In, kD>, L::bytes_dq)) ||
        (err = tiles(dkdv_kernel<Enc, In, kD>, blocks_for(T, L::BK), L::bytes_dkdv)) ||
        (err = tiles(dq_kernel<Enc, In, kD>, blocks_for(T, L::BQ), L::bytes_dq)))
      return err;
  }
  // A side with relative rows and no mod: the last of its rows' products writes dq (dk) itself.
  constexpr bool kDqFromRows = !Enc::kHasQMod && rel_rows_on<Enc>(0);
  constexpr bool kDkFromRows = !Enc::kHasKMod && rel_rows_on<Enc>(1);
  if constexpr (kNumRel > 0) {
    for (int r = 0; r < kNumRel; ++r) {  // the relative rows' gradients into dq', dk'
      const int64_t m = BH * T * Enc::rel_rows(r);
      const int side = Enc::rel_side(r);
      bool last = true;  // of its side
      for (int r2 = r + 1; r2 < kNumRel; ++r2) last = last && Enc::rel_side(r2) != side;
      float *acc = side == 0 ? p.dqm : p.dkm;
      const dim3 grid = slice_blocks(blocks_for(T, kTabTok), BH);
      const float *g = p.drel[r], *table = p.params[Enc::rel_table(r)];
      if ((err = launch(fixed_to_float_kernel<>, blocks_for(m, 256), 256, 0, st,
                        static_cast<const unsigned long long *>(p.drel_fx[r]), p.drel[r], m,
                        static_cast<const uint32_t *>(p.status))))
        return err;
      if (last && (side == 0 ? kDqFromRows : kDkFromRows))
        err = launch(table_dx_kernel<kD, In>, grid, kTabThreads, 0, st, g, table, Enc::rel_rows(r), a.H, T,
                     static_cast<const float *>(acc), side == 0 ? p.dq : p.dk, BH);
      else
        err = launch(table_dx_kernel<kD, float>, grid, kTabThreads, 0, st, g, table, Enc::rel_rows(r), a.H, T,
                     static_cast<const float *>(acc), acc, BH);
      if (err != cudaSuccess) return err;
    }
  }
  // dq, dk from dQ', dK' (mod_backward_kernel), where neither the flash backward nor the relative
  // rows' products wrote them.
  const unsigned mod_blocks = blocks_for(n / run_len<In>(), 256);
  auto mod_back = [&](auto is_q, const In *x, const float *gm, In *dx) -> cudaError_t {
    constexpr bool kIsQ = decltype(is_q)::value;
    constexpr bool kHasMod = kIsQ ? Enc::kHasQMod : Enc::kHasKMod;
    constexpr unsigned kModParams = kIsQ ? traits::QModParams<Enc>::value : traits::KModParams<Enc>::value;
    const int64_t x_group = kIsQ ? int64_t(1) : group;
    if constexpr (linear_mod<Enc, kIsQ>()) {
      return launch(mod_backward_linear_kernel<Enc, In, kIsQ, kD>, linear_mod_grid<In>(p, kD), 256, 0, st, p, gm,
                    dx);
    } else if constexpr (kHasMod && Enc::kNumParams > 0) {
      // A mod whose gradient adds to parameters, with their gradients asked for: the sums over
      // rows in registers (mod_backward_params_kernel).
      bool sums = false;  // (APE_CUDA_MOD_PARAM_SUMS=0: mod_backward_kernel)
      for (int m = 0; m < Enc::kNumParams; ++m)  // (a mask of 32 bits: params past it may be read)
        sums = sums || ((m >= 32 || (kModParams >> m & 1u)) && p.dparam_fx[m]);
      if (sums && mod_param_sums_enabled()) {
        const int64_t blocks = BH * mod_params_blocks_per_slice<kD>(T);
        return launch(mod_backward_params_kernel<Enc, In, kIsQ, kD>, blocks_for(blocks, 1),
                      mod_params_threads<kD>(), 0, st, p, x, gm, dx, x_group);
      }
    }
    return launch(mod_backward_kernel<Enc, In, kIsQ, kD>, mod_blocks, 256, 0, st, p, x, gm, dx, x_group);
  };
  if (!direct_q && !kDqFromRows && (err = mod_back(std::true_type{}, p.q, p.dqm, p.dq))) return err;
  if constexpr (!kDirectK && !kDkFromRows)
    if ((err = mod_back(std::false_type{}, p.k, p.dkm, p.dk))) return err;
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
  // Tables of relative rows and value rows: their gradients, added in fixed point to what the
  // sinks summed (table_grad_kernel), before the parameters' gradients are converted.
  const dim3 tab_grid(blocks_for(a.B * T, kTabGradTok), 0, static_cast<unsigned>(std::min<int64_t>(a.H, max_grid_y())));
  auto table_grad = [&](const float *g, const In *x, int bias, int table, int64_t rows, bool table_trains,
                        bool bias_trains, int64_t x_group = 1) -> cudaError_t {
    if (!table_trains && !bias_trains) return cudaSuccess;
    dim3 grid = tab_grid;
    grid.y = static_cast<unsigned>(std::min<int64_t>(blocks_for(rows, kTabRows), max_grid_y()));
    return launch(table_grad_kernel<In, kD>, grid, kTabThreads, 0, st, g, x,
                  bias >= 0 ? static_cast<const float *>(p.params[bias]) : nullptr,
                  static_cast<const float *>(p.params[table]), rows, a.B, a.H, T,
                  table_trains ? p.dparam_fx[table] : nullptr, bias >= 0 && bias_trains ? p.dparam_fx[bias] : nullptr,
                  p.status, x_group);
  };
  if constexpr (kNumRel > 0) {
    for (int r = 0; r < kNumRel; ++r)
      if ((err = table_grad(p.drel[r], Enc::rel_side(r) == 0 ? p.qm : p.km, Enc::rel_bias(r), Enc::rel_table(r),
                            Enc::rel_rows(r), Enc::rel_table_trainable(r) > 0,
                            Enc::rel_bias(r) >= 0 && Enc::rel_bias_trainable(r) > 0,
                            Enc::rel_side(r) == 0 ? 1 : p.k_group)))
        return err;
  }
  if constexpr (kValueRows > 0) {
    const int64_t m = BH * T * kValueRows;
    if (Enc::kValueTableTrainable &&
        ((err = launch(fixed_to_float_kernel<>, blocks_for(m, 256), 256, 0, st,
                       static_cast<const unsigned long long *>(p.vmass_fx), p.vmass, m,
                       static_cast<const uint32_t *>(p.status))) ||
         (err = table_grad(p.vmass, p.dout, -1, Enc::kValueTable, kValueRows, true, false))))
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
  if (group > 1) {  // each group's dk and dv: the sum of its query heads' (fp32, in head order)
    const int64_t slice = T * kD, kv_n = n / group;
    constexpr int64_t kV = 16 / sizeof(In);
    if ((err = launch(group_sum_kernel<In>, blocks_for(kv_n / kV, 256), 256, 0, st, static_cast<const In *>(p.dk),
                      dk_out, group, slice, kv_n)) != cudaSuccess)
      return err;
    return launch(group_sum_kernel<In>, blocks_for(kv_n / kV, 256), 256, 0, st, static_cast<const In *>(p.dv),
                  dv_out, group, slice, kv_n);
  }
  return cudaSuccess;
}
}  // namespace detail

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
