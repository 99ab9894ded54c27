// fused_attention on the CUDA kernels under the SIMT emulator (runtime/SimtAttention.h). Compiled
// with -DAPE_SIMT: ape/cuda/kernel_entry.h then declares the emulated kernels' interface and the
// emulator's runtime API (ape/simt/cuda.h) stands in for CUDA's.
#include "runtime/SimtAttention.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <ATen/ATen.h>

#include "ape/torch/autograd.h"
#include "ape/cpu/kernel_entry.h"
#include "runtime/Attention.h"

// After LibTorch: the emulator's CUDA surface defines macros (threadIdx, __device__, ...).
#include "ape/cuda/decode.h"
#include "ape/cuda/kernel_abi.h"
#include "ape/cuda/kernel_entry.h"
#include "ape/simt/runtime.h"

namespace ape {
namespace {

std::atomic<int> g_dtype{static_cast<int>(cuda::DType::BF16)};

at::ScalarType torch_dtype(cuda::DType t) {
  return t == cuda::DType::F32 ? at::kFloat : t == cuda::DType::F16 ? at::kHalf : at::kBFloat16;
}

[[noreturn]] void fail(const std::string &enc, const std::string &msg) {
  throw std::runtime_error("emulated CUDA attention (" + enc + "): " + msg);
}

// The emulated entries added at run time (add_simt_kernels: a spec's kernels compiled by
// load_spec_simt), found before the build's registry.
std::mutex g_added_mutex;
std::vector<const cuda::CudaKernelEntry *> &added() {
  static std::vector<const cuda::CudaKernelEntry *> entries;
  return entries;
}

// The emulated entry of `entry`'s encoding that has a variant of (dtype, D): a spec's kernels added
// at run time before the build's own; throws naming the variants there are.
const cuda::CudaKernelEntry &cuda_entry_for(const KernelEntry &entry, cuda::DType dtype, int64_t D) {
  size_t n = 0;
  const cuda::CudaKernelEntry *const *built = cuda::cuda_kernel_registry(&n);
  std::vector<const cuda::CudaKernelEntry *> all;
  {
    const std::lock_guard<std::mutex> lock(g_added_mutex);
    all.assign(added().rbegin(), added().rend());  // the latest first
  }
  all.insert(all.end(), built, built + n);
  for (size_t k = 0; k < all.size(); ++k) {
    if (!all[k] || std::strcmp(all[k]->name, entry.name) != 0) continue;
    if (cuda::find_variant(*all[k], dtype, D)) return *all[k];
    std::ostringstream os;
    os << "no " << cuda::dtype_name(dtype) << " variant at head_dim " << D << "; this build has";
    for (size_t i = 0; i < all[k]->num_variants; ++i)
      os << " " << cuda::dtype_name(all[k]->variants[i].dtype) << "/"
         << all[k]->variants[i].head_dim;
    os << " (cmake -DAPE_SIMT_ALL_VARIANTS=ON builds every one)";
    fail(entry.name, os.str());
  }
  fail(entry.name, "no emulated CUDA kernel of this encoding");
}

const cuda::CudaVariant &variant_for(const KernelEntry &entry, cuda::DType dtype, int64_t D) {
  return *cuda::find_variant(cuda_entry_for(entry, dtype, D), dtype, D);
}

cuda::DType dtype_of(const std::string &dtype) {
  if (dtype == "bf16") return cuda::DType::BF16;
  if (dtype == "f16") return cuda::DType::F16;
  if (dtype == "f32") return cuda::DType::F32;
  throw std::invalid_argument("emulated CUDA kernels: dtype '" + dtype + "' is not bf16, f16 or f32");
}

void check(const std::string &enc, cudaError_t err, const char *what) {
  if (err != cudaSuccess) fail(enc, std::string(what) + ": " + cudaGetErrorString(err));
}
// A call of the kernels: a refusal of its arguments in words (CudaVariant::refusal).
void check_call(const std::string &enc, const cuda::CudaVariant &var, const cuda::CudaAttnArgs &a, bool backward) {
  const cudaError_t err = backward ? var.backward(a) : var.forward(a);
  const char *why = err == cudaErrorInvalidValue && var.refusal ? var.refusal(a, backward) : nullptr;
  if (why) fail(enc, std::string(backward ? "backward" : "forward") + " refused its arguments: " + why);
  check(enc, err, backward ? "backward" : "forward");
}

// Emulated device memory for one call, freed with it.
struct Device {
  std::string enc;
  std::vector<void *> ptrs;
  ~Device() {
    for (void *p : ptrs) cudaFree(p);
  }
  void *alloc(size_t bytes) {
    void *p = nullptr;
    check(enc, cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    ptrs.push_back(p);
    return p;
  }
  void *upload(const at::Tensor &t, at::ScalarType dt) {
    const at::Tensor c = t.to(dt).contiguous();
    void *p = alloc(static_cast<size_t>(c.numel()) * c.element_size());
    check(enc, cudaMemcpy(p, c.data_ptr(), c.numel() * c.element_size(), cudaMemcpyHostToDevice),
          "upload");
    return p;
  }
  void *output(const at::Tensor &like, at::ScalarType dt) {
    return alloc(static_cast<size_t>(like.numel()) * c10::elementSize(dt));
  }
  at::Tensor download(const void *p, at::IntArrayRef shape, at::ScalarType dt, at::ScalarType to) {
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dt));
    check(enc, cudaMemcpy(t.data_ptr(), p, t.numel() * t.element_size(), cudaMemcpyDeviceToHost),
          "download");
    return t.to(to);
  }
};

void expect_clean(const std::string &enc) {
  const auto findings = simt::take_findings();
  if (findings.empty()) return;
  std::ostringstream os;
  os << findings.size() << " finding(s) of the emulator's checks:";
  for (const auto &f : findings) os << "\n  " << simt::check_name(f.check) << ": " << f.message;
  fail(enc, os.str());
}

// The inputs of one call in emulated device memory.
struct Call {
  Device dev;
  cuda::CudaAttnArgs a;
  std::vector<const float *> feats, params;
  std::vector<float *> dfeats, dparams;
};

void fill_inputs(Call &c, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                 const std::vector<at::Tensor> &features, const std::vector<at::Tensor> &params,
                 double scale, cuda::DType dtype) {
  const at::ScalarType dt = torch_dtype(dtype);
  c.a.B = q.size(0), c.a.H = q.size(1), c.a.T = q.size(2), c.a.D = q.size(3);
  c.a.kv_heads = k.size(1) == q.size(1) ? 0 : k.size(1);  // grouped-query attention: read in place
  c.a.dtype = dtype;
  c.a.q = c.dev.upload(q, dt), c.a.k = c.dev.upload(k, dt), c.a.v = c.dev.upload(v, dt);
  for (const auto &f : features) c.feats.push_back(static_cast<const float *>(c.dev.upload(f, at::kFloat)));
  for (const auto &p : params) c.params.push_back(static_cast<const float *>(c.dev.upload(p, at::kFloat)));
  c.a.features = c.feats.data(), c.a.params = c.params.data();
  c.a.scale = static_cast<float>(scale);
}

// What one autograd node runs on: the encoding and the dtype of its CUDA variant (chosen by
// use_simt_kernels when the forward ran, kept for the backward).
struct SimtKernel {
  const KernelEntry *entry;
  cuda::DType dtype;
};

// A stable handle per (entry, dtype) for the autograd binding.
int64_t simt_handle(const KernelEntry &entry, cuda::DType dtype) {
  static std::mutex mu;
  static std::map<std::pair<const KernelEntry *, int>, SimtKernel> kernels;
  std::lock_guard<std::mutex> lock(mu);
  const SimtKernel &k = kernels.try_emplace({&entry, static_cast<int>(dtype)}, SimtKernel{&entry, dtype})
                            .first->second;
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(&k));
}

// The emulator's side of the autograd binding (ape/torch/autograd.h, shared with
// fused_attention on the CPU kernels and the operator library).
struct SimtOps {
  static const SimtKernel &kernel(int64_t handle) {
    return *reinterpret_cast<const SimtKernel *>(static_cast<intptr_t>(handle));
  }
  static std::string prefix(int64_t handle) {
    return std::string("emulated CUDA attention (") + kernel(handle).entry->name + "): ";
  }

  static std::tuple<at::Tensor, at::Tensor> forward(int64_t handle, const at::Tensor &q,
                                                    const at::Tensor &k, const at::Tensor &v,
                                                    at::TensorList features, at::TensorList params,
                                                    double scale) {
    const KernelEntry &e = *kernel(handle).entry;
    const cuda::DType dtype = kernel(handle).dtype;
    const cuda::CudaVariant &var = variant_for(e, dtype, q.size(3));
    Call c;
    c.dev.enc = e.name;
    fill_inputs(c, q, k, v, features.vec(), params.vec(), scale, dtype);
    const at::ScalarType dt = torch_dtype(dtype);
    c.a.o = c.dev.output(q, dt);
    c.a.lse = static_cast<float *>(c.dev.alloc(sizeof(float) * q.size(0) * q.size(1) * q.size(2)));
    check_call(e.name, var, c.a, false);
    expect_clean(e.name);
    // o in the kernel's dtype (the backward's Delta reads it), returned in the caller's dtype.
    at::Tensor o = c.dev.download(c.a.o, q.sizes(), dt, q.scalar_type());
    at::Tensor lse = c.dev.download(c.a.lse, {q.size(0), q.size(1), q.size(2)}, at::kFloat, at::kFloat);
    return {o, lse};
  }

  static AttentionGrads backward(int64_t handle, const at::Tensor &dout, const at::Tensor &q,
                                 const at::Tensor &k, const at::Tensor &v, const at::Tensor &o,
                                 const at::Tensor &lse, at::TensorList features,
                                 at::TensorList params, double scale) {
    const KernelEntry &e = *kernel(handle).entry;
    const cuda::DType dtype = kernel(handle).dtype;
    const cuda::CudaVariant &var = variant_for(e, dtype, q.size(3));
    const at::ScalarType dt = torch_dtype(dtype);

    Call c;
    c.dev.enc = e.name;
    fill_inputs(c, q, k, v, features.vec(), params.vec(), scale, dtype);
    c.a.o = c.dev.upload(o, dt);
    c.a.lse = static_cast<float *>(c.dev.upload(lse, at::kFloat));
    c.a.dout = c.dev.upload(dout, dt);
    c.a.dq = c.dev.output(q, dt), c.a.dk = c.dev.output(k, dt), c.a.dv = c.dev.output(v, dt);
    for (const auto &f : features) c.dfeats.push_back(static_cast<float *>(c.dev.output(f, at::kFloat)));
    for (const auto &p : params) c.dparams.push_back(static_cast<float *>(c.dev.output(p, at::kFloat)));
    c.a.dfeatures = c.dfeats.data(), c.a.dparams = c.dparams.data();
    uint32_t *status = static_cast<uint32_t *>(c.dev.alloc(sizeof(uint32_t)));
    check(e.name, cudaMemset(status, 0, sizeof(uint32_t)), "cudaMemset");
    c.a.status = status;
    check_call(e.name, var, c.a, true);
    expect_clean(e.name);
    uint32_t st = 0;
    check(e.name, cudaMemcpy(&st, status, sizeof st, cudaMemcpyDeviceToHost), "status");
    if (st & cuda::kStatusErrors) fail(e.name, std::string("backward: ") + cuda::status_message(st));

    std::vector<at::Tensor> df, dp;
    for (size_t n = 0; n < features.size(); ++n)
      df.push_back(c.dev.download(c.dfeats[n], features[n].sizes(), at::kFloat, features[n].scalar_type()));
    for (size_t n = 0; n < params.size(); ++n)
      dp.push_back(c.dev.download(c.dparams[n], params[n].sizes(), at::kFloat, params[n].scalar_type()));
    return {c.dev.download(c.a.dq, q.sizes(), dt, q.scalar_type()),
            c.dev.download(c.a.dk, k.sizes(), dt, k.scalar_type()),
            c.dev.download(c.a.dv, v.sizes(), dt, v.scalar_type()), df, dp};
  }
};

at::Tensor simt_attention(const KernelEntry &entry, const at::Tensor &q, const at::Tensor &k,
                          const at::Tensor &v, const std::vector<at::Tensor> &features,
                          const std::vector<at::Tensor> &params, double scale) {
  return AttentionAutograd<SimtOps>::apply(
      q, k, v, at::TensorList(features), at::TensorList(params),
      simt_handle(entry, static_cast<cuda::DType>(g_dtype.load())), scale);
}

}  // namespace

void use_simt_kernels(const std::string &dtype) {
  g_dtype = static_cast<int>(dtype_of(dtype));
  set_attention_impl(&simt_attention);
}

void use_cpu_kernels() { set_attention_impl(nullptr); }

std::pair<int, int> simt_device_pose() { return {simt::arch(), simt::sm_count()}; }

void pose_simt_device(int sm, int multiprocessors) {
  if (sm != 80 && sm != 86 && sm != 89 && sm != 90)
    throw std::invalid_argument("the emulator poses as sm_80, 86, 89 or 90, not sm_" + std::to_string(sm));
  simt::set_arch(sm);
  simt::set_sm_count(multiprocessors);
}

std::vector<std::pair<std::string, int64_t>> simt_variants(const std::string &name) {
  size_t n = 0;
  const cuda::CudaKernelEntry *const *built = cuda::cuda_kernel_registry(&n);
  std::vector<const cuda::CudaKernelEntry *> all;
  {
    const std::lock_guard<std::mutex> lock(g_added_mutex);
    all.assign(added().rbegin(), added().rend());
  }
  all.insert(all.end(), built, built + n);
  std::vector<std::pair<std::string, int64_t>> out;
  for (const cuda::CudaKernelEntry *e : all) {
    if (!e || name != e->name) continue;
    for (size_t k = 0; k < e->num_variants; ++k)
      out.emplace_back(cuda::dtype_name(e->variants[k].dtype), e->variants[k].head_dim);
    break;  // the one fused_attention would run
  }
  return out;
}

std::pair<at::Tensor, at::Tensor> simt_decode(const KernelEntry &entry, const std::string &dtype,
                                              const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                              const std::vector<at::Tensor> &features,
                                              const std::vector<at::Tensor> &params, double scale,
                                              const std::vector<int64_t> &steps, int num_splits) {
  const cuda::DType t = dtype_of(dtype);
  const at::ScalarType dt = torch_dtype(t);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const cuda::CudaKernelEntry &ce = cuda_entry_for(entry, t, D);
  Device dev;
  dev.enc = entry.name;
  std::vector<const float *> pp;
  for (const auto &p : params) pp.push_back(static_cast<const float *>(dev.upload(p, at::kFloat)));
  at::Tensor o = at::full({B, H, T, D}, NAN, at::dtype(at::kFloat));
  at::Tensor lse = at::full({B, H, T}, NAN, at::dtype(at::kFloat));
  cuda::CudaDecodeCache cache;
  cache.capacity = T + 13;  // beyond the tokens, as ape-generate's caches (the row pitch differs)
  int64_t L0 = 0;
  for (int64_t n : steps) {
    if (n < 1 || L0 + n > T) fail(entry.name, "decode steps past the tokens given");
    Device step;  // the step's inputs and outputs, freed with it
    step.enc = entry.name;
    auto cut = [&](const at::Tensor &x) { return x.narrow(2, L0, n); };
    cuda::CudaDecodeArgs a;
    a.B = B, a.H = H, a.n = n, a.D = D, a.dtype = t;
    a.kv_heads = k.size(1) == H ? 0 : k.size(1);  // grouped-query attention: k, v of their key heads
    a.q = step.upload(cut(q), dt), a.k = step.upload(cut(k), dt), a.v = step.upload(cut(v), dt);
    std::vector<const float *> fp;
    for (const auto &f : features) fp.push_back(static_cast<const float *>(step.upload(cut(f), at::kFloat)));
    a.features = fp.data(), a.params = pp.data(), a.scale = static_cast<float>(scale);
    a.o = step.alloc(static_cast<size_t>(B * H * n * D) * c10::elementSize(dt));
    a.lse = static_cast<float *>(step.alloc(sizeof(float) * static_cast<size_t>(B * H * n)));
    a.num_splits = num_splits;
    if (const char *why = cuda::decode_refusal(ce, cache, a)) fail(entry.name, std::string("decode step refused: ") + why);
    check(entry.name, cuda::decode_step(ce, cache, a), "decode step");
    check(entry.name, cudaDeviceSynchronize(), "decode step");
    expect_clean(entry.name);
    if (cache.len != L0 + n) fail(entry.name, "a decode step that succeeded left the cache's length wrong");
    o.narrow(2, L0, n).copy_(step.download(a.o, {B, H, n, D}, dt, at::kFloat));
    lse.narrow(2, L0, n).copy_(step.download(a.lse, {B, H, n}, at::kFloat, at::kFloat));
    L0 += n;
  }
  cache.release();
  check(entry.name, cudaDeviceSynchronize(), "releasing the decode cache");
  expect_clean(entry.name);
  return {o, lse};
}

uint64_t simt_kernel_abi() { return cuda::cuda_kernel_abi_fingerprint(); }

void add_simt_kernels(const void *entry) {
  if (!entry) throw std::invalid_argument("add_simt_kernels: no entry");
  const std::lock_guard<std::mutex> lock(g_added_mutex);
  added().push_back(static_cast<const cuda::CudaKernelEntry *>(entry));
}

}  // namespace ape
