// fused_attention: the generated CPU kernels of a KernelEntry behind the autograd binding shared
// with the operator library (ape/torch/autograd.h); AttnArgs packed by ape/cpu/kernel_call.h.
#include "runtime/Attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include <ATen/ATen.h>

#include "ape/contract/value_rules.h"
#include "ape/torch/autograd.h"
#include "ape/cpu/kernel_call.h"
#include "runtime/CudaAttention.h"

namespace ape {
namespace {

std::string describe(const at::Tensor &t) {
  if (!t.defined()) return "an undefined tensor";
  std::ostringstream s;
  s << t.sizes() << " " << t.scalar_type();
  if (!t.device().is_cpu()) s << " on " << t.device();
  return s.str();
}

[[noreturn]] void bad(const KernelEntry &e, const std::string &msg) {
  throw std::invalid_argument(std::string("fused_attention(") + e.name + "): " + msg);
}

// Validates every input against the entry's manifest; returns the parsed manifest. On the CPU
// every tensor is float32 or float64, q's dtype; on a GPU q, k, v are float32, float16 or
// bfloat16 (one dtype) and the features and params any of those (autocast leaves params in
// float32), all on q's device.
}  // namespace

std::string keys_problem(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v) {
  for (const auto &[name, t] : {std::pair<const char *, const at::Tensor *>{"k", &k}, {"v", &v}}) {
    const bool heads_ok = t->defined() && t->dim() == 4 &&
                          ape_rules::kv_heads_fit(t->size(1) == q.size(1) ? 0 : t->size(1), q.size(1));
    if (!heads_ok || t->size(0) != q.size(0) || t->size(2) != q.size(2) || t->size(3) != q.size(3) ||
        t->scalar_type() != q.scalar_type() || t->device() != q.device() || (name[0] == 'v' && t->sizes() != k.sizes()))
      return std::string(name) + " must match q (" + describe(q) + ") but for its heads, a divisor of q's" +
             (name[0] == 'v' ? ", and k's shape" : "") + ", got " + describe(*t);
  }
  return "";
}

namespace {

const Manifest &check_inputs(const KernelEntry &e, const at::Tensor &q, const at::Tensor &k,
                             const at::Tensor &v, at::TensorList features, at::TensorList params) {
  const Manifest &m = manifest_of(e);
  const bool gpu = q.defined() && q.is_cuda();
  auto is_fp = [&](const at::Tensor &t) {
    if (!t.defined()) return false;
    const at::ScalarType s = t.scalar_type();
    return gpu ? (s == at::kFloat || s == at::kBFloat16 || s == at::kHalf)
               : (s == at::kFloat || s == at::kDouble);
  };
  // Features and params: q's dtype on the CPU, any GPU float dtype on a GPU.
  auto fits = [&](const at::Tensor &t) {
    return t.defined() && t.device() == q.device() && (gpu ? is_fp(t) : t.scalar_type() == q.scalar_type());
  };
  if (!is_fp(q) || q.dim() != 4 || !(q.device().is_cpu() || gpu))
    bad(e, "q must be [B,H,T,D] float32 or float64 on the CPU, or float32, float16 or bfloat16 on a GPU, got " +
               describe(q));
  // k and v: q's shape, or H_kv heads dividing q's H (grouped-query attention, AttnArgs::kv_heads).
  if (const std::string problem = keys_problem(q, k, v); !problem.empty()) bad(e, problem);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  if (int64_t(features.size()) != m.num_features())
    bad(e, "expected " + std::to_string(m.num_features()) + " feature tensors (manifest), got " +
               std::to_string(features.size()));
  const std::string want_dtype = gpu ? std::string("float32, float16 or bfloat16 on ") + q.device().str()
                                     : std::string(c10::toString(q.scalar_type()));
  for (size_t i = 0; i < features.size(); ++i) {
    const auto &f = features[i];
    if (!fits(f) || f.dim() != 3 || f.size(0) != B || f.size(1) != H || f.size(2) != T)
      bad(e, "feature '" + m.features[i].name + "' must be [B,H,T] = [" + std::to_string(B) + ", " +
                 std::to_string(H) + ", " + std::to_string(T) + "] " + want_dtype + ", got " + describe(f));
  }
  if (int64_t(params.size()) != m.num_params())
    bad(e, "expected " + std::to_string(m.num_params()) + " param tensors (manifest), got " +
               std::to_string(params.size()));
  for (size_t i = 0; i < params.size(); ++i) {
    const auto &p = params[i];
    const int64_t want = m.params[i].numel(H, D);
    if (!fits(p) || p.numel() != want)
      bad(e, "param '" + m.params[i].name + "' must have " + std::to_string(want) + " " + want_dtype +
                 " elements (shape " +
                 [&] {
                   std::string s = "[";
                   for (size_t d = 0; d < m.params[i].shape.size(); ++d)
                     s += (d ? ", " : "") + m.params[i].shape[d].str();
                   return s + "]";
                 }() + "), got " + describe(p));
  }
  return m;
}

// "float32" or "float64", for messages.
template <typename T> const char *dtype_word() { return std::is_same_v<T, float> ? "float32" : "float64"; }

template <typename T>
void run_forward(const KernelEntry &e, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                 const std::vector<at::Tensor> &feats, const std::vector<at::Tensor> &params,
                 double scale, AttnLayer layer, at::Tensor &o, at::Tensor &lse) {
  std::vector<const T *> fp, pp;
  for (const auto &f : feats) fp.push_back(f.data_ptr<T>());
  for (const auto &p : params) pp.push_back(p.data_ptr<T>());
  const AttnArgs<T> a = forward_args<T>({q.size(0), q.size(1), q.size(2), q.size(3), k.size(1)}, scale,
                                         q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(),
                                         fp.data(), pp.data(), o.data_ptr<T>(), lse.data_ptr<T>(),
                                         layer.index, layer.count);
  auto forward = entry_forward<T>(e);
  if (!forward) bad(e, std::string("the kernel has no ") + dtype_word<T>() + " forward");
  forward(a);
}

std::vector<at::Tensor> contiguous_all(at::TensorList ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto &t : ts) out.push_back(t.contiguous());
  return out;
}

std::pair<at::Tensor, at::Tensor> forward_impl(const KernelEntry &e, const at::Tensor &q0,
                                               const at::Tensor &k0, const at::Tensor &v0,
                                               at::TensorList features, at::TensorList params,
                                               double scale, AttnLayer layer) {
  check_inputs(e, q0, k0, v0, features, params);
  if (q0.is_cuda())
    return cuda_attention_forward(e, q0, k0, v0, features.vec(), params.vec(), scale, 0, layer);
  at::Tensor q = q0.contiguous(), k = k0.contiguous(), v = v0.contiguous();
  auto feats = contiguous_all(features);
  auto ps = contiguous_all(params);
  at::Tensor o = at::empty_like(q);
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  if (q.scalar_type() == at::kFloat)
    run_forward<float>(e, q, k, v, feats, ps, scale, layer, o, lse);
  else
    run_forward<double>(e, q, k, v, feats, ps, scale, layer, o, lse);
  return {o, lse};
}

// The raw gradients on the CPU: dq, dk, dv, dfeatures, dparams from dout and the forward's o, lse.
AttentionGrads backward_impl(const KernelEntry &e, const at::Tensor &dout0, const at::Tensor &q0,
                             const at::Tensor &k0, const at::Tensor &v0, const at::Tensor &o0,
                             const at::Tensor &lse0, at::TensorList features, at::TensorList params,
                             double scale) {
  at::Tensor q = q0.contiguous(), k = k0.contiguous(), v = v0.contiguous();
  at::Tensor o = o0.contiguous(), lse = lse0.contiguous(), dout = dout0.contiguous();
  auto feats = contiguous_all(features);
  auto ps = contiguous_all(params);
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  std::vector<at::Tensor> dfeats, dparams;
  for (const auto &f : feats) dfeats.push_back(at::empty_like(f));
  for (const auto &p : ps) dparams.push_back(at::zeros_like(p));

  auto run = [&](auto tag) {
    using T = decltype(tag);
    std::vector<const T *> fp, pp;
    std::vector<T *> dfp, dpp;
    for (const auto &f : feats) fp.push_back(f.data_ptr<T>());
    for (const auto &p : ps) pp.push_back(p.data_ptr<T>());
    for (auto &f : dfeats) dfp.push_back(f.data_ptr<T>());
    for (auto &p : dparams) dpp.push_back(p.data_ptr<T>());
    const AttnArgs<T> a = backward_args(
        forward_args<T>({q.size(0), q.size(1), q.size(2), q.size(3), k.size(1)}, scale, q.data_ptr<T>(),
                        k.data_ptr<T>(), v.data_ptr<T>(), fp.data(), pp.data(), o.data_ptr<T>(),
                        lse.data_ptr<T>()),
        dout.data_ptr<T>(), dq.data_ptr<T>(), dk.data_ptr<T>(), dv.data_ptr<T>(), dfp.data(),
        dpp.data());
    auto backward = entry_backward<T>(e);
    if (!backward) bad(e, std::string("the kernel has no ") + dtype_word<T>() + " backward");
    backward(a);
  };
  if (q.scalar_type() == at::kFloat) run(float{}); else run(double{});
  for (size_t i = 0; i < dparams.size(); ++i) dparams[i] = dparams[i].view_as(params[i]);
  return {dq, dk, dv, dfeats, dparams};
}

// The runtime's side of the autograd binding (ape/torch/autograd.h): the CPU kernels of the
// KernelEntry at `handle`.
struct EntryOps {
  static const KernelEntry &entry(int64_t handle) {
    return *reinterpret_cast<const KernelEntry *>(static_cast<intptr_t>(handle));
  }
  static std::string prefix(int64_t handle) {
    return std::string("fused_attention(") + entry(handle).name + "): ";
  }
  static std::tuple<at::Tensor, at::Tensor> forward(int64_t handle, const at::Tensor &q,
                                                    const at::Tensor &k, const at::Tensor &v,
                                                    at::TensorList features, at::TensorList params,
                                                    double scale) {
    auto [o, lse] = forward_impl(entry(handle), q, k, v, features, params, scale, AttnLayer{});
    return {o, lse};
  }
  static AttentionGrads backward(int64_t handle, const at::Tensor &dout, const at::Tensor &q,
                                 const at::Tensor &k, const at::Tensor &v, const at::Tensor &o,
                                 const at::Tensor &lse, at::TensorList features,
                                 at::TensorList params, double scale) {
    return backward_impl(entry(handle), dout, q, k, v, o, lse, features, params, scale);
  }
};
using FusedAttention = AttentionAutograd<EntryOps>;

}  // namespace

const Manifest &manifest_of(const KernelEntry &entry) {
  static std::mutex mu;
  // Keyed by the entry and its manifest text, so an entry object reused at the same address with
  // another manifest is parsed again.
  static std::map<std::pair<const KernelEntry *, const char *>, Manifest> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(&entry, entry.manifest_json);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (!entry.manifest_json)
    throw std::runtime_error(std::string("encoding '") + (entry.name ? entry.name : "?") + "' has no manifest");
  Manifest m = Manifest::parse(entry.manifest_json, entry.name ? entry.name : "<unnamed kernel>");
  return cache.emplace(key, std::move(m)).first->second;
}

namespace {
std::atomic<AttentionImpl> g_attention_impl{nullptr};
}  // namespace

void set_attention_impl(AttentionImpl impl) { g_attention_impl = impl; }

at::Tensor fused_attention(const KernelEntry &entry, const at::Tensor &q, const at::Tensor &k,
                           const at::Tensor &v, const std::vector<at::Tensor> &features,
                           const std::vector<at::Tensor> &params, double scale, AttnLayer layer) {
  const Manifest &m = check_inputs(entry, q, k, v, features, params);
  if (m.inference_only) {  // an attention transition: forward only, at the caller's layer
    auto records = [](const at::Tensor &t) { return t.requires_grad(); };
    if (at::GradMode::is_enabled() &&
        (records(q) || records(k) || records(v) || std::any_of(features.begin(), features.end(), records) ||
         std::any_of(params.begin(), params.end(), records)))
      throw std::invalid_argument(inference_only_message(m.encoding));
    return forward_impl(entry, q, k, v, features, params, scale, layer).first;
  }
  if (q.is_cuda())
    return cuda_fused_attention(entry, q, k, v, features, params, scale);
  if (AttentionImpl impl = g_attention_impl.load()) return impl(entry, q, k, v, features, params, scale);
  return FusedAttention::apply(q, k, v, at::TensorList(features), at::TensorList(params),
                               static_cast<int64_t>(reinterpret_cast<intptr_t>(&entry)), scale);
}

std::pair<at::Tensor, at::Tensor> attention_forward(const KernelEntry &entry, const at::Tensor &q,
                                                    const at::Tensor &k, const at::Tensor &v,
                                                    const std::vector<at::Tensor> &features,
                                                    const std::vector<at::Tensor> &params, double scale,
                                                    AttnLayer layer) {
  at::NoGradGuard no_grad;
  return forward_impl(entry, q, k, v, features, params, scale, layer);
}

at::Tensor init_param(const ParamSpec &spec, int64_t heads, int64_t head_dim, at::ScalarType dtype) {
  auto shape = spec.resolve_shape(heads, head_dim);
  auto opts = at::TensorOptions().dtype(dtype);
  switch (spec.init.kind) {
    case InitSpec::Kind::Zeros: return at::zeros(shape, opts);
    case InitSpec::Kind::Ones: return at::ones(shape, opts);
    case InitSpec::Kind::Normal: return at::randn(shape, opts) * spec.init.std;
    case InitSpec::Kind::Constant: return at::full(shape, spec.init.value, opts);
    case InitSpec::Kind::AlibiSlopes: {
      auto s = alibi_slopes(heads);
      return at::tensor(s, at::TensorOptions().dtype(at::kDouble)).to(dtype).view(shape);
    }
    case InitSpec::Kind::Sinusoidal: {  // PE[r, c], c = h·head_dim + j over d = heads·head_dim
      const auto pe = abi::sinusoid_table(shape.at(0), heads * head_dim);
      return at::tensor(pe, at::TensorOptions().dtype(at::kDouble)).to(dtype).view(shape);
    }
    case InitSpec::Kind::ProjectionTerm:
    case InitSpec::Kind::ProjectionPrefix:
      throw std::logic_error("init_param: '" + spec.name + "' is a " + std::string(abi::name(spec.init.kind)) +
                             "; the model computes it from the " + spec.init.projection +
                             " projection every step");
  }
  throw std::logic_error("init_param: unknown init kind");
}

}  // namespace ape
