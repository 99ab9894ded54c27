// CUDA KV-cache decoding for generated positional encodings (docs/decoding.md).
//
// The CUDA sibling of cpu/decode.h, driving the same generated kernels as the full forward
// (cuda/attention.cuh, through CudaKernelEntry): a step appends n new tokens (their raw k, v and
// token features, on the device; their q is read, not kept) to a cache of L0 tokens and returns the attention outputs
// of the n new queries over all L = L0 + n keys. A prefill is the first step (L0 = 0).
// Contract, as on the CPU: the outputs of a step equal rows L0 .. L - 1 of the full forward over
// the L tokens so far, bit for bit (they are that forward's rows: the same kernels over the same
// inputs, with the query tiles before the one holding row L0 skipped, CudaAttnArgs::first_row),
// where the step runs unsplit (num_splits 1). By default a step whose query tiles alone leave the
// device's SMs idle (a one-token step: one tile a slice) splits each tile's keys over several
// blocks and adds their shares (CudaAttnArgs::num_splits, FlashDecoding): its rows then equal the
// full forward's within the 16-bit rounding of P and o (another order of the same sums), the same
// run to run. A one-token step of grouped keys (kv_heads) whose scores are scale q'·k' alone
// (NoPE, RoPE, xPos) packs each group's query heads into one block unless num_splits is 1
// (cuda/packed_decode.cuh): P in fp32, its rows within half an ulp of the dtype of the reference.
//
// How: the cache holds every token's raw k and v in buffers of `capacity` rows per slice, (B, H,
// capacity, D), allocated at the first step; a step copies its n new rows into place and runs the
// forward with T = L, first_row = L0 and CudaAttnArgs::ld = capacity, which reads the buffers in
// place. It keeps no q: the forward reads q from L0 rounded down to kQueryWindow (384) only, and
// those rows before L0 make only outputs the step does not keep, so the step passes its own q
// (CudaAttnArgs::q_row0 = L0) where L0 is such a multiple and q is 16-byte aligned, else a window
// of those rows in scratch, zeros before L0. Where the encoding's k mod does not depend on the length (CudaKernelEntry::caches_k_mod)
// the cache keeps k' too (CudaAttnArgs::km), and likewise the key side's relative rows
// (CudaKernelEntry::key_rel_floats, CudaAttnArgs::krel) and, where the token program does not read
// the length, its sequences and scan carries (tok_seqs, CudaAttnArgs::tok: a step reruns it from
// its first new token's chunk of 256): a step computes the new keys' only, and q' of the
// rows from the first computed query tile only (from a multiple of 384 rows, kFwdRowAlign; from
// the new rows' first warp, a multiple of 32, where the FlashAttention-2-class kernel computes
// only the warps holding new rows: kFwdWarpRows). So a
// one-token step moves O(L·D) bytes once: the keys and values the attention reads (the re-packing
// of every array and the q/k mods over all L tokens that an earlier version ran each step moved
// some six times that). The token features are kept at the capacity too (CudaAttnArgs::feat_ld):
// a step copies its new ones into place.
// Grouped-query attention (CudaDecodeArgs::kv_heads): k and v of kv_heads heads, kept so (and k'
// per key head where the encoding shares it over a group, CudaKernelEntry::shares_k_mod, else per
// query head): the forward reads them in place (CudaAttnArgs::kv_heads).
// Arguments the forward would refuse (a missing param or feature, a scale that is not finite, a
// layer out of range) are refused before the cache changes.
//
// Plain C++17 over the CUDA runtime API (the host compiler builds it, as cuda/kernel_entry.h);
// under -DAPE_SIMT the same code runs on the SIMT emulator. Errors are returned, never thrown.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "ape/contract/value_rules.h"
#include "ape/cuda/kernel_entry.h"

namespace ape::cuda {
APE_CUDA_ABI_BEGIN

inline size_t dtype_bytes(DType t) { return t == DType::F32 ? 4 : 2; }

// The cache of one attention layer (device memory owned by it; free it with release()).
struct CudaDecodeCache {
  int64_t capacity = 0;           // tokens it may hold; set before the first step
  int64_t len = 0;                // tokens cached
  int64_t B = 0, H = 0, D = 0;    // fixed by the first step
  int64_t KV = 0;                 // key heads, fixed by the first step (H: not grouped)
  DType dtype = DType::BF16;
  void *k = nullptr, *v = nullptr;  // (B, KV, capacity, D) raw projections, rows [0, len) (q: none
                                    // kept; a step reads its own, CudaAttnArgs::q_row0)
  void *km = nullptr;       // (B, KV or H, capacity, D) k' (CudaKernelEntry::caches_k_mod; KV
                            // heads where the encoding shares_k_mod), or null
  float *krel = nullptr;    // the key side's relative rows, B H capacity key_rel_floats floats
                            // (CudaAttnArgs::krel), or null
  float *tok = nullptr;     // the token program's sequences, (B, H, tok_seqs, capacity)
                            // (CudaAttnArgs::tok), or null
  double *tok_carry = nullptr;  // its scans' running sums, (B, H, tok_seqs, 2)
  int64_t km_len = 0;       // rows of km, krel and tok computed (a prefill with a transition
                            // computes none)
  int64_t rows = 0;         // rows per slice of the buffers: the capacity at the first step
  std::vector<float *> features;                  // Enc::kNumFeatures x (B, H, capacity), rows [0, len)
  // The stream of the first step: the buffers were allocated there (cudaMallocAsync), a step on
  // another stream is ordered after the work queued here and this stream after it (events), and
  // release() frees them here (cudaFreeAsync), after every step queued so far. Release the cache
  // before destroying that stream.
  cudaStream_t stream = nullptr;
  bool started() const { return B > 0; }
  void release() {
    for (void *x : {k, v, km, static_cast<void *>(krel), static_cast<void *>(tok), static_cast<void *>(tok_carry)})
      if (x) cudaFreeAsync(x, stream);
    for (float *f : features)
      if (f) cudaFreeAsync(f, stream);
    k = v = km = nullptr, krel = tok = nullptr, tok_carry = nullptr;
    features.clear(), len = km_len = rows = 0, B = H = D = KV = 0, stream = nullptr;
  }
  ~CudaDecodeCache() { release(); }
  CudaDecodeCache() = default;
  CudaDecodeCache(const CudaDecodeCache &) = delete;
  CudaDecodeCache &operator=(const CudaDecodeCache &) = delete;
};

// One step: n new tokens of every (b, h) slice; device pointers as in CudaAttnArgs.
struct CudaDecodeArgs {
  int64_t B = 0, H = 0, n = 0, D = 0;
  DType dtype = DType::BF16;
  const void *q = nullptr, *k = nullptr, *v = nullptr;  // q (B, H, n, D), k and v (B, kv_heads, n, D), contiguous
  const float *const *features = nullptr;  // HOST array of Enc::kNumFeatures device (B, H, n)
  const float *const *params = nullptr;    // HOST array of device params, as CudaAttnArgs (the
                                           // same every step: a cached k' is computed from them)
  float scale = 0;                          // kappa
  void *o = nullptr;                        // (B, H, n, D), overlapping none of q, k, v
  float *lse = nullptr;                     // (B, H, n) or null (4-byte aligned)
  // The layer (0-based) of a model of num_layers, as CudaAttnArgs: an attention transition
  // transforms the prompt only, i.e. the prefill (the first step), at T = n; later steps attend
  // as usual (cpu/decode.h likewise).
  int64_t layer = 0, num_layers = 0;
  // The keys of the step's query tiles split over up to this many blocks: CudaAttnArgs::num_splits
  // (0, the default: the device decides; 1: never, the full forward's rows bit for bit).
  int num_splits = 0;
  // A stream of the current device (CudaAttnArgs::stream), the cache's device: make it current
  // before each step.
  cudaStream_t stream = nullptr;
  // The step's scratch memory (the forward's, sized by the step's rows; o through it only where o is
  // not 16-byte aligned, lse where lse is null, q's window of at most 383 + n rows where L0 is not a
  // multiple of 384 or q is not 16-byte aligned; CudaAttnArgs::scratch; nullptr: cudaMallocAsync).
  // The cache's own buffers come from cudaMallocAsync on the first step's stream
  // (CudaDecodeCache::stream; release() frees them there).
  const CudaScratchAllocator *scratch = nullptr;
  // Heads of k and v: 0 = H; else a divisor of H (grouped-query attention, CudaAttnArgs::kv_heads).
  int64_t kv_heads = 0;
};

namespace decode_detail {

// dst (S, rows_dst, W) <- src (S, rows_src, W) rows [0, rows) of every slice, to dst rows
// [row0, row0 + rows); W bytes per row. One 2-D copy for the S slices (a copy per slice costs a
// runtime call each: 16 per array and step at B 1, H 16); a copy per slice only where a slice's
// pitch exceeds what a 2-D copy takes (max_pitch: the test's way to reach that branch).
constexpr size_t kMaxPitch = (size_t(1) << 31) - 1;  // cudaDevAttrMaxPitch on current GPUs
inline cudaError_t copy_rows(void *dst, int64_t rows_dst, int64_t row0, const void *src,
                             int64_t rows_src, int64_t rows, int64_t S, size_t W,
                             cudaStream_t st, size_t max_pitch = kMaxPitch) {
  if (rows == 0 || S == 0) return cudaSuccess;
  char *d = static_cast<char *>(dst) + row0 * W;
  const char *s = static_cast<const char *>(src);
  const size_t dpitch = rows_dst * W, spitch = rows_src * W, width = rows * W;
  if (S == 1) return cudaMemcpyAsync(d, s, width, cudaMemcpyDeviceToDevice, st);
  if (dpitch <= max_pitch && spitch <= max_pitch)
    return cudaMemcpy2DAsync(d, dpitch, s, spitch, width, static_cast<size_t>(S), cudaMemcpyDeviceToDevice, st);
  for (int64_t x = 0; x < S; ++x) {
    const cudaError_t err = cudaMemcpyAsync(d + x * dpitch, s + x * spitch, width, cudaMemcpyDeviceToDevice, st);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// `later`'s work from now on runs after the work queued on `earlier` so far (nothing where they
// are one stream).
// Inside a CUDA graph capture (either stream capturing, or the query refused) nothing is ordered:
// an event recorded outside a capture cannot be waited on inside it, nor one inside waited on
// outside (the capture would fail); the caller orders the streams of a captured step itself.
inline bool stream_capturing(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}
inline cudaError_t order_after(cudaStream_t earlier, cudaStream_t later) {
  if (earlier == later || stream_capturing(earlier) || stream_capturing(later)) return cudaSuccess;
  cudaEvent_t ev = nullptr;
  cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (err != cudaSuccess) return err;
  if ((err = cudaEventRecord(ev, earlier)) == cudaSuccess) err = cudaStreamWaitEvent(later, ev, 0);
  cudaEventDestroy(ev);  // (released once the wait has it)
  return err;
}

// A failed allocation leaves its error as the thread's last one, which the next launch would
// report as its own (platform.cuh, launch): cleared, once returned here.
inline cudaError_t malloc_async(void **ptr, size_t bytes, cudaStream_t st) {
  const cudaError_t err = cudaMallocAsync(ptr, bytes, st);
  if (err != cudaSuccess) (void)cudaGetLastError();
  return err;
}

// Why the forward would refuse the step's arguments (refused before the cache changes): params
// and features present, a finite scale, the layer, the sizes; nullptr where they pass.
inline const char *step_args_problem(const CudaKernelEntry &e, const CudaDecodeArgs &a, bool prefill) {
  constexpr int64_t kMaxDim = int64_t(1) << 31;
  if (a.B >= kMaxDim || a.H >= kMaxDim || a.n >= kMaxDim || a.D >= kMaxDim) return "B, H, n or D is 2^31 or more";
  if (a.B * a.H >= kMaxDim) return "B·H is 2^31 slices or more";
  if (!::ape_rules::check_call_scale(a.scale).empty()) return "scale is not finite, nor 0 or at least 2^-64 in magnitude";
  if (a.num_layers < 0 || (a.num_layers > 0 && (a.layer < 0 || a.layer >= a.num_layers)))
    return "layer is not in [0, num_layers)";
  if (e.num_features > 0 && !a.features) return "features is null";
  for (int f = 0; f < e.num_features; ++f)
    if (!a.features[f]) return "a features pointer is null";
  if (e.num_params > 0 && !a.params) return "params is null";
  for (int n = 0; n < e.num_params; ++n)
    if (!a.params[n] && (!e.param_numel || e.param_numel(n, a.H, a.D) > 0)) return "a params pointer is null";
  // A prefill that may run an attention transition hands the step's own q, k, v to the forward,
  // which moves rows in 16-byte chunks.
  auto aligned = [](const void *x) { return reinterpret_cast<uintptr_t>(x) % 16 == 0; };
  if (prefill && a.num_layers > 0 && (!aligned(a.q) || !aligned(a.k) || !aligned(a.v)))
    return "a prefill with num_layers > 0 needs q, k and v 16-byte aligned";
  // The forward writes lse's floats in place (o goes through scratch where it is not aligned).
  if (reinterpret_cast<uintptr_t>(a.lse) % alignof(float) != 0) return "lse is not 4-byte aligned";
  return nullptr;
}

}  // namespace decode_detail

// In words, why decode_step(e, c, a) would return cudaErrorInvalidValue before changing the cache,
// or nullptr where the step's arguments pass (the step may still fail: memory, a launch).
inline const char *decode_refusal(const CudaKernelEntry &e, const CudaDecodeCache &c, const CudaDecodeArgs &a) {
  if (a.B < 1 || a.H < 1 || a.D < 1 || a.n < 1) return "B, H, D and n must be at least 1";
  if (!::ape_rules::kv_heads_fit(a.kv_heads, a.H)) return ::ape_rules::kKvHeadsRule;
  const int64_t KV = a.kv_heads > 0 ? a.kv_heads : a.H;
  if (!a.q || !a.k || !a.v || !a.o) return "q, k, v or o is null";
  if (const char *why = decode_detail::step_args_problem(e, a, c.len == 0)) return why;
  if (!find_variant(e, a.dtype, a.D)) return "this build has no variant of that dtype and head dim (D)";
  if (c.capacity < 1) return "the cache has no capacity";
  if (c.capacity >= (int64_t(1) << 31)) return "the cache's capacity is 2^31 tokens or more";
  if (c.len + a.n > c.capacity) return "the step's tokens pass the cache's capacity";
  if (c.started() && (a.B != c.B || a.H != c.H || KV != c.KV || a.D != c.D || a.dtype != c.dtype))
    return "B, H, kv_heads, D or the dtype differs from the cache's first step";
  if (a.scratch && (!a.scratch->alloc || !a.scratch->free)) return "the scratch allocator lacks alloc or free";
  if (a.num_splits < 0) return "num_splits is negative";
  if (c.started() && c.len + a.n > c.rows) return "the cache's capacity was raised after its first step";
  if (!c.started()) {  // its buffers' sizes
    const int64_t S = a.B * a.H, C = c.capacity;
    const int64_t row = a.D * static_cast<int64_t>(dtype_bytes(a.dtype));
    if (S > INT64_MAX / C || S * C > INT64_MAX / row) return "the cache's size overflows int64";
    const int64_t per_token = e.key_rel_floats + e.tok_seqs;  // floats a token of krel and tok
    if (per_token > 0 && S * C > INT64_MAX / (per_token * int64_t(sizeof(float))))
      return "the cache's size overflows int64";
  }
  return nullptr;
}

// Appends a.n tokens to `c` and writes their attention outputs (see the top of this file).
// cudaErrorInvalidValue for shapes that do not match the cache, a step past its capacity, a
// missing pointer or param, a scale that is not finite, a layer out of range, or a (dtype, head
// dim) this build did not instantiate (decode_refusal says which): the cache is then unchanged. After an error of the runtime
// itself (an allocation, a copy, a launch) the cache still holds its L0 tokens (the step's rows
// past them are rewritten by the next step; the kept rows and scan sums are recomputed where they
// belong to it): the step may be retried, or the cache release()d.
inline cudaError_t decode_step(const CudaKernelEntry &e, CudaDecodeCache &c, const CudaDecodeArgs &a) {
  using namespace decode_detail;
  if (decode_refusal(e, c, a)) return cudaErrorInvalidValue;
  const cudaStream_t st = a.stream;
  const int64_t S = a.B * a.H, L0 = c.len, n = a.n, L = L0 + n, D = a.D;
  const int64_t KV = a.kv_heads > 0 ? a.kv_heads : a.H, Skv = a.B * KV;  // k and v's slices
  const int64_t C = c.started() ? c.rows : c.capacity;
  const size_t row = static_cast<size_t>(D) * dtype_bytes(a.dtype);
  cudaError_t err = cudaSuccess;
  if (c.started() && (err = order_after(c.stream, st)) != cudaSuccess) return err;
  // Whatever the step queued on st before an error: the cache's stream after it (release()).
  struct OrderBack {
    CudaDecodeCache &c;
    cudaStream_t st;
    bool done = false;
    ~OrderBack() {
      if (!done && c.started()) order_after(st, c.stream);
    }
  } back{c, st};
  if (!c.started()) {  // the buffers, once
    const size_t bytes = static_cast<size_t>(Skv * C) * row;  // (sizes checked: decode_refusal)
    const size_t km_bytes = static_cast<size_t>((e.shares_k_mod ? Skv : S) * C) * row;
    const size_t rel_bytes = static_cast<size_t>(S * C * e.key_rel_floats) * sizeof(float);
    const size_t tok_bytes = static_cast<size_t>(S * C * e.tok_seqs) * sizeof(float);
    const size_t carry_bytes = static_cast<size_t>(S * e.tok_seqs) * 2 * sizeof(double);
    const size_t feat_bytes = static_cast<size_t>(S * C) * sizeof(float);
    void *krel = nullptr, *tok = nullptr, *carry = nullptr;
    std::vector<void *> feats(static_cast<size_t>(e.num_features), nullptr);
    std::vector<std::pair<void **, size_t>> bufs = {{&c.k, bytes}, {&c.v, bytes},
                                                    {e.caches_k_mod ? &c.km : nullptr, km_bytes},
                                                    {rel_bytes > 0 ? &krel : nullptr, rel_bytes},
                                                    {tok_bytes > 0 ? &tok : nullptr, tok_bytes},
                                                    {tok_bytes > 0 ? &carry : nullptr, carry_bytes}};
    for (void *&f : feats) bufs.push_back({&f, feat_bytes});
    auto keep = [&] {
      c.krel = static_cast<float *>(krel), c.tok = static_cast<float *>(tok);
      c.tok_carry = static_cast<double *>(carry);
      c.features.clear();
      for (void *f : feats) c.features.push_back(static_cast<float *>(f));
    };
    c.stream = st;
    for (const auto &[buf, size] : bufs)
      if (buf && ((err = malloc_async(buf, size, st)) != cudaSuccess ||
                  (err = cudaMemsetAsync(*buf, 0, size, st)) != cudaSuccess)) {  // no unwritten row is ever read
        keep();
        c.release();
        return err;
      }
    keep();
    c.B = a.B, c.H = a.H, c.KV = KV, c.D = D, c.dtype = a.dtype, c.rows = C;
  }
  // The new rows into place.
  if ((err = copy_rows(c.k, C, L0, a.k, n, n, Skv, row, st)) != cudaSuccess ||
      (err = copy_rows(c.v, C, L0, a.v, n, n, Skv, row, st)) != cudaSuccess)
    return err;
  for (int f = 0; f < e.num_features; ++f)
    if ((err = copy_rows(c.features[f], C, L0, a.features[f], n, n, S, sizeof(float), st)) != cudaSuccess)
      return err;
  // The forward over the L tokens from row L0: its rows [L0, L) straight into the caller's
  // (S, n, .) outputs (CudaAttnArgs::o_from_first; a prefill's n is L), through scratch only where
  // o is not 16-byte aligned (the kernels' vector stores) or lse is not wanted; the scratch comes
  // from the caller's allocator where it gave one. A step's memory is its new rows', not the
  // sequence's.
  auto take = [&](void *&ptr, size_t bytes) -> cudaError_t {
    if (!a.scratch) return malloc_async(&ptr, bytes, st);
    ptr = a.scratch->alloc(a.scratch->ctx, bytes, st);
    return ptr ? cudaSuccess : cudaErrorMemoryAllocation;
  };
  auto give = [&](void *ptr) {
    if (!ptr) return;
    if (a.scratch) a.scratch->free(a.scratch->ctx, ptr, st);
    else cudaFreeAsync(ptr, st);
  };
  const bool o_direct = reinterpret_cast<uintptr_t>(a.o) % 16 == 0;
  // q: the forward reads rows [q0, L), q0 = L0 rounded down to kQueryWindow (CudaAttnArgs::q_row0):
  // the step's own rows where they are all of it and aligned, else a window in scratch, zeros
  // before L0 (those rows make only outputs before L0, which are not kept) and the step's rows.
  const int64_t q0 = L0 / kQueryWindow * kQueryWindow;
  const bool q_direct = q0 == L0 && reinterpret_cast<uintptr_t>(a.q) % 16 == 0;
  void *o_tmp = nullptr, *lse_tmp = nullptr, *q_tmp = nullptr;
  auto give_all = [&] {
    give(o_tmp);
    give(lse_tmp);
    give(q_tmp);
  };
  if ((!o_direct && (err = take(o_tmp, static_cast<size_t>(S * n) * row)) != cudaSuccess) ||
      (!a.lse && (err = take(lse_tmp, static_cast<size_t>(S * n) * sizeof(float))) != cudaSuccess) ||
      (!q_direct && ((err = take(q_tmp, static_cast<size_t>(S * (L - q0)) * row)) != cudaSuccess ||
                     (L0 > q0 && (err = cudaMemsetAsync(q_tmp, 0, static_cast<size_t>(S * (L - q0)) * row, st)) !=
                                     cudaSuccess) ||
                     (err = copy_rows(q_tmp, L - q0, L0 - q0, a.q, n, n, S, row, st)) != cudaSuccess))) {
    give_all();
    return err;
  }
  CudaAttnArgs f;
  f.B = a.B, f.H = a.H, f.T = L, f.D = D, f.dtype = a.dtype, f.kv_heads = KV == a.H ? 0 : KV;
  f.o = o_direct ? a.o : o_tmp, f.lse = a.lse ? a.lse : static_cast<float *>(lse_tmp);
  f.o_from_first = true;
  std::vector<const float *> feats(c.features.begin(), c.features.end());
  f.features = feats.empty() ? nullptr : feats.data();
  f.params = a.params, f.scale = a.scale, f.first_row = L0, f.stream = st, f.scratch = a.scratch;
  f.num_splits = a.num_splits;
  if (L0 == 0 && a.num_layers > 0) {
    // A prefill that may run an attention transition: from the step's own inputs (q (B, H, n, D),
    // k and v (B, kv_heads, n, D): the transition reads them with T rows a slice); k' is left to
    // the next step. Its
    // outputs are (B, H, T, .) as they are: o_from_first stays false (refused with layers).
    f.layer = a.layer, f.num_layers = a.num_layers, f.o_from_first = false;
    f.q = a.q, f.k = a.k, f.v = a.v, f.features = a.features;
  } else {
    f.q = q_direct ? a.q : q_tmp, f.q_row0 = q0, f.q_ld = L - q0;
    f.k = c.k, f.v = c.v, f.ld = C, f.feat_ld = C;
    if (c.km) f.km = c.km;
    if (c.krel) f.krel = c.krel;
    if (c.tok) f.tok = c.tok, f.tok_carry = c.tok_carry;
    if (c.km || c.krel || c.tok) f.km_rows = c.km_len;
  }
  err = forward(e, f);
  if (err == cudaSuccess && !o_direct) err = copy_rows(a.o, n, 0, o_tmp, n, n, S, row, st);
  give_all();
  // The cache's stream after the step's work: a later step there, or release(), follows it.
  back.done = true;
  const cudaError_t ordered = order_after(st, c.stream);
  if (err == cudaSuccess) err = ordered;
  if (err != cudaSuccess) return err;
  c.len = L;  // the step counts once it has succeeded whole
  if (f.km || f.krel || f.tok) c.km_len = L;
  return cudaSuccess;
}

APE_CUDA_ABI_END
}  // namespace ape::cuda
