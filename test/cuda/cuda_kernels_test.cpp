// Numerics of the CUDA kernels (examples/encodings/*.mlir compiled by apec --emit=cuda; the
// encodings, dtypes and head dims of the build), through ape::cuda::cuda_kernel_registry(). One
// source, two programs (test/cuda/cuda_tests.cmake):
//   ape_simt_kernels_test  the kernels compiled by the host compiler and run by the SIMT emulator
//                          (-DAPE_SIMT; docs/cuda.md), with its memcheck, racecheck, initcheck and
//                          synccheck on every launch: runs everywhere;
//   ape_cuda_kernels_test  the nvcc-compiled kernels on a GPU (registered when one is present).
// Suites:
//   - CudaRegistry: every CUDA entry has a CPU twin with the same manifest, its counts and param
//     sizes agree with the manifest, an uninstantiated (dtype, head_dim) is refused;
//   - CudaKernel: every variant against the fp64 materialised reference (kernel_reference.h) and
//     the CPU fp32 kernel, forward and gradients (o, lse, dq, dk, dv, every feature and param
//     gradient), T = 1, partial tiles and several tiles, several batches and heads (many blocks);
//     bitwise determinism of two backward runs; one batch element computed alone equals the same
//     element inside a larger batch, bit for bit; the status word reports non-finite and
//     out-of-range gradient terms; null gradient pointers are refused;
//   - CudaLaunch: every variant launches under the shared-memory limit of every architecture
//     the kernels claim (sm_80, 86, 89, 90; emulator only: it can pose as each).
// Tolerances (measured under the emulator, which rounds as the hardware does: bf16/f16 products
// exact, f32 accumulation): f32 variants, max error against the fp64 reference <= 2x that of the
// CPU fp32 kernel (the same-precision baseline; for parameter gradients the larger of it and the
// fp32-rounded materialised attention's, whose exact sums of fp32 terms are the kernel's scheme)
// plus 1e-4 of the quantity's magnitude plus an absolute 2e-6 (kF32Floor), and against the CPU
// fp32 kernel 3x (fp32 on both sides, different summation orders). f16 / bf16 variants, FlashAttention's rule: max error
// against the fp64 reference <= 2x that of a same-precision materialised attention (the
// reference on inputs rounded to the dtype, rounding q', k', dS, P and o where a 16-bit flash
// kernel does: kernel_reference.h, RefRounding; outputs rounded) plus 1e-3 of the quantity's
// magnitude plus kF32Floor: the 16-bit kernels accumulate in fp32 too, which the materialised
// attention does not model (dP - Delta starts from -Delta in the tensor-core accumulator: at
// T = 1, where a distance bias's gradient is exactly 0, f16 at D = 128 leaves 2e-6).
//
// Shapes: q, k, v, o, dout [B, H, T, D]; lse, features [B, H, T]; params per manifest.
#include "kernel_reference.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <array>
#include <map>
#include <set>
#include <torch/torch.h>  // before the emulator's CUDA surface and its macros

#include <ape/contract/transition.h>
#include <ape/cuda/bwd_layouts.h>
#include <ape/cuda/decode.h>
#include <ape/cuda/kernel_entry.h>
#include <ape/cpu/kernel_entry.h>
#ifdef APE_SIMT
#include <ape/simt/runtime.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace ape {
const KernelEntry *const *kernel_registry(size_t *count);
namespace cuda {
APE_CUDA_ABI_BEGIN
const CudaKernelEntry *const *cuda_kernel_registry(size_t *count);
APE_CUDA_ABI_END
}
}  // namespace ape

namespace {

using ape::cuda::CudaAttnArgs;
using ape::cuda::CudaKernelEntry;
using ape::cuda::DType;
using torch::Tensor;

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);

// Absolute floor of the fp32 comparisons: a gradient that vanishes in exact arithmetic (at T = 1,
// dS = P (dP - Delta) = dO.v - dO.o = 0) is the cancellation of two fp32 dot products of D unit
// normal terms, so it carries noise of order sqrt(D) u |dO| |v| (u = 2^-24), about 1e-7..1e-6 for
// D <= 128, in either kernel.
constexpr double kF32Floor = 2e-6;

std::vector<const CudaKernelEntry *> cuda_entries() {
  size_t n = 0;
  const CudaKernelEntry *const *e = ape::cuda::cuda_kernel_registry(&n);
  return std::vector<const CudaKernelEntry *>(e, e + n);
}

const ape::KernelEntry *cpu_entry(const std::string &name) {
  size_t n = 0;
  const ape::KernelEntry *const *e = ape::kernel_registry(&n);
  for (size_t k = 0; k < n; ++k)
    if (e[k] && e[k]->name && name == e[k]->name) return e[k];
  return nullptr;
}

bool has_gpu() {  // the emulator is always there
  static const int devices = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
  }();
  return devices > 0;
}

torch::ScalarType torch_type(DType t) {
  return t == DType::F32 ? torch::kFloat32 : t == DType::F16 ? torch::kHalf : torch::kBFloat16;
}

// ---- manifest params ------------------------------------------------------------------------------
struct ParamInfo {
  std::string name;
  nlohmann::json shape, init;
  bool trainable = false;
};

std::vector<ParamInfo> manifest_params(const nlohmann::json &m) {
  std::vector<ParamInfo> out;
  for (const auto &p : m.at("params"))
    out.push_back({p.at("name"), p.at("shape"), p.at("init"), p.at("trainable")});
  return out;
}

std::vector<int64_t> resolve(const nlohmann::json &shape, int64_t H, int64_t D) {
  std::vector<int64_t> s;
  for (const auto &d : shape) {
    if (d.is_number()) s.push_back(d.get<int64_t>());
    else if (d == "heads") s.push_back(H);
    else if (d == "head_dim") s.push_back(D);
    else ADD_FAILURE() << "unknown shape symbol " << d;
  }
  return s;
}

// ---- one problem: fp64 master inputs ---------------------------------------------------------------
struct Problem {
  std::string enc;
  int64_t B = 0, H = 0, T = 0, D = 0;
  double scale = 0;
  bool deterministic = true;  // CudaAttnArgs::deterministic
  Tensor q, k, v, dout;
  std::vector<Tensor> features, params;
  std::vector<ParamInfo> pinfo;
};

Problem make_problem(const CudaKernelEntry &e, int64_t B, int64_t H, int64_t T, int64_t D,
                     uint64_t seed) {
  Problem p;
  p.enc = e.name, p.B = B, p.H = H, p.T = T, p.D = D;
  const auto m = nlohmann::json::parse(e.manifest_json);
  p.scale = m.at("scale").is_null() ? 1.0 / std::sqrt(double(D)) : m.at("scale").get<double>();
  torch::manual_seed(seed);
  p.q = torch::randn({B, H, T, D}, kF64), p.k = torch::randn({B, H, T, D}, kF64);
  p.v = torch::randn({B, H, T, D}, kF64), p.dout = torch::randn({B, H, T, D}, kF64);
  for (int n = 0; n < e.num_features; ++n) p.features.push_back(torch::randn({B, H, T}, kF64));
  p.pinfo = manifest_params(m);
  // The values every kernel suite uses (kernel_reference.h): biases large enough to matter in bf16,
  // trainable constants moved off their inits (KERPLE's p != a, FIRE's 512 L inside the sequence).
  for (const ParamInfo &info : p.pinfo) {
    const std::optional<double> value =
        info.init.contains("value") ? std::optional<double>(info.init.at("value").get<double>()) : std::nullopt;
    p.params.push_back(ape_test::test_param_values(info.name, info.init.at("kind"), value, info.trainable,
                                                   resolve(info.shape, H, D), H, T));
  }
  return p;
}

ape_test::RefInputs ref_inputs(const Problem &p) {
  ape_test::RefInputs in;
  // (k and v of fewer heads, grouped-query attention: repeated to every query head)
  const int64_t group = p.H / p.k.size(1);
  in.q = p.q, in.features = p.features, in.scale = p.scale;
  in.k = group > 1 ? p.k.repeat_interleave(group, 1) : p.k;
  in.v = group > 1 ? p.v.repeat_interleave(group, 1) : p.v;
  for (size_t n = 0; n < p.params.size(); ++n) {
    in.params[p.pinfo[n].name] = p.params[n];
    if (p.pinfo[n].trainable) in.trainable.push_back(p.pinfo[n].name);
  }
  return in;
}

// Every quantity of one run, fp64 on the host: o, lse, dq, dk, dv, dfeatures..., dparams...
using Outputs = std::vector<std::pair<std::string, Tensor>>;

Outputs from_reference(const Problem &p, const ape_test::RefOutputs &r) {
  Outputs out = {{"o", r.o}, {"lse", r.lse}, {"dq", r.dq}, {"dk", r.dk}, {"dv", r.dv}};
  for (size_t n = 0; n < r.dfeatures.size(); ++n)
    out.push_back({"dfeature" + std::to_string(n), r.dfeatures[n]});
  for (size_t n = 0; n < p.params.size(); ++n) {
    auto it = r.dparams.find(p.pinfo[n].name);
    out.push_back({"dparam:" + p.pinfo[n].name,
                   it != r.dparams.end() ? it->second : torch::zeros_like(p.params[n])});
  }
  return out;
}

// ---- the CPU fp32 kernel -----------------------------------------------------------------------------
Outputs run_cpu(const ape::KernelEntry &e, const Problem &p) {
  auto f = [](const Tensor &t) { return t.to(torch::kFloat32).contiguous().clone(); };
  Tensor q = f(p.q), k = f(p.k), v = f(p.v), dout = f(p.dout);
  Tensor o = torch::empty_like(q), lse = torch::empty({p.B, p.H, p.T}, torch::kFloat32);
  Tensor dq = torch::empty_like(q), dk = torch::empty_like(q), dv = torch::empty_like(q);
  std::vector<Tensor> feats, prms, dfeats, dprms;
  std::vector<const float *> fp, pp;
  std::vector<float *> dfp, dpp;
  for (const auto &t : p.features) feats.push_back(f(t)), dfeats.push_back(torch::empty_like(feats.back()));
  for (const auto &t : p.params) prms.push_back(f(t)), dprms.push_back(torch::empty_like(prms.back()));
  for (auto &t : feats) fp.push_back(t.data_ptr<float>());
  for (auto &t : prms) pp.push_back(t.data_ptr<float>());
  for (auto &t : dfeats) dfp.push_back(t.data_ptr<float>());
  for (auto &t : dprms) dpp.push_back(t.data_ptr<float>());
  ape::AttnArgs<float> a{};
  a.B = p.B, a.H = p.H, a.T = p.T, a.D = p.D;
  a.q = q.data_ptr<float>(), a.k = k.data_ptr<float>(), a.v = v.data_ptr<float>();
  a.o = o.data_ptr<float>(), a.lse = lse.data_ptr<float>();
  a.features = fp.data(), a.params = pp.data(), a.scale = static_cast<float>(p.scale);
  a.dout = dout.data_ptr<float>();
  a.dq = dq.data_ptr<float>(), a.dk = dk.data_ptr<float>(), a.dv = dv.data_ptr<float>();
  a.dfeatures = dfp.data(), a.dparams = dpp.data();
  e.forward_f32(a);
  e.backward_f32(a);
  Outputs out = {{"o", o}, {"lse", lse}, {"dq", dq}, {"dk", dk}, {"dv", dv}};
  for (size_t n = 0; n < dfeats.size(); ++n) out.push_back({"dfeature" + std::to_string(n), dfeats[n]});
  for (size_t n = 0; n < dprms.size(); ++n) out.push_back({"dparam:" + p.pinfo[n].name, dprms[n]});
  for (auto &[name, t] : out) t = t.to(torch::kFloat64);
  return out;
}

// ---- the CUDA kernel ---------------------------------------------------------------------------------
struct DevBuf {
  void *ptr = nullptr;
  DevBuf() = default;
  DevBuf(const DevBuf &) = delete;
  DevBuf(DevBuf &&o) noexcept : ptr(o.ptr) { o.ptr = nullptr; }
  ~DevBuf() { cudaFree(ptr); }
};

#define ASSERT_CUDA(call)                                                      \
  do {                                                                         \
    const cudaError_t err_ = (call);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #call << ": " << cudaGetErrorString(err_); \
  } while (0)

void upload(DevBuf &b, const Tensor &host) {
  const Tensor t = host.contiguous();
  const size_t bytes = t.numel() * t.element_size();
  ASSERT_EQ(cudaMalloc(&b.ptr, bytes + 16), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(b.ptr, t.data_ptr(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
}

Tensor download(const DevBuf &b, const Tensor &like) {
  Tensor t = torch::empty_like(like).contiguous();
  EXPECT_EQ(cudaMemcpy(t.data_ptr(), b.ptr, t.numel() * t.element_size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return t;
}

// Under the emulator: nothing its checks found since the last call.
void expect_no_findings() {
#ifdef APE_SIMT
  for (const auto &f : ape::simt::take_findings())
    ADD_FAILURE() << "emulator " << ape::simt::check_name(f.check) << ": " << f.kernel << ": "
                  << f.message;
#endif
}

// One forward + backward of a CUDA variant; outputs in the order of from_reference. The status
// word goes to *status_out when given, else it must hold no error.
// What run_gpu runs beyond the forward of every row: the backward (not for an inference-only
// encoding), and the forward's layer of a model (an attention transition's).
struct RunOptions {
  bool backward = true;
  int64_t layer = 0, num_layers = 0;
  const ape::cuda::CudaScratchAllocator *scratch = nullptr;  // CudaAttnArgs::scratch
  int num_splits = 0;  // the forward's CudaAttnArgs::num_splits
  uint32_t *status_record = nullptr;  // the backward's CudaAttnArgs::status_record (device memory)
};

void run_gpu(const ape::cuda::CudaVariant &var, const Problem &p, Outputs &out,
             uint32_t *status_out = nullptr, RunOptions opt = {}) {
  const auto dt = torch_type(var.dtype);
  const Tensor q = p.q.to(dt), k = p.k.to(dt), v = p.v.to(dt), dout = p.dout.to(dt);
  const Tensor lse_like = torch::empty({p.B, p.H, p.T}, torch::kFloat32);
  DevBuf dq_, dk_, dv_, do_, o_, lse_, qd, kd, vd;
  upload(qd, q), upload(kd, k), upload(vd, v), upload(do_, dout);
  upload(o_, torch::zeros_like(q)), upload(dq_, torch::zeros_like(q));
  upload(dk_, torch::zeros_like(k)), upload(dv_, torch::zeros_like(v));  // (k, v of kv_heads heads)
  upload(lse_, torch::zeros_like(lse_like));
  std::vector<DevBuf> feats(p.features.size()), dfeats(p.features.size()), prms(p.params.size()),
      dprms(p.params.size());
  std::vector<const float *> fp, pp;
  std::vector<float *> dfp, dpp;
  for (size_t n = 0; n < p.features.size(); ++n) {
    upload(feats[n], p.features[n].to(torch::kFloat32));
    upload(dfeats[n], torch::full_like(p.features[n].to(torch::kFloat32), NAN));
    fp.push_back(static_cast<const float *>(feats[n].ptr));
    dfp.push_back(static_cast<float *>(dfeats[n].ptr));
  }
  for (size_t n = 0; n < p.params.size(); ++n) {
    upload(prms[n], p.params[n].to(torch::kFloat32));
    upload(dprms[n], torch::full_like(p.params[n].to(torch::kFloat32), NAN));
    pp.push_back(static_cast<const float *>(prms[n].ptr));
    dpp.push_back(static_cast<float *>(dprms[n].ptr));
  }
  CudaAttnArgs a;
  a.B = p.B, a.H = p.H, a.T = p.T, a.D = p.D, a.dtype = var.dtype;
  a.q = qd.ptr, a.k = kd.ptr, a.v = vd.ptr, a.o = o_.ptr, a.lse = static_cast<float *>(lse_.ptr);
  a.features = fp.data(), a.params = pp.data(), a.scale = static_cast<float>(p.scale);
  a.dout = do_.ptr, a.dq = dq_.ptr, a.dk = dk_.ptr, a.dv = dv_.ptr;
  a.dfeatures = dfp.data(), a.dparams = dpp.data();
  DevBuf status;
  upload(status, torch::zeros({1}, torch::kInt32));
  a.status = static_cast<uint32_t *>(status.ptr);
  a.layer = opt.layer, a.num_layers = opt.num_layers;
  a.deterministic = p.deterministic;
  a.kv_heads = p.k.size(1) == p.H ? 0 : p.k.size(1);  // grouped-query attention (k, v of fewer heads)
  a.scratch = opt.scratch;
  a.num_splits = opt.num_splits;
  a.status_record = opt.status_record;
  ASSERT_CUDA(var.forward(a));
  a.num_splits = 0;  // (forward only)
  if (opt.backward) ASSERT_CUDA(var.backward(a));
  ASSERT_CUDA(cudaDeviceSynchronize());
  uint32_t st = 0;
  ASSERT_CUDA(cudaMemcpy(&st, status.ptr, sizeof st, cudaMemcpyDeviceToHost));
  if (status_out) *status_out = st;
  else EXPECT_EQ(st & ape::cuda::kStatusErrors, 0u) << ape::cuda::status_message(st);
  expect_no_findings();
  auto f64 = [](const Tensor &t) { return t.to(torch::kFloat64); };
  out = {{"o", f64(download(o_, q))},   {"lse", f64(download(lse_, lse_like))},
         {"dq", f64(download(dq_, q))}, {"dk", f64(download(dk_, k))},
         {"dv", f64(download(dv_, v))}};
  for (size_t n = 0; n < dfeats.size(); ++n)
    out.push_back({"dfeature" + std::to_string(n),
                   f64(download(dfeats[n], p.features[n].to(torch::kFloat32)))});
  for (size_t n = 0; n < dprms.size(); ++n)
    out.push_back({"dparam:" + p.pinfo[n].name, f64(download(dprms[n], p.params[n].to(torch::kFloat32)))});
}

double max_abs(const Tensor &t) { return t.numel() ? t.abs().max().item<double>() : 0.0; }
double max_err(const Tensor &a, const Tensor &b) {
  // -inf lse (a row without finite logits) equals -inf.
  const Tensor both_inf = torch::isinf(a) & torch::isinf(b) & (a == b);
  return a.numel() ? torch::where(both_inf, torch::zeros_like(a), a - b).abs().max().item<double>()
                   : 0.0;
}

// ---- registry checks (no GPU) ------------------------------------------------------------------------
TEST(CudaRegistry, EveryEntryHasItsCpuTwinAndManifest) {
  const auto entries = cuda_entries();
  ASSERT_FALSE(entries.empty());
  for (const CudaKernelEntry *e : entries) {
    ASSERT_NE(e, nullptr);
    SCOPED_TRACE(e->name);
    const ape::KernelEntry *cpu = cpu_entry(e->name);
    ASSERT_NE(cpu, nullptr) << "no CPU kernel of the same name";
    EXPECT_STREQ(e->manifest_json, cpu->manifest_json);
    const auto m = nlohmann::json::parse(e->manifest_json);
    EXPECT_EQ(m.at("encoding").get<std::string>(), e->name);
    EXPECT_EQ(e->num_features, static_cast<int>(m.at("features").size()));
    ASSERT_EQ(e->num_params, static_cast<int>(m.at("params").size()));
    const auto params = manifest_params(m);
    for (int n = 0; n < e->num_params; ++n) {
      int64_t numel = 1;
      for (int64_t d : resolve(params[n].shape, 5, 64)) numel *= d;
      EXPECT_EQ(e->param_numel(n, 5, 64), numel) << params[n].name;
    }
    ASSERT_GT(e->num_variants, 0u);
    for (size_t k = 0; k < e->num_variants; ++k) {
      const auto &v = e->variants[k];
      EXPECT_TRUE(v.forward && v.backward);
      EXPECT_TRUE(v.head_dim == 32 || v.head_dim == 64 || v.head_dim == 128);
      EXPECT_EQ(ape::cuda::find_variant(*e, v.dtype, v.head_dim), &v);
    }
  }
}

// What the variant says of a call's arguments (CudaVariant::refusal): "" where they pass.
std::string refused(const ape::cuda::CudaVariant &var, const CudaAttnArgs &a, bool backward) {
  const char *why = var.refusal ? var.refusal(a, backward) : "(no refusal function)";
  return why ? why : "";
}

TEST(CudaRegistry, UninstantiatedVariantIsRefused) {
  for (const CudaKernelEntry *e : cuda_entries()) {
    CudaAttnArgs a;
    a.D = 48;  // never instantiated
    EXPECT_EQ(ape::cuda::forward(*e, a), cudaErrorInvalidValue) << e->name;
    EXPECT_EQ(ape::cuda::backward(*e, a), cudaErrorInvalidValue) << e->name;
    const char *why = ape::cuda::refusal(*e, a, false);
    EXPECT_STREQ(why ? why : "", "this build has no variant of that dtype and head dim (D)") << e->name;
  }
}

// Sizes before any device call: an empty call succeeds without reading a pointer, except the
// param gradients an empty backward zeroes (it read params and dparams of an encoding with
// params: SIGSEGV with null ones); sizes whose element count overflows int64 are refused (2^32 x
// 2^32 x 16 wrapped to an "empty" call that succeeded).
TEST(CudaArgs, EmptyAndOverflowingSizes) {
  for (const CudaKernelEntry *e : cuda_entries())
    for (size_t k = 0; k < e->num_variants; ++k) {
      const auto &var = e->variants[k];
      CudaAttnArgs a;
      a.D = var.head_dim, a.dtype = var.dtype, a.B = 1, a.H = 2, a.T = 0, a.scale = 0.125f;
      EXPECT_EQ(var.forward(a), cudaSuccess) << e->name;
      bool zeroes = false;  // a param gradient to zero: the call needs dparams
      for (int n = 0; n < e->num_params; ++n) zeroes |= e->param_numel(n, a.H, a.D) > 0;
      const bool training = !nlohmann::json::parse(e->manifest_json).value("inference_only", false);
      if (training) EXPECT_EQ(var.backward(a), zeroes ? cudaErrorInvalidValue : cudaSuccess) << e->name;
      a.T = 16;
      for (int64_t big : {int64_t(1) << 32, int64_t(1) << 31}) {
        a.B = a.H = big;
        EXPECT_EQ(var.forward(a), cudaErrorInvalidValue) << e->name << " B = H = " << big;
      }
      a.B = a.H = int64_t(1) << 30, a.T = int64_t(1) << 30;
      EXPECT_EQ(var.forward(a), cudaErrorInvalidValue) << e->name << " 2^90 elements";
      EXPECT_EQ(refused(var, a, false), "B·H is 2^31 slices or more") << e->name;
      // B·H slices at most 2^31 - 1 (a grid's x; 2^31 of one token each fit int64 elements).
      a.B = int64_t(1) << 16, a.H = int64_t(1) << 15, a.T = 1;
      EXPECT_EQ(var.forward(a), cudaErrorInvalidValue) << e->name << " 2^31 slices";
      EXPECT_EQ(refused(var, a, false), "B·H is 2^31 slices or more") << e->name;
      a.B = 1, a.H = 2, a.T = 16;
      for (float bad : {NAN, 1e-30f, -1e-37f}) {  // (B / scale overflowed float: NaN in bf16)
        a.scale = bad;
        EXPECT_EQ(refused(var, a, false), "scale is not finite, nor 0 or at least 2^-64 in magnitude")
            << e->name << " " << bad;
      }
    }
}

// ---- numerics (GPU) ------------------------------------------------------------------------------------
using Case = std::tuple<std::string, size_t>;  // encoding, variant index

// An inference-only encoding (an attention transition): a forward, no backward.
bool inference_only(const CudaKernelEntry &e) {
  return nlohmann::json::parse(e.manifest_json).value("inference_only", false);
}

// The trainable encodings' variants (the inference-only ones have CudaTransition below).
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const CudaKernelEntry *e : cuda_entries())
    if (!inference_only(*e))
      for (size_t k = 0; k < e->num_variants; ++k) cases.push_back({e->name, k});
  return cases;
}

const CudaKernelEntry *find_cuda(const std::string &name) {
  for (const CudaKernelEntry *e : cuda_entries())
    if (name == e->name) return e;
  return nullptr;
}

class CudaKernel : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!has_gpu())
      GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount): ape_simt_kernels_test runs these "
                      "kernels under the emulator";
  }
};

// One problem through a CUDA variant against the references: the fp64 materialised attention,
// with same-precision baselines (the CPU fp32 kernel, the fp32 materialised attention). Every
// encoding the suite runs has that reference: the CPU kernel alone, from the same spec and code
// generator, would be no independent one.
void check_problem(const std::string &name, const ape::cuda::CudaVariant &var, const Problem &p,
                   const RunOptions &opt = {}) {
  const auto &known = ape_test::reference_encodings();
  const bool has_ref = std::find(known.begin(), known.end(), name) != known.end();
  ASSERT_TRUE(has_ref) << name << " has no independent reference (test/unit/kernel_reference.cpp)";
  const ape::KernelEntry *cpu = cpu_entry(name);
  ASSERT_NE(cpu, nullptr);
  Outputs gpu;
  run_gpu(var, p, gpu, nullptr, opt);
  if (::testing::Test::HasFatalFailure()) return;
  const Outputs cpu_out = run_cpu(*cpu, p);
  Outputs ref, lowp, lowp_own_o;
  if (has_ref) {
    ref = from_reference(p, ape_test::reference_attention(name, ref_inputs(p), p.dout));
    if (var.dtype == DType::F32 && !p.params.empty()) {
      // The kernel's parameter gradients are exact (fixed-point) sums of fp32 terms
      // dS_ij (times the bias's derivative): the same-precision materialised attention that
      // rounds q', k', the logits, P, dS and o to fp32 and sums in fp64 is that scheme, so its
      // error is the parameter gradients' second baseline (as for 16-bit kernels, one
      // sample of a sum's rounding noise is not enough; a gradient that is exactly 0, such
      // as FIRE's per-head b2 under softmax's shift invariance, is nothing but that noise).
      lowp = from_reference(
          p, ape_test::reference_attention(name, ref_inputs(p), p.dout, {torch::kFloat32}));
      lowp_own_o = from_reference(
          p, ape_test::reference_attention(name, ref_inputs(p), p.dout,
                                           {torch::kFloat32, gpu[0].second}));
    }
    if (var.dtype != DType::F32) {
      // Same-precision materialised attention: inputs rounded to the dtype, and the reference
      // rounding where a 16-bit flash kernel does (kernel_reference.h, RefRounding), outputs
      // rounded.
      Problem r = p;
      const auto dt = torch_type(var.dtype);
      auto rnd = [&](const Tensor &t) { return t.to(dt).to(torch::kFloat64); };
      r.q = rnd(p.q), r.k = rnd(p.k), r.v = rnd(p.v), r.dout = rnd(p.dout);
      for (auto &t : r.features) t = t.to(torch::kFloat32).to(torch::kFloat64);
      for (auto &t : r.params) t = t.to(torch::kFloat32).to(torch::kFloat64);
      lowp = from_reference(
          p, ape_test::reference_attention(name, ref_inputs(r), r.dout, {torch_type(var.dtype)}));
      for (size_t n = 0; n < 5; ++n) lowp[n].second = n == 1 ? lowp[n].second : rnd(lowp[n].second);
      // Parameter gradients sum P (dP - Delta) times the bias's derivative over B·H·T·T
      // elements; their same-precision error is dominated by the rounding of o in Delta
      // (Delta_i = dO_i . o_i misses sum_j P_ij dP_ij by about 2^-8 |dO_i| |o_i| in bf16),
      // weighted by the derivative (for ALiBi's slope the distance i - j, up to T). That error
      // is one sample of a sum of ~T rounding terms, so a second same-precision backward that
      // reads the kernel's own rounded o (which the kernel's backward reads) is an equally
      // valid baseline; parameter gradients are held to the larger of the two.
      lowp_own_o = from_reference(
          p, ape_test::reference_attention(name, ref_inputs(r), r.dout,
                                           {torch_type(var.dtype), gpu[0].second}));
    }
  }
  ASSERT_EQ(gpu.size(), cpu_out.size());
  for (size_t n = 0; n < gpu.size(); ++n) {
    const std::string &what = gpu[n].first;
    const Tensor &g = gpu[n].second;
    EXPECT_FALSE(torch::isnan(g).any().item<bool>()) << what << " has NaN (not written?)";
    const double mag = std::max(1e-3, max_abs(cpu_out[n].second));
    if (var.dtype == DType::F32) {
      // The same-precision baseline of fp32 is the CPU fp32 kernel's own error against the
      // fp64 reference (parameter gradients are sums over B·H·T·T terms, whose fp32 error
      // can exceed any fixed floor); at most twice it, plus 1e-4 relative and the floor.
      const double base = has_ref ? max_err(cpu_out[n].second, ref[n].second) : 0.0;
      EXPECT_LE(max_err(g, cpu_out[n].second), 3 * base + 1e-4 * mag + kF32Floor)
          << what << " vs the CPU fp32 kernel (whose error against the reference is " << base << ")";
      double ref_base = base;
      if (has_ref && what.rfind("dparam:", 0) == 0 && !lowp.empty())
        ref_base = std::max({base, max_err(lowp[n].second, ref[n].second),
                             max_err(lowp_own_o[n].second, ref[n].second)});
      if (has_ref)
        EXPECT_LE(max_err(g, ref[n].second), 2 * ref_base + 1e-4 * mag + kF32Floor)
            << what << " vs the reference (same-precision baselines: the CPU fp32 kernel's error "
            << base << ", the larger with the fp32 materialised attention " << ref_base << ")";
    } else {
      const double err = max_err(g, ref[n].second);
      double base = max_err(lowp[n].second, ref[n].second);
      if (what.rfind("dparam:", 0) == 0)
        base = std::max(base, max_err(lowp_own_o[n].second, ref[n].second));
      EXPECT_LE(err, 2 * base + 1e-3 * mag + kF32Floor)
          << what << ": kernel error " << err << ", same-precision materialised error " << base;
    }
  }
}

TEST_P(CudaKernel, MatchesReferencesForwardAndGradients) {
  const auto &[name, index] = GetParam();
  const CudaKernelEntry *e = find_cuda(name);
  ASSERT_NE(e, nullptr);
  const auto &var = e->variants[index];
  for (auto [B, H, T] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {2, 3, 77}, {1, 2, 130},
                         {2, 1, 257}}) {
    SCOPED_TRACE(std::string(ape::cuda::dtype_name(var.dtype)) + " D=" +
                 std::to_string(var.head_dim) + " B=" + std::to_string(B) + " H=" +
                 std::to_string(H) + " T=" + std::to_string(T));
    check_problem(name, var, make_problem(*e, B, H, T, var.head_dim, 1000 * T + 10 * B + H));
    if (HasFatalFailure()) return;
  }
}

// The sm_90a paths that are off by default asked for while in scope: the flash backward's wgmma
// layout (APE_CUDA_WGMMA_BACKWARD=1), the Hopper forward's turns (APE_CUDA_PINGPONG=1) and its
// persistent grid (APE_CUDA_PERSISTENT=1).
// Environment variables set while one lives, then as they were (unset, or their old values).
struct EnvScope {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  explicit EnvScope(std::initializer_list<std::pair<const char *, const char *>> vars) {
    for (const auto &[name, value] : vars) {
      const char *old = std::getenv(name);
      saved.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      setenv(name, value, 1);
    }
  }
  ~EnvScope() {
    for (const auto &[name, old] : saved)
      if (old) setenv(name.c_str(), old->c_str(), 1);
      else unsetenv(name.c_str());
  }
};
struct HopperOptIns : EnvScope {
  HopperOptIns()
      : EnvScope({{"APE_CUDA_WGMMA_BACKWARD", "1"}, {"APE_CUDA_PINGPONG", "1"}, {"APE_CUDA_PERSISTENT", "1"}}) {}
};

#ifdef APE_SIMT
// The emulator poses as an sm_XX device while one lives (then as what it was).
struct PoseAs {
  int saved = ape::simt::arch();
  explicit PoseAs(int sm) { ape::simt::set_arch(sm); }
  ~PoseAs() { ape::simt::set_arch(saved); }
};
struct PoseAsSm90 : PoseAs {
  PoseAsSm90() : PoseAs(90) {}
};
// The emulated device reports `n` multiprocessors while one lives (then its architecture's).
struct PoseWithSms {
  explicit PoseWithSms(int n) { ape::simt::set_sm_count(n); }
  ~PoseWithSms() { ape::simt::set_sm_count(0); }
};

// The layouts of the flash backward (BwdTiles) that the launches since the last call ran, by the
// emulator's traffic records (those given, or taken now): "wide" (128 keys per block), "narrow"
// (64), "wgmma" (128 keys on sm_90a's wgmma), "wide_sub" (the wide layout's 128 keys in steps of
// 64 queries formed in sub-tiles of 32), "wide_tma" (the wide layout with dQ' by TMA reductions),
// "square" (FlashAttention-2's tiling of the products), "square_tma" (the same with dQ' by TMA
// reductions), one entry per launch.
template <class Records = decltype(ape::simt::take_traffic())>
std::vector<std::string> flash_backward_layouts(const Records &records = ape::simt::take_traffic()) {
  std::vector<std::string> out;
  for (const auto &t : records)
    if (t.kernel.find("flash_backward_kernel<") != std::string::npos) {
      const size_t close = t.kernel.find(">(");
      const std::string args = t.kernel.substr(0, close);
      // Its last template argument, the layout's id (cuda/bwd_layouts.h).
      const char d = args.size() >= 3 && args.compare(args.size() - 3, 2, ", ") == 0 ? args.back() : '?';
      const char *layout = d >= '0' && d <= '9' ? ape::cuda::detail::bwd_layout_name(d - '0') : nullptr;
      for (size_t n = 0; n < t.launches; ++n) out.push_back(layout ? std::string(layout) : "unknown: " + t.kernel);
    }
  return out;
}

// Runs `name`'s bf16 variants at D 64 and 128 (one slice, T 70) as each architecture the kernels
// claim, calling check(D, sm) after each run (the emulator's traffic records hold its launches);
// returns how many ran.
template <class Check> int run_as_each_arch(const char *name, Check check) {
  const CudaKernelEntry *e = find_cuda(name);
  if (!e) {
    ADD_FAILURE() << name << " is not in the emulated build";
    return 0;
  }
  int seen = 0;
  for (int D : {64, 128}) {
    const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, DType::BF16, D);
    if (!var) continue;
    for (int sm : {80, 86, 89, 90}) {
      SCOPED_TRACE(std::string(name) + " bf16 hd" + std::to_string(D) + " sm_" + std::to_string(sm));
      const PoseAs guard(sm);
      Outputs out;
      ape::simt::take_traffic();
      run_gpu(*var, make_problem(*e, 1, 1, 70, D, 3), out);
      check(D, sm);
      ++seen;
    }
  }
  return seen;
}

// The device picks the flash backward's layout: the wgmma one at D = 64 and 128 on sm_90 (its
// default there), else the wide one (128 keys, 8 warps) wherever its shared memory fits a block, the narrow
// one (64 keys) at D = 128 on sm_86/89 (99 KiB a block).
TEST(CudaLaunch, FlashBackwardLayoutFollowsTheDevice) {
  const int seen = run_as_each_arch("rope", [](int D, int sm) {
    const bool narrow = D == 128 && (sm == 86 || sm == 89);
    const char *want = sm == 90 ? "wgmma" : narrow ? "narrow" : "wide";
    EXPECT_EQ(flash_backward_layouts(), std::vector<std::string>{want});
  });
  EXPECT_EQ(seen, 8) << "rope's bf16 variants at D 64 and 128 are in the emulated build";
}

// The kernels with value rows (Shaw) follow the device too: the flash forward (the masses after its
// tiles) where they fit a block, the general forward at D = 128 on sm_86/89 (99 KiB); the flash
// backward (the step's masses after its tiles) in the wide layout where it fits, the narrow one
// on sm_86/89 at D = 64 and 128 (the wide one needs 114 and 121 KiB there), the wgmma one on
// sm_90.
TEST(CudaLaunch, ValueRowsFollowTheDevice) {
  const int seen = run_as_each_arch("shaw", [](int D, int sm) {
    const auto records = ape::simt::take_traffic();
    const bool small = sm == 86 || sm == 89;
    const char *backward = sm == 90 ? "wgmma" : small ? "narrow" : "wide";  // (sm_90's default)
    EXPECT_EQ(flash_backward_layouts(records), std::vector<std::string>{backward});
    std::vector<std::string> forwards;
    for (const auto &t : records) {
      std::string name = t.kernel.substr(0, t.kernel.find('<'));  // "... ns::kernel_name"
      name = name.substr(name.find_last_of(": ") + 1);
      if (name == "flash_forward_kernel" || name == "forward_kernel" || name == "hopper_forward_kernel")
        forwards.push_back(name);
    }
    const bool general = D == 128 && small;
    EXPECT_EQ(forwards, std::vector<std::string>{general ? "forward_kernel" : "flash_forward_kernel"});
  });
  EXPECT_EQ(seen, 8) << "shaw's bf16 variants at D 64 and 128 are in the emulated build";
}

// The same through the sm_90 path with every wgmma kernel: the emulator poses as an H100 of two
// multiprocessors, so the 16-bit forward runs hopper_forward_kernel on its persistent grid
// (APE_CUDA_PERSISTENT=1: two blocks, each claiming further tiles where there are more than two,
// the ring of key tiles running on across a block's tiles), its consumers taking turns
// (APE_CUDA_PINGPONG=1: the named barriers' rounds counted), and, with APE_CUDA_WGMMA_BACKWARD=1,
// the 16-bit backward
// at D 64 and 128 the flash backward's wgmma layout (checked from the launches; f32 and D 32 run
// the kernels of sm_80, here under sm_90's limits; the mma.sync backward and the forward without
// turns at sm_90: Sm90MmaSyncBackwardMatchesReferences). Sizes: one row, partial tiles, several
// query and key tiles of 128, partial and whole (at T 384 every warp's rows of the last query
// tile are real rows: a buffer one of them released too early shows, since the emulator runs the
// threads an mbarrier's phase wakes before the thread that completed it, docs/cuda.md).
TEST_P(CudaKernel, Sm90PathMatchesReferences) {
  const auto &[name, index] = GetParam();
  const CudaKernelEntry *e = find_cuda(name);
  ASSERT_NE(e, nullptr);
  const auto &var = e->variants[index];
  const PoseAsSm90 guard;
  const PoseWithSms two_sms(2);
  const HopperOptIns opt_ins;
  ape::simt::take_traffic();
  for (auto [B, H, T] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {2, 3, 77}, {1, 2, 300}, {1, 1, 384}}) {
    SCOPED_TRACE(std::string(ape::cuda::dtype_name(var.dtype)) + " D=" +
                 std::to_string(var.head_dim) + " B=" + std::to_string(B) + " H=" +
                 std::to_string(H) + " T=" + std::to_string(T) + " sm_90");
    check_problem(name, var, make_problem(*e, B, H, T, var.head_dim, 7000 * T + 10 * B + H));
    if (HasFatalFailure()) return;
  }
  const auto records = ape::simt::take_traffic();
  size_t hopper = 0, rounds = 0, blocks = 0;
  for (const auto &t : records)
    if (t.kernel.find("hopper_forward_kernel<") != std::string::npos)
      hopper += t.launches, rounds += t.named_rounds[1] + t.named_rounds[2], blocks += t.blocks;
  // A query tile of n key tiles takes n - 1 turns per consumer (one round of each barrier per
  // turn): at T = 300, query tiles 0, 1, 2 of both slices, 2 (0 + 1 + 2) x 2 = 12 rounds, at T = 384
  // of one slice 6; T <= 128: none. Blocks: 1 for the one tile at T = 1, then 2 (of 6 or 3 tiles)
  // at each other size.
  // Every 16-bit variant's forward runs it here (unsplit at these sizes on two multiprocessors),
  // except with value rows (Shaw's: launch.cuh keeps them on the FlashAttention-2-class forward).
  const bool expect_hopper = var.dtype != DType::F32 && name != "shaw";
  EXPECT_EQ(hopper > 0, expect_hopper) << "hopper_forward_kernel launches: " << hopper;
  if (expect_hopper) {
    EXPECT_EQ(rounds, 18u) << "the consumers took turns";
    EXPECT_EQ(blocks, 7u) << "a block per multiprocessor, claiming the other tiles";
  }
  const std::vector<std::string> layouts = flash_backward_layouts(records);
  const bool wg = var.dtype != DType::F32 && var.head_dim >= 64;
  EXPECT_EQ(layouts.size(), var.dtype == DType::F32 ? 0u : 4u) << "a flash backward per size";
  for (const std::string &layout : layouts) EXPECT_EQ(layout, wg ? "wgmma" : "wide");
}

// APE_CUDA_HOPPER_FORWARD=0 runs the FlashAttention-2-class forward on sm_90 (the GPU check times
// both per head dim): the forward kernel each setting launches, and the references with it; and
// the Hopper forward with K' released together with V (APE_CUDA_KV_SPLIT=0: the GPU check times
// it against the separate K and V pipelines), with and without the turns and the persistent grid.
TEST(CudaLaunch, HopperForwardSwitch) {
  const PoseAsSm90 guard;
  const CudaKernelEntry *e = find_cuda("rope");
  ASSERT_NE(e, nullptr);
  const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, DType::BF16, 64);
  ASSERT_NE(var, nullptr) << "rope bf16/hd64 is in the emulated build";
  for (const char *setting : {"1", "0"}) {
    SCOPED_TRACE(std::string("APE_CUDA_HOPPER_FORWARD=") + setting);
    const EnvScope forward({{"APE_CUDA_HOPPER_FORWARD", setting}, {"APE_CUDA_PINGPONG", "0"}});
    ape::simt::take_traffic();
    check_problem("rope", *var, make_problem(*e, 2, 3, 77, 64, 9300));
    if (HasFatalFailure()) return;
    int hopper = 0, flash = 0;
    for (const auto &t : ape::simt::take_traffic()) {
      if (t.kernel.find("hopper_forward_kernel<") != std::string::npos)
        EXPECT_EQ(t.named_rounds[1] + t.named_rounds[2], 0u) << "no turns with APE_CUDA_PINGPONG=0";
      hopper += t.kernel.find("hopper_forward_kernel<") != std::string::npos ? static_cast<int>(t.launches) : 0;
      flash += t.kernel.find("flash_forward_kernel<") != std::string::npos ? static_cast<int>(t.launches) : 0;
    }
    EXPECT_GT(setting[0] == '1' ? hopper : flash, 0);
    EXPECT_EQ(setting[0] == '1' ? flash : hopper, 0);
  }
  for (const char *fa3 : {"0", "1"}) {
    SCOPED_TRACE(std::string("APE_CUDA_KV_SPLIT=0, APE_CUDA_PINGPONG=APE_CUDA_PERSISTENT=") + fa3);
    const EnvScope shared({{"APE_CUDA_KV_SPLIT", "0"}, {"APE_CUDA_PINGPONG", fa3}, {"APE_CUDA_PERSISTENT", fa3}});
    const PoseWithSms sms(2);  // with the persistent grid a block claims several tiles: the ring runs on
    check_problem("rope", *var, make_problem(*e, 2, 3, 300, 64, 9301));
    if (HasFatalFailure()) return;
  }
}

// The Hopper forward with three consumer warpgroups (APE_CUDA_HOPPER_CONSUMERS=3: query tiles of
// 192 rows at d_h <= 64; the GPU check times it beside the default two) against the references, with
// the turns and the persistent grid, through each of its paths: no score mod, a q/k mod, a
// trainable distance bias, row/column biases, a score mod over features; and against the two
// consumers' forward within rounding (o within a bf16 ulp, lse within 2^-20 relative: a row sees
// its key tiles in the same order, plus at most one fully masked one). One tile, partial tiles,
// several query and key tiles; the three barriers' rounds of the turns counted.
TEST(CudaLaunch, HopperThreeConsumersMatchReferences) {
  const PoseAsSm90 guard;
  const PoseWithSms two_sms(2);
  const HopperOptIns opt_ins;
  int checked = 0;
  for (auto [name, D] : {std::pair<const char *, int>{"nope", 64}, {"rope", 64}, {"alibi", 64}, {"cable", 64},
                         {"kcable", 64}, {"rope", 32}}) {
    const CudaKernelEntry *e = find_cuda(name);
    ASSERT_NE(e, nullptr) << name;
    const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, DType::BF16, D);
    if (!var) continue;
    size_t rounds = 0, blocks = 0, launches = 0;
    for (auto [B, H, T] : {std::tuple<int64_t, int64_t, int64_t>{2, 3, 77}, {1, 2, 300}, {1, 1, 384}}) {
      SCOPED_TRACE(std::string(name) + " bf16 D=" + std::to_string(D) + " B=" + std::to_string(B) + " H=" +
                   std::to_string(H) + " T=" + std::to_string(T) + " sm_90, three consumers");
      const Problem prob = make_problem(*e, B, H, T, D, 9400 + T);
      Outputs two;
      {
        const EnvScope cons({{"APE_CUDA_HOPPER_CONSUMERS", "2"}});
        run_gpu(*var, prob, two, nullptr, RunOptions{false});
      }
      if (HasFatalFailure()) return;
      const EnvScope cons({{"APE_CUDA_HOPPER_CONSUMERS", "3"}});
      ape::simt::take_traffic();
      check_problem(name, *var, prob);
      if (HasFatalFailure()) return;
      for (const auto &t : ape::simt::take_traffic())
        if (t.kernel.find("hopper_forward_kernel<") != std::string::npos) {
          EXPECT_NE(t.kernel.find(", 3>"), std::string::npos) << t.kernel;
          launches += t.launches, blocks += t.blocks;
          rounds += t.named_rounds[1] + t.named_rounds[2] + t.named_rounds[3];
        }
      Outputs three;
      run_gpu(*var, prob, three, nullptr, RunOptions{false});
      if (HasFatalFailure()) return;
      // o and lse within rounding of the two consumers' (a row of a 192-row tile may see one more,
      // fully masked, key tile: its rescaling by exp2 of the max's rounding moves l by an ulp).
      for (size_t n = 0; n < 2; ++n) {
        const double big = three[n].second.abs().max().item<double>();
        EXPECT_LE(max_err(three[n].second, two[n].second), (n == 0 ? 0x1p-8 : 0x1p-20) * std::max(big, 1.0))
            << three[n].first << " against the two consumers' forward";
      }
    }
    // Query tiles of 192 rows: T 77, one tile (no turns); T 300, tiles of 2 and 3 key tiles, 3 x (1 + 2)
    // rounds per slice, 2 slices; T 384 the same in one slice: 27. Blocks: 2 (of 6 tiles), 2 (of 4),
    // 2 (of 2: a block per tile).
    EXPECT_EQ(launches, 3u) << name;
    EXPECT_EQ(rounds, 27u) << name << ": the consumers took turns";
    EXPECT_EQ(blocks, 6u) << name;
    ++checked;
  }
  EXPECT_GE(checked, 6) << "each at bf16/hd64 (and rope's at hd32) is in the emulated build";
}

// The Hopper forward's tile order in groups of slices (APE_CUDA_TILE_GROUP: FlashAttention-3's L2
// grouping; the GPU check times `auto` beside one group): groups of 4 (and a last one of 2) and of
// 1 of six slices, with the turns and the persistent grid, each tile computed once (against the
// references) and as in one group, bit for bit (a tile's work does not depend on the order).
TEST(CudaLaunch, HopperTileGroupsMatchReferences) {
  const PoseAsSm90 guard;
  const PoseWithSms two_sms(2);
  const HopperOptIns opt_ins;
  const CudaKernelEntry *e = find_cuda("alibi");
  ASSERT_NE(e, nullptr);
  for (int D : {64, 128}) {
    const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, DType::BF16, D);
    ASSERT_NE(var, nullptr) << "alibi bf16/hd" << D << " is in the emulated build";
    const Problem prob = make_problem(*e, 2, 3, 300, D, 9500 + D);
    Outputs one;
    run_gpu(*var, prob, one, nullptr, RunOptions{false});
    if (HasFatalFailure()) return;
    for (const char *group : {"4", "1"}) {
      SCOPED_TRACE(std::string("alibi bf16 D=") + std::to_string(D) + " B=2 H=3 T=300 sm_90, APE_CUDA_TILE_GROUP=" + group);
      const EnvScope groups({{"APE_CUDA_TILE_GROUP", group}});
      check_problem("alibi", *var, prob);
      if (HasFatalFailure()) return;
      Outputs grouped;
      run_gpu(*var, prob, grouped, nullptr, RunOptions{false});
      if (HasFatalFailure()) return;
      for (size_t n = 0; n < 2; ++n)
        EXPECT_TRUE(torch::equal(grouped[n].second, one[n].second)) << grouped[n].first << ": not one group's bits";
    }
  }
}

// The mma.sync backward posing as sm_90 (APE_CUDA_WGMMA_BACKWARD=0: 8-byte dQ' reductions, sm_90's limits), through each of its paths: no mod, a q/k mod,
// trainable distance and row/column biases, value rows, relative rows. Partial tiles, several key
// and query tiles.
TEST(CudaLaunch, Sm90MmaSyncBackwardMatchesReferences) {
  const PoseAsSm90 guard;
  const EnvScope mma({{"APE_CUDA_WGMMA_BACKWARD", "0"}});
  int checked = 0;
  for (const char *name : {"nope", "rope", "t5", "cable", "shaw", "transformer_xl"}) {
    const CudaKernelEntry *e = find_cuda(name);
    ASSERT_NE(e, nullptr) << name;
    for (int D : {64, 128}) {
      const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, DType::BF16, D);
      if (!var) continue;
      SCOPED_TRACE(std::string(name) + " bf16 D=" + std::to_string(D) + " B=1 H=2 T=300 sm_90, mma.sync");
      ape::simt::take_traffic();
      check_problem(name, *var, make_problem(*e, 1, 2, 300, D, 9100 + D));
      if (HasFatalFailure()) return;
      for (const std::string &layout : flash_backward_layouts()) EXPECT_EQ(layout, "wide");
      ++checked;
    }
  }
  EXPECT_GE(checked, 6) << "each at bf16/hd64 is in the emulated build";
}

// The narrow layout against the references where it runs (D = 128, 16-bit inputs, posing as
// sm_86; the other tests run the wide one), for every such variant with a flash backward (those
// with value rows have the general backward): one row, partial tiles, several key tiles of 64.
TEST(CudaLaunch, NarrowFlashBackwardMatchesReferences) {
  const PoseAs guard(86);
  int narrow = 0;
  for (const auto &[name, index] : all_cases()) {
    const CudaKernelEntry *e = find_cuda(name);
    const auto &var = e->variants[index];
    if (var.head_dim != 128 || var.dtype == DType::F32) continue;
    for (auto [B, H, T] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {2, 3, 77}, {1, 2, 300}}) {
      SCOPED_TRACE(name + " " + ape::cuda::dtype_name(var.dtype) + " D=128 B=" + std::to_string(B) +
                   " H=" + std::to_string(H) + " T=" + std::to_string(T) + " sm_86");
      ape::simt::take_traffic();
      check_problem(name, var, make_problem(*e, B, H, T, var.head_dim, 8000 * T + 10 * B + H));
      if (HasFatalFailure()) return;
      const std::vector<std::string> layouts = flash_backward_layouts();
      if (layouts.empty()) break;  // the general backward (value rows): no layout to check
      for (const std::string &layout : layouts) EXPECT_EQ(layout, "narrow");
      narrow += T == 300;
    }
  }
  EXPECT_GE(narrow, 4) << "rope and cable at bf16 and f16, D = 128, are in the emulated build";
}
#else
// Whether the GPU is an sm_90 device (compute capability 9.0: the build's sm_90a kernels run).
bool sm90_device() {
  int dev = 0, major = 0, minor = 0;
  return has_gpu() && cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
         minor == 0;
}
// On an sm_90 GPU, the flash backward's wgmma layout (APE_CUDA_WGMMA_BACKWARD=1; the build's
// sm_90a code) and the Hopper forward's turns (APE_CUDA_PINGPONG=1) against the references, as
// the emulated suite checks them posing as one (Sm90PathMatchesReferences). Other GPUs have
// neither.
TEST_P(CudaKernel, WgmmaBackwardMatchesReferences) {
  const auto &[name, index] = GetParam();
  const CudaKernelEntry *e = find_cuda(name);
  ASSERT_NE(e, nullptr);
  const auto &var = e->variants[index];
  if (!sm90_device()) GTEST_SKIP() << "needs an sm_90 GPU (the emulated suite checks this layout posing as one)";
  if (var.dtype == DType::F32 || var.head_dim < 64) GTEST_SKIP() << "16-bit inputs at D 64 and 128 only";
  const HopperOptIns opt_ins;
  for (auto [B, H, T] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {2, 3, 77}, {1, 2, 300}}) {
    SCOPED_TRACE(std::string(ape::cuda::dtype_name(var.dtype)) + " D=" + std::to_string(var.head_dim) +
                 " B=" + std::to_string(B) + " H=" + std::to_string(H) + " T=" + std::to_string(T) +
                 " wgmma backward");
    check_problem(name, var, make_problem(*e, B, H, T, var.head_dim, 7000 * T + 10 * B + H));
    if (HasFatalFailure()) return;
  }
}

// The Hopper forward's persistent grid where it claims tiles on a GPU: more query tiles (3 x 80
// slices) than an H100 or H200 has SMs, so blocks take several each (the emulated suite poses as a
// device of two SMs instead: Sm90PathMatchesReferences). NoPE, RoPE (a q/k mod), ALiBi (a distance
// bias) and Cable (row/column biases) at bf16, D 64 and 128, with the turns as well.
TEST(CudaLaunch, PersistentHopperForwardMatchesReferences) {
  int dev = 0, sms = 0;
  if (!sm90_device() || cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    GTEST_SKIP() << "needs an sm_90 GPU (the emulated suite checks this grid posing as one)";
  constexpr int64_t B = 2, H = 40, T = 300;  // 3 query tiles of 128 per slice
  ASSERT_GT(B * H * 3, sms) << "more tiles than SMs";
  const HopperOptIns opt_ins;
  int checked = 0;
  for (const char *name : {"nope", "rope", "alibi", "cable"}) {
    const CudaKernelEntry *e = find_cuda(name);
    if (!e) continue;  // not in this build (APE_GPU_CHECK_ENCODINGS)
    for (int D : {64, 128}) {
      const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, DType::BF16, D);
      if (!var) continue;
      SCOPED_TRACE(std::string(name) + " bf16 D=" + std::to_string(D) + " persistent");
      check_problem(name, *var, make_problem(*e, B, H, T, D, 4100 + D));
      if (HasFatalFailure()) return;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0) << "none of nope, rope, alibi, cable at bf16 is in this build";
}
#endif

// `p` with dQ' in any order (Problem::deterministic false) against the references; under the
// emulator, every flash backward that ran (one at least) took `layout`, and with `fence_free` its
// kernel without the order's fence (flash_backward_kernel<..., false, L>: the 128-key mma.sync
// layouts have one).
void check_in_any_order(const std::string &name, const ape::cuda::CudaVariant &var, Problem p,
                        [[maybe_unused]] const std::string &layout, [[maybe_unused]] bool fence_free = true) {
  p.deterministic = false;
#ifdef APE_SIMT
  ape::simt::take_traffic();
#endif
  check_problem(name, var, p);
#ifdef APE_SIMT
  const auto records = ape::simt::take_traffic();
  const std::vector<std::string> layouts = flash_backward_layouts(records);
  EXPECT_FALSE(layouts.empty()) << "no flash backward ran";
  for (const std::string &l : layouts) EXPECT_EQ(l, layout);
  if (fence_free)
    for (const auto &t : records)
      if (t.kernel.find("flash_backward_kernel<") != std::string::npos)
        EXPECT_NE(t.kernel.find(", false, "), std::string::npos) << "the ordered kernel ran: " << t.kernel;
#endif
}

// The flash backward with its dQ' in any order (CudaAttnArgs::deterministic false: every block
// reduces into a zeroed dQ' and the conversion pass writes dq, where key tile 0 writes it in
// order) against the references, through each flash path: no mod (NoPE), fixed and trainable
// distance biases (ALiBi, its learned slopes, T5), a q/k mod (RoPE), row/column biases (Cable);
// at sm_80 and as sm_90 (8-byte reductions). Partial tiles, several key and query tiles.
TEST(CudaLaunch, UnorderedDqMatchesReferences) {
  int checked = 0;
  for (const char *name : {"nope", "alibi", "alibi_learned", "t5", "rope", "cable"}) {
    const CudaKernelEntry *e = find_cuda(name);
#ifdef APE_SIMT
    ASSERT_NE(e, nullptr) << name;
#else
    if (!e) continue;  // a GPU build of some encodings only (APE_GPU_CHECK_ENCODINGS)
#endif
    const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, DType::BF16, 64);
    ASSERT_NE(var, nullptr) << name << " bf16/hd64 is in the emulated build";
#ifdef APE_SIMT
    for (int sm : {80, 90}) {
      const PoseAs guard(sm);
      // (sm_90's default at D 64 is the wgmma layout, whose any-order path CudaLaunch.DqByTmaReductions
      // checks: here the wide mma.sync layout's fence-free kernel, with its 8-byte reductions)
      const EnvScope wide({{"APE_CUDA_WGMMA_BACKWARD", "0"}});
#else
    for (int sm : {0}) {  // the device's own path (0 in the trace)
#endif
      for (auto [B, H, T] : {std::tuple<int64_t, int64_t, int64_t>{2, 3, 77}, {1, 2, 300}}) {
        SCOPED_TRACE(std::string(name) + " bf16 D=64 B=" + std::to_string(B) + " H=" +
                     std::to_string(H) + " T=" + std::to_string(T) + " sm_" + std::to_string(sm) +
                     ", dQ' in any order");
        check_in_any_order(name, *var, make_problem(*e, B, H, T, 64, 9000 * T + 10 * B + H), "wide");
        if (HasFatalFailure()) return;
        ++checked;
      }
    }
  }
#ifdef APE_SIMT
  EXPECT_EQ(checked, 24);
#else
  EXPECT_GE(checked, 4) << "nope and rope are in every GPU build";
#endif
}

// A distance bias that stops depending on the distance (T5: every distance >= 113 reads bucket 31):
// the flash backward adds the dS of a query tile whose distances all lie past the slice's d_sat
// (dist_sat_kernel) to one sum per thread instead of its diagonals' (the saturated steps), after
// handing the running sums of the last diagonal step to the slice's. The other tests' sizes have
// no such step; at T 520 the first key tile has 4 (64 queries per step, 128 keys per block) and
// the second 2; the narrow layout (D 128 posing as sm_86: 32 and 64) has 10 and 8. Posing as
// sm_90, also the wgmma backward (APE_CUDA_WGMMA_BACKWARD=1), whose producer warpgroup takes the
// consumers' barrier before the saturated steps too.
TEST(CudaLaunch, SaturatedDistanceStepsMatchReferences) {
  const CudaKernelEntry *e = find_cuda("t5");
#ifdef APE_SIMT
  ASSERT_NE(e, nullptr) << "t5 is in the emulated build";
#else
  if (!e) GTEST_SKIP() << "T5's CUDA kernels are not in this build (APE_CUDA_ALL_ENCODINGS=ON has them)";
#endif
  int checked = 0;
  for (int D : {64, 128}) {
    const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, DType::BF16, D);
    ASSERT_NE(var, nullptr) << "t5 bf16/hd" << D << " is in the emulated build";
#ifdef APE_SIMT
    for (int sm : {80, 86, 90}) {
      if (sm == 86 && D == 64) continue;  // the wide layout, as sm_80's
      const PoseAs guard(sm);
#else
    for (int sm : {0}) {  // the device's own path (0 in the trace)
#endif
      SCOPED_TRACE("t5 bf16 D=" + std::to_string(D) + " B=1 H=1 T=520 sm_" + std::to_string(sm));
      check_problem("t5", *var, make_problem(*e, 1, 1, 520, D, 9300 + D + sm));
      if (HasFatalFailure()) return;
      ++checked;
#ifdef APE_SIMT
      if (sm == 90) {
        SCOPED_TRACE("wgmma backward");
        const EnvScope wgmma({{"APE_CUDA_WGMMA_BACKWARD", "1"}});
        ape::simt::take_traffic();
        check_problem("t5", *var, make_problem(*e, 1, 1, 520, D, 9400 + D));
        if (HasFatalFailure()) return;
        EXPECT_EQ(flash_backward_layouts(), std::vector<std::string>{"wgmma"});
        ++checked;
      }
#endif
    }
  }
#ifdef APE_SIMT
  EXPECT_EQ(checked, 7);
#else
  EXPECT_EQ(checked, 2);
#endif
}

// Score mods over features (flash_feature_steps: Shaw's, Transformer-XL's and DeBERTa's relative
// rows, K-Cable's token sums): at T 520 the steps and forward tiles past the saturation point (Shaw's distance 33,
// Transformer-XL's 256, DeBERTa's last bucket, K-Cable's 0) are feature steps, the rest element by
// element. Against the references in the wide layout (posing as sm_80) and the wgmma one (sm_90),
// Shaw at D 128 in the narrow one too (sm_86); under the emulator, the same problem with
// APE_CUDA_FEATURE_STEPS=0 (every step element by element) moves more bytes of L2 atomics in the
// backward (at this length 5% more for Transformer-XL, whose rows saturate at 256, 22% for Shaw,
// 2.3x for K-Cable; dQ' included) and its forward (FlashAttention-2-class, or the Hopper one as
// sm_90 but for Shaw) reads more: the feature steps and tiles ran. (bench/results/cuda_traffic_general.md has the counts at a longer length.)
TEST(CudaLaunch, FeatureStepsMatchReferences) {
  int checked = 0;
  for (const std::string name : {"shaw", "transformer_xl", "deberta", "kcable"}) {
    const CudaKernelEntry *e = find_cuda(name);
#ifdef APE_SIMT
    ASSERT_NE(e, nullptr) << name << " is in the emulated build";
#else
    if (!e) continue;  // (APE_CUDA_ALL_ENCODINGS=ON has them)
#endif
    for (int D : {64, 128}) {
      const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, DType::BF16, D);
      if (D == 128 && name != "shaw") continue;
      ASSERT_NE(var, nullptr) << name << " bf16/hd" << D;
#ifdef APE_SIMT
      for (int sm : {80, 86, 90}) {
        if (sm == 86 && D == 64) continue;  // the wide layout, as sm_80's
        if (sm == 90 && D == 128) continue;
        const PoseAs guard(sm);
        const EnvScope wgmma({{"APE_CUDA_WGMMA_BACKWARD", sm == 90 ? "1" : "0"}});
#else
      for (int sm : {0}) {
#endif
        SCOPED_TRACE(name + " bf16 D=" + std::to_string(D) + " B=1 H=2 T=520 sm_" + std::to_string(sm));
        const Problem prob = make_problem(*e, 1, 2, 520, D, 9500 + D + sm);
#ifdef APE_SIMT
        ape::simt::take_traffic();
#endif
        check_problem(name, *var, prob);
        if (HasFatalFailure()) return;
        ++checked;
#ifdef APE_SIMT
        // (the backward's bytes of atomics, the flash forward's bytes read)
        auto bytes = [] {
          std::pair<size_t, size_t> b{0, 0};
          for (const auto &t : ape::simt::take_traffic()) {
            if (t.kernel.find("flash_backward_kernel<") != std::string::npos) b.first += t.atomic;
            if (t.kernel.find("flash_forward_kernel<") != std::string::npos ||
                t.kernel.find("hopper_forward_kernel<") != std::string::npos)
              b.second += t.read;
          }
          return b;
        };
        const auto with = bytes();
        if (sm != 86) {
          const EnvScope off({{"APE_CUDA_FEATURE_STEPS", "0"}});
          Outputs out;
          run_gpu(*var, prob, out);
          const auto without = bytes();
          EXPECT_LT(with.first, without.first) << "L2 atomics of the backward: " << with.first
                                               << " bytes with feature steps, " << without.first << " without";
          EXPECT_LT(with.second, without.second) << "bytes the flash forward reads: " << with.second
                                                 << " with feature tiles, " << without.second << " without";
        }
#endif
      }
    }
  }
#ifdef APE_SIMT
  EXPECT_EQ(checked, 10);
#else
  if (checked == 0) GTEST_SKIP() << "no encoding over features is in this build (APE_CUDA_ALL_ENCODINGS=ON has them)";
#endif
}

// Calls f(sm, name, entry, variant) for every case (all_cases) of the build: under the emulator
// posing as each architecture in `poses`, on a GPU once on the device's own path (sm 0). Stops at a
// fatal failure.
template <class F> void for_each_pose_and_case([[maybe_unused]] std::initializer_list<int> poses, F f) {
#ifdef APE_SIMT
  for (int sm : poses) {
    const PoseAs guard(sm);
#else
  for (int sm : {0}) {
#endif
    for (const auto &[name, index] : all_cases()) {
      const CudaKernelEntry *e = find_cuda(name);
      f(sm, name, *e, e->variants[index]);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// The flash backward's wide layout in sub-tiles (APE_CUDA_BWD_SUBTILES=1, kBwdWideSub): at D = 128
// a step of 64 queries forms S^T, dP^T, P^T, dS^T and the dV, dK' products in two sub-tiles of 32
// (the distance sums' shared group carried from one to the next), then adds its dQ' tile once.
// Every 16-bit variant at D 128 against the references (one row, partial tiles, several key and
// query tiles), T5's saturated steps (T 520), and dQ' in any order; posing as sm_80 and sm_90
// under emulation (as sm_86 the narrow layout runs: the setting does not apply). Value rows'
// masses do not fit beside 64-query tiles: Shaw keeps its 32-query steps.
// (The wgmma layout, which would take the sub-tiles' place on sm_90, stays off while one lives.)
struct SubTileOptIn : EnvScope {
  SubTileOptIn() : EnvScope({{"APE_CUDA_BWD_SUBTILES", "1"}, {"APE_CUDA_WGMMA_BACKWARD", "0"}}) {}
};
#ifndef APE_SIMT
// On a GPU: whether the device gives a block the sub-tile layout's shared memory (sm_80, sm_90;
// not sm_86/89, where the narrow layout runs), else the test's reason to skip.
std::string sub_tiles_unavailable() {
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    return "the device's shared memory per block could not be read";
  if (optin < 166912)
    return "this device gives a block " + std::to_string(optin) +
           " bytes of shared memory: the narrow layout runs, the sub-tiles do not";
  return "";
}
#endif
TEST(CudaLaunch, SubTileBackwardMatchesReferences) {
  const SubTileOptIn opt_in;
#ifndef APE_SIMT
  if (const std::string why = sub_tiles_unavailable(); !why.empty()) GTEST_SKIP() << why;
#endif
  int sub = 0;
  for_each_pose_and_case({80, 90, 86}, [&](int sm, const std::string &name, const CudaKernelEntry &e,
                                          const ape::cuda::CudaVariant &var) {
    if (var.head_dim != 128 || var.dtype == DType::F32) return;
    for (auto [B, H, T] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {2, 3, 77}, {1, 2, 300}}) {
      // Every size for bf16 as sm_80 (and on a GPU); f16 and the other poses (the layout's
      // choice) at T 300.
      const bool full = sm == 80 || sm == 0;
      if ((!full || var.dtype != DType::BF16) && T != 300) continue;
      if (!full && var.dtype != DType::BF16) continue;
      SCOPED_TRACE(name + " " + ape::cuda::dtype_name(var.dtype) + " D=128 B=" + std::to_string(B) + " H=" +
                   std::to_string(H) + " T=" + std::to_string(T) + " sm_" + std::to_string(sm) + ", sub-tiles");
#ifdef APE_SIMT
      ape::simt::take_traffic();
#endif
      check_problem(name, var, make_problem(e, B, H, T, 128, 9400 * T + 10 * B + H));
      if (HasFatalFailure()) return;
#ifdef APE_SIMT
      for (const std::string &layout : flash_backward_layouts()) {
        const bool value_rows = name == "shaw";
        EXPECT_EQ(layout, sm == 86 ? "narrow" : value_rows ? "wide" : "wide_sub");
        sub += layout == "wide_sub";
      }
#else
      ++sub;
#endif
    }
  });
  if (HasFatalFailure()) return;
#ifdef APE_SIMT
  EXPECT_GE(sub, 15) << "rope, cable, t5: at bf16 3 sizes as sm_80 and T 300 as sm_90, at f16 T 300";
#else
  EXPECT_GE(sub, 8) << "rope and cable (every build has them): at bf16 3 sizes, at f16 T 300";
#endif
  const CudaKernelEntry *t5 = find_cuda("t5");
#ifdef APE_SIMT
  ASSERT_NE(t5, nullptr) << "t5 is in the emulated build";
#else
  if (!t5) return;  // T5's kernels are not in this build (APE_CUDA_ALL_ENCODINGS=ON has them)
#endif
  const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*t5, DType::BF16, 128);
  ASSERT_NE(var, nullptr) << "t5 bf16/hd128 is in the emulated build";
  {
    SCOPED_TRACE("t5 bf16 D=128 B=1 H=1 T=520, sub-tiles: saturated steps");
#ifdef APE_SIMT
    const PoseAs guard(80);
#endif
    check_problem("t5", *var, make_problem(*t5, 1, 1, 520, 128, 9480));
    if (HasFatalFailure()) return;
  }
  {
    SCOPED_TRACE("t5 bf16 D=128 B=2 H=3 T=300, sub-tiles, dQ' in any order");
#ifdef APE_SIMT
    const PoseAs guard(90);
#endif
    check_in_any_order("t5", *var, make_problem(*t5, 2, 3, 300, 128, 9490), "wide_sub");
  }
}

// The gradients of `p` bit for bit the same whether the blocks run one after another or (under
// the emulator) three at once, where the blocks of a slice interleave: what the flash backward's
// dQ' order promises. On a GPU the two runs are simply two runs. Emulated, the second run's flash
// backward launches must all be of layout `layout` (flash_backward_layouts), and each release of a
// dQ' tile holds its block until the other blocks wait (APE_SIMT_STALL_RELEASES): a write to the
// tile that the release does not cover (one after it in the block's order, as the wgmma layout's
// first stores were before ff33db0) then lands after the next key tile's adds and changes the bits,
// in every run rather than in one of many.
void expect_same_bits_with_blocks_at_once(const ape::cuda::CudaVariant &var, const Problem &p,
                                          [[maybe_unused]] const std::string &layout) {
  Outputs first, second;
  run_gpu(var, p, first);
#ifdef APE_SIMT
  {
    const EnvScope workers({{"APE_SIMT_WORKERS", "3"}, {"APE_SIMT_STALL_RELEASES", "1"}});
    ape::simt::take_traffic();
    run_gpu(var, p, second);
    const std::vector<std::string> layouts = flash_backward_layouts();
    EXPECT_EQ(layouts.size(), 1u);
    for (const std::string &l : layouts) EXPECT_EQ(l, layout);
  }
#else
  run_gpu(var, p, second);
#endif
  ASSERT_EQ(first.size(), second.size());
  for (size_t n = 0; n < first.size(); ++n)
    EXPECT_TRUE(torch::equal(first[n].second, second[n].second)) << first[n].first << " differs";
}

// The sub-tile layout's dQ' order while blocks run at once (3 emulator threads: the blocks of a
// slice interleave): its semaphores count the layout's 64-query tiles, so the sums come in
// key-tile order and the gradients are the same bits as with the blocks one after another.
TEST(CudaLaunch, SubTileBackwardIsDeterministic) {
  const SubTileOptIn opt_in;
#ifndef APE_SIMT
  if (const std::string why = sub_tiles_unavailable(); !why.empty()) GTEST_SKIP() << why;
#endif
  int checked = 0;
  for (const char *name : {"rope", "t5"}) {
    const CudaKernelEntry *e = find_cuda(name);
#ifdef APE_SIMT
    ASSERT_NE(e, nullptr) << name << " is in the emulated build";
    const PoseAs guard(80);
#else
    if (!e) continue;  // T5's kernels are not in this build (APE_CUDA_ALL_ENCODINGS=ON has them)
#endif
    const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, DType::BF16, 128);
    ASSERT_NE(var, nullptr) << name << " bf16/hd128";
    SCOPED_TRACE(std::string(name) + " bf16 D=128 B=2 H=2 T=300, sub-tiles, blocks at once");
    expect_same_bits_with_blocks_at_once(*var, make_problem(*e, 2, 2, 300, 128, 9600), "wide_sub");
    if (HasFatalFailure()) return;
    ++checked;
  }
  EXPECT_GE(checked, 1);
}

// dQ' by TMA reductions (BwdTiles::kDqTma; FlashAttention-3's form), in the wgmma layout
// (APE_CUDA_WGMMA_BACKWARD=1) and the wide one (APE_CUDA_DQ_TMA=1): in order, bit for bit the same
// whether the blocks run one after another or three at once (the semaphores order the
// reductions), and in any order within the references (each block's reductions into the zeroed
// dQ'); NoPE (key tile 0 writes dq), RoPE (a conversion pass writes it), T5 (the distance sums in
// the turn), at D 64 and 128. T 300: 5 or 10 query tiles over 3 key tiles, the last tile partial
// (the reductions must not write its rows past T, which belong to the next slice).
TEST(CudaLaunch, DqByTmaReductions) {
#ifdef APE_SIMT
  const PoseAsSm90 guard;
#else
  if (!sm90_device()) GTEST_SKIP() << "needs an sm_90 GPU (the emulated suite checks these layouts posing as one)";
#endif
  int checked = 0;
  for (auto [variable, layout_name] : {std::pair<const char *, const char *>{"APE_CUDA_WGMMA_BACKWARD", "wgmma"},
                                       {"APE_CUDA_DQ_TMA", "wide_tma"}}) {
    const bool wgmma = layout_name == std::string("wgmma");
    const EnvScope setting({{variable, "1"}});
    const EnvScope layout({{"APE_CUDA_WGMMA_BACKWARD", wgmma ? "1" : "0"}});  // (the wide one at D 128)
    for (const char *name : {"nope", "rope", "t5"}) {
      const CudaKernelEntry *e = find_cuda(name);
#ifdef APE_SIMT
      ASSERT_NE(e, nullptr) << name << " is in the emulated build";
#else
      if (!e) continue;  // T5's kernels are not in this build (APE_CUDA_ALL_ENCODINGS=ON has them)
#endif
      // NoPE's key tile 0 writes dq itself with APE_CUDA_DQ_DIRECT=1 (the mma.sync layouts'
      // default), else adds its tile and the conversion pass writes dq (the wgmma layout's): the
      // same sums in the same order, rounded once, so the same bits.
      const bool direct_too = std::string(name) == "nope";
      for (int D : {64, 128}) {
        Outputs by_default;
        for (const char *direct : {"", "0", "1"}) {
          if (*direct && !direct_too) continue;
          const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, DType::BF16, D);
          if (!var) continue;
          const EnvScope dq_direct({{"APE_CUDA_DQ_DIRECT", direct}});
          SCOPED_TRACE(std::string(name) + " bf16 D=" + std::to_string(D) + " B=2 H=2 T=300, " + variable +
                       "=1, APE_CUDA_DQ_DIRECT=" + direct);
          Problem p = make_problem(*e, 2, 2, 300, D, 9700 + D);
          expect_same_bits_with_blocks_at_once(*var, p, layout_name);
          if (HasFatalFailure()) return;
          SCOPED_TRACE("dQ' in any order");
          check_in_any_order(name, *var, p, layout_name, false);  // (these layouts have no fence-free kernel)
          if (HasFatalFailure()) return;
          if (direct_too) {
            Outputs out;
            run_gpu(*var, p, out);
            if (!*direct) {
              by_default = std::move(out);
            } else {
              ASSERT_EQ(out.size(), by_default.size());
              for (size_t n = 0; n < out.size(); ++n)
                EXPECT_TRUE(torch::equal(out[n].second, by_default[n].second))
                    << out[n].first << " differs from the default's";
            }
          }
          ++checked;
        }
      }
    }
  }
#ifdef APE_SIMT
  EXPECT_EQ(checked, 14) << "nope at bf16/hd64 (three ways), rope and t5 at bf16/hd64 and hd128 are in the emulated build";
#else
  EXPECT_GE(checked, 2);
#endif
}

// Key tile 0 writing dq itself (the mma.sync layouts' default) against adding its tile like the
// others and leaving dq to the conversion pass (APE_CUDA_DQ_DIRECT=0; the wgmma layout's default):
// the same gradients bit for bit (the same sums in the same order, rounded once), in the wide
// mma.sync layout (the wgmma and TMA layouts: CudaLaunch.DqByTmaReductions), the pass's way also
// with three blocks at once; only the latter's launches hold the conversion pass. NoPE and Cable
// (no q mod).
#ifdef APE_SIMT
TEST(CudaLaunch, DirectDqIsTheConversionPassBits) {
  const PoseAs guard(80);
  auto conversions = [](const std::vector<ape::simt::Traffic> &records) {
    size_t n = 0;
    for (const auto &t : records)
      if (t.kernel.find("mod_backward") != std::string::npos) n += t.launches;
    return n;
  };
  for (const char *name : {"nope", "cable"}) {
    const CudaKernelEntry *e = find_cuda(name);
    ASSERT_NE(e, nullptr) << name;
    const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, DType::BF16, 64);
    ASSERT_NE(var, nullptr) << name << " bf16/hd64 is in the emulated build";
    SCOPED_TRACE(std::string(name) + " bf16 D=64 B=2 H=2 T=300 sm_80");
    const Problem p = make_problem(*e, 2, 2, 300, 64, 9900);
    Outputs direct, by_pass;
    ape::simt::take_traffic();
    run_gpu(*var, p, direct);
    EXPECT_EQ(conversions(ape::simt::take_traffic()), 0u) << "key tile 0 writes dq by default";
    {
      const EnvScope off({{"APE_CUDA_DQ_DIRECT", "0"}});
      run_gpu(*var, p, by_pass);
      EXPECT_EQ(conversions(ape::simt::take_traffic()), 1u) << "the conversion pass writes dq";
      expect_same_bits_with_blocks_at_once(*var, p, "wide");
      if (HasFatalFailure()) return;
    }
    ASSERT_EQ(direct.size(), by_pass.size());
    for (size_t n = 0; n < direct.size(); ++n)
      EXPECT_TRUE(torch::equal(direct[n].second, by_pass[n].second)) << direct[n].first << " differs";
  }
}
#endif

// The wide layout with dQ' by TMA reductions (APE_CUDA_DQ_TMA=1, posing as sm_90) against the
// references for every 16-bit variant at D 64 and 128: its staging tile moves the shared memory of
// the distance and row/column sums, value rows' masses and the parameter cache. One size with
// partial tiles and several key and query tiles.
#ifdef APE_SIMT
TEST(CudaLaunch, WideDqTmaMatchesReferences) {
  const PoseAsSm90 guard;
  const EnvScope setting({{"APE_CUDA_DQ_TMA", "1"}, {"APE_CUDA_WGMMA_BACKWARD", "0"}});
  int checked = 0;
  for (const auto &[name, index] : all_cases()) {
    const CudaKernelEntry *e = find_cuda(name);
    const auto &var = e->variants[index];
    if (var.head_dim < 64 || var.dtype == DType::F32) continue;
    SCOPED_TRACE(name + " " + ape::cuda::dtype_name(var.dtype) + " D=" + std::to_string(var.head_dim) +
                 " B=1 H=2 T=300 sm_90, APE_CUDA_DQ_TMA=1");
    ape::simt::take_traffic();
    check_problem(name, var, make_problem(*e, 1, 2, 300, var.head_dim, 9800 + var.head_dim));
    if (HasFatalFailure()) return;
    for (const std::string &layout : flash_backward_layouts()) EXPECT_EQ(layout, "wide_tma");
    ++checked;
  }
  EXPECT_GE(checked, 20);
}
#endif

// FlashAttention-2's tiling of the backward's products (APE_CUDA_BWD_SQUARE=1, kBwdSquare: 32 x 32
// warp tiles of S^T and dP^T, P^T and dS^T through shared memory, dK' and dV of 32 keys x D/2
// columns, dQ' of 32 queries x D/4) at D = 128 for the encodings without a score mod of their own
// (RoPE), with a row/column bias (Cable: its sums on the tensor cores) or a distance bias (T5: its
// diagonal sums, saturated steps at T 520), and never with value rows (Shaw) or at D 64: every
// 16-bit variant at D 128 (and RoPE's at D 64) against the references, posing as sm_80 (Cable's tables fit its block, T5's
// distance sums do not: the wide layout runs), sm_90 (where they do) and sm_86 (161 KiB do not fit:
// the narrow layout runs). One row, partial tiles, several key and query tiles for bf16 where the
// layout runs, T 300 for the rest. Then its dQ' order with the blocks three at once (bit for bit),
// and dQ' in any order (its kernel without the order's fence).
struct SquareOptIn : EnvScope {
  SquareOptIn() : EnvScope({{"APE_CUDA_BWD_SQUARE", "1"}, {"APE_CUDA_WGMMA_BACKWARD", "0"}}) {}
};
// The layout the emulated backward must take for `name` at D = 128 posing as sm_`sm` with the
// square tiling asked for ("" where the test does not expect one; a GPU runs the device's own).
std::string square_expected(const std::string &name, int sm) {
  if (sm == 86) return "narrow";
  if (name == "rope" || name == "nope" || name == "cable" || name == "alibi") return "square";
  if (name == "t5" || name == "kerple_log" || name == "kerple_power") return sm == 90 ? "square" : "wide";
  return "";
}
TEST(CudaLaunch, SquareBackwardMatchesReferences) {
  const SquareOptIn opt_in;
  const std::set<std::string> never = {"shaw", "fire"};  // value rows, a general score mod
  int square = 0;
  for_each_pose_and_case({80, 90, 86}, [&](int sm, const std::string &name, const CudaKernelEntry &e,
                                          const ape::cuda::CudaVariant &var) {
    if (var.head_dim < 64 || var.dtype == DType::F32) return;
    // At D = 64 the square tiling never applies: the wide layout runs, as in the default tests of
    // every variant; RoPE shows that the switch leaves it there.
    if (var.head_dim == 64 && name != "rope") return;
    const std::string expected = var.head_dim == 64 ? "wide" : square_expected(name, sm);
    // As sm_90 and sm_86 only the encodings whose layout changes with the device, at D = 128.
    if (sm != 80 && sm != 0 && (var.head_dim != 128 || expected.empty() || (sm == 86 && name != "rope")))
      return;
    for (auto [B, H, T] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {2, 3, 77}, {1, 2, 300}, {1, 1, 520}}) {
      // Every size for bf16 where the square layout runs (T 520: T5's saturated steps), T 300 else.
      const bool full = var.dtype == DType::BF16 && (sm == 0 || (sm != 86 && expected == "square"));
      if (!full && T != 300) continue;
      if (T == 520 && name != "t5") continue;
      SCOPED_TRACE(name + " " + ape::cuda::dtype_name(var.dtype) + " D=" + std::to_string(var.head_dim) +
                   " B=" + std::to_string(B) + " H=" + std::to_string(H) + " T=" + std::to_string(T) + " sm_" +
                   std::to_string(sm) + ", APE_CUDA_BWD_SQUARE=1");
#ifdef APE_SIMT
      ape::simt::take_traffic();
#endif
      check_problem(name, var, make_problem(e, B, H, T, var.head_dim, 9900 * T + 10 * B + H));
      if (HasFatalFailure()) return;
#ifdef APE_SIMT
      for (const std::string &layout : flash_backward_layouts()) {
        if (!expected.empty()) EXPECT_EQ(layout, expected);
        if (never.count(name)) EXPECT_NE(layout, "square");
        square += layout == "square";
      }
#endif
    }
  });
  if (HasFatalFailure()) return;
#ifdef APE_SIMT
  EXPECT_GE(square, 21) << "rope, cable (and t5 as sm_90) at bf16/hd128 in every size, and at f16, as sm_80 and sm_90";
#endif
  // Bit for bit with the blocks at once: RoPE (dQ') and Cable (dQ' and its rows' sums, added in
  // the same turns); dQ' in any order for NoPE and RoPE.
  for (const char *name : {"nope", "rope", "cable"}) {
    const CudaKernelEntry *e = find_cuda(name);
    if (!e) continue;
    const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, DType::BF16, 128);
    if (!var) continue;
#ifdef APE_SIMT
    const PoseAs guard(80);
#endif
    {
      SCOPED_TRACE(std::string(name) + " bf16 D=128 B=2 H=2 T=300, square: blocks at once");
      expect_same_bits_with_blocks_at_once(*var, make_problem(*e, 2, 2, 300, 128, 9950), "square");
      if (HasFatalFailure()) return;
    }
    if (std::string(name) != "cable") {
      SCOPED_TRACE(std::string(name) + " bf16 D=128 B=2 H=3 T=300, square, dQ' in any order");
      check_in_any_order(name, *var, make_problem(*e, 2, 3, 300, 128, 9960), "square");
      if (HasFatalFailure()) return;
    }
  }
}

// The square tiling with its dQ' tiles added by TMA reductions from shared memory
// (APE_CUDA_BWD_SQUARE=1 with APE_CUDA_DQ_TMA=1, kBwdSquareTma; sm_90a), posing as sm_90: RoPE,
// Cable and T5 at D = 128 against the references (T5's saturated steps at T 520), the layout read
// back; RoPE and Cable bit for bit with the blocks three at once; RoPE with dQ' in any order. As
// sm_80 the setting does not apply (the square layout runs).
#ifdef APE_SIMT
TEST(CudaLaunch, SquareDqTmaMatchesReferences) {
  const EnvScope opt_in({{"APE_CUDA_BWD_SQUARE", "1"}, {"APE_CUDA_DQ_TMA", "1"}, {"APE_CUDA_WGMMA_BACKWARD", "0"}});
  int checked = 0;
  for (const char *name : {"rope", "cable", "t5"}) {
    const CudaKernelEntry *e = find_cuda(name);
    ASSERT_NE(e, nullptr) << name << " is in the emulated build";
    for (DType dt : {DType::BF16, DType::F16}) {
      const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, dt, 128);
      ASSERT_NE(var, nullptr) << name << " at D = 128 is in the emulated build";
      for (auto [B, H, T, sm] : {std::tuple<int64_t, int64_t, int64_t, int>{1, 2, 300, 90}, {2, 3, 77, 90},
                                 {1, 1, 520, 90}, {1, 2, 300, 80}}) {
        if (dt == DType::F16 && (T != 300 || sm != 90)) continue;
        if (T == 520 && std::string(name) != "t5") continue;
        if (sm == 80 && std::string(name) == "t5") continue;  // (its distance sums: the wide layout there)
        SCOPED_TRACE(std::string(name) + " " + ape::cuda::dtype_name(dt) + " D=128 B=" + std::to_string(B) +
                     " H=" + std::to_string(H) + " T=" + std::to_string(T) + " sm_" + std::to_string(sm) +
                     ", square tiling with dQ' by TMA reductions");
        const PoseAs guard(sm);
        ape::simt::take_traffic();
        check_problem(name, *var, make_problem(*e, B, H, T, 128, 9970 * T + 10 * B + H));
        if (HasFatalFailure()) return;
        for (const std::string &layout : flash_backward_layouts()) EXPECT_EQ(layout, sm == 90 ? "square_tma" : "square");
        ++checked;
      }
    }
    if (std::string(name) == "t5") continue;
    const PoseAs guard(90);
    const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, DType::BF16, 128);
    SCOPED_TRACE(std::string(name) + " bf16 D=128 B=2 H=2 T=300, square_tma");
    expect_same_bits_with_blocks_at_once(*var, make_problem(*e, 2, 2, 300, 128, 9980), "square_tma");
    if (HasFatalFailure()) return;
    if (std::string(name) == "rope") {
      check_in_any_order(name, *var, make_problem(*e, 2, 3, 300, 128, 9990), "square_tma", false);
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_EQ(checked, 12) << "rope and cable: 3 bf16 sizes and poses and f16; t5: 3 bf16 sizes as sm_90 and f16";
}
#endif

// A general score mod's parameters staged in shared memory (ParamCache, cuda/flash_forward.cuh):
// each parameter is staged while it fits (48 KiB in the backward, 8 KiB in the forward), the rest
// read and summed in global memory. FIRE's w2 has 32 H elements: at H = 3 every parameter is
// staged; at H = 80 (2706 elements, 53 KiB with their gradients) w2 is not and the others are, in
// both passes. Both against the references, with the gradients summed per block. Then through the
// Hopper kernels (their opt-ins; posing as sm_90 under the emulator): the wgmma backward stages and
// flushes with its consumers' 256 threads (its producer warpgroup does neither), so at H = 12
// w2's 384 elements, staged, take two rounds of them (a stride of the block's 384 threads once
// left elements 256-383 unstaged and their gradients unsummed); the Hopper forward copies with all
// of its threads.
TEST(CudaLaunch, StagedParametersMatchReferences) {
  const CudaKernelEntry *e = find_cuda("fire");
  if (!e) GTEST_SKIP() << "FIRE's CUDA kernels are not in this build";
  const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, DType::BF16, 64);
  ASSERT_NE(var, nullptr) << "fire bf16/hd64 is in every build with FIRE";
  for (bool hopper : {false, true}) {
#ifdef APE_SIMT
    std::optional<PoseAsSm90> pose;
    if (hopper) pose.emplace(), ape::simt::take_traffic();
#endif
    std::optional<HopperOptIns> opt_ins;
    if (hopper) opt_ins.emplace();
    for (auto [B, H, T] : {std::tuple<int64_t, int64_t, int64_t>{2, 3, 77}, {1, 12, 33}, {1, 80, 33}}) {
      if (!hopper && H == 12) continue;
      SCOPED_TRACE(std::string(hopper ? "Hopper kernels: " : "") + "fire bf16 D=64 B=" + std::to_string(B) +
                   " H=" + std::to_string(H) + " T=" + std::to_string(T));
      check_problem("fire", *var, make_problem(*e, B, H, T, 64, 7000 * T + 10 * B + H));
      if (HasFatalFailure()) return;
    }
#ifdef APE_SIMT
    if (hopper) EXPECT_EQ(flash_backward_layouts(), std::vector<std::string>(3, "wgmma"));
#endif
  }
}

// A q/k mod whose gradient adds to parameters (ExPE's a_h, b_h at (head, column), ExQPE's per
// residue, expe_rope_cable's at a partner column too) sums them over each thread's rows in
// registers (mod_backward_params_kernel): against the references with a thread's rows cut short
// (T 300: 4 or 5 rows 64 apart); and at T 1, 77, 300, 640 and (past a chunk of 2,048 rows) 2100
// bit for bit the gradients of one atomic per term (APE_CUDA_MOD_PARAM_SUMS=0,
// mod_backward_kernel): integer sums. Emulated, the default launches the new kernel for both sides
// and the other for neither, and at T 640 (10 rows a thread) the mods' atomics fall more than 8x.
TEST(CudaLaunch, ModParamSumsMatchReferences) {
  int checked = 0;
  for (const char *name : {"expe", "exqpe", "expe_rope_cable"}) {
    const CudaKernelEntry *e = find_cuda(name);
    if (!e) continue;
    for (auto [dt, D] : {std::pair{DType::BF16, 64}, {DType::F32, 64}, {DType::BF16, 32}, {DType::BF16, 128},
                         {DType::F16, 128}}) {
      // (the emulated build has D 64; a GPU build or APE_SIMT_FULL_ENCODINGS with expe the others:
      // a thread's column and the blocks of a slice depend on D)
      const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, dt, D);
      if (!var) continue;
      for (auto [B, H, T] : {std::tuple<int64_t, int64_t, int64_t>{2, 3, 77}, {1, 2, 300}, {1, 1, 1},
                             {1, 1, 640}, {1, 1, 2100}}) {
        if (T > 300 && (dt != DType::BF16 || D != 64 || std::string(name) != (T > 640 ? "expe" : name) ||
                        std::string(name) == "expe_rope_cable"))
          continue;
        SCOPED_TRACE(std::string(name) + " " + ape::cuda::dtype_name(dt) + " D=" + std::to_string(D) +
                     " B=" + std::to_string(B) + " H=" + std::to_string(H) + " T=" + std::to_string(T));
        const Problem p = make_problem(*e, B, H, T, D, 911 * T + 7 * H + B);
        // (the suite's other tests hold every variant's default, this kernel, to the references)
        if (T == 300) check_problem(name, *var, p);
        if (HasFatalFailure()) return;
#ifdef APE_SIMT
        auto launches_and_atomics = [](const char *kernel, size_t &atomic) {
          size_t n = 0;
          atomic = 0;
          for (const auto &t : ape::simt::take_traffic()) {
            if (t.kernel.find("mod_backward") != std::string::npos) atomic += t.atomic;  // (the mods' backward)
            if (t.kernel.find(kernel) != std::string::npos) n += t.launches;
          }
          return n;
        };
        ape::simt::take_traffic();
#endif
        Outputs sums, per_term;
        run_gpu(*var, p, sums);
#ifdef APE_SIMT
        size_t atomic_sums = 0, atomic_terms = 0;
        EXPECT_EQ(launches_and_atomics("mod_backward_params_kernel<", atomic_sums), 2u) << "q and k";
#endif
        {
          const EnvScope off({{"APE_CUDA_MOD_PARAM_SUMS", "0"}});
          run_gpu(*var, p, per_term);
        }
#ifdef APE_SIMT
        EXPECT_EQ(launches_and_atomics("mod_backward_params_kernel<", atomic_terms), 0u)
            << "APE_CUDA_MOD_PARAM_SUMS=0 launched it";
        if (T == 640) EXPECT_LT(atomic_sums * 8, atomic_terms) << "the mods' atomics did not fall";
#endif
        ASSERT_EQ(sums.size(), per_term.size());
        for (size_t n = 0; n < sums.size(); ++n)
          EXPECT_TRUE(torch::equal(sums[n].second, per_term[n].second)) << sums[n].first << " differs";
        ++checked;
      }
    }
  }
#ifdef APE_SIMT
  ASSERT_GT(checked, 0) << "the emulated build has ExPE's bf16 variant at D 64";
#else
  if (checked == 0) GTEST_SKIP() << "no encoding with q/k mod parameters in this build";
#endif
  // The status word through the register sums: terms beyond 2^31 (dO scaled by 1e12) and a
  // non-finite one (a NaN in dO) set the same bits as one atomic per term, and poison the
  // parameters' gradients (NaN) in both.
  const CudaKernelEntry *e = find_cuda("expe");
  const ape::cuda::CudaVariant *var = e ? ape::cuda::find_variant(*e, DType::BF16, 64) : nullptr;
  if (!var) return;
  for (int bad = 0; bad < 2; ++bad) {
    SCOPED_TRACE(bad ? "a NaN in dO" : "dO times 1e12");
    Problem p = make_problem(*e, 1, 2, 150, 64, 404);
    if (bad) p.dout[0][1][100][5] = std::numeric_limits<double>::quiet_NaN();
    else p.dout = p.dout * 1e12;
    Outputs sums, per_term;
    uint32_t st_sums = 0, st_terms = 0;
    run_gpu(*var, p, sums, &st_sums);
    {
      const EnvScope off({{"APE_CUDA_MOD_PARAM_SUMS", "0"}});
      run_gpu(*var, p, per_term, &st_terms);
    }
    EXPECT_TRUE(st_sums & (bad ? ape::cuda::kStatusNonFinite : ape::cuda::kStatusRange)) << "status " << st_sums;
    EXPECT_EQ(st_sums, st_terms);
    for (size_t n = 0; n < sums.size(); ++n)
      if (sums[n].first.rfind("dparam:override", 0) == 0) {
        EXPECT_TRUE(torch::isnan(sums[n].second).all().item<bool>()) << sums[n].first;
        EXPECT_TRUE(torch::isnan(per_term[n].second).all().item<bool>()) << per_term[n].first;
      }
  }
}

// A scale <= 0 (legal: only a finite scale is required) takes other paths: the flash kernels
// keep raw scores (S = Q'K'^T + B / scale with a distance bias) and need scale > 0 in the
// forward and scale != 0 in a distance bias's backward; the rest runs the general kernels.
TEST_P(CudaKernel, NonPositiveScalesMatchReferences) {
  const auto &[name, index] = GetParam();
  const CudaKernelEntry *e = find_cuda(name);
  ASSERT_NE(e, nullptr);
  const auto &var = e->variants[index];
  for (double scale : {-0.3, 0.0}) {
    SCOPED_TRACE(std::string(ape::cuda::dtype_name(var.dtype)) + " D=" +
                 std::to_string(var.head_dim) + " scale=" + std::to_string(scale));
    Problem p = make_problem(*e, 1, 2, 130, var.head_dim, 4242);
    p.scale = scale;
    check_problem(name, var, p);
    if (HasFatalFailure()) return;
  }
}

TEST_P(CudaKernel, BackwardIsDeterministic) {
  const auto &[name, index] = GetParam();
  const CudaKernelEntry *e = find_cuda(name);
  ASSERT_NE(e, nullptr);
  const Problem p = make_problem(*e, 2, 3, 150, e->variants[index].head_dim, 7);
  Outputs first, second;
  run_gpu(e->variants[index], p, first);
#ifdef APE_SIMT
  // The second run spreads the blocks over 3 OS threads, so blocks of one slice run at the same
  // time in an order of their own: the flash backward's dQ adds must still come in key-tile
  // order (its semaphores), the sinks' sums must not depend on the order at all.
  setenv("APE_SIMT_WORKERS", "3", 1);
  run_gpu(e->variants[index], p, second);
  unsetenv("APE_SIMT_WORKERS");
#else
  run_gpu(e->variants[index], p, second);
#endif
  ASSERT_EQ(first.size(), second.size());
  for (size_t n = 0; n < first.size(); ++n)
    EXPECT_TRUE(torch::equal(first[n].second, second[n].second)) << first[n].first << " differs";
}

// One batch element computed alone (B = 1) equals the same element inside a batch of 5, bit for
// bit: no block reads another slice's data, and a slice's result does not depend on the grid.
// Parameter gradients are sums over the batch, so they are left out.
TEST_P(CudaKernel, SliceAloneEqualsSliceInBatch) {
  const auto &[name, index] = GetParam();
  const CudaKernelEntry *e = find_cuda(name);
  ASSERT_NE(e, nullptr);
  const auto &var = e->variants[index];
  const Problem big = make_problem(*e, 5, 2, 97, var.head_dim, 11);
  const int64_t b = 3;
  Problem one = big;
  one.B = 1;
  auto pick = [&](const Tensor &t) { return t.narrow(0, b, 1).contiguous(); };
  one.q = pick(big.q), one.k = pick(big.k), one.v = pick(big.v), one.dout = pick(big.dout);
  for (auto &f : one.features) f = pick(f);
  Outputs all, alone;
  run_gpu(var, big, all);
  run_gpu(var, one, alone);
  if (HasFatalFailure()) return;
  for (size_t n = 0; n < alone.size(); ++n) {
    if (alone[n].first.rfind("dparam:", 0) == 0) continue;
    EXPECT_TRUE(torch::equal(pick(all[n].second), alone[n].second))
        << alone[n].first << " of batch element " << b << " differs from the same element alone";
  }
}

// The forward alone over the first L tokens of p: o (in the variant's dtype) and lse, on the host.
void run_forward_prefix(const ape::cuda::CudaVariant &var, const Problem &p, int64_t L, Tensor &o,
                        Tensor &lse) {
  const auto dt = torch_type(var.dtype);
  auto head = [&](const Tensor &t) { return t.narrow(2, 0, L).contiguous(); };
  const Tensor q = head(p.q).to(dt), k = head(p.k).to(dt), v = head(p.v).to(dt);
  const Tensor lse_like = torch::empty({p.B, p.H, L}, torch::kFloat32);
  DevBuf qd, kd, vd, od, ld;
  upload(qd, q), upload(kd, k), upload(vd, v);
  upload(od, torch::zeros_like(q)), upload(ld, lse_like.zero_());
  std::vector<DevBuf> feats(p.features.size()), prms(p.params.size());
  std::vector<const float *> fp, pp;
  for (size_t n = 0; n < p.features.size(); ++n) {
    upload(feats[n], head(p.features[n]).to(torch::kFloat32));
    fp.push_back(static_cast<const float *>(feats[n].ptr));
  }
  for (size_t n = 0; n < p.params.size(); ++n) {
    upload(prms[n], p.params[n].to(torch::kFloat32));
    pp.push_back(static_cast<const float *>(prms[n].ptr));
  }
  CudaAttnArgs a;
  a.B = p.B, a.H = p.H, a.T = L, a.D = p.D, a.dtype = var.dtype;
  a.kv_heads = p.k.size(1) == p.H ? 0 : p.k.size(1);
  a.q = qd.ptr, a.k = kd.ptr, a.v = vd.ptr, a.o = od.ptr, a.lse = static_cast<float *>(ld.ptr);
  a.features = fp.data(), a.params = pp.data(), a.scale = static_cast<float>(p.scale);
  ASSERT_CUDA(var.forward(a));
  ASSERT_CUDA(cudaDeviceSynchronize());
  o = download(od, q), lse = download(ld, lse_like);
}

// A scratch allocator that fails its fail_at-th allocation (counting from 1; 0: none fails).
struct FailingScratch {
  int calls = 0, fail_at = 0;
  ape::cuda::CudaScratchAllocator alloc{
      [](void *ctx, size_t bytes, cudaStream_t st) -> void * {
        auto *self = static_cast<FailingScratch *>(ctx);
        if (++self->calls == self->fail_at) return nullptr;
        void *ptr = nullptr;
        return cudaMallocAsync(&ptr, bytes, st) == cudaSuccess ? ptr : nullptr;
      },
      [](void *, void *ptr, cudaStream_t st) { cudaFreeAsync(ptr, st); }, this};
};

// Decoding (cuda/decode.h): a prefill of 125 tokens, 4 steps of one token (rows 125 to 128: the
// last rows of a query tile of 32, 64 or 128 rows and the first of the next, so every kernel skips
// tiles, and from a tile's last row), then 7 tokens at once;
// every step's o and lse equal, bit for bit, the rows L0 .. L-1 of the full forward over the L
// tokens so far (the contract of cpu/decode.h, kept here) with the keys unsplit (num_splits 1);
// with them split (num_splits > 1, or 0: the device decides), within the rounding of another order
// of the same fp32 sums. Then the refusals: a step past the capacity, another dtype, a missing
// pointer.
// retry_step >= 0: that step first fails at each of its scratch allocations in turn (the cache must
// keep its length, and the step then succeed as if none had failed).
// kv_heads > 0: 4 query heads reading k and v of kv_heads heads (CudaDecodeArgs::kv_heads).
void check_decode_steps(const std::string &name, size_t index, int64_t num_layers = 0,
                        const std::vector<int64_t> &steps = {125, 1, 1, 1, 1, 7}, int num_splits = 1,
                        int retry_step = -1, int64_t kv_heads = 0) {
  const CudaKernelEntry *e = find_cuda(name);
  ASSERT_NE(e, nullptr);
  const auto &var = e->variants[index];
  int64_t T = 0;
  for (int64_t n : steps) T += n;
  Problem p = make_problem(*e, 2, kv_heads > 0 ? 4 : 1, T, var.head_dim, 23);
  if (kv_heads > 0) p.k = p.k.narrow(1, 0, kv_heads).contiguous(), p.v = p.v.narrow(1, 0, kv_heads).contiguous();
  const auto dt = torch_type(var.dtype);
  ape::cuda::CudaDecodeCache cache;
  cache.capacity = T;
  std::vector<DevBuf> prms(p.params.size());
  std::vector<const float *> pp;
  for (size_t n = 0; n < p.params.size(); ++n) {
    upload(prms[n], p.params[n].to(torch::kFloat32));
    pp.push_back(static_cast<const float *>(prms[n].ptr));
  }
  // Every other step on a stream of its own: the cache orders it after the steps before on the
  // first step's stream, and that stream after it (events; on a GPU the step would otherwise race
  // the copies and the forward queued there).
  cudaStream_t side_stream = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking));
  struct DestroyStream {
    cudaStream_t s;
    ~DestroyStream() { cudaStreamDestroy(s); }
  } destroy_side{side_stream};
  int64_t L0 = 0;
  int step_index = 0;
  for (int64_t n : steps) {
    SCOPED_TRACE("step of " + std::to_string(n) + " tokens at L0 = " + std::to_string(L0));
    const bool retry = step_index++ == retry_step;
    auto part = [&](const Tensor &t) { return t.narrow(2, L0, n).contiguous(); };
    const Tensor q = part(p.q).to(dt);
    DevBuf qd, kd, vd, od, ld;
    upload(qd, q), upload(kd, part(p.k).to(dt)), upload(vd, part(p.v).to(dt));
    upload(od, torch::zeros_like(q));
    const Tensor lse_like = torch::zeros({p.B, p.H, n}, torch::kFloat32);
    upload(ld, lse_like);
    std::vector<DevBuf> feats(p.features.size());
    std::vector<const float *> fp;
    for (size_t f = 0; f < p.features.size(); ++f) {
      upload(feats[f], part(p.features[f]).to(torch::kFloat32));
      fp.push_back(static_cast<const float *>(feats[f].ptr));
    }
    ape::cuda::CudaDecodeArgs a;
    a.B = p.B, a.H = p.H, a.n = n, a.D = p.D, a.dtype = var.dtype;
    a.q = qd.ptr, a.k = kd.ptr, a.v = vd.ptr, a.o = od.ptr, a.lse = static_cast<float *>(ld.ptr);
    a.features = fp.data(), a.params = pp.data(), a.scale = static_cast<float>(p.scale);
    a.layer = num_layers > 0 ? num_layers - 1 : 0, a.num_layers = num_layers;
    a.num_splits = num_splits;
    a.kv_heads = kv_heads;
    a.stream = step_index % 2 == 0 ? side_stream : nullptr;  // (step_index: this step's + 1)
    FailingScratch failing;
    for (int at = 1; retry; ++at) {
      failing.calls = 0, failing.fail_at = at, a.scratch = &failing.alloc;
      const cudaError_t err = ape::cuda::decode_step(*e, cache, a);
      ASSERT_CUDA(cudaDeviceSynchronize());
      if (failing.calls < at) {  // no allocation failed: the step ran whole
        ASSERT_CUDA(err);
        ASSERT_GT(at, 1) << "the step took no scratch memory";
        break;
      }
      ASSERT_EQ(err, cudaErrorMemoryAllocation) << "allocation " << at;
      ASSERT_EQ(cache.len, L0) << "a failed step changed the cache's length (allocation " << at << ")";
    }
    if (!retry) ASSERT_CUDA(ape::cuda::decode_step(*e, cache, a));
    ASSERT_CUDA(cudaDeviceSynchronize());
    ASSERT_EQ(cache.len, L0 + n);
    ASSERT_EQ(cache.KV, kv_heads > 0 ? kv_heads : p.H) << "the cache's key heads";
    const Tensor o = download(od, q), lse = download(ld, lse_like);
    Tensor full_o, full_lse;
    run_forward_prefix(var, p, L0 + n, full_o, full_lse);
    if (::testing::Test::HasFatalFailure()) return;
    if (num_splits == 1) {
      EXPECT_TRUE(torch::equal(o, full_o.narrow(2, L0, n))) << "o differs from the full forward";
      EXPECT_TRUE(torch::equal(lse, full_lse.narrow(2, L0, n))) << "lse differs from the full forward";
    } else {
      // The shares' own maxima round P (16-bit in P V) and o / l differently: a few units of the
      // output dtype's last place at most; lse is fp32 sums of the same terms.
      const Tensor fo = full_o.narrow(2, L0, n).to(torch::kFloat64), fl = full_lse.narrow(2, L0, n).to(torch::kFloat64);
      const double o_tol = var.dtype == DType::F32 ? 1e-5 : 1.0 / 64;
      EXPECT_LE(max_err(o.to(torch::kFloat64), fo), o_tol * std::max(1.0, max_abs(fo))) << "o vs the full forward";
      EXPECT_LE(max_err(lse.to(torch::kFloat64), fl), 1e-4 * std::max(1.0, max_abs(fl))) << "lse vs the full forward";
      EXPECT_FALSE(torch::isnan(o).any().item<bool>()) << "o has NaN (not written?)";
      // And against the independent reference (the fp64 materialised attention over the tokens so
      // far): the split rows' error at most twice the unsplit forward's, plus a unit of the output
      // dtype's last place at the rows' largest value (a share's keys dropped or weighed wrongly
      // shows here where the 1/64 above lets it through).
      Problem pre = p;
      pre.T = L0 + n;
      auto head = [&](const Tensor &t) { return t.narrow(2, 0, L0 + n); };
      pre.q = head(p.q), pre.k = head(p.k), pre.v = head(p.v), pre.dout = head(p.dout);
      for (auto &f : pre.features) f = head(f);
      const Tensor ro = ape_test::reference_attention(p.enc, ref_inputs(pre), Tensor()).o.narrow(2, L0, n);
      const double split_err = max_err(o.to(torch::kFloat64), ro), full_err = max_err(fo, ro);
      const double ulp = (var.dtype == DType::BF16 ? 0x1p-8 : 0x1p-11) * max_abs(ro);
      EXPECT_LE(split_err, 2 * full_err + ulp)
          << "o vs the reference: the split rows' error " << split_err << ", the unsplit forward's " << full_err;
    }
    L0 += n;
  }
  expect_no_findings();
  // Refusals leave the cache as it was.
  DevBuf buf;
  ASSERT_CUDA(cudaMalloc(&buf.ptr, 1 << 20));
  ASSERT_CUDA(cudaMemset(buf.ptr, 0, 1 << 20));  // (the good step below reads it as q, k, v)
  std::vector<const float *> side(16, static_cast<const float *>(buf.ptr));
  ape::cuda::CudaDecodeArgs a;
  a.B = p.B, a.H = p.H, a.n = 1, a.D = p.D, a.dtype = var.dtype, a.kv_heads = kv_heads;
  a.q = a.k = a.v = buf.ptr, a.o = buf.ptr, a.features = side.data(), a.params = pp.data();
  EXPECT_EQ(ape::cuda::decode_step(*e, cache, a), cudaErrorInvalidValue) << "past the capacity";
  EXPECT_STREQ(ape::cuda::decode_refusal(*e, cache, a), "the step's tokens pass the cache's capacity");
  cache.capacity = T + 1;
  a.dtype = var.dtype == DType::F32 ? DType::BF16 : DType::F32;
  EXPECT_EQ(ape::cuda::decode_step(*e, cache, a), cudaErrorInvalidValue) << "another dtype";
  if (ape::cuda::find_variant(*e, a.dtype, a.D))
    EXPECT_STREQ(ape::cuda::decode_refusal(*e, cache, a), "B, H, kv_heads, D or the dtype differs from the cache's first step");
  a.dtype = var.dtype;
  if (kv_heads > 0) {  // other key heads than the first step's
    a.kv_heads = 0;
    EXPECT_EQ(ape::cuda::decode_step(*e, cache, a), cudaErrorInvalidValue) << "other key heads";
    EXPECT_STREQ(ape::cuda::decode_refusal(*e, cache, a), "B, H, kv_heads, D or the dtype differs from the cache's first step");
    a.kv_heads = 3;
    EXPECT_STREQ(ape::cuda::decode_refusal(*e, cache, a), ape_rules::kKvHeadsRule);
    a.kv_heads = kv_heads;
  }
  a.o = nullptr;
  EXPECT_EQ(ape::cuda::decode_step(*e, cache, a), cudaErrorInvalidValue) << "no output";
  EXPECT_EQ(cache.len, T);
  // What the forward refuses is refused before a cache changes (a retry would otherwise append
  // the tokens twice), here a fresh one's first step, which would take it otherwise (the same
  // arguments with a finite scale: below).
  ape::cuda::CudaDecodeCache fresh;
  fresh.capacity = 4;
  a.o = buf.ptr, a.scale = std::nanf("");
  EXPECT_EQ(ape::cuda::decode_step(*e, fresh, a), cudaErrorInvalidValue) << "a scale that is not finite";
  a.scale = static_cast<float>(p.scale), a.num_layers = 2, a.layer = 2;
  EXPECT_EQ(ape::cuda::decode_step(*e, fresh, a), cudaErrorInvalidValue) << "a layer out of range";
  EXPECT_STREQ(ape::cuda::decode_refusal(*e, fresh, a), "layer is not in [0, num_layers)");
  a.num_layers = 0, a.layer = 0;
  if (e->num_params > 0) {
    a.params = nullptr;
    EXPECT_EQ(ape::cuda::decode_step(*e, fresh, a), cudaErrorInvalidValue) << "no params";
    a.params = pp.data();
  }
  if (e->num_features > 0) {
    side[e->num_features - 1] = nullptr;
    EXPECT_EQ(ape::cuda::decode_step(*e, fresh, a), cudaErrorInvalidValue) << "a missing feature";
    side[e->num_features - 1] = static_cast<const float *>(buf.ptr);
  }
  EXPECT_FALSE(fresh.started());
  EXPECT_EQ(fresh.len, 0);
  EXPECT_EQ(ape::cuda::decode_refusal(*e, fresh, a), nullptr);
  ASSERT_CUDA(ape::cuda::decode_step(*e, fresh, a));  // the arguments are otherwise good
  ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(fresh.len, 1);
  EXPECT_EQ(fresh.stream, a.stream);
  // A cache too large for the device (up to 1 TiB of k, at least 128 GiB; a capacity below 2^31,
  // which is refused): the first step fails on its allocation and leaves no error behind for the
  // next launch to report as its own, nor a started cache.
  ape::cuda::CudaDecodeCache huge;
  huge.capacity = std::min((int64_t(1) << 31) - 1,
                           (int64_t(1) << 40) / (p.B * p.H * p.D * int64_t(ape::cuda::dtype_bytes(var.dtype))));
  EXPECT_EQ(ape::cuda::decode_step(*e, huge, a), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess) << "the failed allocation's error was left behind";
  EXPECT_FALSE(huge.started());
  ape::cuda::CudaDecodeCache after;
  after.capacity = 4;
  ASSERT_CUDA(ape::cuda::decode_step(*e, after, a));
  ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(after.len, 1);
}

// The backward refuses missing gradient pointers (and a missing status word) instead of
// dereferencing them, for every variant of every encoding with side inputs.

TEST_P(CudaKernel, DecodeStepsEqualTheFullForward) {
  const auto &[name, index] = GetParam();
  check_decode_steps(name, index);
}

#ifdef APE_SIMT
// The same through the sm_90 path (the 16-bit forward is the Hopper kernel; its query tiles of
// 128 rows are skipped by first_row as the others are).
TEST_P(CudaKernel, Sm90DecodeStepsEqualTheFullForward) {
  const auto &[name, index] = GetParam();
  const PoseAsSm90 guard;
  check_decode_steps(name, index);
}
#endif

TEST(CudaArgs, NullGradientPointersAreRefused) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  DevBuf buf;
  ASSERT_EQ(cudaMalloc(&buf.ptr, 1 << 20), cudaSuccess);
  ASSERT_EQ(cudaMemset(buf.ptr, 0, 1 << 20), cudaSuccess);
  std::vector<const float *> side(16, static_cast<const float *>(buf.ptr));
  std::vector<float *> dside(16, static_cast<float *>(buf.ptr));
  int checked = 0;
  for (const CudaKernelEntry *e : cuda_entries()) {
    if (e->num_features == 0 && e->num_params == 0) continue;
    for (size_t k = 0; k < e->num_variants; ++k) {
      const auto &var = e->variants[k];
      CudaAttnArgs a;
      a.B = 1, a.H = 1, a.T = 4, a.D = var.head_dim, a.dtype = var.dtype;
      a.q = a.k = a.v = a.dout = buf.ptr;
      a.o = a.dq = a.dk = a.dv = buf.ptr;
      a.lse = static_cast<float *>(buf.ptr);
      a.features = side.data(), a.params = side.data();
      a.status = static_cast<uint32_t *>(buf.ptr);
      a.dfeatures = nullptr, a.dparams = nullptr;  // missing
      EXPECT_EQ(var.backward(a), cudaErrorInvalidValue) << e->name;
      a.dfeatures = dside.data(), a.dparams = dside.data(), a.status = nullptr;
      EXPECT_EQ(var.backward(a), cudaErrorInvalidValue) << e->name << " without a status word";
      ++checked;
    }
  }
  EXPECT_GT(checked, 0) << "no encoding with side inputs in this build";
  expect_no_findings();
}

// The bf16, head dim 64 variant of `name`, or null (the test then skips, saying why in `why`).
const ape::cuda::CudaVariant *bf16_hd64(const char *name, std::string &why) {
  if (!has_gpu()) return why = "no CUDA device", nullptr;
  const CudaKernelEntry *e = find_cuda(name);
  if (!e) return why = std::string(name) + " is not in this build", nullptr;
  const auto *var = ape::cuda::find_variant(*e, ape::cuda::DType::BF16, 64);
  if (!var) why = std::string(name) + " has no bf16/hd64 variant in this build";
  return var;
}

// A call at B 1, H 1, T 8, D 64 in bf16 over a zeroed 1 MiB device buffer: q, k, v, o, dout, dq,
// dk, dv, lse and the status word side by side, each at a multiple of 16 bytes.
struct PackedCall {
  DevBuf buf;
  char *base = nullptr;
  PackedCall() {
    EXPECT_EQ(cudaMalloc(&buf.ptr, 1 << 20), cudaSuccess);
    EXPECT_EQ(cudaMemset(buf.ptr, 0, 1 << 20), cudaSuccess);
    base = static_cast<char *>(buf.ptr);
  }
  CudaAttnArgs args() const {
    CudaAttnArgs a;
    a.B = 1, a.H = 1, a.T = 8, a.D = 64, a.dtype = ape::cuda::DType::BF16, a.scale = 0.125f;
    const size_t t = 8 * 64 * 2;  // bytes of one tensor
    a.q = base, a.k = base + t, a.v = base + 2 * t, a.o = base + 3 * t, a.dout = base + 4 * t;
    a.dq = base + 5 * t, a.dk = base + 6 * t, a.dv = base + 7 * t;
    a.lse = reinterpret_cast<float *>(base + 8 * t), a.status = reinterpret_cast<uint32_t *>(base + 9 * t);
    return a;
  }
};

// Every row pointer at a multiple of 16 bytes (cuda/kernel_entry.h): a tensor 2 bytes into a
// buffer is refused before any launch (it would have ended in a sticky misaligned-address error),
// and the same call at the aligned address runs.
TEST(CudaArgs, MisalignedRowPointersAreRefused) {
  std::string why;
  const auto *var = bf16_hd64("nope", why);
  if (!var) GTEST_SKIP() << why;
  const PackedCall call;
  auto args = [&] { return call.args(); };
  ASSERT_EQ(var->forward(args()), cudaSuccess);
  ASSERT_EQ(var->backward(args()), cudaSuccess);
  const char *names[] = {"q", "k", "v", "o", "dout", "dq", "dk", "dv"};
  for (int x = 0; x < 8; ++x) {
    CudaAttnArgs a = args();
    const void **in[] = {&a.q, &a.k, &a.v, &a.dout};
    void **out[] = {&a.o, &a.dq, &a.dk, &a.dv};
    const int ins[] = {0, 1, 2, -1, 3, -1, -1, -1}, outs[] = {-1, -1, -1, 0, -1, 1, 2, 3};
    if (ins[x] >= 0) *in[ins[x]] = static_cast<const char *>(*in[ins[x]]) + 2;
    else *out[outs[x]] = static_cast<char *>(*out[outs[x]]) + 2;
    if (x < 4) EXPECT_EQ(var->forward(a), cudaErrorInvalidValue) << names[x];
    EXPECT_EQ(var->backward(a), cudaErrorInvalidValue) << names[x];
    EXPECT_EQ(refused(*var, a, true), x < 4 ? "q, k, v or o is not 16-byte aligned"
                                            : "dout, dq, dk or dv is not 16-byte aligned")
        << names[x];
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_no_findings();
}

// A longer buffer (CudaAttnArgs::ld) and a cached k' (km) where they apply, refused elsewhere:
// ld below T, either in a backward or with an attention transition's layers; km for an encoding
// that does not cache its k mod (NoPE has none), beyond T or misaligned; num_splits below 0, or
// above 1 in a backward. (The decode tests run
// both: DecodeStepsEqualTheFullForward.)
TEST(CudaArgs, LongerBuffersAndKeyCachesWhereTheyApply) {
  std::string why;
  const auto *nope = bf16_hd64("nope", why);
  if (!nope) GTEST_SKIP() << why;
  const auto *rope = bf16_hd64("rope", why);
  if (!rope) GTEST_SKIP() << why;
  ASSERT_TRUE(find_cuda("rope")->caches_k_mod);
  ASSERT_FALSE(find_cuda("nope")->caches_k_mod);
  const PackedCall call;
  CudaAttnArgs a = call.args();
  a.T = 4, a.ld = 8;  // the first 4 of 8 rows a slice
  EXPECT_EQ(nope->forward(a), cudaSuccess);
  EXPECT_EQ(nope->backward(a), cudaErrorInvalidValue) << "ld in a backward";
  EXPECT_EQ(refused(*nope, a, true), "ld other than T is for the forward without num_layers only");
  EXPECT_EQ(refused(*nope, a, false), "");
  a.ld = 3;
  EXPECT_EQ(nope->forward(a), cudaErrorInvalidValue) << "ld below T";
  EXPECT_EQ(refused(*nope, a, false), "ld is below T or 2^31 or more");
  a.ld = 8, a.num_layers = 1;
  EXPECT_EQ(nope->forward(a), cudaErrorInvalidValue) << "ld with a transition's layers";
  a.num_layers = 0;
  CudaAttnArgs c = a;
  c.km = static_cast<char *>(call.buf.ptr) + (1 << 19), c.km_rows = 2;
  EXPECT_EQ(nope->forward(c), cudaErrorInvalidValue) << "km without a k mod";
  EXPECT_EQ(refused(*nope, c, false), "km is given but the encoding does not cache its k mod");
  EXPECT_EQ(rope->forward(c), cudaSuccess);
  EXPECT_EQ(rope->backward(c), cudaErrorInvalidValue) << "km in a backward";
  c.km_rows = 5;
  EXPECT_EQ(rope->forward(c), cudaErrorInvalidValue) << "km_rows beyond T";
  EXPECT_EQ(refused(*rope, c, false), "km_rows is not in [0, T]");
  c.km_rows = 0, c.km = static_cast<char *>(c.km) + 2;
  EXPECT_EQ(rope->forward(c), cudaErrorInvalidValue) << "a misaligned km";
  EXPECT_EQ(refused(*rope, c, false), "km is not 16-byte aligned");
  c.km = static_cast<char *>(c.km) - 2, c.ld = 0;
  EXPECT_EQ(rope->forward(c), cudaErrorInvalidValue) << "km with ld 0 (its rows a slice would follow T)";
  // The key side's relative rows (krel): where the encoding has them and keeps them
  // (key_rel_floats: Transformer-XL's u . k row, DeBERTa's 32 p2c rows), with or without km; one
  // count of cached rows for both.
  CudaAttnArgs r = a;
  r.krel = reinterpret_cast<float *>(call.base + (1 << 19)), r.km_rows = 2;
  EXPECT_EQ(nope->forward(r), cudaErrorInvalidValue) << "krel without key-side relative rows";
  EXPECT_EQ(rope->forward(r), cudaErrorInvalidValue) << "krel without key-side relative rows";
  EXPECT_EQ(find_cuda("rope")->key_rel_floats, 0);
  for (auto [name, floats] : {std::pair<const char *, int64_t>{"shaw", 0}, {"transformer_xl", 1}, {"deberta", 32}})
    if (const CudaKernelEntry *e = find_cuda(name)) EXPECT_EQ(e->key_rel_floats, floats) << name;
  if (const auto *xl = bf16_hd64("transformer_xl", why)) {
    std::vector<const float *> prm(3, reinterpret_cast<const float *>(call.base + (1 << 18)));  // zeros
    r.params = prm.data();
    EXPECT_EQ(xl->forward(r), cudaSuccess);
    EXPECT_EQ(xl->backward(r), cudaErrorInvalidValue) << "krel in a backward";
    r.km_rows = 0, r.krel = nullptr;
    EXPECT_EQ(xl->forward(r), cudaSuccess) << "neither cache";
    r.km_rows = 1;
    EXPECT_EQ(xl->forward(r), cudaErrorInvalidValue) << "km_rows without a cache";
    r.km_rows = 5, r.krel = reinterpret_cast<float *>(call.base + (1 << 19));
    EXPECT_EQ(xl->forward(r), cudaErrorInvalidValue) << "km_rows beyond T";
  }
  // The token program's sequences and scan sums (tok, tok_carry): both or neither, where the
  // program does not read the length (tok_seqs: Cable's feature, map and scan).
  EXPECT_EQ(find_cuda("rope")->tok_seqs, 0);
  if (const CudaKernelEntry *e = find_cuda("cable")) EXPECT_EQ(e->tok_seqs, 3);
  CudaAttnArgs t = a;
  t.tok = reinterpret_cast<float *>(call.base + (1 << 19));
  t.tok_carry = reinterpret_cast<double *>(call.base + (1 << 19) + (1 << 18)), t.km_rows = 2;
  EXPECT_EQ(nope->forward(t), cudaErrorInvalidValue) << "tok without a token program";
  if (const auto *cable = bf16_hd64("cable", why)) {
    std::vector<const float *> feat(1, reinterpret_cast<const float *>(call.base + (1 << 18)));  // zeros
    t.features = feat.data();
    EXPECT_EQ(cable->forward(t), cudaSuccess);
    EXPECT_EQ(cable->backward(t), cudaErrorInvalidValue) << "tok in a backward";
    CudaAttnArgs u = t;
    u.tok_carry = nullptr;
    EXPECT_EQ(cable->forward(u), cudaErrorInvalidValue) << "tok without its carries";
    EXPECT_EQ(refused(*cable, u, false), "tok and tok_carry go together");
    u = t, u.tok = nullptr;
    EXPECT_EQ(cable->forward(u), cudaErrorInvalidValue) << "carries without tok";
    // The features at a longer stride (feat_ld: a cache's capacity), forward only, not below T.
    u = t, u.feat_ld = 8;
    EXPECT_EQ(cable->forward(u), cudaSuccess);
    u.ld = 0, u.tok = nullptr, u.tok_carry = nullptr, u.km_rows = 0;  // nothing else a backward refuses
    EXPECT_EQ(cable->backward(u), cudaErrorInvalidValue) << "feat_ld in a backward";
    u.feat_ld = 0;
    std::vector<float *> dfeat(1, reinterpret_cast<float *>(call.base + (1 << 19)));
    u.dfeatures = dfeat.data();
    EXPECT_EQ(cable->backward(u), cudaSuccess) << "the same backward without feat_ld";
    u = t, u.feat_ld = 8;
    u.feat_ld = 3;
    EXPECT_EQ(cable->forward(u), cudaErrorInvalidValue) << "feat_ld below T";
    u.feat_ld = 8, u.num_layers = 1, u.ld = 0, u.tok = nullptr, u.tok_carry = nullptr, u.km_rows = 0;
    EXPECT_EQ(cable->forward(u), cudaErrorInvalidValue) << "feat_ld with a transition's layers";
  }
  CudaAttnArgs sp = call.args();
  sp.num_splits = -1;
  EXPECT_EQ(nope->forward(sp), cudaErrorInvalidValue) << "num_splits < 0";
  sp.num_splits = 2;
  EXPECT_EQ(nope->forward(sp), cudaSuccess);
  EXPECT_EQ(nope->backward(sp), cudaErrorInvalidValue) << "num_splits in a backward";
  EXPECT_EQ(refused(*nope, sp, true), "the backward needs num_splits 0 or 1");
  // q from a later row (q_row0, q_ld: a decode step's window): at most first_row's window start.
  CudaAttnArgs qw = call.args();
  qw.first_row = 5, qw.q_row0 = 1, qw.q_ld = 7;
  EXPECT_EQ(nope->forward(qw), cudaErrorInvalidValue) << "q_row0 past the window's start";
  EXPECT_EQ(refused(*nope, qw, false), "q_row0 is not in [0, first_row rounded down to a multiple of kQueryWindow]");
  qw.q_row0 = 0, qw.q_ld = 7;
  EXPECT_EQ(refused(*nope, qw, false), "q_ld is below T - q_row0 or 2^31 or more");
  qw.q_ld = 8;
  EXPECT_EQ(nope->forward(qw), cudaSuccess);
  qw.first_row = 0;
  EXPECT_EQ(refused(*nope, qw, true), "q_row0 and q_ld are for the forward without num_layers only");
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_no_findings();
}

#ifdef APE_SIMT
// What a one-token decode step moves (cuda/decode.h; docs/decoding.md): the bytes every kernel of
// the step reads and writes, counted by the emulator, against the keys' and values' read that the
// attention needs (2 L D bf16 per slice), for RoPE (k' cached) and NoPE at L 501 of a 512-token
// cache (B 1, H 2, D 64). The step reads the cache in place: the k mod of the new row, the q mod
// from the new row's warp (the FlashAttention-2-class split kernel, split or as one share, reads
// and computes only the warps holding new rows), no re-packing. (Before, the step's q and k mods ran over all L
// rows, 8 L D bytes a slice, and the arrays were re-packed by copies at the new length.)
TEST(CudaDecode, AOneTokenStepMovesTheKeysAndValuesOnce) {
  for (const char *name : {"rope", "nope"})
    for (int num_splits : {0, 1}) {  // the device's choice (2 shares here), unsplit
      SCOPED_TRACE(std::string(name) + " num_splits " + std::to_string(num_splits));
      std::string why;
      const auto *var = bf16_hd64(name, why);
      if (!var) GTEST_SKIP() << why;
      const CudaKernelEntry *e = find_cuda(name);
      const int64_t C = 512, L0 = 500, D = 64;
      const Problem p = make_problem(*e, 1, 2, L0 + 1, D, 5);
      ape::cuda::CudaDecodeCache cache;
      cache.capacity = C;
      size_t step_bytes = 0, step_flops = 0;
      std::string kernels;
      for (int64_t n : {L0, int64_t(1)}) {
        const int64_t at = cache.len;
        auto part = [&](const Tensor &t) { return t.narrow(2, at, n).contiguous().to(torch::kBFloat16); };
        DevBuf qd, kd, vd, od;
        upload(qd, part(p.q)), upload(kd, part(p.k)), upload(vd, part(p.v)), upload(od, part(p.q));
        ape::cuda::CudaDecodeArgs a;
        a.B = p.B, a.H = p.H, a.n = n, a.D = D, a.dtype = var->dtype;
        a.q = qd.ptr, a.k = kd.ptr, a.v = vd.ptr, a.o = od.ptr, a.scale = static_cast<float>(p.scale);
        a.num_splits = num_splits;
        ape::simt::take_traffic();
        ASSERT_CUDA(ape::cuda::decode_step(*e, cache, a));
        ASSERT_CUDA(cudaDeviceSynchronize());
        step_bytes = 0, step_flops = 0, kernels.clear();
        for (const auto &t : ape::simt::take_traffic()) {
          step_bytes += t.read + t.written + t.atomic, step_flops += t.mma_flops;
          kernels += " " + t.kernel.substr(0, t.kernel.find('<')) + " " + std::to_string(t.read + t.written + t.atomic);
        }
        if (n == 1) std::printf("[decode traffic] %s, num_splits %d:%s\n", name, num_splits, kernels.c_str());
      }
      const double kv = 2.0 * (L0 + 1) * D * 2 * p.B * p.H;  // k' and v of every key, bf16
      std::printf("[decode traffic] %s, num_splits %d: a one-token step at L %lld moves %zu bytes in its kernels, "
                  "%.2fx the keys' and values' %.0f\n",
                  name, num_splits, static_cast<long long>(L0 + 1), step_bytes, step_bytes / kv, kv);
      EXPECT_LT(step_bytes, 1.1 * kv) << "the step moves more than its keys and values (and its rows' q', o)";
      EXPECT_GT(step_bytes, kv) << "the step cannot read fewer bytes than the keys and values";
      EXPECT_EQ(kernels.find("split_combine_kernel") != std::string::npos, num_splits == 0)
          << "two slices of 501 keys on 108 SMs split in two (kFwdSplitMinTiles), only by default";
      // The tensor cores' work: Q'K'^T and P V of the new row's m16 tile over the key tiles (512
      // keys) is the least an mma.sync step can issue; a warp holds two m16 tiles at D 64. Split or
      // not, the warps without the new row compute nothing (the whole 128-row tile: 8x).
      const double m16 = 2.0 * 2 * 16 * 512 * D * p.B * p.H;
      std::printf("[decode traffic] %s, num_splits %d: %zu tensor-core FLOPs, %.1fx one m16 tile's\n", name,
                  num_splits, step_flops, step_flops / m16);
      EXPECT_LE(step_flops, 2 * m16) << "warps without the new row computed";
    }
  expect_no_findings();
}
#endif

// Steps past row 384 (kFwdRowAlign, kQueryWindow), where a step computes q' and the query side's relative rows
// of the rows from 384 only (the Hopper forward's tiles) or from the new rows' warp, 416
// (kFwdWarpRows: the FlashAttention-2-class kernel as one share): the same rows as the full forward, for a q mod (RoPE, its k' cached;
// dynamic NTK, k' recomputed), relative rows on both sides (Shaw, Transformer-XL, DeBERTa) and a
// token program (Cable), bf16 at d_h 64.
TEST(CudaDecode, StepsPastTheFirstAlignedRows) {
  int ran = 0;
  for (const char *name : {"rope", "rope_dynamic_ntk", "shaw", "transformer_xl", "deberta", "cable"}) {
    SCOPED_TRACE(name);
    std::string why;
    const auto *var = bf16_hd64(name, why);
    if (!var) continue;  // not in this build
    const CudaKernelEntry *e = find_cuda(name);
    check_decode_steps(name, static_cast<size_t>(var - e->variants), 0, {420, 1, 7});
    // From row 384 on: a step at 384 reads its own q (CudaAttnArgs::q_row0 = 384), later ones a
    // window from 384 with zeros before their rows; the step of 100 at 400 runs the unsplit
    // kernel (most of its tile's rows are new) from q's row 384. (A q mod, relative rows on the
    // query side, a token program: the kinds of reader of q and its rows.)
    if (std::string(name) == "rope" || std::string(name) == "transformer_xl" || std::string(name) == "cable")
      check_decode_steps(name, static_cast<size_t>(var - e->variants), 0, {384, 1, 15, 100, 7});
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "none of the encodings in this build (or no CUDA device)";
}

// A step's token program resumes at the chunk of 256 tokens holding its first new token, from the
// scans' sums the cache kept there (CudaKernelEntry::tok_seqs, CudaAttnArgs::tok): steps that end
// within a chunk, on its last token (255), on a chunk's end (256: the sums saved for the next
// chunk) and across two; Cable (a scan) and K-Cable, bit for bit with the full forward.
TEST(CudaDecode, TokenProgramResumesAtItsChunk) {
  int ran = 0;
  for (const char *name : {"cable", "kcable"}) {
    SCOPED_TRACE(name);
    std::string why;
    const auto *var = bf16_hd64(name, why);
    if (!var) continue;  // not in this build
    const CudaKernelEntry *e = find_cuda(name);
    ASSERT_GT(e->tok_seqs, 0);
    // The step of 300 fails at each of its allocations first (its token program may have run:
    // the retry resumes from a scan sum the failed step left, or starts again).
    check_decode_steps(name, static_cast<size_t>(var - e->variants), 0, {250, 5, 1, 300, 1}, 1, 3);
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "none of the encodings in this build (or no CUDA device)";
}

// A decode step's memory is its new rows', not the sequence's: its outputs go straight into the
// caller's (B, H, n, .) o and lse (CudaAttnArgs::o_from_first) and q' lives in scratch from the
// first row the forward reads only (Params::qm_row0), where both were (B, H, L, .) scratch, 2·L·D
// bytes a slice each at every one-token step (16 GiB a step at B 1, H 32, L 1M, d_h 128 in bf16).
// RoPE (a q mod) one token after 1,100, on the FlashAttention-2-class kernel (q' from the new row's
// warp) and the Hopper forward (from its window of kFwdRowAlign = 384 rows): no block the step
// takes is larger than (B, H, 384, D), a third of (B, H, L, D) here; bit for bit the rows of the
// full forward. A caller's o that is not
// 16-byte aligned, and a null lse, go through scratch of the step's rows: the same bits.
TEST(CudaDecode, AStepTakesMemoryForItsRowsNotTheSequences) {
  std::string why;
  const auto *var = bf16_hd64("rope", why);
  if (!var) GTEST_SKIP() << why;
  const CudaKernelEntry *e = find_cuda("rope");
  struct Recording {
    size_t largest = 0;
    ape::cuda::CudaScratchAllocator alloc{
        [](void *ctx, size_t bytes, cudaStream_t st) -> void * {
          auto *self = static_cast<Recording *>(ctx);
          self->largest = std::max(self->largest, bytes);
          void *ptr = nullptr;
          return cudaMallocAsync(&ptr, bytes, st) == cudaSuccess ? ptr : nullptr;
        },
        [](void *, void *ptr, cudaStream_t st) { cudaFreeAsync(ptr, st); }, this};
  };
  const int64_t L0 = 1100, L = L0 + 1, D = 64;
  const Problem p = make_problem(*e, 1, 2, L, D, 77);
  const auto dt = torch::kBFloat16;
  const int64_t S = p.B * p.H;
  auto step = [&](ape::cuda::CudaDecodeCache &cache, int64_t row0, int64_t n, void *o, float *lse,
                  Recording *rec) {
    auto part = [&](const Tensor &t) { return t.narrow(2, row0, n).contiguous().to(dt); };
    DevBuf qd, kd, vd;
    upload(qd, part(p.q)), upload(kd, part(p.k)), upload(vd, part(p.v));
    ape::cuda::CudaDecodeArgs a;
    a.B = p.B, a.H = p.H, a.n = n, a.D = D, a.dtype = var->dtype;
    a.q = qd.ptr, a.k = kd.ptr, a.v = vd.ptr, a.o = o, a.lse = lse, a.scale = static_cast<float>(p.scale);
    a.scratch = rec ? &rec->alloc : nullptr;
    a.num_splits = 1;  // (the Hopper forward where the device has it)
    ASSERT_CUDA(ape::cuda::decode_step(*e, cache, a));
    ASSERT_CUDA(cudaDeviceSynchronize());
  };
#ifdef APE_SIMT
  for (const bool sm90 : {false, true}) {
    SCOPED_TRACE(sm90 ? "the Hopper forward" : "the FlashAttention-2-class forward");
    std::optional<PoseAsSm90> pose;
    if (sm90) pose.emplace();
#else
  {  // the device's own kernels
#endif
    Tensor full_o, full_lse;
    run_forward_prefix(*var, p, L, full_o, full_lse);
    if (HasFatalFailure()) return;
    const Tensor want_o = full_o.narrow(2, L0, 1), want_lse = full_lse.narrow(2, L0, 1);
    ape::cuda::CudaDecodeCache cache, other;
    cache.capacity = other.capacity = L;
    DevBuf prefill_o;
    ASSERT_CUDA(cudaMalloc(&prefill_o.ptr, static_cast<size_t>(S * L0 * D) * 2 + 16));
    step(cache, 0, L0, prefill_o.ptr, nullptr, nullptr);
    step(other, 0, L0, prefill_o.ptr, nullptr, nullptr);
    if (HasFatalFailure()) return;
    DevBuf od, ld, od2;
    const Tensor o_like = torch::zeros({p.B, p.H, 1, D}, dt), lse_like = torch::zeros({p.B, p.H, 1});
    upload(od, o_like), upload(ld, lse_like);
    Recording rec;
    step(cache, L0, 1, od.ptr, static_cast<float *>(ld.ptr), &rec);
    if (HasFatalFailure()) return;
    EXPECT_TRUE(torch::equal(download(od, o_like), want_o)) << "o differs from the full forward";
    EXPECT_TRUE(torch::equal(download(ld, lse_like), want_lse)) << "lse differs from the full forward";
    const size_t sequence = static_cast<size_t>(S * L * D) * 2;  // (B, H, L, D) in bf16
    EXPECT_GT(rec.largest, 0u) << "q' comes from the scratch allocator";
    // q' of at most the rows of one kFwdRowAlign (384) window; the whole sequence's was 2.9x that
    const size_t window = static_cast<size_t>(S * 384 * D) * 2;
    EXPECT_LE(rec.largest, window) << "a block of " << rec.largest << " bytes for one new row";
    EXPECT_LT(window, sequence);
    // o at 2 bytes past a 16-byte boundary, lse not wanted.
    ASSERT_CUDA(cudaMalloc(&od2.ptr, static_cast<size_t>(S * D) * 2 + 16));
    char *o_odd = static_cast<char *>(od2.ptr) + 2;
    step(other, L0, 1, o_odd, nullptr, nullptr);
    if (HasFatalFailure()) return;
    Tensor got = torch::empty_like(o_like);
    ASSERT_CUDA(cudaMemcpy(got.data_ptr(), o_odd, got.nbytes(), cudaMemcpyDeviceToHost));
    EXPECT_TRUE(torch::equal(got, want_o)) << "o through scratch differs";
  }
  expect_no_findings();
}

#ifdef APE_SIMT
// The device's count of shares (num_splits 0, ape/cuda/launch.cuh: num_splits_for): the count that
// ends first by rounds of the SMs' blocks, ceil(blocks n / slots) x (ceil(tiles / n) + 1), where
// slots = SMs x the blocks an SM holds (3 of NoPE's d_h 64 bf16 forward as sm_80: its 48 KiB of
// tiles in 164 KiB; the emulator has no registers to count). Counted from the split kernel's blocks
// in the emulator's records of a step at L 2048 (32 key tiles, at most 8 shares of 4).
TEST(CudaLaunch, SplitCountsEndInTheFewestRounds) {
  std::string why;
  const auto *var = bf16_hd64("nope", why);
  if (!var) GTEST_SKIP() << why;
  const PoseAs pose(80);
  const int64_t T = 2048, D = 64, H_most = 16;
  const size_t t = size_t(H_most) * T * D * 2;
  DevBuf buf;
  ASSERT_CUDA(cudaMalloc(&buf.ptr, 4 * t + sizeof(float) * H_most * T));
  ASSERT_CUDA(cudaMemset(buf.ptr, 0, 4 * t + sizeof(float) * H_most * T));
  char *base = static_cast<char *>(buf.ptr);
  auto shares = [&](int sms, int64_t H, int64_t first_row) -> int64_t {
    const PoseWithSms with(sms);
    CudaAttnArgs a;
    a.B = 1, a.H = H, a.T = T, a.D = D, a.dtype = DType::BF16, a.scale = 0.125f, a.first_row = first_row;
    a.q = base, a.k = base + t, a.v = base + 2 * t, a.o = base + 3 * t;
    a.lse = reinterpret_cast<float *>(base + 4 * t);
    ape::simt::take_traffic();
    EXPECT_EQ(var->forward(a), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (const auto &r : ape::simt::take_traffic())
      if (r.kernel.find("flash_forward_kernel") != std::string::npos)
        return r.kernel.find(", true>") != std::string::npos ? int64_t(r.blocks) / H : 1;
    return 0;
  };
  // 4 slices on 6 SMs (18 slots): 4 shares in one round of 8 + 1 (5 would take two rounds; the
  // rule before, two blocks a SM, chose 3); 2 slices: 8, the most (one round of 4 + 1).
  EXPECT_EQ(shares(6, 4, T - 1), 4);
  EXPECT_EQ(shares(6, 2, T - 1), 8);
  // 16 slices on 2 SMs (6 slots): the query tiles fill the SMs, no split.
  EXPECT_EQ(shares(2, 16, T - 1), 1);
  // 2 slices on 108 SMs (324 slots): 8 shares, one round.
  EXPECT_EQ(shares(108, 2, T - 1), 8);
  expect_no_findings();
}
#endif

// Keys split (CudaAttnArgs::num_splits, FlashDecoding): each query tile's key tiles over blocks
// that write their shares' o and lse, added by split_combine_kernel. A full forward split three
// ways against the references (and the backward that reads its o and lse) at T 200, where the
// query tiles' 2 and 4 key tiles leave shares of one tile, two, and none; decode steps split three
// ways, and as the device decides (NoPE: 4 shares of 1,101 keys over 2 slices), against the full
// forward. As sm_80 and sm_90 (where a split call takes the FlashAttention-2-class forward, not
// the Hopper one). The encodings cover each way the flash forward adds a score mod: none (NoPE),
// q and k mods with k' cached (RoPE), a distance bias (ALiBi), row and column biases (Cable),
// staged parameters (FIRE), feature tiles (K-Cable), relative rows (Transformer-XL); value rows
// (Shaw) run unsplit, as f32 does (the general forward), and are the full forward's bit for bit.
TEST(CudaLaunch, SplitKeysMatchReferences) {
  int ran = 0;
#ifdef APE_SIMT
  for (int sm : {80, 90}) {
    const PoseAs pose(sm);
#else
  for (int sm : {0}) {
#endif
    for (const auto &[name, dtype, D] : std::vector<std::tuple<std::string, DType, int>>{
             {"nope", DType::BF16, 64}, {"rope", DType::BF16, 128}, {"alibi", DType::F16, 64},
             {"cable", DType::BF16, 64}, {"fire", DType::BF16, 64}, {"kcable", DType::BF16, 64},
             {"transformer_xl", DType::BF16, 64}, {"shaw", DType::BF16, 64}, {"rope", DType::F32, 64}}) {
      SCOPED_TRACE(name + " " + ape::cuda::dtype_name(dtype) + " D=" + std::to_string(D) + " sm " + std::to_string(sm));
      const CudaKernelEntry *e = find_cuda(name);
      const ape::cuda::CudaVariant *var = e ? ape::cuda::find_variant(*e, dtype, D) : nullptr;
      if (!var || !has_gpu()) continue;  // not in this build
      RunOptions opt;
      opt.num_splits = 3;
      const bool splits = dtype != DType::F32 && name != "shaw";
#ifdef APE_SIMT
      auto combined = [] {  // whether a split's shares were added since the last call
        for (const auto &t : ape::simt::take_traffic())
          if (t.kernel.find("split_combine_kernel") != std::string::npos) return true;
        return false;
      };
      combined();
#endif
      check_problem(name, *var, make_problem(*e, 2, 1, 200, D, 4242), opt);
      if (HasFatalFailure()) return;
#ifdef APE_SIMT
      EXPECT_EQ(combined(), splits) << "the forward split its keys";
#endif
      const size_t index = static_cast<size_t>(var - e->variants);
      if (sm == 90 && name != "nope" && name != "rope") continue;  // (the decode steps as sm_80)
      check_decode_steps(name, index, 0, {420, 1, 7}, splits ? 3 : 1);
      if (HasFatalFailure()) return;
#ifdef APE_SIMT
      EXPECT_EQ(combined(), splits) << "the decode steps split their keys";
#endif
      if (name == "nope" && sm != 90) {
        check_decode_steps(name, index, 0, {1100, 1}, 0);
        if (HasFatalFailure()) return;
#ifdef APE_SIMT
        EXPECT_TRUE(combined()) << "a 1,101-key step over 2 slices splits by default";
#endif
        // A NaN key: the rows that see it are NaN split as unsplit (a share's NaN is not dropped).
        Problem bad = make_problem(*e, 1, 1, 300, D, 99);
        bad.k[0][0][150][3] = std::nan("");
        Outputs split_out, plain_out;
        RunOptions fwd;
        fwd.backward = false, fwd.num_splits = 3;
        run_gpu(*var, bad, split_out, nullptr, fwd);
        fwd.num_splits = 1;
        run_gpu(*var, bad, plain_out, nullptr, fwd);
        if (HasFatalFailure()) return;
        for (int n : {0, 1}) {
          const Tensor a = torch::isnan(split_out[n].second), b = torch::isnan(plain_out[n].second);
          EXPECT_TRUE(torch::equal(a, b)) << split_out[n].first << ": NaN rows differ split and unsplit";
          EXPECT_TRUE(b.any().item<bool>()) << "the NaN key reaches no row";
        }
      }
      ++ran;
    }
  }
  if (ran == 0) GTEST_SKIP() << "none of the encodings in this build (or no CUDA device)";
}

#ifdef APE_SIMT
// The Hopper forward's query tiles of 192 rows (three consumer warpgroups, d_h <= 64) in decode
// steps (q' is computed from first_row's tile: kFwdRowAlign), and prefills given a model's layers
// (decode.h then runs the prefill on the step's own inputs, and the next step computes every k'),
// for RoPE (its k' cached) and NoPE.
TEST(CudaDecode, ThreeConsumerTilesAndPrefillsWithLayers) {
  const PoseAsSm90 guard;
  ASSERT_EQ(setenv("APE_CUDA_HOPPER_CONSUMERS", "3", 1), 0);
  for (const char *name : {"rope", "nope"}) {
    SCOPED_TRACE(name);
    std::string why;
    const auto *var = bf16_hd64(name, why);
    if (!var) {
      unsetenv("APE_CUDA_HOPPER_CONSUMERS");
      GTEST_SKIP() << why;
    }
    const CudaKernelEntry *e = find_cuda(name);
    const size_t index = static_cast<size_t>(var - e->variants);
    check_decode_steps(name, index);
    check_decode_steps(name, index, 2);
  }
  unsetenv("APE_CUDA_HOPPER_CONSUMERS");
}
#endif

// A caller's scratch allocator (CudaAttnArgs::scratch) that counts: every block it hands out
// must come back once, before the call returns; fail_after blocks, it refuses.
struct CountingScratch {
  ape::cuda::CudaScratchAllocator alloc;
  std::set<void *> live;
  int taken = 0, fail_after = -1;
  CountingScratch() { alloc.alloc = &take, alloc.free = &give, alloc.ctx = this; }
  static void *take(void *ctx, size_t bytes, cudaStream_t) {
    auto *self = static_cast<CountingScratch *>(ctx);
    void *ptr = nullptr;
    if ((self->fail_after >= 0 && self->taken >= self->fail_after) || cudaMalloc(&ptr, bytes) != cudaSuccess)
      return nullptr;
    ++self->taken, self->live.insert(ptr);
    return ptr;
  }
  static void give(void *ctx, void *ptr, cudaStream_t) {
    EXPECT_EQ(static_cast<CountingScratch *>(ctx)->live.erase(ptr), 1u) << "a block given back twice or never taken";
    cudaFree(ptr);  // waits for the GPU: the call's kernels are done with it
  }
};

// The scratch memory comes from the caller's allocator when one is given (PyTorch's caching
// allocator through the operator library): the same outputs and gradients, bit for bit, as with
// cudaMallocAsync, every block given back by the time the call returns; an allocator that runs out
// fails the call with cudaErrorMemoryAllocation, the blocks taken before given back; an allocator
// with a function missing is refused.
TEST(CudaArgs, ScratchComesFromTheCallersAllocator) {
  std::string why;
  const auto *var = bf16_hd64("rope", why);
  if (!var) GTEST_SKIP() << why;
  const Problem p = make_problem(*find_cuda("rope"), 1, 2, 37, 64, 41);
  Outputs plain, counted;
  run_gpu(*var, p, plain);
  CountingScratch scratch;
  RunOptions opt;
  opt.scratch = &scratch.alloc;
  run_gpu(*var, p, counted, nullptr, opt);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_GE(scratch.taken, 4) << "q' and k' in the forward and again in the backward";
  EXPECT_TRUE(scratch.live.empty()) << scratch.live.size() << " blocks not given back";
  ASSERT_EQ(plain.size(), counted.size());
  for (size_t n = 0; n < plain.size(); ++n)
    EXPECT_TRUE(torch::equal(plain[n].second, counted[n].second)) << plain[n].first << " differs";

  const PackedCall call;
  std::vector<const float *> side(16, reinterpret_cast<const float *>(call.base + (1 << 19)));
  std::vector<float *> dside(16, reinterpret_cast<float *>(call.base + (1 << 19)));
  CountingScratch short_of;
  short_of.fail_after = 1;
  CudaAttnArgs a = call.args();
  a.features = side.data(), a.params = side.data(), a.dfeatures = dside.data(), a.dparams = dside.data();
  a.scratch = &short_of.alloc;
  EXPECT_EQ(var->forward(a), cudaErrorMemoryAllocation);
  EXPECT_EQ(short_of.taken, 1);
  short_of.taken = 0;
  EXPECT_EQ(var->backward(a), cudaErrorMemoryAllocation);
  EXPECT_EQ(short_of.taken, 1);
  EXPECT_TRUE(short_of.live.empty()) << "a failed call kept " << short_of.live.size() << " blocks";
  ape::cuda::CudaScratchAllocator half = short_of.alloc;
  half.free = nullptr;
  a.scratch = &half;
  EXPECT_EQ(var->forward(a), cudaErrorInvalidValue) << "an allocator without free";
  EXPECT_EQ(var->backward(a), cudaErrorInvalidValue) << "an allocator without free";
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_no_findings();
}

INSTANTIATE_TEST_SUITE_P(All, CudaKernel, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case> &info) {
                           const CudaKernelEntry *e = find_cuda(std::get<0>(info.param));
                           const auto &v = e->variants[std::get<1>(info.param)];
                           return std::get<0>(info.param) + "_" +
                                  ape::cuda::dtype_name(v.dtype) + "_hd" +
                                  std::to_string(v.head_dim);
                         });

// ---- grouped-query attention (CudaAttnArgs::kv_heads) -----------------------------------------
// 6 query heads reading 2 key heads (groups of 3: head h reads h / 3; groups of 2 reading 2 key
// heads could not tell the group size from the key heads' count, h / 2 either way), for encodings
// of each kind:
// no k mod (nope, alibi, cable's token program), a linear k mod the group shares (rope: k' per key
// head), a k mod per query head (expe: k' of each query head from its key head's k), key-side
// relative rows (transformer_xl); the bf16 and f32 variants at D 64 of each on the default device,
// and the bf16 ones of rope, expe and transformer_xl posing as sm_90 (the Hopper forward's TMA
// maps of key heads). Against the call with k
// and v repeated to every query head: o, lse, dq and the features' and params' gradients bit for
// bit; dk and dv that call's summed over each group in fp32 (the kernel's order) and rounded to
// the dtype once. A reference that tiled the groups (head h reading h mod 2) fails every
// encoding's o.
void check_grouped(const CudaKernelEntry &e, const ape::cuda::CudaVariant &var) {
  const int64_t B = 2, H = 6, KV = 2, T = 70;
  Problem grouped = make_problem(e, B, H, T, var.head_dim, 4242);
  grouped.k = grouped.k.narrow(1, 0, KV).contiguous(), grouped.v = grouped.v.narrow(1, 0, KV).contiguous();
  Problem repeated = grouped;
  repeated.k = grouped.k.repeat_interleave(H / KV, 1), repeated.v = grouped.v.repeat_interleave(H / KV, 1);
  Outputs got, want;
#ifdef APE_SIMT
  // The kernels each call launches: the grouped call's are the repeated call's and two group sums
  // (dk, dv), so nothing copies k or v to the query heads (every kernel reads key heads in place).
  auto kernels = [](int64_t *sums) {
    std::set<std::string> names;
    for (const auto &t : ape::simt::take_traffic())
      if (t.kernel.find("group_sum_kernel<") == std::string::npos) names.insert(t.kernel);
      else if (sums) *sums += static_cast<int64_t>(t.launches);
    return names;
  };
  int64_t sums = 0;
  kernels(nullptr);
#endif
  run_gpu(var, grouped, got);
#ifdef APE_SIMT
  const std::set<std::string> grouped_kernels = kernels(&sums);
#endif
  run_gpu(var, repeated, want);
  if (::testing::Test::HasFatalFailure()) return;
#ifdef APE_SIMT
  EXPECT_EQ(grouped_kernels, kernels(nullptr)) << e.name << ": other kernels than the call on repeated k, v";
  EXPECT_EQ(sums, 2) << e.name << ": the group sums of dk and dv";
#endif
  ASSERT_EQ(got.size(), want.size());
  const auto dt = torch_type(var.dtype);
  for (size_t n = 0; n < got.size(); ++n) {
    const std::string &q = got[n].first;
    Tensor w = want[n].second;
    if (q == "dk" || q == "dv")  // each group's sum, in fp32, rounded once
      w = w.to(torch::kFloat32).view({B, KV, H / KV, T, var.head_dim}).sum(2).to(dt).to(torch::kFloat64);
    EXPECT_TRUE(torch::equal(got[n].second, w)) << q << " of " << e.name << " " << ape::cuda::dtype_name(var.dtype)
                                                << " D=" << var.head_dim << ": max diff " << max_err(got[n].second, w);
  }
  Outputs tiled;  // the groups tiled in the "reference": o differs
  Problem wrong = repeated;
  wrong.k = grouped.k.repeat({1, H / KV, 1, 1}), wrong.v = grouped.v.repeat({1, H / KV, 1, 1});
  run_gpu(var, wrong, tiled);
  EXPECT_GT(max_err(got[0].second, tiled[0].second), 1e-3) << e.name << ": tiled groups give the same o";
}

// Decode steps through the cache arguments (ld, first_row, o_from_first, km, krel, tok and
// km_rows, num_splits) of p's tokens (k, v of p.k.size(1) heads) in buffers of `cap` rows, as the
// runtime's GPU cache runs them (k' per key head where the entry shares it): o of every step's
// rows, (B, H, T, D) fp64 (and lse, (B, H, T), where lse_out is given).
void decode_rows(const CudaKernelEntry &e, const ape::cuda::CudaVariant &var, const Problem &p, int64_t cap,
                 const std::vector<int64_t> &steps, int splits, Tensor &out, Tensor *lse_out = nullptr) {
  const auto dt = torch_type(var.dtype);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  const int64_t B = p.B, H = p.H, KV = p.k.size(1), D = p.D;
  auto padded = [&](const Tensor &t) {
    std::vector<int64_t> shape = t.sizes().vec();
    shape[2] = cap;
    Tensor z = torch::zeros(shape, t.options());
    z.narrow(2, 0, p.T).copy_(t);
    return z;
  };
  DevBuf qd, kd, vd, kmd, krd, tkd, tcd;
  upload(qd, padded(p.q).to(dt)), upload(kd, padded(p.k).to(dt)), upload(vd, padded(p.v).to(dt));
  if (e.caches_k_mod) upload(kmd, torch::zeros({B, e.shares_k_mod ? KV : H, cap, D}, kF64).to(dt));
  if (e.key_rel_floats > 0) upload(krd, torch::zeros({B * H * cap * e.key_rel_floats}, f32));
  if (e.tok_seqs > 0) upload(tkd, torch::zeros({B * H * e.tok_seqs * cap}, f32)),
      upload(tcd, torch::zeros({B * H * e.tok_seqs * 2}, kF64));
  std::vector<DevBuf> feats(p.features.size()), prms(p.params.size());
  std::vector<const float *> fp, pp;
  for (size_t n = 0; n < p.features.size(); ++n)
    upload(feats[n], padded(p.features[n]).to(torch::kFloat32)), fp.push_back(static_cast<const float *>(feats[n].ptr));
  for (size_t n = 0; n < p.params.size(); ++n)
    upload(prms[n], p.params[n].to(torch::kFloat32)), pp.push_back(static_cast<const float *>(prms[n].ptr));
  out = torch::full({B, H, p.T, D}, NAN, kF64);
  if (lse_out) *lse_out = torch::full({B, H, p.T}, NAN, kF64);
  int64_t L0 = 0;
  for (const int64_t n : steps) {
    DevBuf od, ld;
    upload(od, torch::zeros({B, H, n, D}, kF64).to(dt)), upload(ld, torch::zeros({B, H, n}, f32));
    CudaAttnArgs a;
    a.B = B, a.H = H, a.T = L0 + n, a.D = D, a.dtype = var.dtype;
    a.kv_heads = KV == H ? 0 : KV;
    a.q = qd.ptr, a.k = kd.ptr, a.v = vd.ptr, a.o = od.ptr, a.lse = static_cast<float *>(ld.ptr);
    a.features = fp.data(), a.params = pp.data(), a.scale = static_cast<float>(p.scale);
    a.ld = cap, a.feat_ld = cap, a.first_row = L0, a.o_from_first = true, a.num_splits = splits;
    a.km = kmd.ptr, a.krel = static_cast<float *>(krd.ptr);
    a.km_rows = kmd.ptr || krd.ptr || tkd.ptr ? L0 : 0;
    a.tok = static_cast<float *>(tkd.ptr), a.tok_carry = static_cast<double *>(tcd.ptr);
    ASSERT_CUDA(var.forward(a));
    ASSERT_CUDA(cudaDeviceSynchronize());
    expect_no_findings();
    out.narrow(2, L0, n).copy_(download(od, torch::zeros({B, H, n, D}, kF64).to(dt)).to(torch::kFloat64));
    if (lse_out) lse_out->narrow(2, L0, n).copy_(download(ld, torch::zeros({B, H, n}, f32)).to(torch::kFloat64));
    L0 += n;
  }
}

// The runtime's grouped GPU cache (runtime/Decode.cpp): k, v of 2 key heads for 4 query heads in a
// cache of 96 rows, steps of 40, 1 and 29 tokens, unsplit and split in up to 3, for a k' kept per
// key head (rope), per query head from its key head's k (expe), key-side relative rows
// (transformer_xl) and a token program's kept sequences (cable): every step's rows bit for bit
// those of the same steps over k and v repeated to every query head.
TEST(CudaGrouped, DecodeStepsEqualThoseWithKeysRepeated) {
  const EnvScope flash_rows({{"APE_CUDA_PACK_GQA", "0"}});  // (the packed steps: the test below)
  int checked = 0;
  for (const char *name : {"rope", "expe", "transformer_xl", "cable"}) {
    const CudaKernelEntry *e = find_cuda(name);
    ASSERT_NE(e, nullptr) << name;
    const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, DType::BF16, 64);
    if (!var) continue;
    Problem grouped = make_problem(*e, 1, 6, 70, 64, 515);  // groups of 3 (see check_grouped)
    grouped.k = grouped.k.narrow(1, 0, 2).contiguous(), grouped.v = grouped.v.narrow(1, 0, 2).contiguous();
    Problem repeated = grouped;
    repeated.k = grouped.k.repeat_interleave(3, 1), repeated.v = grouped.v.repeat_interleave(3, 1);
    for (const int splits : {1, 3}) {
      SCOPED_TRACE(std::string(name) + ", keys split in up to " + std::to_string(splits));
      Tensor got, want;
      decode_rows(*e, *var, grouped, 96, {40, 1, 29}, splits, got);
      decode_rows(*e, *var, repeated, 96, {40, 1, 29}, splits, want);
      if (HasFatalFailure()) return;
      EXPECT_TRUE(torch::equal(got, want)) << "max diff " << max_err(got, want);
      ++checked;
    }
  }
#ifdef APE_SIMT
  EXPECT_EQ(checked, 8) << "the emulated build lacks one of these encodings at bf16, D 64";
#else
  EXPECT_GE(checked, 2) << "the build has too few of these encodings at bf16, D 64";
#endif
}

// The kernels' own decode cache (cuda/decode.h, CudaDecodeArgs::kv_heads): steps of a grouped
// RoPE (k' kept per key head) and ExPE (per query head) equal the grouped full forward's rows, bit
// for bit unsplit, within the split rule split in up to 3 (check_decode_steps); the cache records
// its 2 key heads (CudaDecodeCache::KV) and refuses a step with other key heads.
TEST(CudaGrouped, TheDecodeCacheKeepsKeyHeads) {
  const EnvScope flash_rows({{"APE_CUDA_PACK_GQA", "0"}});  // (the packed steps: the test below)
  int checked = 0;
  for (const char *name : {"rope", "expe"}) {
    const CudaKernelEntry *e = find_cuda(name);
    ASSERT_NE(e, nullptr) << name;
    const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, DType::BF16, 64);
    if (!var) continue;
    const size_t index = static_cast<size_t>(var - e->variants);
    for (const int splits : {1, 3}) {
      SCOPED_TRACE(std::string(name) + ", keys split in up to " + std::to_string(splits));
      check_decode_steps(name, index, 0, {70, 1, 5}, splits, -1, 2);
      if (HasFatalFailure()) return;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4) << "the build lacks rope's or expe's bf16 variant at D 64";
  EXPECT_TRUE(find_cuda("rope")->caches_k_mod && find_cuda("rope")->shares_k_mod);
  EXPECT_TRUE(find_cuda("expe")->caches_k_mod && !find_cuda("expe")->shares_k_mod);
}

// Grouped decode steps packed (packed_decode_kernel: each group's one-token rows in one block,
// which reads k' and v once for the group) for encodings whose scores are scale q'·k' alone (NoPE,
// RoPE, xPos): every one-token step's o and lse against the materialised reference of its prefix
// (q', k' of the prefix's inputs rounded to the dtype, rounded again as the kernels store them;
// the softmax in fp64, times v). The kernel keeps P in fp32 and rounds o once: half an ulp of the
// dtype, held to 2^-8 of the row's largest |o| in bf16 (2^-10 in f16), 1e-5 in f32; lse (fp32
// sums) to 1e-4. And against the same steps with the packing off (APE_CUDA_PACK_GQA=0, the flash
// kernels' rows) within twice that. Groups of 2, 4, 8 and 16 (the most a block packs), D 32, 64 and
// 128, bf16, f16 and f32; the device's choice of shares (here one) and up to 3 (rows 100, 101 and
// 138: a partial last chunk of keys); num_splits 1 packs nothing (the flash rows, bit for bit); the
// emulator's traffic shows one packed launch per one-token step, none with the packing off; a NaN
// key makes the same rows NaN as the flash kernels do.
TEST(CudaGrouped, PackedDecodeStepsMatchTheReference) {
  struct Config {
    const char *name;
    DType dt;
    int64_t D, H, KV;
  };
  const std::vector<Config> configs = {
      {"nope", DType::BF16, 64, 4, 2},  {"nope", DType::BF16, 64, 4, 1}, {"rope", DType::BF16, 64, 4, 2},
      {"rope", DType::BF16, 64, 16, 1}, {"rope", DType::F32, 64, 4, 1},  {"rope", DType::F16, 32, 4, 2},
      {"rope", DType::BF16, 128, 8, 1}, {"xpos", DType::BF16, 64, 4, 1}};
  const std::vector<int64_t> steps = {100, 1, 1, 36, 1};
  int checked = 0, differing = 0;
#ifdef APE_SIMT
  auto packed_launches = [] {
    int64_t n = 0;
    for (const auto &t : ape::simt::take_traffic())
      if (t.kernel.find("packed_decode_kernel<") != std::string::npos) n += static_cast<int64_t>(t.launches);
    return n;
  };
#endif
  for (const Config &c : configs) {
    const CudaKernelEntry *e = find_cuda(c.name);
    const ape::cuda::CudaVariant *var = e ? ape::cuda::find_variant(*e, c.dt, static_cast<int>(c.D)) : nullptr;
    if (!var) continue;
    const auto tdt = torch_type(c.dt);
    auto rnd = [&](const Tensor &x) { return x.to(tdt).to(torch::kFloat64); };
    Problem p = make_problem(*e, 2, c.H, 139, c.D, 77 + c.H + c.KV + c.D);
    p.k = p.k.narrow(1, 0, c.KV).contiguous(), p.v = p.v.narrow(1, 0, c.KV).contiguous();
    const double tol = c.dt == DType::BF16 ? 0x1p-8 : c.dt == DType::F16 ? 0x1p-10 : 1e-5;
    for (const int splits : {0, 3}) {
      SCOPED_TRACE(std::string(c.name) + " " + ape::cuda::dtype_name(c.dt) + " D " + std::to_string(c.D) + ", H " +
                   std::to_string(c.H) + " reading " + std::to_string(c.KV) + ", num_splits " + std::to_string(splits));
      Tensor o, lse, flash_o, flash_lse;
#ifdef APE_SIMT
      packed_launches();
#endif
      decode_rows(*e, *var, p, 160, steps, splits, o, &lse);
#ifdef APE_SIMT
      EXPECT_EQ(packed_launches(), 3) << "one packed launch per one-token step";
#endif
      {
        const EnvScope off({{"APE_CUDA_PACK_GQA", "0"}});
        decode_rows(*e, *var, p, 160, steps, splits, flash_o, &flash_lse);
      }
#ifdef APE_SIMT
      EXPECT_EQ(packed_launches(), 0) << "APE_CUDA_PACK_GQA=0 packs nothing";
#endif
      if (HasFatalFailure()) return;
      // (packed, P stays fp32 where the flash rows round it: some row differs unless the packed
      // kernel did not run, which only the emulator counts directly)
      if (c.dt == DType::BF16) differing += !torch::equal(o, flash_o);
      for (const int64_t row : {int64_t(100), int64_t(101), int64_t(138)}) {
        SCOPED_TRACE("row " + std::to_string(row));
        Problem r = p;  // the prefix of row + 1 tokens, rounded to the dtype
        r.T = row + 1;
        r.q = rnd(p.q.narrow(2, 0, r.T)), r.k = rnd(p.k.narrow(2, 0, r.T)), r.v = rnd(p.v.narrow(2, 0, r.T));
        for (Tensor &f : r.features) f = f.narrow(2, 0, r.T);
        const ape_test::RefInputs in = ref_inputs(r);
        auto [qm, km] = ape_test::reference_qk(c.name, in);
        const Tensor logits = torch::matmul(rnd(qm).narrow(2, row, 1), rnd(km).transpose(-1, -2)) * p.scale;
        const Tensor ref_o = torch::matmul(torch::softmax(logits, -1), in.v), ref_lse = torch::logsumexp(logits, -1);
        const Tensor got = o.narrow(2, row, 1), got_lse = lse.narrow(2, row, 1);
        const double bound = tol * max_abs(ref_o);
        EXPECT_LE(max_err(got, ref_o), bound) << "o against the reference";
        EXPECT_LE(max_err(got_lse, ref_lse), 1e-4) << "lse against the reference";
        EXPECT_LE(max_err(got, flash_o.narrow(2, row, 1)), 2 * bound) << "o against the flash kernels' rows";
        EXPECT_LE(max_err(got_lse, flash_lse.narrow(2, row, 1)), 1e-4) << "lse against theirs";
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 12) << "the emulated build has too few of these variants";
  EXPECT_GT(differing, 0) << "the packed steps' o equals the flash rows' in every bf16 config";
  // num_splits 1 packs nothing (the flash rows, bit for bit); a NaN key (key 120 of key head 0) makes the same rows NaN packed
  // as in the flash rows (those of query heads 0..3 from row 120 on).
  const CudaKernelEntry *rope = find_cuda("rope");
  ASSERT_NE(rope, nullptr);
  const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*rope, DType::BF16, 64);
  ASSERT_NE(var, nullptr);
  Problem p = make_problem(*rope, 1, 8, 139, 64, 5);
  p.k = p.k.narrow(1, 0, 2).contiguous(), p.v = p.v.narrow(1, 0, 2).contiguous();
  Tensor o, flash_o;
#ifdef APE_SIMT
  packed_launches();
#endif
  decode_rows(*rope, *var, p, 160, steps, 1, o);
#ifdef APE_SIMT
  EXPECT_EQ(packed_launches(), 0) << "num_splits 1 packed a step";
#endif
  {
    const EnvScope off({{"APE_CUDA_PACK_GQA", "0"}});
    decode_rows(*rope, *var, p, 160, steps, 1, flash_o);
  }
  EXPECT_TRUE(torch::equal(o, flash_o)) << "num_splits 1: not the flash rows, max diff " << max_err(o, flash_o);
  p.k.select(1, 0).select(1, 120).fill_(NAN);
  decode_rows(*rope, *var, p, 160, steps, 0, o);
  {
    const EnvScope off({{"APE_CUDA_PACK_GQA", "0"}});
    decode_rows(*rope, *var, p, 160, steps, 0, flash_o);
  }
  const Tensor nan = torch::isnan(o.narrow(2, 100, 39)), flash_nan = torch::isnan(flash_o.narrow(2, 100, 39));
  EXPECT_TRUE(torch::equal(nan, flash_nan)) << "NaN rows differ from the flash kernels'";
  EXPECT_TRUE(nan.select(1, 0).narrow(1, 20, 19).all().item<bool>()) << "a NaN key left a row finite";
  EXPECT_FALSE(nan.select(1, 4).any().item<bool>()) << "key head 1's rows became NaN";
}

TEST(CudaGrouped, EqualsTheCallWithKeysRepeated) {
  int checked = 0;
#ifdef APE_SIMT
  const std::vector<bool> poses = {false, true};
#else
  const std::vector<bool> poses = {false};  // a GPU: its own architecture
#endif
  for (const bool sm90 : poses) {
#ifdef APE_SIMT
    std::optional<PoseAsSm90> guard;
    std::optional<HopperOptIns> opt_ins;
    if (sm90) guard.emplace(), opt_ins.emplace();
#endif
    // (posing as sm_90: the 16-bit variants, whose forward is the Hopper one, of one encoding of
    // each way to hold k')
    const std::vector<const char *> names = sm90 ? std::vector<const char *>{"rope", "expe", "transformer_xl"}
                                                 : std::vector<const char *>{"nope", "rope", "alibi", "expe",
                                                                             "transformer_xl", "cable"};
    for (const char *name : names) {
      const CudaKernelEntry *e = find_cuda(name);
      ASSERT_NE(e, nullptr) << name;
      for (const DType dt : sm90 ? std::vector<DType>{DType::BF16} : std::vector<DType>{DType::BF16, DType::F32}) {
        const ape::cuda::CudaVariant *var = nullptr;
        for (size_t n = 0; n < e->num_variants && !var; ++n)
          if (e->variants[n].dtype == dt && e->variants[n].head_dim == 64) var = &e->variants[n];
        if (!var) continue;
        SCOPED_TRACE(std::string(name) + (sm90 ? " sm_90" : ""));
        check_grouped(*e, *var);
        if (HasFatalFailure()) return;
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 6) << "the build has too few of these variants";
  EXPECT_TRUE(find_cuda("rope")->shares_k_mod && find_cuda("nope")->shares_k_mod);
  EXPECT_FALSE(find_cuda("expe")->shares_k_mod);
}

// ---- the attention transition (inference only) ------------------------------------------------
// rope_transition through each CUDA variant at every layer of a 6-layer model, against the
// materialised reference: RoPE's q', k' (kernel_reference) from the inputs rounded to the dtype
// and rounded again as the kernels store them, the T x T softmax in fp64, the spec's steps
// applied literally to every transformed row (ape::transition_row_reference), times V. The
// transformed rows are summed in fp32 from those same rounded values, so what is left there is
// the rounding of o: half an ulp, at most 2^-8 of the largest |o| in bf16 (2^-11 in f16; f32:
// 1e-5); measured 1.4e-3 to 2.2e-3 in bf16. The other rows are the flash forward's, which also
// rounds P before P V: held to twice that (measured 2.4e-3). Untransformed layers equal rope's CUDA
// kernel bit for bit, lse always does (the transition rewrites o of its rows only), and a
// transformed layer differs from rope's by more than 4x the tolerance (0.027 to 0.25 here).
// T = 300: I = 40, layers 1..3 transform [80, 160) .. [160, 240); T = 77: I = 10, a partial block
// of rows.
TEST(CudaTransition, MatchesTheMaterialisedReferenceAtEveryLayer) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const CudaKernelEntry *e = find_cuda("rope_transition"), *plain = find_cuda("rope");
  if (!e) GTEST_SKIP() << "rope_transition is not in this build";
  ASSERT_NE(plain, nullptr);
  const int64_t N = 6;
  for (size_t k = 0; k < e->num_variants; ++k) {
    const auto &var = e->variants[k];
    const ape::cuda::CudaVariant *pv = ape::cuda::find_variant(*plain, var.dtype, var.head_dim);
    ASSERT_NE(pv, nullptr);
    const double tol = var.dtype == DType::BF16 ? 0x1p-8 : var.dtype == DType::F16 ? 0x1p-11 : 1e-5;
    for (auto [B, H, T] : {std::tuple<int64_t, int64_t, int64_t>{2, 2, 300}, {1, 1, 77}}) {
      Problem p = make_problem(*e, B, H, T, var.head_dim, 7 * T + k);
      p.q = p.q * 2.5;  // sharper rows: weights on both sides of the bound
      const auto dt = torch_type(var.dtype);
      auto rnd = [&](const Tensor &x) { return x.to(dt).to(torch::kFloat64); };
      Problem r = p;
      r.q = rnd(p.q), r.k = rnd(p.k), r.v = rnd(p.v);
      auto [qm, km] = ape_test::reference_qk("rope", ref_inputs(r));
      const Tensor logits = torch::matmul(rnd(qm), rnd(km).transpose(-1, -2)) * p.scale;
      const Tensor mask = torch::ones({T, T}, torch::kBool).triu(1);
      const Tensor P0 = torch::softmax(logits.masked_fill(mask, -INFINITY), -1).contiguous();
      int transformed = 0;
      for (int64_t layer = 0; layer < N; ++layer) {
        SCOPED_TRACE(std::string(ape::cuda::dtype_name(var.dtype)) + " D=" +
                     std::to_string(var.head_dim) + " T=" + std::to_string(T) + " layer " +
                     std::to_string(layer) + " of " + std::to_string(N));
        const ape::TransitionRows rows =
            ape::transition_rows_of(ape::TransitionAttrs{}, T, N, layer);
        Tensor P = P0.clone();
        double *pd = P.data_ptr<double>();
        for (int64_t s = 0; s < B * H; ++s)
          for (int64_t i = rows.lo; i < rows.hi; ++i) {
            const int64_t st = rows.start(i);
            ape::transition_row_reference(pd + (s * T + i) * T, st, st + rows.I, 0.5, 0.1);
          }
        const Tensor ref = torch::matmul(P, r.v);
        Outputs got, base;
        run_gpu(var, p, got, nullptr, {false, layer, N});
        run_gpu(*pv, p, base, nullptr, {false, 0, 0});
        if (HasFatalFailure()) return;
        EXPECT_TRUE(torch::equal(got[1].second, base[1].second)) << "lse is the softmax's";
        const double err = max_err(got[0].second, ref) / max_abs(ref);
        EXPECT_LE(err, 2 * tol) << "o against the materialised transition";
        if (rows.empty()) {
          EXPECT_TRUE(torch::equal(got[0].second, base[0].second))
              << "an untransformed layer differs from rope";
        } else {
          ++transformed;
          using torch::indexing::Slice;
          const Tensor mine = got[0].second.index({Slice(), Slice(), Slice(rows.lo, rows.hi)});
          const Tensor theirs = ref.index({Slice(), Slice(), Slice(rows.lo, rows.hi)});
          const double row_err = max_err(mine, theirs) / max_abs(ref);
          EXPECT_LE(row_err, tol) << "the transformed rows against the materialised transition";
          EXPECT_GT(max_err(base[0].second, ref) / max_abs(ref), 4 * tol)
              << "the transition changed nothing the tolerance would see";
        }
      }
      EXPECT_EQ(transformed, 3);
    }
  }
}

// A layer's rows in several launches (CUDA's 65,535 blocks on y: a prompt of some 655K tokens at
// 4 layers has more rows than one launch takes; APE_CUDA_MAX_GRID_Y=1 splits a short one
// into launches of one block's rows): the same o, bit for bit, at every transformed layer.
TEST(CudaTransition, RowsInSeveralLaunchesAreTheSame) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const CudaKernelEntry *e = find_cuda("rope_transition");
  if (!e) GTEST_SKIP() << "rope_transition is not in this build";
  const auto &var = e->variants[0];
  const Problem p = make_problem(*e, 1, 2, 300, var.head_dim, 5);
  for (int64_t layer = 1; layer <= 3; ++layer) {
    SCOPED_TRACE("layer " + std::to_string(layer));
    Outputs one, many;
    run_gpu(var, p, one, nullptr, {false, layer, 6});
    ASSERT_EQ(setenv("APE_CUDA_MAX_GRID_Y", "1", 1), 0);
#ifdef APE_SIMT
    ape::simt::take_traffic();
#endif
    run_gpu(var, p, many, nullptr, {false, layer, 6});
    unsetenv("APE_CUDA_MAX_GRID_Y");
    if (HasFatalFailure()) return;
#ifdef APE_SIMT
    int launches = 0;
    for (const auto &t : ape::simt::take_traffic())
      if (t.kernel.find("transition_kernel") != std::string::npos) launches += static_cast<int>(t.launches);
    EXPECT_GT(launches, 1) << "the rows went in one launch";
#endif
    EXPECT_TRUE(torch::equal(one[0].second, many[0].second)) << "o differs";
    EXPECT_TRUE(torch::equal(one[1].second, many[1].second)) << "lse differs";
  }
  expect_no_findings();
}

// Grids whose y runs over a slice's tiles go in several launches past CUDA's 65,535 blocks there
// (the general forward and backward near T = 1M to 2M tokens, the FlashAttention-2-class forward
// near 8M; APE_CUDA_MAX_GRID_Y=1 makes every tile a launch of its own), and grids over slices or
// groups of slices (the linear mods', the tables') go on to z (a batch of 2M slices): o, lse and
// every gradient bit for bit those of one launch (and within the reference's tolerances of the
// materialised attention), on each variant (f32: the general kernels;
// 16-bit: the FlashAttention-2-class forward, unsplit and with its keys split in two).
TEST(CudaKernel, TilesInSeveralLaunchesAreTheSame) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const CudaKernelEntry *e = find_cuda("rope");
  if (!e) GTEST_SKIP() << "rope is not in this build";
  std::set<DType> seen;  // a variant of each dtype (the launches do not depend on the head dim)
  for (size_t k = 0; k < e->num_variants; ++k) {
    const auto &var = e->variants[k];
    if (!seen.insert(var.dtype).second) continue;
    SCOPED_TRACE(std::string(ape::cuda::dtype_name(var.dtype)) + " d" + std::to_string(var.head_dim));
    // T 200 at B H 2: tiles; T 20 at B H 40: two groups of the linear mod's 32 slices, on z.
    for (const auto [B, H, T] : {std::array<int64_t, 3>{1, 2, 200}, std::array<int64_t, 3>{5, 8, 20}})
    for (const int splits : {1, 2}) {
      const Problem p = make_problem(*e, B, H, T, var.head_dim, 7);
      if (splits == 2 && var.dtype == DType::F32) continue;  // (no split kernel for f32)
      SCOPED_TRACE("B " + std::to_string(B) + " H " + std::to_string(H) + " T " + std::to_string(T) +
                   ", num_splits " + std::to_string(splits));
      RunOptions opt;
      opt.num_splits = splits;
      Outputs one, many;
      run_gpu(var, p, one, nullptr, opt);
#ifdef APE_SIMT
      ape::simt::take_traffic();
#endif
      {
        EnvScope tiles({{"APE_CUDA_MAX_GRID_Y", "1"}});
        run_gpu(var, p, many, nullptr, opt);
        // ...and held to the materialised attention (fp64, with same-precision baselines),
        // forward and gradients, as every kernel is.
        if (splits == 1 && !HasFatalFailure()) check_problem("rope", var, p, opt);
      }
      if (HasFatalFailure()) return;
#ifdef APE_SIMT
      std::map<std::string, int64_t> launches;
      for (const auto &t : ape::simt::take_traffic())
        for (const char *kernel : {"detail::forward_kernel<", "flash_forward_kernel<", "dkdv_kernel<", "dq_kernel<"})
          if (t.kernel.find(kernel) != std::string::npos) launches[kernel] += t.launches;
      if (T == 200 && var.dtype == DType::F32) {
        EXPECT_GT(launches["dkdv_kernel<"], 1) << "the general backward's key tiles went in one launch";
        EXPECT_GT(launches["dq_kernel<"], 1) << "the general backward's query tiles went in one launch";
      }
      if (T == 200)
        EXPECT_GT(launches[var.dtype == DType::F32 ? "detail::forward_kernel<" : "flash_forward_kernel<"], 1)
            << "the forward's tiles went in one launch";
#endif
      ASSERT_EQ(one.size(), many.size());
      for (size_t n = 0; n < one.size(); ++n)
        EXPECT_TRUE(torch::equal(one[n].second, many[n].second)) << one[n].first << " differs";
    }
  }
  expect_no_findings();
}

// The tables' gradients (relative rows: Shaw's key and value tables) take heads on grid z and
// row groups on y, each capped at CUDA's 65,535 (H past it failed its launch): with the cap at 1
// (APE_CUDA_MAX_GRID_Y=1, which caps z too there) one block strides over every head and row
// group, and every output is bit for bit the uncapped launch's (the sums are fixed point).
TEST(CudaKernel, TableGradientsPastTheGridAreTheSame) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const CudaKernelEntry *e = find_cuda("shaw");
  if (!e) GTEST_SKIP() << "shaw is not in this build";
  const auto &var = e->variants[0];
  const Problem p = make_problem(*e, 2, 3, 45, var.head_dim, 11);
  Outputs one, many;
  run_gpu(var, p, one);
#ifdef APE_SIMT
  ape::simt::take_traffic();
#endif
  {
    EnvScope capped({{"APE_CUDA_MAX_GRID_Y", "1"}});
    run_gpu(var, p, many);
  }
  if (HasFatalFailure()) return;
#ifdef APE_SIMT
  int64_t launches = 0;
  for (const auto &t : ape::simt::take_traffic())
    if (t.kernel.find("table_grad_kernel<") != std::string::npos) launches += t.launches;
  EXPECT_GT(launches, 0) << "no table gradient ran";
#endif
  ASSERT_EQ(one.size(), many.size());
  int params = 0;
  for (size_t n = 0; n < one.size(); ++n) {
    params += one[n].first.rfind("dparam", 0) == 0;
    EXPECT_TRUE(torch::equal(one[n].second, many[n].second)) << one[n].first << " differs";
  }
  EXPECT_GT(params, 0) << "no parameter gradient was compared";
  expect_no_findings();
}

// Its backward refuses (training it would compute some other gradient), before reading anything;
// so does a forward given a layer outside its model.
TEST(CudaTransition, BackwardAndLayersOutsideTheModelAreRefused) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const CudaKernelEntry *e = find_cuda("rope_transition");
  if (!e) GTEST_SKIP() << "rope_transition is not in this build";
  for (size_t k = 0; k < e->num_variants; ++k) {
    CudaAttnArgs a;
    a.B = 1, a.H = 1, a.T = 8, a.D = e->variants[k].head_dim, a.dtype = e->variants[k].dtype;
    EXPECT_EQ(e->variants[k].backward(a), cudaErrorNotSupported);
    // A layer outside the model is refused (every other argument valid: layer 0 of 6 runs).
    const Tensor x = torch::zeros({1, 1, 8, a.D}, torch_type(a.dtype));
    DevBuf qd, od, lsed;
    upload(qd, x), upload(od, x), upload(lsed, torch::zeros({1, 1, 8}, torch::kFloat32));
    a.q = a.k = a.v = qd.ptr, a.o = od.ptr, a.lse = static_cast<float *>(lsed.ptr), a.scale = 1.f;
    a.layer = 0, a.num_layers = 6;
    EXPECT_EQ(e->variants[k].forward(a), cudaSuccess);
    for (auto [layer, count] : {std::pair<int64_t, int64_t>{6, 6}, {-1, 6}, {0, -1}}) {
      a.layer = layer, a.num_layers = count;
      EXPECT_EQ(e->variants[k].forward(a), cudaErrorInvalidValue) << layer << " of " << count;
    }
    ASSERT_CUDA(cudaDeviceSynchronize());
  }
}

// The first encoding of the build with token features (a token program: the status word's sums).
const CudaKernelEntry *first_with_features() {
  for (const CudaKernelEntry *c : cuda_entries())
    if (c->num_features > 0) return c;
  return nullptr;
}

// The status word reports what the fixed-point gradient sums cannot hold (cuda/kernel_entry.h):
// a NaN token feature sets kStatusNonFinite; gradient terms beyond 2^31 set kStatusRange. Either
// way the sums are poisoned on the device: every feature gradient is NaN, so a caller that never
// reads the word (the operator library does not: it would wait for the GPU) cannot use a clamped
// gradient. Any encoding with a token program does (the first one built).
TEST(CudaStatus, NonFiniteAndOutOfRangeTermsAreReported) {
  const CudaKernelEntry *e = first_with_features();
  if (!e) GTEST_SKIP() << "no encoding with token features in this build";
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const auto &var = e->variants[0];
  Problem p = make_problem(*e, 1, 2, 40, var.head_dim, 5);
  p.features[0][0][1][17] = std::numeric_limits<double>::quiet_NaN();
  Outputs out;
  uint32_t st = 0;
  run_gpu(var, p, out, &st);
  EXPECT_TRUE(st & ape::cuda::kStatusNonFinite) << "status " << st;
  for (auto &[what, t] : out)
    if (what.rfind("dfeature", 0) == 0) EXPECT_TRUE(torch::isnan(t).all().item<bool>()) << what;

  Problem big = make_problem(*e, 1, 2, 40, var.head_dim, 6);
  big.dout = big.dout * 1e12;
  st = 0;
  run_gpu(var, big, out, &st);
  EXPECT_TRUE(st & ape::cuda::kStatusRange) << "status " << st;
  EXPECT_FALSE(st & ape::cuda::kStatusNonFinite) << "status " << st;
  for (auto &[what, t] : out)
    if (what.rfind("dfeature", 0) == 0) EXPECT_TRUE(torch::isnan(t).all().item<bool>()) << what;
    else if (what == "o" || what == "lse" || what == "dv")  // not from the sums: they stand
      EXPECT_FALSE(torch::isnan(t).any().item<bool>()) << what;
}

// CudaAttnArgs::status_record: the backward ORs its word into a second word (the operator
// library's per-device record) atomically, keeping the bits already there; the call's own word,
// which the kernels read to poison its sums, stays the call's: an error recorded before does not
// poison a later call's gradients.
TEST(CudaStatus, TheRecordGathersEveryCallsBitsAndPoisonsNothing) {
  const CudaKernelEntry *e = first_with_features();
  if (!e) GTEST_SKIP() << "no encoding with token features in this build";
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const auto &var = e->variants[0];
  constexpr uint32_t kEarlier = 0x100;  // no backward sets it: a bit an earlier reader left
  DevBuf record;
  upload(record, torch::full({1}, int32_t(kEarlier), torch::kInt32));
  auto read_record = [&] {
    uint32_t r = 0;
    EXPECT_EQ(cudaMemcpy(&r, record.ptr, sizeof r, cudaMemcpyDeviceToHost), cudaSuccess);
    return r;
  };
  RunOptions opt;
  opt.status_record = static_cast<uint32_t *>(record.ptr);
  Problem bad = make_problem(*e, 1, 2, 40, var.head_dim, 5);
  bad.features[0][0][1][17] = std::numeric_limits<double>::quiet_NaN();
  Outputs out;
  uint32_t st = 0;
  run_gpu(var, bad, out, &st, opt);
  EXPECT_TRUE(st & ape::cuda::kStatusNonFinite) << "status " << st;
  EXPECT_FALSE(st & kEarlier) << "the call's word holds the record's bits: " << st;
  EXPECT_EQ(read_record(), kEarlier | st);

  const Problem good = make_problem(*e, 1, 2, 40, var.head_dim, 5);
  run_gpu(var, good, out, &st, opt);
  EXPECT_EQ(st & ape::cuda::kStatusErrors, 0u) << ape::cuda::status_message(st);
  EXPECT_EQ(read_record() & ape::cuda::kStatusErrors, ape::cuda::kStatusNonFinite);
  for (auto &[what, t] : out) EXPECT_FALSE(torch::isnan(t).any().item<bool>()) << what;
}

#ifdef APE_SIMT
// Every variant launches, forward and backward, under the shared-memory limit of each
// architecture the kernels claim (the emulator poses as each; ape/simt/runtime.h).
TEST(CudaLaunch, EveryVariantFitsEveryClaimedArchitecture) {
  const int saved = ape::simt::arch();
  for (int sm : {80, 86, 89, 90}) {
    ape::simt::set_arch(sm);
    for (const CudaKernelEntry *e : cuda_entries())
      for (size_t k = 0; k < e->num_variants; ++k) {
        const auto &var = e->variants[k];
        SCOPED_TRACE(std::string(e->name) + " " + ape::cuda::dtype_name(var.dtype) + " hd" +
                     std::to_string(var.head_dim) + " sm_" + std::to_string(sm));
        const Problem p = make_problem(*e, 1, 1, 3, var.head_dim, 3);
        Outputs out;
        run_gpu(var, p, out, nullptr, {!inference_only(*e), 0, 0});
      }
  }
  ape::simt::set_arch(saved);
}
#endif

}  // namespace

int main(int argc, char **argv) {
  torch::set_num_threads(2);
  ::testing::InitGoogleTest(&argc, argv);
#ifdef APE_SIMT
  std::printf("simt_kernels_test: CUDA kernels on the SIMT emulator, sm_%d limits\n",
              ape::simt::arch());
#else
  if (!has_gpu())
    std::printf("cuda_kernels_test: no CUDA device; the numerics tests skip (registry tests run)\n");
#endif
  const int status = RUN_ALL_TESTS();
#ifdef APE_SIMT
  const ape::simt::Stats st = ape::simt::stats();
  std::printf("simt: %zu launches, %zu blocks, %zu thread switches, %zu checked accesses, %zu "
              "findings\n", st.launches, st.blocks, st.switches, st.accesses,
              ape::simt::finding_count());
#endif
  return status;
}
