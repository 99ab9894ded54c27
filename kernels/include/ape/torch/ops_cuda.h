// The CUDA kernels of the operator library: the raw pair on CUDA tensors calls the generated
// kernels (apec --emit=cuda; cuda/kernel_entry.h, docs/cuda.md) on the current CUDA stream of
// q's device, with no host copies. Included by torch/ops_impl.h (when the emitted CMakeLists.txt
// finds a LibTorch with CUDA: APE_TORCH_OPS_CUDA), after the helpers it uses.
//
// The CUDA kernels take q, k, v, o, dout, dq, dk, dv in float32, float16 or bfloat16 at the
// instantiated (dtype, head dim) pairs, lse in float32, features and params (and their
// gradients) in float32. So: features and params are converted to float32 on the device (small:
// (B, H, T) and the params), their gradients converted back; strided inputs are made contiguous
// on the device. The kernels' scratch memory (q' and k', the backward's fp32 dQ', ...) comes from
// PyTorch's CUDA allocator (TorchScratch), so torch.cuda.memory_allocated and
// max_memory_allocated count it, PyTorch's memory limits apply to it, and it shares one pool with
// the tensors; running out of it raises torch.OutOfMemoryError.
//
// No call waits for the GPU (a training step keeps its overlap; test_cuda.py runs every call
// under torch.cuda.set_sync_debug_mode("error")). The backward's status word (cuda/kernel_entry.h:
// what the fixed-point gradient sums could not hold) is therefore never read here:
//   - the kernels poison every gradient an error concerns with NaN on the device, so a clamped or
//     wrapped sum is never used silently (NaN reaches the loss, the gradient norm, GradScaler);
//   - each call's word is ORed, on the stream, into a per-device record that the operator
//     backward_status() returns (and clears) when the user asks: a synchronisation the user
//     places, e.g. next to a loss.item() already paid for. The Python helper's
//     check_backward() raises with the reason;
//   - APE_CUDA_SYNC_CHECK=1 in the environment reads the word after every backward and raises at
//     once (it waits for the GPU: for debugging).
//
// The backward is bitwise deterministic by default (CudaAttnArgs::deterministic: the flash
// backward adds its dQ' tiles in a fixed order). APE_CUDA_DETERMINISTIC=0 in the environment,
// read at each call, lets it add them in any order, as FlashAttention-2 does by default: faster,
// with dq that may differ in its last bits from run to run. torch.use_deterministic_algorithms(True)
// keeps the fixed order whatever the variable says.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ape/cuda/kernel_entry.h"

namespace ape::torch_ops {

inline std::optional<cuda::DType> cuda_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return cuda::DType::F32;
    case at::kHalf: return cuda::DType::F16;
    case at::kBFloat16: return cuda::DType::BF16;
    default: return std::nullopt;  // float64: the CUDA template computes in fp32 at most
  }
}

// The generated CUDA variant for q's dtype and head dim, or nullptr.
inline const cuda::CudaVariant *cuda_variant(const Library &lib, const at::Tensor &q) {
  if (!lib.cuda) return nullptr;
  const cuda::CudaKernelEntry &e = *lib.cuda;
  TORCH_INTERNAL_ASSERT(e.num_features == lib.inputs->num_features &&
                            e.num_params == lib.inputs->num_params,
                        prefix(*lib.inputs, "attention"),
                        "the CUDA kernels and the CPU kernel disagree on the inputs");
  std::optional<cuda::DType> dt = cuda_dtype(q.scalar_type());
  const cuda::CudaVariant *v = dt ? cuda::find_variant(e, *dt, q.size(3)) : nullptr;
  return v && v->forward ? v : nullptr;
}

// `who`: the start of every message ("ape_NAME.attention_forward: "). With the call's variant and
// arguments, a refusal says which rule the arguments broke (CudaVariant::refusal).
inline void check_cuda(cudaError_t status, const std::string &who, const cuda::CudaVariant *var = nullptr,
                       const cuda::CudaAttnArgs *a = nullptr, bool backward = false) {
  if (status == cudaSuccess) return;
  const char *why = status == cudaErrorInvalidValue && var && var->refusal && a ? var->refusal(*a, backward) : nullptr;
  TORCH_CHECK(!why, who, "the CUDA kernel refused its arguments: ", why);
  TORCH_CHECK(false, who, "the CUDA kernel failed: ", cudaGetErrorName(status), " (", cudaGetErrorString(status),
              ")");
}

// Contiguous float32 copies on the device and their data pointers (a host array, as the
// kernels take it).
struct Float32Tensors {
  std::vector<at::Tensor> tensors;
  std::vector<float *> ptrs;
  explicit Float32Tensors(at::TensorList ts) {
    for (const auto &t : ts) tensors.push_back(t.to(at::kFloat).contiguous());
    for (auto &t : tensors) ptrs.push_back(t.data_ptr<float>());
  }
};

// t contiguous at an address the kernels take (cuda/kernel_entry.h: a multiple of 16 bytes): t
// itself when it is, else a copy (a view at an odd offset, e.g. of a flat buffer, is contiguous
// but misaligned; the caching allocator's blocks are aligned).
inline at::Tensor kernel_operand(const at::Tensor &t) {
  at::Tensor c = t.contiguous();
  if (reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 != 0) c = c.clone(at::MemoryFormat::Contiguous);
  return c;
}

// The kernels' scratch allocator (cuda/kernel_entry.h, CudaScratchAllocator) over PyTorch's CUDA
// caching allocator: stream ordered as the kernels need (a block freed on a stream is reused by work
// queued on that stream after it). A failed allocation is kept and raised after the call (raise()),
// as PyTorch's own error: torch.OutOfMemoryError when the memory ran out.
struct TorchScratch {
  cuda::CudaScratchAllocator alloc;
  std::string error;  // the allocator's message, when an allocation failed
  bool out_of_memory = false;
  TorchScratch() {
    alloc.alloc = &take, alloc.free = &give, alloc.ctx = this;
  }
  TorchScratch(const TorchScratch &) = delete;
  TorchScratch &operator=(const TorchScratch &) = delete;
  // Neither throws (CudaScratchAllocator's contract: the kernels' host code is between them and
  // the caller).
  static void *take(void *ctx, size_t bytes, cudaStream_t stream) noexcept {
    auto *self = static_cast<TorchScratch *>(ctx);
    try {
      return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, stream);
    } catch (const c10::OutOfMemoryError &e) {
      self->error = e.what_without_backtrace(), self->out_of_memory = true;
    } catch (const c10::Error &e) {
      self->error = e.what_without_backtrace();
    } catch (const std::exception &e) {
      self->error = e.what();
    } catch (...) {
      self->error = "an unknown error";
    }
    return nullptr;
  }
  static void give(void *, void *ptr, cudaStream_t) noexcept {
    try {
      c10::cuda::CUDACachingAllocator::raw_delete(ptr);
    } catch (...) {
      // A block the allocator cannot take back stays allocated: nothing better to do here.
    }
  }
  // After a call: the allocator's own error when the call failed for want of scratch memory.
  void raise(cudaError_t status, const std::string &who) const {
    if (status != cudaErrorMemoryAllocation || error.empty()) return;
    if (out_of_memory) TORCH_CHECK_WITH(OutOfMemoryError, false, who, "the CUDA kernels' scratch memory: ", error);
    TORCH_CHECK(false, who, "the CUDA kernels' scratch memory: ", error);
  }
};

inline cuda::CudaAttnArgs cuda_args(const cuda::CudaVariant &var, const at::Tensor &q,
                                    double scale) {
  cuda::CudaAttnArgs a;
  a.B = q.size(0), a.H = q.size(1), a.T = q.size(2), a.D = q.size(3);
  a.dtype = var.dtype;
  a.scale = static_cast<float>(scale);
  a.stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
  return a;
}

// A decode cache read in place (CudaAttnArgs::ld, q_row0, km, krel, tok): k and v of forward_cuda
// hold `rows` = k.size(2) rows per slice of which the first T are the call's, q the rows
// [q_row0, T) only, (B, H, T - q_row0, D), and o and lse hold the rows from first_row only,
// (B, H, T - first_row, .) (CudaAttnArgs::o_from_first); km (B, km_heads, rows, D) of k's dtype,
// or undefined, holds k' of the first km_rows rows (km_heads: k's heads where the encoding shares
// its k' over a group, CudaKernelEntry::shares_k_mod, else q's), krel (float32, B H rows krel_floats elements, or
// undefined) the key side's relative rows of them (CudaKernelEntry::key_rel_floats), tok (float32,
// B H tok_seqs rows) and tok_carry (float64, B H tok_seqs 2) the token program's sequences and
// scan sums (CudaKernelEntry::tok_seqs), and the call computes the rest up to T. The features
// then hold `rows` elements per slice too (CudaAttnArgs::feat_ld), the first T the call's.
struct CacheRows {
  int64_t T = -1;  // -1: every row (no cache): else k and v hold the cache's rows (B, H, capacity, D)
  int64_t q_row0 = 0;  // q holds rows [q_row0, T) only (CudaAttnArgs::q_row0; a decode step's window)
  at::Tensor km, krel, tok, tok_carry;
  int64_t km_rows = 0, krel_floats = 0, tok_seqs = 0;
  // km's heads: k's where the encoding shares its k' over a group (CudaKernelEntry::shares_k_mod:
  // the kernels then write k' per key head), else q's (0: q's). A wrong count here is a buffer the
  // kernels under- or overrun: the caller takes it from the entry.
  int64_t km_heads = 0;
};

// forward_cuda / backward_cuda: also the runtime's CUDA attention (runtime/CudaAttention.cpp).
// first_row: the first query row whose output is wanted (CudaAttnArgs::first_row; a decode step);
// layer of num_layers: the layer of a model this call computes (an attention transition's).
inline ForwardResult forward_cuda(const std::string &who, const cuda::CudaVariant &var,
                                  const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                  at::TensorList features, at::TensorList params, double scale,
                                  int64_t first_row = 0, int64_t layer = 0,
                                  int64_t num_layers = 0, const CacheRows &cache = {}) {
  const c10::cuda::CUDAGuard device(q.device());
  at::Tensor qc = kernel_operand(q), kc = kernel_operand(k), vc = kernel_operand(v);
  Float32Tensors f(features), p(params);
  const int64_t T = cache.T < 0 ? q.size(2) : cache.T;
  TORCH_CHECK(first_row >= 0 && (T == 0 || first_row < T), who, "first_row must be in [0, T), got ", first_row,
              " with T = ", T);
  const bool window = cache.T >= 0 && num_layers == 0;  // o, lse: the rows from first_row only
  const int64_t o_rows = window ? T - first_row : T;
  at::Tensor o = at::empty({q.size(0), q.size(1), o_rows, q.size(3)}, qc.options());
  at::Tensor lse = at::empty({q.size(0), q.size(1), o_rows}, qc.options().dtype(at::kFloat));
  if (q.size(0) * q.size(1) * T * q.size(3) == 0) return {o, lse};  // nothing to launch
  cuda::CudaAttnArgs a = cuda_args(var, q, scale);
  a.q = qc.data_ptr(), a.k = kc.data_ptr(), a.v = vc.data_ptr();
  a.o = o.data_ptr(), a.lse = lse.data_ptr<float>();
  a.first_row = first_row, a.layer = layer, a.num_layers = num_layers, a.o_from_first = window;
  a.kv_heads = k.size(1) == q.size(1) ? 0 : k.size(1);  // grouped-query attention: read in place
  if (cache.T >= 0) {
    const int64_t rows = k.size(2);  // the cache's capacity
    TORCH_CHECK(q.size(2) == T - cache.q_row0, who, "a cache's q must hold rows [q_row0, T)");
    TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(1) >= 1 && q.size(1) % k.size(1) == 0 &&
                    k.size(3) == q.size(3) && rows >= T,
                who, "a cache's k and v must be (B, H_kv, rows >= T, D) like q's B and D, H_kv dividing q's H");
    a.T = T, a.ld = rows, a.feat_ld = rows, a.q_row0 = cache.q_row0, a.q_ld = q.size(2);
    for (const auto &t : features)
      TORCH_CHECK(t.dim() == 3 && t.size(0) == q.size(0) && t.size(1) == q.size(1) && t.size(2) == rows, who,
                  "a cache's features must be (B, H, rows) like its k");
    if (cache.km.defined()) {  // written in place: no copy may stand in for it
      const int64_t km_heads = cache.km_heads > 0 ? cache.km_heads : q.size(1);
      TORCH_CHECK(cache.km.is_contiguous() && cache.km.dim() == 4 && cache.km.size(0) == k.size(0) &&
                      cache.km.size(1) == km_heads && cache.km.size(2) == rows && cache.km.size(3) == k.size(3) &&
                      cache.km.scalar_type() == k.scalar_type() && cache.km.device() == k.device() &&
                      reinterpret_cast<uintptr_t>(cache.km.data_ptr()) % 16 == 0,
                  who, "the k' cache must be contiguous, aligned, (B, ", km_heads, ", rows, D), typed and placed like k");
      a.km = cache.km.data_ptr(), a.km_rows = cache.km_rows;
    }
    if (cache.krel.defined()) {
      TORCH_CHECK(cache.krel.is_contiguous() && cache.krel.scalar_type() == at::kFloat &&
                      cache.krel.device() == q.device() && cache.krel_floats > 0 &&
                      cache.krel.numel() == q.size(0) * q.size(1) * rows * cache.krel_floats,
                  who, "the relative rows' cache must be contiguous float32 on q's device, B H rows x ",
                  cache.krel_floats, " elements");
      a.krel = cache.krel.data_ptr<float>(), a.km_rows = cache.km_rows;
    }
    if (cache.tok.defined() || cache.tok_carry.defined()) {
      const int64_t S = q.size(0) * q.size(1);
      TORCH_CHECK(cache.tok.defined() && cache.tok_carry.defined() && cache.tok_seqs > 0 &&
                      cache.tok.is_contiguous() && cache.tok.scalar_type() == at::kFloat &&
                      cache.tok.numel() == S * cache.tok_seqs * rows && cache.tok_carry.is_contiguous() &&
                      cache.tok_carry.scalar_type() == at::kDouble && cache.tok_carry.numel() == S * cache.tok_seqs * 2 &&
                      cache.tok.device() == q.device() && cache.tok_carry.device() == q.device(),
                  who, "the token program's cache must be contiguous float32 (B H ", cache.tok_seqs,
                  " rows) and float64 (B H ", cache.tok_seqs, " 2) on q's device");
      a.tok = cache.tok.data_ptr<float>(), a.tok_carry = cache.tok_carry.data_ptr<double>();
      a.km_rows = cache.km_rows;
    }
  }
  std::vector<const float *> fp(f.ptrs.begin(), f.ptrs.end()), pp(p.ptrs.begin(), p.ptrs.end());
  a.features = fp.data(), a.params = pp.data();
  TorchScratch scratch;
  a.scratch = &scratch.alloc;
  const cudaError_t status = var.forward(a);
  scratch.raise(status, who);
  check_cuda(status, who, &var, &a);
  return {o, lse};
}

// Whether `device`'s current stream is capturing a CUDA graph (the device made current first: the
// query is of the current device's stream, and would otherwise start a context on another GPU).
inline bool capturing(const at::Device &device) {
  const c10::cuda::CUDAGuard guard(device);
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

// The record of one device: the OR of every backward's status word there since the last
// backward_status(clear=True), an int32 on that device. Never freed (a CUDA tensor destroyed at
// process exit may outlive the CUDA context). Made by the first backward on the device, which
// must not be inside a CUDA graph capture: there the record would come from the graph's memory
// pool and its zeroing would be a node of the graph, rerun at every replay (erasing the bits of
// the replays before). Each backward ORs its word in with an atomic OR on its stream
// (CudaAttnArgs::status_record): backwards running at once on several streams keep every bit.
inline at::Tensor status_record(const at::Device &device, const std::string &who = "") {
  static std::mutex mutex;
  static auto *records = new std::vector<at::Tensor>();
  const std::lock_guard<std::mutex> lock(mutex);
  const size_t index = static_cast<size_t>(device.index());
  if (records->size() <= index) records->resize(index + 1);
  at::Tensor &r = (*records)[index];
  if (!r.defined()) {
    TORCH_CHECK(!capturing(device), who, "the first CUDA backward on ", device,
                " runs inside a CUDA graph capture: run one backward before capturing (the warm-up "
                "PyTorch's CUDA graphs ask for), so that its status record is made outside the graph");
    r = at::zeros({1}, at::TensorOptions().device(device).dtype(at::kInt));
  }
  return r;
}

// CudaAttnArgs::deterministic of a backward (top of this file).
inline bool deterministic_backward() {
  if (at::globalContext().deterministicAlgorithms()) return true;
  const char *e = std::getenv("APE_CUDA_DETERMINISTIC");
  return !(e && std::string(e) == "0");
}

inline bool sync_check_requested() {
  static const bool on = [] {
    const char *e = std::getenv("APE_CUDA_SYNC_CHECK");
    return e && *e && std::string(e) != "0";
  }();
  return on;
}

// backward_status(device, clear): the record of `device` (the current CUDA device when index < 0)
// once every stream of the device has finished its work so far (a backward ORs its bits on its own
// stream, which need not be the current one): the whole device is waited for, then read and
// cleared with nothing in flight.
inline int64_t backward_status_cuda(int64_t index, bool clear) {
  if (!at::hasCUDA()) return 0;
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(
                                         index < 0 ? c10::cuda::current_device() : index));
  const c10::cuda::CUDAGuard guard(device);
  at::Tensor r = status_record(device);
  c10::cuda::device_synchronize();
  const int64_t st = static_cast<uint32_t>(r.item<int32_t>());
  if (clear) {
    r.zero_();
    c10::cuda::device_synchronize();  // cleared before any later backward, on whatever stream, ORs
  }
  return st;
}

// The status word of `device` so far, as a copy on the device (int32 [1]), and the record cleared
// after it on the current stream: nothing waits. For a caller that reads it with other results in
// one copy (the trainer, with its queued losses) and runs every backward on the current stream (a
// backward ORing on another stream between the copy and the clear would lose its bits). Not inside
// a CUDA graph capture (the copy and the clear would be nodes of the graph). A device without an
// index is the current one.
inline at::Tensor take_backward_status_async(const at::Device &device_in) {
  const at::Device device = device_in.has_index() ? device_in : at::Device(at::kCUDA, c10::cuda::current_device());
  const c10::cuda::CUDAGuard guard(device);
  at::Tensor r = status_record(device);
  at::Tensor copy = r.clone();
  r.zero_();
  return copy;
}

// Each gradient has its input's dtype (features and params may be float32 with a 16-bit q:
// ops_impl.h, check_like_q; the runtime's params stay float32 under autocast).
inline BackwardResult backward_cuda(const std::string &who, const cuda::CudaVariant &var,
                                    const at::Tensor &dout, const at::Tensor &q,
                                    const at::Tensor &k, const at::Tensor &v, const at::Tensor &o,
                                    const at::Tensor &lse, at::TensorList features,
                                    at::TensorList params, double scale) {
  const c10::cuda::CUDAGuard device(q.device());
  at::Tensor qc = kernel_operand(q), kc = kernel_operand(k), vc = kernel_operand(v);
  at::Tensor oc = kernel_operand(o), lc = lse.contiguous(), gc = kernel_operand(dout);
  Float32Tensors f(features), p(params);
  at::Tensor dq = at::empty_like(qc), dk = at::empty_like(kc), dv = at::empty_like(vc);
  std::vector<at::Tensor> df, dp;
  for (const auto &t : f.tensors) df.push_back(at::empty_like(t));
  for (const auto &t : p.tensors) dp.push_back(at::zeros_like(t));  // T = 0: no contribution
  if (dq.numel() > 0) {
    cuda::CudaAttnArgs a = cuda_args(var, q, scale);
    a.q = qc.data_ptr(), a.k = kc.data_ptr(), a.v = vc.data_ptr();
    a.kv_heads = k.size(1) == q.size(1) ? 0 : k.size(1);  // dk, dv: each group's sum, shaped like k, v
    a.o = oc.data_ptr(), a.lse = lc.data_ptr<float>(), a.dout = gc.data_ptr();
    a.dq = dq.data_ptr(), a.dk = dk.data_ptr(), a.dv = dv.data_ptr();
    std::vector<const float *> fp(f.ptrs.begin(), f.ptrs.end()), pp(p.ptrs.begin(), p.ptrs.end());
    std::vector<float *> dfp, dpp;
    for (auto &t : df) dfp.push_back(t.data_ptr<float>());
    for (auto &t : dp) dpp.push_back(t.data_ptr<float>());
    a.features = fp.data(), a.params = pp.data();
    a.dfeatures = dfp.data(), a.dparams = dpp.data();
    a.deterministic = deterministic_backward();
    // The status word of the deterministic gradient sums (top of this file): filled and ORed
    // atomically into the device's record by the backward, on the stream (status_record), never
    // read here unless APE_CUDA_SYNC_CHECK asks.
    at::Tensor status = at::zeros({1}, qc.options().dtype(at::kInt));
    a.status = reinterpret_cast<uint32_t *>(status.data_ptr<int32_t>());
    a.status_record = reinterpret_cast<uint32_t *>(status_record(q.device(), who).data_ptr<int32_t>());
    TorchScratch scratch;
    a.scratch = &scratch.alloc;
    const cudaError_t launched = var.backward(a);
    scratch.raise(launched, who);
    check_cuda(launched, who, &var, &a, true);
    if (sync_check_requested() && !capturing(q.device())) {  // (a host read: none inside a graph capture)
      const uint32_t st = static_cast<uint32_t>(status.item<int32_t>());
      TORCH_CHECK((st & cuda::kStatusErrors) == 0, who,
                  cuda::status_message(st), " (APE_CUDA_SYNC_CHECK)");
    }
  } else {
    for (auto &t : df) t.zero_();
  }
  for (size_t i = 0; i < df.size(); ++i) df[i] = df[i].to(features[i].scalar_type());
  for (size_t i = 0; i < dp.size(); ++i) dp[i] = dp[i].to(params[i].scalar_type());
  return {dq, dk, dv, df, dp};
}

}  // namespace ape::torch_ops
