// fused_attention on the CUDA kernels under the SIMT emulator (runtime/SimtAttention.h). Compiled
// with -DAPE_SIMT: ape/cuda_kernel_entry.h then declares the emulated kernels' interface and the
// emulator's runtime API (ape/simt/cuda.h) stands in for CUDA's.
#include "runtime/SimtAttention.h"

#include <atomic>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "ape/kernel_entry.h"
#include "runtime/Attention.h"

// After LibTorch: the emulator's CUDA surface defines macros (threadIdx, __device__, ...).
#include "ape/cuda_kernel_entry.h"
#include "ape/simt/runtime.h"

namespace ape {
namespace cuda {
APE_CUDA_ABI_BEGIN
const CudaKernelEntry *const *cuda_kernel_registry(size_t *count);
APE_CUDA_ABI_END
}  // namespace cuda

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::atomic<int> g_dtype{static_cast<int>(cuda::DType::BF16)};

at::ScalarType torch_dtype(cuda::DType t) {
  return t == cuda::DType::F32 ? at::kFloat : t == cuda::DType::F16 ? at::kHalf : at::kBFloat16;
}

[[noreturn]] void fail(const std::string &enc, const std::string &msg) {
  throw std::runtime_error("emulated CUDA attention (" + enc + "): " + msg);
}

const cuda::CudaVariant &variant_for(const KernelEntry &entry, cuda::DType dtype, int64_t D) {
  size_t n = 0;
  const cuda::CudaKernelEntry *const *all = cuda::cuda_kernel_registry(&n);
  for (size_t k = 0; k < n; ++k) {
    if (!all[k] || std::strcmp(all[k]->name, entry.name) != 0) continue;
    if (const cuda::CudaVariant *v = cuda::find_variant(*all[k], dtype, D)) return *v;
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

void check(const std::string &enc, cudaError_t err, const char *what) {
  if (err != cudaSuccess) fail(enc, std::string(what) + ": " + cudaGetErrorString(err));
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
  c.a.dtype = dtype;
  c.a.q = c.dev.upload(q, dt), c.a.k = c.dev.upload(k, dt), c.a.v = c.dev.upload(v, dt);
  for (const auto &f : features) c.feats.push_back(static_cast<const float *>(c.dev.upload(f, at::kFloat)));
  for (const auto &p : params) c.params.push_back(static_cast<const float *>(c.dev.upload(p, at::kFloat)));
  c.a.features = c.feats.data(), c.a.params = c.params.data();
  c.a.scale = static_cast<float>(scale);
}

// Saved: q, k, v, o, lse, features..., params...
struct SimtAttention : public torch::autograd::Function<SimtAttention> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &q, const at::Tensor &k,
                            const at::Tensor &v, at::TensorList features, at::TensorList params,
                            int64_t entry_bits, double scale) {
    const auto &e = *reinterpret_cast<const KernelEntry *>(static_cast<intptr_t>(entry_bits));
    const auto dtype = static_cast<cuda::DType>(g_dtype.load());
    const cuda::CudaVariant &var = variant_for(e, dtype, q.size(3));
    Call c;
    c.dev.enc = e.name;
    fill_inputs(c, q, k, v, features.vec(), params.vec(), scale, dtype);
    const at::ScalarType dt = torch_dtype(dtype);
    c.a.o = c.dev.output(q, dt);
    c.a.lse = static_cast<float *>(c.dev.alloc(sizeof(float) * q.size(0) * q.size(1) * q.size(2)));
    check(e.name, var.forward(c.a), "forward");
    expect_clean(e.name);
    // o in the kernel's dtype (the backward's Delta reads it), returned in the caller's dtype.
    at::Tensor o = c.dev.download(c.a.o, q.sizes(), dt, q.scalar_type());
    at::Tensor lse = c.dev.download(c.a.lse, {q.size(0), q.size(1), q.size(2)}, at::kFloat, at::kFloat);
    variable_list saved = {q, k, v, o, lse};
    for (const auto &f : features) saved.push_back(f);
    for (const auto &p : params) saved.push_back(p);
    ctx->save_for_backward(saved);
    ctx->saved_data["entry"] = entry_bits;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    ctx->saved_data["nf"] = static_cast<int64_t>(features.size());
    ctx->saved_data["np"] = static_cast<int64_t>(params.size());
    return o;
  }

  static variable_list backward(AutogradContext *ctx, variable_list grad_outputs) {
    const auto &e = *reinterpret_cast<const KernelEntry *>(
        static_cast<intptr_t>(ctx->saved_data["entry"].toInt()));
    const double scale = ctx->saved_data["scale"].toDouble();
    const auto dtype = static_cast<cuda::DType>(ctx->saved_data["dtype"].toInt());
    const int64_t nf = ctx->saved_data["nf"].toInt(), np = ctx->saved_data["np"].toInt();
    auto s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &o = s[3], &lse = s[4];
    std::vector<at::Tensor> feats(s.begin() + 5, s.begin() + 5 + nf);
    std::vector<at::Tensor> params(s.begin() + 5 + nf, s.begin() + 5 + nf + np);
    const cuda::CudaVariant &var = variant_for(e, dtype, q.size(3));
    const at::ScalarType dt = torch_dtype(dtype);

    Call c;
    c.dev.enc = e.name;
    fill_inputs(c, q, k, v, feats, params, scale, dtype);
    c.a.o = c.dev.upload(o, dt);
    c.a.lse = static_cast<float *>(c.dev.upload(lse, at::kFloat));
    c.a.dout = c.dev.upload(grad_outputs[0], dt);
    c.a.dq = c.dev.output(q, dt), c.a.dk = c.dev.output(k, dt), c.a.dv = c.dev.output(v, dt);
    for (const auto &f : feats) c.dfeats.push_back(static_cast<float *>(c.dev.output(f, at::kFloat)));
    for (const auto &p : params) c.dparams.push_back(static_cast<float *>(c.dev.output(p, at::kFloat)));
    c.a.dfeatures = c.dfeats.data(), c.a.dparams = c.dparams.data();
    uint32_t *status = static_cast<uint32_t *>(c.dev.alloc(sizeof(uint32_t)));
    check(e.name, cudaMemset(status, 0, sizeof(uint32_t)), "cudaMemset");
    c.a.status = status;
    check(e.name, var.backward(c.a), "backward");
    expect_clean(e.name);
    uint32_t st = 0;
    check(e.name, cudaMemcpy(&st, status, sizeof st, cudaMemcpyDeviceToHost), "status");
    if (st & cuda::kStatusErrors) fail(e.name, std::string("backward: ") + cuda::status_message(st));

    variable_list grads = {c.dev.download(c.a.dq, q.sizes(), dt, q.scalar_type()),
                           c.dev.download(c.a.dk, k.sizes(), dt, k.scalar_type()),
                           c.dev.download(c.a.dv, v.sizes(), dt, v.scalar_type())};
    for (size_t n = 0; n < feats.size(); ++n)
      grads.push_back(c.dev.download(c.dfeats[n], feats[n].sizes(), at::kFloat, feats[n].scalar_type()));
    for (int64_t n = 0; n < np; ++n)
      grads.push_back(ctx->needs_input_grad(3 + nf + n)
                          ? c.dev.download(c.dparams[n], params[n].sizes(), at::kFloat,
                                           params[n].scalar_type())
                          : at::Tensor());
    grads.emplace_back();
    grads.emplace_back();
    return grads;
  }
};

at::Tensor simt_attention(const KernelEntry &entry, const at::Tensor &q, const at::Tensor &k,
                          const at::Tensor &v, const std::vector<at::Tensor> &features,
                          const std::vector<at::Tensor> &params, double scale) {
  return SimtAttention::apply(q, k, v, at::TensorList(features), at::TensorList(params),
                              static_cast<int64_t>(reinterpret_cast<intptr_t>(&entry)), scale);
}

}  // namespace

void use_simt_kernels(const std::string &dtype) {
  cuda::DType t;
  if (dtype == "bf16") t = cuda::DType::BF16;
  else if (dtype == "f16") t = cuda::DType::F16;
  else if (dtype == "f32") t = cuda::DType::F32;
  else throw std::invalid_argument("emulated CUDA kernels: dtype '" + dtype + "' is not bf16, f16 or f32");
  g_dtype = static_cast<int>(t);
  set_attention_impl(&simt_attention);
}

void use_cpu_kernels() { set_attention_impl(nullptr); }

}  // namespace ape
