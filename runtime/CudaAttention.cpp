// runtime/CudaAttention.h. With APE_RUNTIME_CUDA (runtime/CMakeLists.txt) the generated CUDA kernels
// (ape_cuda_kernels' registry) behind ape/torch/autograd.h and ape/torch/ops_cuda.h; without
// it, the refusals.
#include "runtime/CudaAttention.h"

#include <cctype>
#include <stdexcept>

#include "ape/cpu/kernel_entry.h"

namespace ape {

std::string cuda_arch_problem(const std::string &built, int major, int minor) {
  const int cc = major * 10 + minor;
  std::string list;
  size_t at = 0;
  while (at <= built.size()) {
    size_t end = built.find_first_of(";, ", at);
    if (end == std::string::npos) end = built.size();
    const std::string arch = built.substr(at, end - at);
    at = end + 1;
    if (arch.empty()) continue;
    list += (list.empty() ? "sm_" : ", sm_") + arch;
    size_t digits = 0;
    while (digits < arch.size() && std::isdigit(static_cast<unsigned char>(arch[digits]))) ++digits;
    if (digits == 0) return "";  // native, all, all-major: CMake's choice, which this cannot tell
    const int n = std::stoi(arch.substr(0, digits));
    const std::string rest = arch.substr(digits);
    const bool real = rest.find("-virtual") == std::string::npos, ptx = rest.find("-real") == std::string::npos;
    if (!rest.empty() && rest[0] == 'a') {
      if (cc == n) return "";
    } else if (!rest.empty() && rest[0] == 'f') {
      if (major == n / 10 && minor >= n % 10) return "";
    } else {
      if (real && major == n / 10 && minor >= n % 10) return "";
      if (ptx && cc >= n) return "";
    }
  }
  const std::string here = std::to_string(major) + std::to_string(minor);
  return "this build's CUDA kernels are compiled for " + (list.empty() ? std::string("no architecture") : list) +
         " (APE_CUDA_ARCHS), which this GPU (compute capability " + std::to_string(major) + "." +
         std::to_string(minor) + ") cannot run: rebuild with cmake -DAPE_CUDA_ARCHS=\"" + here +
         (major == 9 && minor == 0 ? "a" : "") + "\" (several: \"80;90a\")";
}

}  // namespace ape

#if APE_RUNTIME_CUDA
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include "ape/torch/ops_impl.h"  // with APE_TORCH_OPS_CUDA: forward_cuda, backward_cuda
#include "ape/cuda/kernel_abi.h"
#include "runtime/SpecLibrary.h"

namespace ape {
namespace {

// The CUDA kernels of specs compiled at run time (cuda_compile_spec), before the build's.
std::mutex g_spec_mu;
std::vector<const cuda::CudaKernelEntry *> &spec_entries() {
  static std::vector<const cuda::CudaKernelEntry *> v;
  return v;
}

const cuda::CudaKernelEntry *cuda_entry(const char *name) {
  {
    std::lock_guard<std::mutex> lock(g_spec_mu);
    for (const cuda::CudaKernelEntry *e : spec_entries())
      if (name && std::strcmp(e->name, name) == 0) return e;
  }
  size_t n = 0;
  const cuda::CudaKernelEntry *const *all = cuda::cuda_kernel_registry(&n);
  for (size_t k = 0; k < n; ++k)
    if (all[k] && name && std::strcmp(all[k]->name, name) == 0) return all[k];
  return nullptr;
}

std::string variant_list(const cuda::CudaKernelEntry &e) {
  std::string s;
  for (size_t i = 0; i < e.num_variants; ++i)
    s += (i ? " " : "") + std::string(cuda::dtype_name(e.variants[i].dtype)) + "/hd" +
         std::to_string(e.variants[i].head_dim);
  return s;
}

std::string names_with_kernels() {
  size_t n = 0;
  const cuda::CudaKernelEntry *const *all = cuda::cuda_kernel_registry(&n);
  std::string s;
  for (size_t k = 0; k < n; ++k)
    if (all[k]) s += (s.empty() ? "" : ", ") + std::string(all[k]->name);
  return s.empty() ? "none" : s;
}

// What one autograd node runs: the encoding and its variant, with the message prefix.
struct CudaKernel {
  const KernelEntry *entry;
  const cuda::CudaVariant *variant;
  std::string who;
};

const CudaKernel &kernel_for(const KernelEntry &entry, const at::Tensor &q) {
  static std::mutex mu;
  static std::map<std::pair<const KernelEntry *, const cuda::CudaVariant *>, CudaKernel> kernels;
  const std::optional<cuda::DType> dt = torch_ops::cuda_dtype(q.scalar_type());
  const cuda::CudaKernelEntry *e = cuda_entry(entry.name);
  const cuda::CudaVariant *var = dt && e ? cuda::find_variant(*e, *dt, q.size(3)) : nullptr;
  if (!var || !var->forward)
    throw std::invalid_argument(std::string("fused_attention(") + entry.name + ") on " +
                                q.device().str() + ": " +
                                cuda_attention_problem(entry, q.scalar_type(), q.size(3)));
  if (e->num_features < 0 || e->num_params < 0) throw std::logic_error("bad CUDA kernel entry");
  std::lock_guard<std::mutex> lock(mu);
  return kernels
      .try_emplace({&entry, var},
                   CudaKernel{&entry, var, std::string("fused_attention(") + entry.name + ", CUDA): "})
      .first->second;
}

// The CUDA side of the autograd binding (ape/torch/autograd.h).
struct CudaOps {
  static const CudaKernel &kernel(int64_t handle) {
    return *reinterpret_cast<const CudaKernel *>(static_cast<intptr_t>(handle));
  }
  static std::string prefix(int64_t handle) { return kernel(handle).who; }
  static std::tuple<at::Tensor, at::Tensor> forward(int64_t handle, const at::Tensor &q,
                                                    const at::Tensor &k, const at::Tensor &v,
                                                    at::TensorList features, at::TensorList params,
                                                    double scale) {
    const CudaKernel &c = kernel(handle);
    return torch_ops::forward_cuda(c.who, *c.variant, q, k, v, features, params, scale);
  }
  static AttentionGrads backward(int64_t handle, const at::Tensor &dout, const at::Tensor &q,
                                 const at::Tensor &k, const at::Tensor &v, const at::Tensor &o,
                                 const at::Tensor &lse, at::TensorList features,
                                 at::TensorList params, double scale) {
    const CudaKernel &c = kernel(handle);
    // dout arrives in o's dtype under autocast too (o is the kernel's output).
    return torch_ops::backward_cuda(c.who, *c.variant, dout.to(o.scalar_type()), q, k, v, o, lse,
                                    features, params, scale);
  }
};

}  // namespace

bool cuda_attention_built() { return true; }

std::vector<std::string> cuda_attention_kernels() {
  size_t n = 0;
  const cuda::CudaKernelEntry *const *all = cuda::cuda_kernel_registry(&n);
  std::vector<std::string> out;
  {
    std::lock_guard<std::mutex> lock(g_spec_mu);
    for (const cuda::CudaKernelEntry *e : spec_entries()) out.push_back(std::string(e->name) + ": " + variant_list(*e));
  }
  for (size_t k = 0; k < n; ++k)
    if (all[k]) out.push_back(std::string(all[k]->name) + ": " + variant_list(*all[k]));
  return out;
}

std::string cuda_attention_problem(const KernelEntry &entry, at::ScalarType dtype, int64_t head_dim) {
  const cuda::CudaKernelEntry *e = cuda_entry(entry.name);
  if (!e && registered_spec(entry.name))
    return "encoding '" + std::string(entry.name) +
           "' was compiled at run time (--spec) and its CUDA kernels are not compiled yet (cuda_compile_spec)";
  if (!e)
    return "encoding '" + std::string(entry.name) + "' has no CUDA kernels in this build (built: " +
           names_with_kernels() +
           "; cmake -DAPE_CUDA_ALL_ENCODINGS=ON, or -DAPE_CUDA_ENCODINGS=..., compiles others)";
  const std::optional<cuda::DType> dt = torch_ops::cuda_dtype(dtype);
  if (!dt)
    return std::string("the CUDA kernels take float32, float16 or bfloat16, not ") +
           c10::toString(dtype);
  if (!cuda::find_variant(*e, *dt, head_dim))
    return "encoding '" + std::string(entry.name) + "' has no " + cuda::dtype_name(*dt) +
           " CUDA kernel at head dim " + std::to_string(head_dim) + " in this build (it has " +
           variant_list(*e) + "; cmake -DAPE_CUDA_DTYPES=... -DAPE_CUDA_HEAD_DIMS=... compiles others)";
  return "";
}

at::Tensor cuda_fused_attention(const KernelEntry &entry, const at::Tensor &q, const at::Tensor &k,
                                const at::Tensor &v, const std::vector<at::Tensor> &features,
                                const std::vector<at::Tensor> &params, double scale) {
  const CudaKernel &c = kernel_for(entry, q);
  return AttentionAutograd<CudaOps>::apply(q, k, v, at::TensorList(features), at::TensorList(params),
                                           static_cast<int64_t>(reinterpret_cast<intptr_t>(&c)), scale);
}

std::pair<at::Tensor, at::Tensor> cuda_attention_forward(const KernelEntry &entry, const at::Tensor &q,
                                                         const at::Tensor &k, const at::Tensor &v,
                                                         const std::vector<at::Tensor> &features,
                                                         const std::vector<at::Tensor> &params,
                                                         double scale, int64_t first_row,
                                                         AttnLayer layer) {
  const CudaKernel &c = kernel_for(entry, q);
  auto [o, lse] = torch_ops::forward_cuda(c.who, *c.variant, q, k, v, features, params, scale, first_row,
                                          layer.index, layer.count);
  return {o, lse};
}

at::Tensor cuda_decode_forward(const KernelEntry &entry, const at::Tensor &q, const at::Tensor &k,
                               const at::Tensor &v, int64_t T, const std::vector<at::Tensor> &features,
                               const std::vector<at::Tensor> &params, double scale, int64_t first_row,
                               const CudaKeptRows &kept) {
  const CudaKernel &c = kernel_for(entry, q);
  const CudaDecodeKeeps keeps = cuda_decode_keeps(entry);
  torch_ops::CacheRows rows;
  // q from first_row rounded down to the forward's window: the step's own rows where that is
  // first_row, else zeros before them (they make only outputs before first_row, not returned).
  const int64_t q0 = first_row / cuda::kQueryWindow * cuda::kQueryWindow;
  at::Tensor qw = q;
  if (q0 < first_row) {
    qw = at::zeros({q.size(0), q.size(1), T - q0, q.size(3)}, q.options());
    qw.narrow(2, first_row - q0, q.size(2)).copy_(q);
  }
  rows.q_row0 = q0;
  rows.T = T, rows.km = kept.km, rows.krel = kept.krel, rows.tok = kept.tok, rows.tok_carry = kept.tok_carry;
  rows.km_rows = kept.rows, rows.krel_floats = keeps.krel_floats, rows.tok_seqs = keeps.tok_seqs;
  rows.km_heads = keeps.km_per_key_head ? k.size(1) : q.size(1);  // (from the entry: ops_cuda.h, CacheRows)
  return std::get<0>(torch_ops::forward_cuda(c.who, *c.variant, qw, k, v, features, params, scale, first_row, 0, 0, rows));
}

CudaDecodeKeeps cuda_decode_keeps(const KernelEntry &entry) {
  const cuda::CudaKernelEntry *e = cuda_entry(entry.name);
  if (!e) return {};
  return {e->caches_k_mod, e->key_rel_floats, e->tok_seqs, e->shares_k_mod};
}

std::string cuda_device_problem(int64_t index) {
#ifdef APE_CUDA_ARCHS_BUILT
#define APE_CUDA_ARCHS_STR2(...) #__VA_ARGS__
#define APE_CUDA_ARCHS_STR(...) APE_CUDA_ARCHS_STR2(__VA_ARGS__)
  // A device this process does not see is choose_device's to refuse.
  if (index < 0 || index >= static_cast<int64_t>(c10::cuda::device_count())) return "";
  const cudaDeviceProp *p = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index));
  return cuda_arch_problem(APE_CUDA_ARCHS_STR(APE_CUDA_ARCHS_BUILT), p->major, p->minor);
#else
  (void)index;
  return "";
#endif
}

std::string cuda_arch(int64_t index) {
  if (const char *a = std::getenv("APE_CUDA_ARCH"); a && *a) return a;
  const cudaDeviceProp *p = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index));
  // sm_90 runs the wgmma forward only when compiled for 90a (APE_CUDA_SM90A).
  return p->major == 9 && p->minor == 0 ? "90a" : std::to_string(p->major) + std::to_string(p->minor);
}

void cuda_compile_spec(const KernelEntry &entry, at::ScalarType dtype, int64_t head_dim, const std::string &arch,
                       std::ostream *log) {
  const SpecLibrary *spec = registered_spec(entry.name);
  if (!spec) throw std::invalid_argument(std::string("encoding '") + entry.name + "' is not a spec compiled at run time");
  const std::optional<cuda::DType> dt = torch_ops::cuda_dtype(dtype);
  if (!dt) throw std::invalid_argument(std::string("the CUDA kernels take float32, float16 or bfloat16, not ") +
                                       c10::toString(dtype));
  if (const cuda::CudaKernelEntry *e = cuda_entry(entry.name); e && cuda::find_variant(*e, *dt, head_dim)) return;
  SpecLibraryOptions opts;
  opts.log = log;
  const auto *e = static_cast<const cuda::CudaKernelEntry *>(
      load_spec_cuda(*spec, SpecCudaOptions{arch, {cuda::dtype_name(*dt)}, {head_dim}, cuda::cuda_kernel_abi_fingerprint()},
                     opts));
  if (!e->name || std::strcmp(e->name, entry.name) != 0 || !cuda::find_variant(*e, *dt, head_dim))
    throw std::runtime_error("the CUDA kernels compiled for spec '" + std::string(entry.name) +
                             "' are not the ones asked for");
  std::lock_guard<std::mutex> lock(g_spec_mu);
  auto &v = spec_entries();
  v.insert(v.begin(), e);  // the newest library of an encoding (another variant) first
}

at::Tensor cuda_backward_status(int64_t index) {
  return torch_ops::take_backward_status_async(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index)));
}

std::string cuda_status_error(uint32_t st) { return (st & cuda::kStatusErrors) ? cuda::status_message(st) : ""; }

int64_t cuda_peak_memory(int64_t index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
  return stats.allocated_bytes[0].peak;  // [0]: StatType::AGGREGATE, all pools
}

at::Tensor to_device_async(const at::Tensor &host, const c10::Device &device) {
  if (device.is_cpu()) return host;
  // pin_memory takes a block of LibTorch's caching host allocator; the non_blocking copy records
  // an event on the stream, so that block is reused only once the copy has read it.
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

namespace {
c10::cuda::SyncDebugMode requested_sync_debug() {
  const char *e = std::getenv("APE_CUDA_SYNC_DEBUG");
  const std::string v = e ? e : "";
  if (v == "warn") return c10::cuda::SyncDebugMode::L_WARN;
  if (v == "error") return c10::cuda::SyncDebugMode::L_ERROR;
  return c10::cuda::SyncDebugMode::L_DISABLED;
}
}  // namespace

std::string cuda_sync_debug_mode() {
  switch (c10::cuda::warning_state().get_sync_debug_mode()) {
    case c10::cuda::SyncDebugMode::L_WARN: return "warn";
    case c10::cuda::SyncDebugMode::L_ERROR: return "error";
    default: return "off";
  }
}

CudaSyncDebugScope::CudaSyncDebugScope(Mode mode) {
  const c10::cuda::SyncDebugMode want =
      mode == kOff ? c10::cuda::SyncDebugMode::L_DISABLED : requested_sync_debug();
  if (mode == kFromEnvironment && want == c10::cuda::SyncDebugMode::L_DISABLED) return;
  was_ = static_cast<int>(c10::cuda::warning_state().get_sync_debug_mode());
  c10::cuda::warning_state().set_sync_debug_mode(want);
}
CudaSyncDebugScope::~CudaSyncDebugScope() {
  if (was_ >= 0) c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(was_));
}

}  // namespace ape

#else  // no CUDA kernels in this build

namespace ape {
namespace {
[[noreturn]] void unbuilt() {
  throw std::runtime_error(
      "this build of APE has no CUDA kernels (CMake found no nvcc or no CUDA LibTorch; docs/cuda.md)");
}
}  // namespace

bool cuda_attention_built() { return false; }
std::vector<std::string> cuda_attention_kernels() { return {}; }
std::string cuda_attention_problem(const KernelEntry &, at::ScalarType, int64_t) {
  return "this build of APE has no CUDA kernels (CMake found no nvcc or no CUDA LibTorch; docs/cuda.md)";
}
at::Tensor cuda_fused_attention(const KernelEntry &, const at::Tensor &, const at::Tensor &,
                                const at::Tensor &, const std::vector<at::Tensor> &,
                                const std::vector<at::Tensor> &, double) {
  unbuilt();
}
std::pair<at::Tensor, at::Tensor> cuda_attention_forward(const KernelEntry &, const at::Tensor &,
                                                         const at::Tensor &, const at::Tensor &,
                                                         const std::vector<at::Tensor> &,
                                                         const std::vector<at::Tensor> &, double, int64_t,
                                                         AttnLayer) {
  unbuilt();
}
at::Tensor cuda_decode_forward(const KernelEntry &, const at::Tensor &, const at::Tensor &, const at::Tensor &,
                               int64_t, const std::vector<at::Tensor> &, const std::vector<at::Tensor> &, double,
                               int64_t, const CudaKeptRows &) {
  unbuilt();
}
CudaDecodeKeeps cuda_decode_keeps(const KernelEntry &) { return {}; }
at::Tensor cuda_backward_status(int64_t) { return {}; }
std::string cuda_status_error(uint32_t) { return ""; }
std::string cuda_arch(int64_t) { unbuilt(); }
std::string cuda_device_problem(int64_t) { return ""; }
void cuda_compile_spec(const KernelEntry &, at::ScalarType, int64_t, const std::string &, std::ostream *) {
  unbuilt();
}
int64_t cuda_peak_memory(int64_t) { return 0; }
at::Tensor to_device_async(const at::Tensor &host, const c10::Device &device) {
  return device.is_cpu() ? host : host.to(device);
}
std::string cuda_sync_debug_mode() { return "off"; }
CudaSyncDebugScope::CudaSyncDebugScope(Mode) {}
CudaSyncDebugScope::~CudaSyncDebugScope() = default;

}  // namespace ape
#endif
