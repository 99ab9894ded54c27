// Operator-library template: PyTorch operators around one generated kernel (docs/frameworks.md).
//
// apec --emit=torch-library writes NAME_ops.cpp, which describes the kernel's inputs
// (kernel_inputs.h) and registers, in the operator namespace ape_NAME:
//
//   attention(Tensor q, Tensor k, Tensor v, <one Tensor per feature>, <one Tensor per param>,
//             float? scale=None) -> Tensor
//       o = causal attention with the encoding; differentiable: its Autograd kernel is the
//       torch::autograd::Function below, so loss.backward() reaches q, k, v, the features and
//       every trainable param. scale None = the manifest's scale, else 1/sqrt(D).
//   attention_forward(Tensor q, Tensor k, Tensor v, Tensor[] features, Tensor[] params,
//                     float scale) -> (Tensor o, Tensor lse)
//   attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse,
//                      Tensor[] features, Tensor[] params, float scale)
//       -> (Tensor dq, Tensor dk, Tensor dv, Tensor[] dfeatures, Tensor[] dparams)
//       the raw kernels (no autograd), for other autograd systems; CPU, CUDA and Meta kernels.
//
// Shapes: q, k, v, o, dout (B, H, T, D); lse and every feature (B, H, T); params by their
// manifest shape with "heads" = H and "head_dim" = D. dtype float32 or float64, one device for all.
// Non-contiguous inputs are accepted (copied to contiguous first).
//
// CPU: the fused flash-attention kernel of cpu_attention.h (OpenMP threads). CUDA: the same
// kernel on host copies of the inputs, results copied back to the device; correct, not fast,
// until a device kernel is plugged in here (forward_on / backward_on with Where::kCuda).
// Meta: shapes only (checks included), for tracing.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>
#include <torch/version.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_entry.h"
#include "kernel_inputs.h"

namespace ape::torch_ops {

// The C++ type of a `float?` argument: c10::optional in LibTorch 1.x, std::optional since
// c10::optional became its (now deprecated) alias.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
template <class T> using Optional = std::optional<T>;
#else
template <class T> using Optional = c10::optional<T>;
#endif

// Shapes of one call: B batch, H heads, T tokens, D head dim.
struct Shape {
  int64_t B, H, T, D;
};

// "ape_NAME.op: ", the start of every message.
inline std::string prefix(const KernelInputs &in, const char *op) {
  return std::string("ape_") + in.encoding + "." + op + ": ";
}

inline std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kLong: return "torch.int64";
    case at::kInt: return "torch.int32";
    case at::kBool: return "torch.bool";
    default: return std::string("torch ") + c10::toString(t);
  }
}

// Checks t against q (defined, dtype, device) and against the shape `want`; `legend` spells the
// shape symbolically ("[B, H, T]").
inline void check_like_q(const std::string &w, const at::Tensor &q, const at::Tensor &t,
                         const std::string &what, at::IntArrayRef want, const std::string &legend,
                         const std::string &note = "") {
  TORCH_CHECK_VALUE(t.defined(), w, what, " is an undefined tensor");
  TORCH_CHECK_TYPE(t.scalar_type() == q.scalar_type(), w, what, " has dtype ",
                   dtype_name(t.scalar_type()), " but q has ", dtype_name(q.scalar_type()),
                   "; all inputs must share q's dtype");
  TORCH_CHECK(t.device() == q.device(), w, what, " is on ", t.device(), " but q is on ",
              q.device(), "; all inputs must be on one device");
  TORCH_CHECK_VALUE(t.sizes() == want, w, what, " must have shape ", legend, " = ", want, note,
                    ", got ", t.sizes());
}

// Validates q, k, v, the features and the params against the kernel's inputs.
inline Shape check_inputs(const KernelInputs &in, const char *op, const at::Tensor &q,
                          const at::Tensor &k, const at::Tensor &v, at::TensorList features,
                          at::TensorList params) {
  const std::string w = prefix(in, op);
  TORCH_CHECK_VALUE(q.defined(), w, "q is an undefined tensor");
  TORCH_CHECK_VALUE(q.dim() == 4, w, "q must be a 4-D tensor [B, H, T, D], got shape ",
                    q.sizes());
  TORCH_CHECK_TYPE(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble, w,
                   "q has dtype ", dtype_name(q.scalar_type()),
                   "; the kernels take torch.float32 or torch.float64");
  const Shape s{q.size(0), q.size(1), q.size(2), q.size(3)};
  TORCH_CHECK_VALUE(s.D >= 1, w, "q's last dimension (head dim D) must be >= 1, got shape ",
                    q.sizes());
  check_like_q(w, q, k, "k", q.sizes(), "[B, H, T, D] (q's shape)");
  check_like_q(w, q, v, "v", q.sizes(), "[B, H, T, D] (q's shape)");

  auto names = [](int n, auto name) {
    std::string s = "(";
    for (int i = 0; i < n; ++i) s += (i ? ", '" : "'") + std::string(name(i)) + "'";
    return s + ")";
  };
  TORCH_CHECK_VALUE(static_cast<int64_t>(features.size()) == in.num_features, w, "expected ",
                    in.num_features, " feature tensor(s) ",
                    names(in.num_features, [&](int i) { return in.feature_names[i]; }), ", got ",
                    features.size());
  const std::vector<int64_t> fshape{s.B, s.H, s.T};
  for (int i = 0; i < in.num_features; ++i)
    check_like_q(w, q, features[i], std::string("feature '") + in.feature_names[i] + "'", fshape,
                 "[B, H, T]");
  TORCH_CHECK_VALUE(static_cast<int64_t>(params.size()) == in.num_params, w, "expected ",
                    in.num_params, " param tensor(s) ",
                    names(in.num_params, [&](int i) { return in.params[i].name; }), ", got ",
                    params.size());
  for (int i = 0; i < in.num_params; ++i) {
    const ParamInput &p = in.params[i];
    check_like_q(w, q, params[i], std::string("param '") + p.name + "'", param_shape(p, s.H, s.D),
                 param_shape_text(p),
                 " (heads = " + std::to_string(s.H) + ", head_dim = " + std::to_string(s.D) + ")");
  }
  return s;
}

inline void check_scale(const KernelInputs &in, const char *op, double scale) {
  TORCH_CHECK_VALUE(std::isfinite(scale), prefix(in, op), "scale must be finite, got ", scale);
}

inline std::vector<at::Tensor> contiguous_all(at::TensorList ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto &t : ts) out.push_back(t.contiguous());
  return out;
}

template <typename T> std::vector<T *> data_ptrs(const std::vector<at::Tensor> &ts) {
  std::vector<T *> out;
  for (const auto &t : ts) out.push_back(t.data_ptr<T>());
  return out;
}

// The generated kernel on contiguous CPU tensors: o and lse (forward), or the gradients
// (backward, when dout is defined).
template <typename Real>
void run_kernel(const KernelInputs &in, const Shape &s, const at::Tensor &q, const at::Tensor &k,
                const at::Tensor &v, const std::vector<at::Tensor> &features,
                const std::vector<at::Tensor> &params, double scale, const at::Tensor &o,
                const at::Tensor &lse, const at::Tensor &dout, const at::Tensor &dq,
                const at::Tensor &dk, const at::Tensor &dv,
                const std::vector<at::Tensor> &dfeatures, const std::vector<at::Tensor> &dparams) {
  std::vector<Real *> fp = data_ptrs<Real>(features), pp = data_ptrs<Real>(params);
  std::vector<const Real *> cfp(fp.begin(), fp.end()), cpp(pp.begin(), pp.end());
  AttnArgs<Real> a{};
  a.B = s.B, a.H = s.H, a.T = s.T, a.D = s.D;
  a.q = q.data_ptr<Real>(), a.k = k.data_ptr<Real>(), a.v = v.data_ptr<Real>();
  a.o = o.data_ptr<Real>(), a.lse = lse.data_ptr<Real>();
  a.features = cfp.data(), a.params = cpp.data();
  a.scale = static_cast<Real>(scale);
  const KernelEntry &e = *in.entry;
  if (!dout.defined()) {
    if constexpr (std::is_same_v<Real, float>) e.forward_f32(a); else e.forward_f64(a);
    return;
  }
  std::vector<Real *> dfp = data_ptrs<Real>(dfeatures), dpp = data_ptrs<Real>(dparams);
  a.dout = dout.data_ptr<Real>();
  a.dq = dq.data_ptr<Real>(), a.dk = dk.data_ptr<Real>(), a.dv = dv.data_ptr<Real>();
  a.dfeatures = dfp.data(), a.dparams = dpp.data();
  if constexpr (std::is_same_v<Real, float>) e.backward_f32(a); else e.backward_f64(a);
}

using ForwardResult = std::tuple<at::Tensor, at::Tensor>;
using BackwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, std::vector<at::Tensor>,
                                  std::vector<at::Tensor>>;

inline ForwardResult forward_cpu(const KernelInputs &in, const Shape &s, const at::Tensor &q,
                                 const at::Tensor &k, const at::Tensor &v, at::TensorList features,
                                 at::TensorList params, double scale) {
  at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  std::vector<at::Tensor> fc = contiguous_all(features), pc = contiguous_all(params);
  at::Tensor o = at::empty({s.B, s.H, s.T, s.D}, q.options());
  at::Tensor lse = at::empty({s.B, s.H, s.T}, q.options());
  if (q.scalar_type() == at::kFloat)
    run_kernel<float>(in, s, qc, kc, vc, fc, pc, scale, o, lse, {}, {}, {}, {}, {}, {});
  else
    run_kernel<double>(in, s, qc, kc, vc, fc, pc, scale, o, lse, {}, {}, {}, {}, {}, {});
  return {o, lse};
}

inline BackwardResult backward_cpu(const KernelInputs &in, const Shape &s, const at::Tensor &dout,
                                   const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                   const at::Tensor &o, const at::Tensor &lse,
                                   at::TensorList features, at::TensorList params, double scale) {
  at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  at::Tensor oc = o.contiguous(), lc = lse.contiguous(), gc = dout.contiguous();
  std::vector<at::Tensor> fc = contiguous_all(features), pc = contiguous_all(params);
  at::Tensor dq = at::empty_like(qc), dk = at::empty_like(kc), dv = at::empty_like(vc);
  std::vector<at::Tensor> df, dp;
  for (const auto &f : fc) df.push_back(at::empty_like(f));
  for (const auto &p : pc) dp.push_back(at::empty_like(p));
  if (q.scalar_type() == at::kFloat)
    run_kernel<float>(in, s, qc, kc, vc, fc, pc, scale, oc, lc, gc, dq, dk, dv, df, dp);
  else
    run_kernel<double>(in, s, qc, kc, vc, fc, pc, scale, oc, lc, gc, dq, dk, dv, df, dp);
  return {dq, dk, dv, df, dp};
}

// ---- the raw operators, per device -------------------------------------------------------------
enum class Where { kCpu, kCuda, kMeta };

inline std::vector<at::Tensor> to_host(at::TensorList ts) {
  std::vector<at::Tensor> out;
  for (const auto &t : ts) out.push_back(t.cpu());
  return out;
}

inline ForwardResult forward_on(Where where, const KernelInputs &in, const at::Tensor &q,
                                const at::Tensor &k, const at::Tensor &v, at::TensorList features,
                                at::TensorList params, double scale) {
  const char *op = "attention_forward";
  const Shape s = check_inputs(in, op, q, k, v, features, params);
  check_scale(in, op, scale);
  switch (where) {
    case Where::kCpu:
      TORCH_CHECK(q.device().is_cpu(), prefix(in, op), "the CPU kernel got q on ", q.device());
      return forward_cpu(in, s, q, k, v, features, params, scale);
    case Where::kCuda: {
      TORCH_CHECK(q.is_cuda(), prefix(in, op), "the CUDA kernel got q on ", q.device());
      auto [o, lse] = forward_cpu(in, s, q.cpu(), k.cpu(), v.cpu(), to_host(features),
                                  to_host(params), scale);
      return {o.to(q.device()), lse.to(q.device())};
    }
    case Where::kMeta:
      return {at::empty({s.B, s.H, s.T, s.D}, q.options()), at::empty({s.B, s.H, s.T}, q.options())};
  }
  TORCH_INTERNAL_ASSERT(false, "unknown device kind");
}

inline BackwardResult backward_on(Where where, const KernelInputs &in, const at::Tensor &dout,
                                  const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                  const at::Tensor &o, const at::Tensor &lse,
                                  at::TensorList features, at::TensorList params, double scale) {
  const char *op = "attention_backward";
  const Shape s = check_inputs(in, op, q, k, v, features, params);
  check_scale(in, op, scale);
  const std::string w = prefix(in, op);
  check_like_q(w, q, dout, "dout", q.sizes(), "[B, H, T, D] (q's shape)");
  check_like_q(w, q, o, "o", q.sizes(), "[B, H, T, D] (q's shape)");
  check_like_q(w, q, lse, "lse", {s.B, s.H, s.T}, "[B, H, T]");
  switch (where) {
    case Where::kCpu:
      TORCH_CHECK(q.device().is_cpu(), w, "the CPU kernel got q on ", q.device());
      return backward_cpu(in, s, dout, q, k, v, o, lse, features, params, scale);
    case Where::kCuda: {
      TORCH_CHECK(q.is_cuda(), w, "the CUDA kernel got q on ", q.device());
      auto [dq, dk, dv, df, dp] = backward_cpu(in, s, dout.cpu(), q.cpu(), k.cpu(), v.cpu(),
                                               o.cpu(), lse.cpu(), to_host(features),
                                               to_host(params), scale);
      for (auto &t : df) t = t.to(q.device());
      for (auto &t : dp) t = t.to(q.device());
      return {dq.to(q.device()), dk.to(q.device()), dv.to(q.device()), df, dp};
    }
    case Where::kMeta: {
      std::vector<at::Tensor> df, dp;
      for (const auto &f : features) df.push_back(at::empty_like(f));
      for (const auto &p : params) dp.push_back(at::empty_like(p));
      return {at::empty_like(q), at::empty_like(k), at::empty_like(v), df, dp};
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unknown device kind");
}

// Kernels with the generated kernel_inputs() baked in, for m.impl.
template <const KernelInputs &(*In)(), Where W>
ForwardResult forward_kernel(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                             at::TensorList features, at::TensorList params, double scale) {
  return forward_on(W, In(), q, k, v, features, params, scale);
}
template <const KernelInputs &(*In)(), Where W>
BackwardResult backward_kernel(const at::Tensor &dout, const at::Tensor &q, const at::Tensor &k,
                               const at::Tensor &v, const at::Tensor &o, const at::Tensor &lse,
                               at::TensorList features, at::TensorList params, double scale) {
  return backward_on(W, In(), dout, q, k, v, o, lse, features, params, scale);
}

// The schemas of the raw pair (inside TORCH_LIBRARY).
inline void define_raw_ops(torch::Library &m) {
  m.def("attention_forward(Tensor q, Tensor k, Tensor v, Tensor[] features, Tensor[] params, "
        "float scale) -> (Tensor o, Tensor lse)");
  m.def("attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, "
        "Tensor[] features, Tensor[] params, float scale) -> (Tensor dq, Tensor dk, Tensor dv, "
        "Tensor[] dfeatures, Tensor[] dparams)");
}

// Their kernels for one dispatch key (inside TORCH_LIBRARY_IMPL(ns, CPU | CUDA | Meta, m)).
template <const KernelInputs &(*In)(), Where W> void impl_raw_ops(torch::Library &m) {
  m.impl("attention_forward", &forward_kernel<In, W>);
  m.impl("attention_backward", &backward_kernel<In, W>);
}

// Under the Autograd key the raw pair falls through to its device kernels: their outputs carry
// no gradient history (the differentiable operator is `attention`).
inline void impl_raw_ops_fallthrough(torch::Library &m) {
  m.impl("attention_forward", torch::CppFunction::makeFallthrough());
  m.impl("attention_backward", torch::CppFunction::makeFallthrough());
}

// ---- the differentiable operator ---------------------------------------------------------------
using ForwardSig = ForwardResult(const at::Tensor &, const at::Tensor &, const at::Tensor &,
                                 at::TensorList, at::TensorList, double);
using BackwardSig = BackwardResult(const at::Tensor &, const at::Tensor &, const at::Tensor &,
                                   const at::Tensor &, const at::Tensor &, const at::Tensor &,
                                   at::TensorList, at::TensorList, double);

inline c10::TypedOperatorHandle<ForwardSig> forward_op(const KernelInputs &in) {
  const std::string name = std::string("ape_") + in.encoding + "::attention_forward";
  return c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), "").typed<ForwardSig>();
}
inline c10::TypedOperatorHandle<BackwardSig> backward_op(const KernelInputs &in) {
  const std::string name = std::string("ape_") + in.encoding + "::attention_backward";
  return c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), "").typed<BackwardSig>();
}

// Saved for backward: q, k, v, o, lse, features..., params...
struct AttentionFunction : public torch::autograd::Function<AttentionFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &q,
                            const at::Tensor &k, const at::Tensor &v, at::TensorList features,
                            at::TensorList params, int64_t inputs_bits, double scale) {
    const auto &in = *reinterpret_cast<const KernelInputs *>(static_cast<intptr_t>(inputs_bits));
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [o, lse] = forward_op(in).call(q, k, v, features, params, scale);
    torch::autograd::variable_list saved{q, k, v, o, lse};
    saved.insert(saved.end(), features.begin(), features.end());
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["inputs"] = inputs_bits;
    ctx->saved_data["scale"] = scale;
    return o;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto &in = *reinterpret_cast<const KernelInputs *>(
        static_cast<intptr_t>(ctx->saved_data["inputs"].toInt()));
    TORCH_CHECK(!at::GradMode::is_enabled(), prefix(in, "attention"),
                "the kernel's backward is not differentiable (no double backward: "
                "create_graph=True is not supported)");
    const double scale = ctx->saved_data["scale"].toDouble();
    const int nf = in.num_features, np = in.num_params;
    auto s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &o = s[3], &lse = s[4];
    std::vector<at::Tensor> features(s.begin() + 5, s.begin() + 5 + nf);
    std::vector<at::Tensor> params(s.begin() + 5 + nf, s.begin() + 5 + nf + np);
    at::Tensor dout = grad_outputs[0].defined() ? grad_outputs[0] : at::zeros_like(o);
    auto [dq, dk, dv, df, dp] =
        backward_op(in).call(dout, q, k, v, o, lse, features, params, scale);
    // One gradient per forward argument: q, k, v, features..., params..., inputs_bits, scale.
    torch::autograd::variable_list grads{dq, dk, dv};
    for (int i = 0; i < nf; ++i)
      grads.push_back(ctx->needs_input_grad(3 + i) ? df[i] : at::Tensor());
    for (int i = 0; i < np; ++i)
      grads.push_back(ctx->needs_input_grad(3 + nf + i) ? dp[i] : at::Tensor());
    grads.emplace_back();
    grads.emplace_back();
    return grads;
  }
};

inline double resolve_scale(const KernelInputs &in, const Shape &s, Optional<double> scale) {
  const double kappa = scale.has_value() ? *scale : in.scale_for(s.D);
  check_scale(in, "attention", kappa);
  return kappa;
}

// The Autograd kernel of `attention`.
inline at::Tensor attention(const KernelInputs &in, const at::Tensor &q, const at::Tensor &k,
                            const at::Tensor &v, const std::vector<at::Tensor> &features,
                            const std::vector<at::Tensor> &params, Optional<double> scale) {
  const Shape s = check_inputs(in, "attention", q, k, v, features, params);
  if (at::GradMode::is_enabled()) {
    for (int i = 0; i < in.num_params; ++i)
      TORCH_CHECK_VALUE(in.params[i].trainable || !params[i].requires_grad(),
                        prefix(in, "attention"), "param '", in.params[i].name,
                        "' requires grad, but the encoding declares it not trainable: the kernel "
                        "computes no gradient for it. Pass a tensor that does not require grad "
                        "(a buffer, or .detach()).");
  }
  return AttentionFunction::apply(q, k, v, at::TensorList(features), at::TensorList(params),
                                  static_cast<int64_t>(reinterpret_cast<intptr_t>(&in)),
                                  resolve_scale(in, s, scale));
}

// The CompositeExplicitAutograd kernel of `attention` (reached without autograd, e.g. under
// torch.inference_mode): the forward only.
inline at::Tensor attention_forward_only(const KernelInputs &in, const at::Tensor &q,
                                         const at::Tensor &k, const at::Tensor &v,
                                         const std::vector<at::Tensor> &features,
                                         const std::vector<at::Tensor> &params,
                                         Optional<double> scale) {
  const Shape s = check_inputs(in, "attention", q, k, v, features, params);
  return std::get<0>(forward_op(in).call(q, k, v, features, params, resolve_scale(in, s, scale)));
}

}  // namespace ape::torch_ops
