// CudaKernelEntry: what one generated encoding exports for the GPU (docs/cuda.md).
//
// Plain C++17 (no nvcc needed to include it): a runtime or a test compiled by the host compiler
// calls the kernels through this header and links the objects that nvcc built from the generated
// NAME_cuda*.cu files. Tensors are raw device pointers; per-call scratch memory is taken from
// the caller's allocator (CudaScratchAllocator), else from cudaMallocAsync on `stream`.
//
//   q, k, v, o, dout, dq, dk, dv   (B, H, T, D) contiguous, dtype f32 | f16 | bf16, each address a
//                                  multiple of 16 bytes (the kernels move rows in 16-byte
//                                  chunks: cp.async, TMA, vector stores); a call with another
//                                  returns cudaErrorInvalidValue and launches nothing
//   lse                            (B, H, T) float32: log sum_j exp(l_ij) of the final logits
//   features, dfeatures            Enc::kNumFeatures x (B, H, T) float32
//   params, dparams                Enc::kNumParams tensors, float32, shapes per manifest
//   status                         one uint32_t in device memory (backward): see below
// `features`, `params`, `dfeatures` and `dparams` are HOST arrays of DEVICE pointers.
//
// Compiled with -DAPE_SIMT (the SIMT emulator, docs/cuda.md) the same declarations live in the
// inline namespace ape::cuda::simt and the runtime API types are the emulator's, so a program
// may link emulated and real kernels side by side.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ape/cuda/symbols.h"
#ifdef APE_SIMT
#include "ape/simt/cuda.h"
#else
#include <cuda_runtime_api.h>
#endif

namespace ape::cuda {
APE_CUDA_ABI_BEGIN

// Bits of the backward's status word: what the deterministic fixed-point gradient sums (token and
// parameter gradients; cuda/attention.cuh) could not represent. The errors (after any of them
// every sum of the call, and what is computed from the sums, is NaN: poisoned on the device):
constexpr uint32_t kStatusNonFinite = 1u;  // a gradient term was NaN or infinite
constexpr uint32_t kStatusRange = 2u;      // a term of magnitude >= 2^31 was clamped
constexpr uint32_t kStatusOverflow = 4u;   // a sum left (-2^31, 2^31) and wrapped
constexpr uint32_t kStatusErrors = kStatusNonFinite | kStatusRange | kStatusOverflow;
// For information: a non-zero term below 2^-65 in magnitude was dropped (the sums are exact to
// 2^-64 per term).
constexpr uint32_t kStatusDropped = 8u;

inline const char *status_message(uint32_t status) {
  if (status & kStatusNonFinite) return "a token or parameter gradient term was NaN or infinite";
  if (status & kStatusRange) return "a token or parameter gradient term exceeded 2^31 and was clamped";
  if (status & kStatusOverflow) return "a token or parameter gradient sum exceeded 2^31 and wrapped";
  if (status & kStatusDropped) return "gradient terms below 2^-65 were dropped";
  return "ok";
}

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2 };

inline const char *dtype_name(DType t) {
  return t == DType::F32 ? "f32" : t == DType::F16 ? "f16" : "bf16";
}

// Where a call takes its scratch memory (q' and k', the backward's fp32 dQ' and sums, the bias
// tables; freed when the call returns): a framework passes its own allocator, so that the memory is
// counted, limited and reused with its tensors' (PyTorch's caching allocator: ops_cuda.h). Both
// functions run on the host inside the call. alloc returns `bytes` of device memory for work
// queued on `stream` from then on, or nullptr (the call then frees what it took and returns
// cudaErrorMemoryAllocation); free gives a block back once the call's kernels that use it are
// queued, so the allocator must be stream ordered: a freed block is reused only by work queued on
// `stream` after them (as cudaMallocAsync and PyTorch's caching allocator do). Blocks must be
// aligned to 16 bytes at least (256 is usual; another returns cudaErrorInvalidValue). Neither
// function may throw: report a failure by returning nullptr.
struct CudaScratchAllocator {
  void *(*alloc)(void *ctx, size_t bytes, cudaStream_t stream) = nullptr;
  void (*free)(void *ctx, void *ptr, cudaStream_t stream) = nullptr;
  void *ctx = nullptr;
};

// A forward computes q' (and reads q) from first_row rounded down to a multiple of this on
// (CudaAttnArgs::first_row, q_row0): every query tile divides it.
constexpr int64_t kQueryWindow = 384;

struct CudaAttnArgs {
  int64_t B = 0, H = 0, T = 0, D = 0;
  DType dtype = DType::BF16;
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  void *o = nullptr;
  float *lse = nullptr;
  const float *const *features = nullptr;
  const float *const *params = nullptr;
  // kappa, the logit scale: finite (else cudaErrorInvalidValue). Set it: the manifest's "scale",
  // or 1/sqrt(D) where that is null (0, the default, gives uniform attention; < 0 is allowed).
  float scale = 0;
  // Forward only: the first query row whose output is wanted. The query tiles before the one
  // holding it are skipped (rows [first_row, T) of o and lse are written; with o_from_first false,
  // the rows of that tile before first_row may be written with their values (of the q given:
  // q_row0) or left as they were:
  // a call that splits its keys (num_splits), or whose computed tiles' rows are mostly before
  // first_row or past T (a decode step's), computes only the warps that hold wanted rows);
  // the token program, k' and the key side's relative rows still cover all T tokens (from km_rows
  // where km, krel, tok are given: the token program from its chunk of 256), q' and the query
  // side's relative rows the rows from first_row's window of 384 rows (or from first_row's warp
  // of 32), in scratch of those rows only. 0: every row. A
  // decode step (cuda/decode.h) passes its cache length. The backward needs 0.
  int64_t first_row = 0;
  // Forward only: o and lse hold the wanted rows only, (B, H, T - first_row, D) and
  // (B, H, T - first_row): row i of a slice at i - first_row. A decode step's outputs (and the q'
  // it computes, in scratch) then take its new rows' memory, not the whole sequence's. false (the
  // default): (B, H, T, D) and (B, H, T). Refused with num_layers > 0 (an attention transition
  // reads and rewrites o and lse as (B, H, T, .)); no effect where first_row is 0.
  bool o_from_first = false;
  // Forward only: the rows per (b, h) slice of q (but see q_ld), k and v (each slice's T rows followed by
  // ld - T unused ones: a longer buffer, such as a decode cache of ld tokens, read in place). 0
  // (the default) or T: contiguous (B, H, T, D). ld > T is refused for the backward and for a
  // call with num_layers > 0 (an attention transition reads q', k', v as (B, H, T, D)), whether
  // or not the encoding has a transition.
  int64_t ld = 0;
  // Forward only: q holds each slice's rows from q_row0 on, q_ld rows a slice (0: ld, or T where
  // ld is 0), so a decode step passes the rows the forward reads, not the sequence's: q_row0 at
  // most first_row rounded down to a multiple of kQueryWindow (the forward reads q from there; its
  // rows before first_row make only rows of o and lse before first_row, which the call leaves
  // unspecified, so a caller may pass zeros for them), q_row0 + q_ld >= T. Both 0 (the default): q as k and v. Refused for the backward and with
  // num_layers > 0.
  int64_t q_row0 = 0, q_ld = 0;
  // Forward only: the elements per (b, h) slice of each feature (B, H, feat_ld), the first T of
  // each slice the call's (a decode cache's features, kept at its capacity, read in place). 0 (the
  // default) or T: contiguous (B, H, T). Refused below T, for the backward and with num_layers > 0,
  // as ld.
  int64_t feat_ld = 0;
  // Forward only: a buffer of k' (the k mod's output) with ld rows per slice whose first km_rows
  // rows of every slice a previous call computed (CudaKernelEntry::caches_k_mod: neither the k mod
  // nor the token sequences it may read depend on the sequence length). The call computes k' of
  // rows [km_rows, T) into it and reads k' from it, so a decode step computes the new keys' k'
  // only. The cached rows stay valid while the keys, the features and the params they were
  // computed from do: calls that share a km pass the same params. nullptr (the default): k' in
  // scratch memory, every row. Refused (cudaErrorInvalidValue) where the encoding does not cache
  // its k mod, and for the backward.
  void *km = nullptr;
  // Forward only, likewise: a float buffer of the key side's relative rows (CudaKernelEntry::
  // key_rel_floats floats a token: each key-side table's (B, H, ld, rows) in the spec's order),
  // whose first km_rows rows of every slice a previous call computed; the call computes rows
  // [km_rows, T) and reads them from it. Refused where key_rel_floats is 0, and for the backward.
  float *krel = nullptr;
  // Forward only, likewise: the token program's sequences, (B, H, CudaKernelEntry::tok_seqs, ld)
  // floats, and its scans' running sums, (B, H, tok_seqs, 2) doubles ({sum, the token it was taken
  // at}), as the previous call that shared them left them (both zeroed before the first); the call
  // reruns the program from the chunk of 256 tokens holding row km_rows on (a scan from its sum
  // there where that sum is the chunk's, else from token 0: the same values as a run over all T
  // tokens, bit for bit) and updates both. Both or neither; refused where tok_seqs is 0, and for
  // the backward.
  float *tok = nullptr;
  double *tok_carry = nullptr;
  // The rows of km, krel and tok that earlier calls computed (a call gives any of them, and ld:
  // their rows per slice; ld = 0 is refused with them).
  int64_t km_rows = 0;
  // Forward only: the keys of each query tile split over up to this many blocks (FlashDecoding),
  // each adding its share's o and lse to scratch, then a pass that adds the shares: a call with
  // few query tiles (a decode step: one tile a slice) then fills the device. 0 (the default): the
  // device decides for a call with first_row > 0 (the count that ends first by rounds of the blocks
  // its SMs hold; 1 where the tiles alone fill them, at most one share per 256 keys;
  // APE_CUDA_NUM_SPLITS=N sets N), 1
  // for any other; 1: never split (rows bit for bit those of the full forward); n > 1: min(n, the
  // key tiles of 64 keys, 128). Split rows equal the unsplit ones within the 16-bit rounding of P
  // (against each share's own maximum) and o: another order of the same fp32 sums, the same run to
  // run; NaN where the unsplit rows are NaN; rows of first_row's tile before it are not written.
  // The FlashAttention-2-class forward only (16-bit inputs, no value rows; on sm_90 the call takes
  // it over the Hopper forward when it splits); elsewhere the call runs unsplit; and a one-token
  // step of grouped keys that packs each group into a block (kv_heads; NoPE, RoPE, xPos: docs/
  // decoding.md), any dtype, unless num_splits is 1 (then the flash rows, bit for bit). Refused
  // (< 0, or > 1 for the backward).
  int num_splits = 0;
  // Forward only: the layer (0-based) of a model of num_layers that this call computes, read by
  // an attention transition (contract/transition.h), which rewrites the rows of some layers;
  // num_layers = 0 (the default) transforms none. 0 <= layer < num_layers when num_layers > 0.
  int64_t layer = 0, num_layers = 0;
  // backward only (reads q, k, v, o, lse, dout)
  const void *dout = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;  // overwritten
  float *const *dfeatures = nullptr;                  // overwritten
  float *const *dparams = nullptr;                    // overwritten (zero where not trainable)
  // Device word the backward ORs its kStatus* bits into (the caller zeroes it and reads it when
  // it likes: no synchronisation here; the sums are already NaN after an error, so a caller need
  // not read it before using the gradients). Required when the encoding has token or parameter
  // gradients (Enc::kNumTok > 0 or kNumParams > 0): without it the backward returns
  // cudaErrorInvalidValue.
  uint32_t *status = nullptr;
  // Backward only, optional: a second device word, e.g. a record many calls share, into which the
  // backward ORs `status` on the stream after its kernels, with an atomic OR (backwards running at
  // once on several streams keep every bit). The call's own word stays the call's: the kernels
  // read `status` to poison its sums, never the record. Ignored where `status` is null and by
  // encodings without token or param gradients (they set no bit).
  uint32_t *status_record = nullptr;
  // The stream of the launches, a stream of the current device (cudaSetDevice first, as for any
  // CUDA library call): the device's limits and the kernels' attributes are the current device's.
  cudaStream_t stream = nullptr;
  // The scratch memory's allocator (both functions set), or nullptr: cudaMallocAsync on `stream`.
  // One with a function missing is refused (cudaErrorInvalidValue).
  const CudaScratchAllocator *scratch = nullptr;
  // Backward only: true (the default) adds the flash backward's dQ' tiles in a fixed order, so
  // the gradients are bitwise identical run to run; false lets its blocks add them as they come
  // (fp32 reductions into a zeroed dQ', as FlashAttention-2 does by default, then a conversion
  // pass): no waits between blocks, sums that may differ in their last bits between runs. The
  // other gradients and the general (two-kernel) backward are deterministic either way.
  bool deterministic = true;
  // Grouped-query attention: the heads of k and v (and of dk, dv), 0 (the default) = H, else a
  // divisor of H: k and v are (B, kv_heads, ld, D) and query head h reads key head h / (H /
  // kv_heads), as PyTorch groups them; dk and dv are the sums over each group's query heads. The
  // kernels read the key heads in place (k' too, per key head where the encoding shares it:
  // CudaKernelEntry::shares_k_mod; a decode cache's km is then (B, kv_heads, ld, D), else
  // (B, H, ld, D)); the backward writes each query head's dk, dv into scratch (2 (B, H, T, D)
  // buffers, in the dtype) and adds each group's in head order in fp32, rounding the sum once
  // (deterministic). Refused
  // where kv_heads is negative, above H or not a divisor of it (ape_rules::kKvHeadsRule).
  int64_t kv_heads = 0;
};

using CudaAttnFn = cudaError_t (*)(const CudaAttnArgs &);

// One explicit instantiation of the CUDA template: input dtype x head dim.
struct CudaVariant {
  DType dtype;
  int64_t head_dim;
  CudaAttnFn forward;
  CudaAttnFn backward;
  // Why forward (backward true: backward) refuses a call's arguments (cudaErrorInvalidValue,
  // nothing launched), in words, or nullptr where they pass: the check both run first, for a call
  // of this variant (a.D its head_dim, a.dtype its dtype: find_variant). See refusal() below, which
  // also names a variant the build lacks.
  const char *(*refusal)(const CudaAttnArgs &a, bool backward);
};

struct CudaKernelEntry {
  const char *name;
  const char *manifest_json;
  int num_features;                                  // Enc::kNumFeatures
  int num_params;                                    // Enc::kNumParams
  int64_t (*param_numel)(int n, int64_t H, int64_t D);  // elements of param n
  const CudaVariant *variants;  // only the (dtype, head_dim) pairs this build instantiated
  size_t num_variants;
  // The encoding has a k mod whose k' of a key does not change as the sequence grows (neither the
  // mod nor the token sequences it may read depend on the length): a decode cache may keep k'
  // (CudaAttnArgs::km) instead of recomputing it, while the params stay the same.
  bool caches_k_mod = false;
  // Floats per token of the key side's relative rows (ape.rel_rows "k": Transformer-XL's u . k,
  // DeBERTa's p2c) a decode cache may keep (CudaAttnArgs::krel) on the same terms as k'; 0: none.
  int64_t key_rel_floats = 0;
  // Token sequences (Enc::kNumTok) a decode cache may keep (CudaAttnArgs::tok, tok_carry): where
  // the token program does not read the length; 0: none.
  int64_t tok_seqs = 0;
  // The encoding's k' reads neither the head nor the data (no k mod, or a linear one): under
  // grouped-query attention (CudaAttnArgs::kv_heads) one key head's k' serves its whole group, and
  // a decode cache's km holds kv_heads heads.
  bool shares_k_mod = false;
};

// The variant for (dtype, D), or nullptr when it was not instantiated.
inline const CudaVariant *find_variant(const CudaKernelEntry &e, DType dtype, int64_t D) {
  for (size_t n = 0; n < e.num_variants; ++n)
    if (e.variants[n].dtype == dtype && e.variants[n].head_dim == D) return &e.variants[n];
  return nullptr;
}

// Dispatch on (a.dtype, a.D); cudaErrorInvalidValue when the pair was not instantiated.
inline cudaError_t forward(const CudaKernelEntry &e, const CudaAttnArgs &a) {
  const CudaVariant *v = find_variant(e, a.dtype, a.D);
  return v ? v->forward(a) : cudaErrorInvalidValue;
}
inline cudaError_t backward(const CudaKernelEntry &e, const CudaAttnArgs &a) {
  const CudaVariant *v = find_variant(e, a.dtype, a.D);
  return v ? v->backward(a) : cudaErrorInvalidValue;
}

// In words, why forward(e, a) (backward: backward(e, a)) returns cudaErrorInvalidValue before
// launching anything, or nullptr where the arguments pass: a (dtype, head dim) the build did not
// instantiate, or the first rule of CudaAttnArgs the call breaks ("q, k, v or o is not 16-byte
// aligned"). A call whose arguments pass may still fail: memory, a launch, or (cudaErrorInvalidValue
// too) a scratch block from the caller's allocator that is not 16-byte aligned, or B·H·T past the
// Hopper kernels' int tile counts and TMA coordinates (B·H·T past some 2^37 rows, or T within a
// tile of 2^31: hundreds of GiB at the least).
inline const char *refusal(const CudaKernelEntry &e, const CudaAttnArgs &a, bool backward) {
  const CudaVariant *v = find_variant(e, a.dtype, a.D);
  if (!v) return "this build has no variant of that dtype and head dim (D)";
  return v->refusal ? v->refusal(a, backward) : nullptr;
}

// Every entry of a build, `*count` of them: defined by the build that compiles the entries (this
// repository's CMake, cmake/ApeRegistries.cmake; a --emit=cuda-package folder's CMakeLists.txt).
const CudaKernelEntry *const *cuda_kernel_registry(size_t *count);

APE_CUDA_ABI_END
}  // namespace ape::cuda
