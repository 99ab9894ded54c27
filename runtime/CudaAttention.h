// CudaAttention: fused_attention on CUDA tensors, through the nvcc-compiled kernels of the
// encoding (ape_cuda_kernels: apec --emit=cuda of the example specs; docs/cuda.md).
//
// The same autograd binding as the CPU kernels and the operator library (ape/torch/autograd.h)
// and the operator library's launch code (ape/torch/ops_cuda.h): q, k, v in float32, float16 or
// bfloat16 (one dtype), features and params in any floating dtype (computed in float32), every
// gradient returned in its input's dtype; the kernels run on the current CUDA stream of q's device
// and no call waits for the GPU. The backward's status word (what the deterministic gradient sums
// could not hold; the gradients it concerns are NaN already) is ORed into a per-device record on
// the stream, which cuda_backward_status() takes without a wait and cuda_status_error() explains
// once the caller has read it (the trainer reads it with its queued losses, in one copy).
//
// Built when CMake found nvcc and a CUDA LibTorch (APE_RUNTIME_CUDA); otherwise every function
// here says so: cuda_attention_built() is false and the others throw std::runtime_error.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/Attention.h"  // AttnLayer

namespace ape {
struct KernelEntry;

// Whether this build has CUDA kernels at all.
bool cuda_attention_built();

// "name: bf16/hd32 bf16/hd64 ..." for every encoding with CUDA kernels in this build.
std::vector<std::string> cuda_attention_kernels();

// "" when `entry` has a CUDA kernel for `dtype` (float32, float16, bfloat16) at `head_dim`;
// otherwise why not, in words a user can act on (for --device refusals).
std::string cuda_attention_problem(const KernelEntry &entry, at::ScalarType dtype, int64_t head_dim);

// Differentiable attention on CUDA tensors (fused_attention's contract, runtime/Attention.h).
at::Tensor cuda_fused_attention(const KernelEntry &entry, const at::Tensor &q, const at::Tensor &k,
                                const at::Tensor &v, const std::vector<at::Tensor> &features,
                                const std::vector<at::Tensor> &params, double scale);

// Forward only: {o, lse}, lse float32. Rows before `first_row` are not computed (a decode step:
// runtime/Decode.h); rows from first_row on are the full forward's, bit for bit where the call
// runs unsplit, within the 16-bit rounding of P and o where first_row > 0 splits the keys over
// blocks (CudaAttnArgs::num_splits: by default where the slices alone leave SMs idle).
// layer: the layer of a model this call computes (read by an attention transition only).
std::pair<at::Tensor, at::Tensor> cuda_attention_forward(const KernelEntry &entry, const at::Tensor &q,
                                                         const at::Tensor &k, const at::Tensor &v,
                                                         const std::vector<at::Tensor> &features,
                                                         const std::vector<at::Tensor> &params,
                                                         double scale, int64_t first_row = 0,
                                                         AttnLayer layer = {});

// What a decode cache keeps for this encoding's CUDA kernels besides the raw k, v
// (cuda/kernel_entry.h, CudaKernelEntry): k' (caches_k_mod), the key side's relative rows
// (key_rel_floats floats a token), the token program's sequences (tok_seqs) and their scans'
// running sums; and whether a grouped model's k' is kept per key head (shares_k_mod: its k' reads
// neither the head nor the data), else per query head.
struct CudaDecodeKeeps {
  bool km = false;
  int64_t krel_floats = 0, tok_seqs = 0;
  bool km_per_key_head = false;
};
CudaDecodeKeeps cuda_decode_keeps(const KernelEntry &entry);

// The kept rows of a decode cache (runtime/Decode.h): km (B, H or, where the encoding shares k'
// over a group, H_kv, capacity, D), k's dtype; krel
// (float32, B H capacity krel_floats elements); tok (float32, B H tok_seqs capacity) and
// tok_carry (float64, B H tok_seqs 2). Each undefined where not kept; `rows` of them computed.
struct CudaKeptRows {
  at::Tensor km, krel, tok, tok_carry;
  int64_t rows = 0;
};

// A decode step's forward over a cache read in place: k, v (B, H_kv, capacity, D) hold T tokens, q
// (B, H, T - first_row, D) the step's own queries (the forward reads q from first_row rounded down
// to kQueryWindow: a window with zeros before first_row where that is earlier; the cache keeps no
// q); the kept rows get the rows from kept.rows up to T. Returns o of rows [first_row, T) only,
// (B, H, T - first_row, D) (cuda/kernel_entry.h: ld, q_row0, km, krel, tok, o_from_first).
at::Tensor cuda_decode_forward(const KernelEntry &entry, const at::Tensor &q, const at::Tensor &k,
                               const at::Tensor &v, int64_t T, const std::vector<at::Tensor> &features,
                               const std::vector<at::Tensor> &params, double scale, int64_t first_row,
                               const CudaKeptRows &kept);

// The CUDA kernels of a spec compiled at run time (runtime/SpecLibrary.h, --spec) for `dtype` at
// `head_dim`, compiled by nvcc for GPU architecture `arch` (cuda_arch) unless this process has them,
// then used like the build's. Throws std::runtime_error when nvcc fails (or is missing).
void cuda_compile_spec(const KernelEntry &entry, at::ScalarType dtype, int64_t head_dim, const std::string &arch,
                       std::ostream *log = nullptr);

// Why the GPU architectures `built` (APE_CUDA_ARCHS as CMake takes them: "80;90a", "86-real",
// "90-virtual") have no code that a device of compute capability major.minor runs, or "" when
// they do: "NNa" runs on NN itself only; "NNf" and an "NN" or "NN-real" binary on the same major at
// the same or a later minor (sm_80 on 8.6 and 8.9); an "NN" or "NN-virtual" PTX, compiled by the
// driver, on any later one.
std::string cuda_arch_problem(const std::string &built, int major, int minor);

// cuda_arch_problem for this build's kernels (APE_CUDA_ARCHS) on CUDA device `index` (a spec's
// kernels, compiled at run time for the device, are not concerned); "" without CUDA kernels.
std::string cuda_device_problem(int64_t index);

// nvcc's architecture for CUDA device `index` ("90a" on an H100, "80" on an A100; $APE_CUDA_ARCH
// overrides).
std::string cuda_arch(int64_t index);

// The CUDA attention backwards' status word on device `index` since the last call (ape/cuda/
// kernel_entry.h: what a gradient sum could not hold; those gradients are NaN), as an int32 [1]
// tensor on the device, and the record cleared after it on the current stream. Nothing waits: the
// caller copies it to the host with whatever else it reads. Undefined without CUDA kernels.
at::Tensor cuda_backward_status(int64_t index);
// Why the backwards failed, from a status word read back by the caller, or "" when none did.
std::string cuda_status_error(uint32_t status);

// The most memory LibTorch's caching allocator held allocated on CUDA device `index` since the
// process started (bytes; 0 without CUDA kernels). For the training summary.
int64_t cuda_peak_memory(int64_t index);

// `host` (a CPU tensor, e.g. a step's token windows) on `device` without making the host wait:
// staged in pinned memory and copied with non_blocking, so the copy is queued behind the step's
// kernels. A plain .to(device) from pageable memory copies synchronously: the host first waits
// for every kernel already queued, i.e. for the whole previous step. On the CPU: `host` itself.
at::Tensor to_device_async(const at::Tensor &host, const c10::Device &device);

// LibTorch's CUDA sync debug mode (torch.cuda.set_sync_debug_mode) while a CudaSyncDebugScope
// lives, the mode before restored after it:
//   kFromEnvironment  the mode $APE_CUDA_SYNC_DEBUG names, "warn" or "error" (otherwise nothing
//                     changes): a call that makes the host wait for the GPU (an item(), a copy to
//                     or from pageable memory, a stream synchronisation) then prints "called a
//                     synchronizing CUDA operation" or throws it (the trainer's queued steps; the
//                     GPU check's training smoke counts the warnings);
//   kOff              off: a place that waits on purpose (reading the queued losses, writing a
//                     checkpoint).
// Without CUDA kernels in the build: nothing.
class CudaSyncDebugScope {
 public:
  enum Mode { kFromEnvironment, kOff };
  explicit CudaSyncDebugScope(Mode mode);
  ~CudaSyncDebugScope();
  CudaSyncDebugScope(const CudaSyncDebugScope &) = delete;
  CudaSyncDebugScope &operator=(const CudaSyncDebugScope &) = delete;

 private:
  int was_ = -1;  // the mode before, or -1 when nothing changed
};
// LibTorch's CUDA sync debug mode now: "off", "warn" or "error" ("off" without CUDA kernels).
std::string cuda_sync_debug_mode();

}  // namespace ape
