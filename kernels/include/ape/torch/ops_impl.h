// Operator-library implementation: the PyTorch operators of one generated kernel. torch/ops.h
// declares what the generated NAME_ops.cpp calls; docs/frameworks.md has the user's contract.
// Compiled once per library from the emitted ape/torch_ops.cpp: nothing here depends on the
// encoding at compile time (the kernel's inputs come as a KernelInputs table at run time), so a
// project building many emitted folders compiles it once.
//
// In the namespace ape_NAME (the operators that return tensors, all but backward_status, which
// waits for the device, pt2_compliant: opcheck-tested, torch.compile-able):
//
//   attention(Tensor q, Tensor k, Tensor v, <one Tensor per feature>, <one Tensor per param>,
//             float? scale=None) -> Tensor
//       o = causal attention with the encoding; differentiable: its Autograd kernel is
//       AttentionFunction below (forward = attention_forward, backward = attention_backward), so
//       loss.backward() reaches q, k, v, the features and every trainable param. scale None = the
//       manifest's scale, else 1/sqrt(D).
//   attention_forward(Tensor q, Tensor k, Tensor v, Tensor[] features, Tensor[] params,
//                     float scale) -> (Tensor o, Tensor lse)
//   attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse,
//                      Tensor[] features, Tensor[] params, float scale)
//       -> (Tensor dq, Tensor dk, Tensor dv, Tensor[] dfeatures, Tensor[] dparams)
//       the raw kernels (no autograd history), for other autograd systems.
//   derived_params(Tensor? w_q=None, Tensor? w_k=None, Tensor? w_v=None, *, int heads,
//                  int head_dim) -> Tensor[]
//       the params an override derives from the projection weights (torch/derived_params.h), in
//       manifest order; ATen ops, so gradients reach the weights.
//   init_value(str name, *, int heads, int head_dim) -> Tensor
//       the float64 initial value of an alibi_slopes or sinusoidal param (vocabulary.h's math, as
//       APE's runtime computes it), in its manifest shape
//   manifest() -> str
//   cuda_kernels() -> str[]    the CUDA variants compiled in ("bf16/hd64", ...; none: [])
//   cpu_level() -> str         the CPU kernels' instruction-set level (ape/cpu/dispatch.h)
//   backward_status(Device? device=None, bool clear=True) -> int
//       the OR of the status words (ape/cuda/kernel_entry.h kStatus*) of every CUDA backward on
//       the device (None: the current CUDA device) since the last clear; 0 on the CPU and without
//       CUDA kernels. Reading it waits for the device: the backward itself never does
//       (torch/ops_cuda.h); after an error the gradients it concerns are NaN already.
//
// Kernels by dispatch key:
//   Autograd                   attention: AttentionFunction; the raw pair falls through
//   CompositeExplicitAutograd  attention without autograd (no_grad, inference_mode): the forward
//   CPU                        the raw pair: the fused CPU kernel (OpenMP); float32 and float64
//                              directly, bfloat16 and float16 in float32 (converted copies)
//   CUDA                       the raw pair: the generated CUDA kernels on the current stream
//                              (torch/ops_cuda.h); where the library has no kernel for the dtype
//                              and head dim, the CPU kernel on host copies (warned once)
//   Meta                       the raw pair: shapes and dtypes only; symbolic sizes allowed, so
//                              fake tensors (torch.compile, opcheck) trace through
//   CompositeImplicitAutograd  derived_params, init_value, manifest, cuda_kernels, cpu_level,
//                              backward_status
//
// An inference-only library (an attention transition, Library::inference_only) differs in three
// ways: attention takes `*, int layer, int num_layers` after scale and attention_forward `int
// layer, int num_layers` after its scale (the layer of a model of num_layers this call computes:
// the transition transforms some layers' rows, 0 <= layer < num_layers; num_layers 0 transforms
// nothing); attention refuses inputs that require grad while grad mode is on, and dual tensors of
// forward-mode AD (there is no derivative: call it under torch.no_grad() or
// torch.inference_mode()); attention_backward refuses every call.
//
// Shapes: q, o, dout (B, H, T, D); k, v (B, H_kv, T, D) with H a multiple of H_kv (H_kv < H:
// grouped-query attention, query head h reading key head h / (H / H_kv); the encoding stays per
// query head, as if k and v were repeated to H heads); lse and every feature (B, H, T); params by
// their manifest shape with "heads" = H and "head_dim" = D. One dtype for q, k, v, dout, o, features
// and params; lse is float64 for float64 inputs, float32 otherwise. One device for all.
// Non-contiguous inputs are accepted (copied to contiguous first); outputs are contiguous.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ape/contract/kernel_inputs.h"
#include "ape/contract/vocabulary.h"
#include "ape/cpu/kernel_call.h"
#include "ape/cpu/kernel_entry.h"
#include "ape/torch/autograd.h"
#include "ape/torch/derived_params.h"
#include "ape/torch/ops.h"

namespace ape::torch_ops {

// ---- messages ----------------------------------------------------------------------------------
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

// ---- dtypes -------------------------------------------------------------------------------------
// The kernels compute in float64 for float64 inputs and in float32 for the others (bfloat16 and
// float16 inputs: float32 accumulation, results rounded once to the input dtype). lse has the
// compute dtype.
inline bool supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}
inline at::ScalarType compute_dtype(at::ScalarType t) {
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

// ---- argument checks (symbolic sizes: they also run on fake tensors under torch.compile) ------
using SymSizes = std::vector<c10::SymInt>;

// Checks t against q (defined, dtype, device) and against the shape `want`; `legend` spells the
// shape symbolically ("[B, H, T]"), `note()` adds to a wrong shape's message. `dtype` is the
// dtype t must have (default: q's). A call that passes formats nothing: TORCH_CHECK builds its
// message only on failure, and `note` is called only there (a message built on every call, with
// its sizes through an ostream, cost each call an allocation and a stream, and on the H200 machine
// crashed every call of an encoding with params; bench/results/gpu_h200.md).
struct NoNote {
  const char *operator()() const { return ""; }
};
// Features and params (side inputs) may also be float32 where q is bfloat16 or float16: what
// torch.autocast leaves them (nn.Parameters stay float32); the kernels compute in float32 anyway,
// and each gradient comes back in its input's dtype.
inline bool float32_side(const at::Tensor &q, const at::Tensor &t) {
  return t.scalar_type() == at::kFloat && (q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf);
}
template <class Note = NoNote>
inline void check_like_q(const std::string &w, const at::Tensor &q, const at::Tensor &t,
                         const std::string &what, c10::SymIntArrayRef want,
                         const std::string &legend, Note note = {},
                         std::optional<at::ScalarType> dtype = std::nullopt, bool side = false) {
  TORCH_CHECK_VALUE(t.defined(), w, what, " is an undefined tensor");
  if (!dtype) {
    TORCH_CHECK_TYPE(t.scalar_type() == q.scalar_type() || (side && float32_side(q, t)), w, what,
                     " has dtype ", dtype_name(t.scalar_type()), " but q has ", dtype_name(q.scalar_type()),
                     side ? "; features and params must have q's dtype (or float32 with a bfloat16 or "
                            "float16 q)"
                          : "; all inputs must share q's dtype");
  } else {
    TORCH_CHECK_TYPE(t.scalar_type() == *dtype, w, what, " has dtype ",
                     dtype_name(t.scalar_type()), " but must be ", dtype_name(*dtype), " for q of ",
                     dtype_name(q.scalar_type()));
  }
  TORCH_CHECK(t.device() == q.device(), w, what, " is on ", t.device(), " but q is on ",
              q.device(), "; all inputs must be on one device");
  TORCH_CHECK_VALUE(t.sym_sizes() == want, w, what, " must have shape ", legend, " = ", want,
                    note(), ", got ", t.sym_sizes());
}

// The shape of param p for H heads of dimension D.
inline SymSizes sym_param_shape(const ParamInput &p, const c10::SymInt &H, const c10::SymInt &D) {
  SymSizes shape;
  for (int i = 0; i < p.rank; ++i)
    shape.push_back(p.dims[i].is(ape_abi::Dim::Kind::Heads)     ? H
                    : p.dims[i].is(ape_abi::Dim::Kind::HeadDim) ? D
                                                                : c10::SymInt(p.dims[i].value));
  return shape;
}

// Validates q, k, v, the features and the params against the kernel's inputs.
inline void check_inputs(const KernelInputs &in, const char *op, const at::Tensor &q,
                         const at::Tensor &k, const at::Tensor &v, at::TensorList features,
                         at::TensorList params) {
  const std::string w = prefix(in, op);
  TORCH_CHECK_VALUE(q.defined(), w, "q is an undefined tensor");
  TORCH_CHECK_VALUE(q.dim() == 4, w, "q must be a 4-D tensor [B, H, T, D], got shape ",
                    q.sym_sizes());
  TORCH_CHECK_TYPE(supported_dtype(q.scalar_type()), w, "q has dtype ",
                   dtype_name(q.scalar_type()),
                   "; the kernels take torch.float32, torch.float64, torch.bfloat16 or "
                   "torch.float16");
  const c10::SymInt &H = q.sym_size(1), &D = q.sym_size(3);
  TORCH_CHECK_VALUE(D >= 1, w, "q's last dimension (head dim D) must be >= 1, got shape ",
                    q.sym_sizes());
  // k and v: q's shape, or H_kv heads that H is a multiple of (grouped-query attention: query
  // head h reads key head h / (H / H_kv), AttnArgs::kv_heads).
  const SymSizes kshape{q.sym_size(0), k.defined() && k.dim() == 4 ? k.sym_size(1) : H,
                        q.sym_size(2), D};
  check_like_q(w, q, k, "k", kshape, "[B, H_kv, T, D] (q's B, T and D; H_kv = H or a divisor of it)");
  const c10::SymInt &Hk = kshape[1];
  TORCH_CHECK_VALUE(Hk == H || (Hk >= 1 && Hk <= H && H % Hk == 0), w, "k has ", Hk, " heads and q ", H,
                    ": grouped-query attention needs q's heads to be a multiple of k's");
  check_like_q(w, q, v, "v", kshape, "[B, H_kv, T, D] (k's shape)");

  auto names = [](int n, auto name) {
    std::string s = "(";
    for (int i = 0; i < n; ++i) s += (i ? ", '" : "'") + std::string(name(i)) + "'";
    return s + ")";
  };
  TORCH_CHECK_VALUE(static_cast<int64_t>(features.size()) == in.num_features, w, "expected ",
                    in.num_features, " feature tensor(s) ",
                    names(in.num_features, [&](int i) { return in.feature_names[i]; }), ", got ",
                    features.size());
  const SymSizes fshape{q.sym_size(0), H, q.sym_size(2)};
  for (int i = 0; i < in.num_features; ++i)
    check_like_q(w, q, features[i], std::string("feature '") + in.feature_names[i] + "'", fshape,
                 "[B, H, T]", NoNote{}, std::nullopt, /*side=*/true);
  TORCH_CHECK_VALUE(static_cast<int64_t>(params.size()) == in.num_params, w, "expected ",
                    in.num_params, " param tensor(s) ",
                    names(in.num_params, [&](int i) { return in.params[i].name; }), ", got ",
                    params.size());
  for (int i = 0; i < in.num_params; ++i) {
    const ParamInput &p = in.params[i];
    check_like_q(w, q, params[i], std::string("param '") + p.name + "'",
                 sym_param_shape(p, H, D), param_shape_text(p),
                 [&] { return c10::str(" (heads = ", H, ", head_dim = ", D, ")"); }, std::nullopt,
                 /*side=*/true);
  }
}

// The scale, finite, 0 or not tiny (ape_rules::check_call_scale), and within the range of the type
// the kernels compute in (float but for float64 inputs: a finite double such as 1e300 became inf
// there, and every output NaN).
inline void check_scale(const KernelInputs &in, const char *op, double scale, at::ScalarType dtype) {
  const std::string why = ::ape_rules::check_call_scale(scale);
  TORCH_CHECK_VALUE(why.empty(), prefix(in, op), why);
  TORCH_CHECK_VALUE(compute_dtype(dtype) == at::kDouble ||
                        std::fabs(scale) <= static_cast<double>(std::numeric_limits<float>::max()),
                    prefix(in, op), "scale ", scale, " is beyond the range of float, in which ",
                    dtype_name(dtype), " inputs are computed");
}

// ---- the CPU kernel -----------------------------------------------------------------------------
// Sizes of one call on real tensors: B batch, H heads, T tokens, D head dim.
struct Shape {
  int64_t B, H, T, D;
  int64_t KV;  // heads of k and v (H, or a divisor of it: grouped-query attention)
};
inline Shape shape_of(const at::Tensor &q, const at::Tensor &k) {
  return {q.size(0), q.size(1), q.size(2), q.size(3), k.size(1)};
}

// t in the dtype `dt`, contiguous (t itself when it already is).
inline at::Tensor prepared(const at::Tensor &t, at::ScalarType dt) { return t.to(dt).contiguous(); }
inline std::vector<at::Tensor> prepared(at::TensorList ts, at::ScalarType dt) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto &t : ts) out.push_back(prepared(t, dt));
  return out;
}

template <typename T> std::vector<T *> data_ptrs(const std::vector<at::Tensor> &ts) {
  std::vector<T *> out;
  for (const auto &t : ts) out.push_back(t.data_ptr<T>());
  return out;
}

// The generated kernel on contiguous CPU tensors: o and lse (forward), or the gradients (backward,
// when dout is defined). q, k, v, o, dout, dq, dk, dv are of type Real, or bfloat16 when `bf16`
// (Real float: AttnArgs::bf16_io, the kernel converts each slice's rows itself, and, on a CPU with
// AMX, takes the tile products with bf16 operands as on a GPU: AttnArgs::bf16_products); lse,
// features, params and their gradients are Real.
template <typename Real>
void run_kernel(const KernelInputs &in, const Shape &s, const at::Tensor &q, const at::Tensor &k,
                const at::Tensor &v, const std::vector<at::Tensor> &features,
                const std::vector<at::Tensor> &params, double scale, const at::Tensor &o,
                const at::Tensor &lse, const at::Tensor &dout, const at::Tensor &dq,
                const at::Tensor &dk, const at::Tensor &dv,
                const std::vector<at::Tensor> &dfeatures, const std::vector<at::Tensor> &dparams,
                bool bf16, int64_t layer = 0, int64_t num_layers = 0) {
  std::vector<Real *> fp = data_ptrs<Real>(features), pp = data_ptrs<Real>(params);
  std::vector<const Real *> cfp(fp.begin(), fp.end()), cpp(pp.begin(), pp.end());
  // The Real pointer of t, or null when t is held as bf16 (or absent).
  auto real = [bf16](const at::Tensor &t) -> Real * {
    return bf16 || !t.defined() ? nullptr : t.data_ptr<Real>();
  };
  auto bits = [](const at::Tensor &t) -> uint16_t * {
    return t.defined() ? reinterpret_cast<uint16_t *>(t.data_ptr<at::BFloat16>()) : nullptr;
  };
  Bf16Io io;
  if (bf16) {
    io.q = bits(q), io.k = bits(k), io.v = bits(v), io.o = bits(o);
    io.dout = bits(dout), io.dq = bits(dq), io.dk = bits(dk), io.dv = bits(dv);
  }
  AttnArgs<Real> a = forward_args<Real>({s.B, s.H, s.T, s.D, s.KV}, scale, real(q), real(k), real(v),
                                        cfp.data(), cpp.data(), real(o), lse.data_ptr<Real>(), layer,
                                        num_layers);
  a.bf16_products = bf16;
  if (bf16) a.bf16_io = &io;
  const KernelEntry &e = *in.entry;
  if (!dout.defined()) {
    entry_forward<Real>(e)(a);
    return;
  }
  std::vector<Real *> dfp = data_ptrs<Real>(dfeatures), dpp = data_ptrs<Real>(dparams);
  entry_backward<Real>(e)(backward_args(a, real(dout), real(dq), real(dk), real(dv), dfp.data(),
                                        dpp.data()));
}

using ForwardResult = std::tuple<at::Tensor, at::Tensor>;
using BackwardResult = AttentionGrads;  // dq, dk, dv, dfeatures, dparams

// ts[i] in the dtype of like[i] (each gradient in its input's dtype).
inline std::vector<at::Tensor> converted(std::vector<at::Tensor> ts, at::TensorList like) {
  for (size_t i = 0; i < ts.size(); ++i) ts[i] = ts[i].to(like[i].scalar_type());
  return ts;
}

// The dtype the kernel reads q, k, v, o, dout in: bfloat16 as they are (AttnArgs::bf16_io), else
// the compute dtype (float16 inputs are copied to float).
inline at::ScalarType io_dtype(at::ScalarType t) {
  return t == at::kBFloat16 ? at::kBFloat16 : compute_dtype(t);
}

// The fixed params' values (pc: as the CPU kernel reads them, in its compute type) against their
// ranges, in the runtime's words (param_range_problem). On the CPU only: a CUDA call would have
// to wait for the GPU to read them (docs/frameworks.md).
inline void check_param_values(const KernelInputs &in, const char *op, const std::vector<at::Tensor> &pc) {
  for (int i = 0; i < in.num_params; ++i) {
    if (!in.params[i].has_range) continue;
    const at::Tensor t = pc[i].to(at::kDouble).contiguous();
    const std::string why = param_range_problem(in.params[i], t.data_ptr<double>(), t.numel());
    TORCH_CHECK_VALUE(why.empty(), prefix(in, op), why);
  }
}

inline ForwardResult forward_cpu(const KernelInputs &in, const at::Tensor &q, const at::Tensor &k,
                                 const at::Tensor &v, at::TensorList features,
                                 at::TensorList params, double scale, int64_t layer = 0,
                                 int64_t num_layers = 0) {
  const Shape s = shape_of(q, k);
  const at::ScalarType ct = compute_dtype(q.scalar_type()), it = io_dtype(q.scalar_type());
  const bool bf16 = it == at::kBFloat16;
  at::Tensor qc = prepared(q, it), kc = prepared(k, it), vc = prepared(v, it);
  std::vector<at::Tensor> fc = prepared(features, ct), pc = prepared(params, ct);
  check_param_values(in, "attention_forward", pc);
  at::Tensor o = at::empty({s.B, s.H, s.T, s.D}, qc.options());
  at::Tensor lse = at::empty({s.B, s.H, s.T}, qc.options().dtype(ct));
  if (ct == at::kFloat)
    run_kernel<float>(in, s, qc, kc, vc, fc, pc, scale, o, lse, {}, {}, {}, {}, {}, {}, bf16, layer,
                      num_layers);
  else
    run_kernel<double>(in, s, qc, kc, vc, fc, pc, scale, o, lse, {}, {}, {}, {}, {}, {}, bf16, layer,
                       num_layers);
  return {o.to(q.scalar_type()), lse};
}

inline BackwardResult backward_cpu(const KernelInputs &in, const at::Tensor &dout,
                                   const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                   const at::Tensor &o, const at::Tensor &lse,
                                   at::TensorList features, at::TensorList params, double scale) {
  const Shape s = shape_of(q, k);
  const at::ScalarType ct = compute_dtype(q.scalar_type()), it = io_dtype(q.scalar_type());
  const bool bf16 = it == at::kBFloat16;
  at::Tensor qc = prepared(q, it), kc = prepared(k, it), vc = prepared(v, it);
  at::Tensor oc = prepared(o, it), lc = prepared(lse, ct), gc = prepared(dout, it);
  std::vector<at::Tensor> fc = prepared(features, ct), pc = prepared(params, ct);
  check_param_values(in, "attention_backward", pc);
  at::Tensor dq = at::empty_like(qc), dk = at::empty_like(kc), dv = at::empty_like(vc);
  std::vector<at::Tensor> df, dp;
  for (const auto &f : fc) df.push_back(at::empty_like(f));
  for (const auto &p : pc) dp.push_back(at::empty_like(p));
  if (ct == at::kFloat)
    run_kernel<float>(in, s, qc, kc, vc, fc, pc, scale, oc, lc, gc, dq, dk, dv, df, dp, bf16);
  else
    run_kernel<double>(in, s, qc, kc, vc, fc, pc, scale, oc, lc, gc, dq, dk, dv, df, dp, bf16);
  const at::ScalarType dt = q.scalar_type();
  return {dq.to(dt), dk.to(dt), dv.to(dt), converted(df, features), converted(dp, params)};
}

}  // namespace ape::torch_ops

#ifdef APE_TORCH_OPS_CUDA  // set by the emitted CMakeLists.txt when LibTorch has CUDA
#include "ape/torch/ops_cuda.h"  // the CUDA kernels' calls; uses the helpers above
#endif

namespace ape::torch_ops {

// ---- the raw operators, per device --------------------------------------------------------------
enum class Where { kCpu, kCuda, kMeta };

inline std::vector<at::Tensor> to_host(at::TensorList ts) {
  std::vector<at::Tensor> out;
  for (const auto &t : ts) out.push_back(t.cpu());
  return out;
}
inline std::vector<at::Tensor> to_device(std::vector<at::Tensor> ts, const at::Device &d) {
  for (auto &t : ts) t = t.to(d);
  return ts;
}

// "bf16/hd64", ...: the CUDA variants compiled into the library (none without CUDA kernels).
inline std::vector<std::string> cuda_kernel_names(const Library &lib) {
  std::vector<std::string> out;
#ifdef APE_TORCH_OPS_CUDA
  if (lib.cuda)
    for (size_t n = 0; n < lib.cuda->num_variants; ++n)
      if (lib.cuda->variants[n].forward)
        out.push_back(std::string(cuda::dtype_name(lib.cuda->variants[n].dtype)) + "/hd" +
                      std::to_string(lib.cuda->variants[n].head_dim));
#else
  (void)lib;
#endif
  return out;
}

// CUDA tensors for which the library has no CUDA kernel (built without nvcc, an encoding the CUDA
// template does not support yet, or a dtype / head dim that was not instantiated) run the CPU
// kernel on host copies: correct, slow, and said once.
inline std::string no_cuda_kernel_reason(const Library &lib, const at::Tensor &q) {
  if (lib.cuda)
    return c10::str("its CUDA kernels take (dtype/head dim) ", c10::Join(", ", cuda_kernel_names(lib)),
                    ", not ", dtype_name(q.scalar_type()), " with head dim ", q.size(3));
  return lib.no_cuda_reason ? lib.no_cuda_reason : "";
}
inline void warn_host_copies(const Library &lib, const at::Tensor &q) {
  TORCH_WARN_ONCE(prefix(*lib.inputs, "attention"), "no CUDA kernel for these inputs (",
                  no_cuda_kernel_reason(lib, q),
                  "): computing on host copies with the CPU kernel (correct, but slow)");
}
// The same inside a CUDA graph capture, where host copies cannot be made: refused.
inline std::string no_kernel_in_capture(const Library &lib, const at::Tensor &q) {
  return c10::str("no CUDA kernel for these inputs (", no_cuda_kernel_reason(lib, q),
                  "), and its fallback, the CPU kernel on host copies, cannot run inside a CUDA graph capture");
}

// An inference-only library's layer of num_layers (Library::inference_only).
inline void check_layer(const KernelInputs &in, const char *op, int64_t layer, int64_t num_layers) {
  TORCH_CHECK_VALUE(num_layers >= 0 && num_layers <= 100000, prefix(in, op),
                    "num_layers must be in [0, 100000] (0: no layer is transformed), got ", num_layers);
  TORCH_CHECK_VALUE(num_layers == 0 ? layer == 0 : layer >= 0 && layer < num_layers, prefix(in, op),
                    "layer must be in [0, num_layers) = [0, ", num_layers, ") (0 when num_layers is 0), got ",
                    layer);
}

// Why an inference-only library has no backward, and what to do instead.
inline constexpr const char *kNoBackward =
    "the encoding is inference-only (an ape.attention_transition has no derivative): call attention "
    "under torch.no_grad() or torch.inference_mode(), or with inputs that do not require grad; train "
    "with the encoding without the transition";

inline ForwardResult forward_on(Where where, const Library &lib, const at::Tensor &q,
                                const at::Tensor &k, const at::Tensor &v, at::TensorList features,
                                at::TensorList params, double scale, int64_t layer = 0,
                                int64_t num_layers = 0) {
  const KernelInputs &in = *lib.inputs;
  const char *op = "attention_forward";
  check_inputs(in, op, q, k, v, features, params);
  check_scale(in, op, scale, q.scalar_type());
  check_layer(in, op, layer, num_layers);
  switch (where) {
    case Where::kCpu:
      TORCH_CHECK(q.device().is_cpu(), prefix(in, op), "the CPU kernel got q on ", q.device());
      return forward_cpu(in, q, k, v, features, params, scale, layer, num_layers);
    case Where::kCuda: {
      TORCH_CHECK(q.is_cuda(), prefix(in, op), "the CUDA kernel got q on ", q.device());
#ifdef APE_TORCH_OPS_CUDA
      if (const cuda::CudaVariant *var = cuda_variant(lib, q))
        return forward_cuda(prefix(in, op), *var, q, k, v, features, params, scale, 0, layer, num_layers);
#endif
#ifdef APE_TORCH_OPS_CUDA
      TORCH_CHECK(!capturing(q.device()), prefix(in, op), no_kernel_in_capture(lib, q));
#endif
      warn_host_copies(lib, q);
      auto [o, lse] = forward_cpu(in, q.cpu(), k.cpu(), v.cpu(), to_host(features),
                                  to_host(params), scale, layer, num_layers);
      return {o.to(q.device()), lse.to(q.device())};
    }
    case Where::kMeta:  // contiguous, as the kernels return them
      return {at::empty_symint(q.sym_sizes(), q.options()),
              at::empty_symint({q.sym_size(0), q.sym_size(1), q.sym_size(2)},
                               q.options().dtype(compute_dtype(q.scalar_type())))};
  }
  TORCH_INTERNAL_ASSERT(false, "unknown device kind");
}

inline BackwardResult backward_on(Where where, const Library &lib, const at::Tensor &dout,
                                  const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                  const at::Tensor &o, const at::Tensor &lse,
                                  at::TensorList features, at::TensorList params, double scale) {
  const KernelInputs &in = *lib.inputs;
  const char *op = "attention_backward";
  TORCH_CHECK(!lib.inference_only, prefix(in, op), kNoBackward);
  check_inputs(in, op, q, k, v, features, params);
  check_scale(in, op, scale, q.scalar_type());
  const std::string w = prefix(in, op);
  check_like_q(w, q, dout, "dout", q.sym_sizes(), "[B, H, T, D] (q's shape)");
  check_like_q(w, q, o, "o", q.sym_sizes(), "[B, H, T, D] (q's shape)");
  check_like_q(w, q, lse, "lse", {q.sym_size(0), q.sym_size(1), q.sym_size(2)}, "[B, H, T]", NoNote{},
               compute_dtype(q.scalar_type()));
  switch (where) {
    case Where::kCpu:
      TORCH_CHECK(q.device().is_cpu(), w, "the CPU kernel got q on ", q.device());
      return backward_cpu(in, dout, q, k, v, o, lse, features, params, scale);
    case Where::kCuda: {
      TORCH_CHECK(q.is_cuda(), w, "the CUDA kernel got q on ", q.device());
#ifdef APE_TORCH_OPS_CUDA
      if (const cuda::CudaVariant *var = cuda_variant(lib, q))
        return backward_cuda(w, *var, dout, q, k, v, o, lse, features, params, scale);
#endif
#ifdef APE_TORCH_OPS_CUDA
      TORCH_CHECK(!capturing(q.device()), w, no_kernel_in_capture(lib, q));
#endif
      warn_host_copies(lib, q);
      auto [dq, dk, dv, df, dp] = backward_cpu(in, dout.cpu(), q.cpu(), k.cpu(), v.cpu(),
                                               o.cpu(), lse.cpu(), to_host(features),
                                               to_host(params), scale);
      const at::Device d = q.device();
      return {dq.to(d), dk.to(d), dv.to(d), to_device(df, d), to_device(dp, d)};
    }
    case Where::kMeta: {  // contiguous, as the kernels return them
      std::vector<at::Tensor> df, dp;
      for (const auto &f : features) df.push_back(at::empty_symint(f.sym_sizes(), f.options()));
      for (const auto &p : params) dp.push_back(at::empty_symint(p.sym_sizes(), p.options()));
      return {at::empty_symint(q.sym_sizes(), q.options()),
              at::empty_symint(k.sym_sizes(), k.options()),
              at::empty_symint(v.sym_sizes(), v.options()), df, dp};
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unknown device kind");
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
// An inference-only library's attention_forward: (..., scale, layer, num_layers).
using LayeredForwardSig = ForwardResult(const at::Tensor &, const at::Tensor &, const at::Tensor &,
                                        at::TensorList, at::TensorList, double, int64_t, int64_t);
inline c10::TypedOperatorHandle<LayeredForwardSig> forward_op(const KernelInputs &in, bool /*layered*/) {
  const std::string name = std::string("ape_") + in.encoding + "::attention_forward";
  return c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), "").typed<LayeredForwardSig>();
}
inline c10::TypedOperatorHandle<BackwardSig> backward_op(const KernelInputs &in) {
  const std::string name = std::string("ape_") + in.encoding + "::attention_backward";
  return c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), "").typed<BackwardSig>();
}

// The operator library's side of the autograd binding (torch/autograd.h), for the
// KernelInputs at `handle`: forward and backward call the raw operators through the dispatcher, so
// tracing (AOTAutograd) records attention_forward and attention_backward, each with its device
// and Meta kernels.
struct LibraryOps {
  static const KernelInputs &inputs(int64_t handle) {
    return *reinterpret_cast<const KernelInputs *>(static_cast<intptr_t>(handle));
  }
  static std::string prefix(int64_t handle) {
    return torch_ops::prefix(inputs(handle), "attention");
  }
  static ForwardResult forward(int64_t handle, const at::Tensor &q, const at::Tensor &k,
                               const at::Tensor &v, at::TensorList features, at::TensorList params,
                               double scale) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return forward_op(inputs(handle)).call(q, k, v, features, params, scale);
  }
  static BackwardResult backward(int64_t handle, const at::Tensor &dout, const at::Tensor &q,
                                 const at::Tensor &k, const at::Tensor &v, const at::Tensor &o,
                                 const at::Tensor &lse, at::TensorList features,
                                 at::TensorList params, double scale) {
    return backward_op(inputs(handle)).call(dout, q, k, v, o, lse, features, params, scale);
  }
};
using AttentionFunction = AttentionAutograd<LibraryOps>;

// scale None: the manifest's scale, else 1/sqrt(D) (D is then specialised under torch.compile).
inline double resolve_scale(const KernelInputs &in, const at::Tensor &q,
                            std::optional<double> scale) {
  double kappa = 0;
  if (scale)
    kappa = *scale;
  else if (in.has_scale)
    kappa = in.scale;
  else
    kappa = in.scale_for(q.sym_size(3).guard_int(__FILE__, __LINE__));
  check_scale(in, "attention", kappa, q.scalar_type());
  return kappa;
}

// The Autograd kernel of `attention`.
inline at::Tensor attention(const KernelInputs &in, const at::Tensor &q, const at::Tensor &k,
                            const at::Tensor &v, const std::vector<at::Tensor> &features,
                            const std::vector<at::Tensor> &params, std::optional<double> scale) {
  check_inputs(in, "attention", q, k, v, features, params);
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
                                  resolve_scale(in, q, scale));
}

// The Autograd kernel of an inference-only library's `attention`: the forward, refused where
// autograd would need a backward (grad mode on and an input that requires grad).
inline at::Tensor attention_inference(const KernelInputs &in, const at::Tensor &q, const at::Tensor &k,
                                      const at::Tensor &v, const std::vector<at::Tensor> &features,
                                      const std::vector<at::Tensor> &params, std::optional<double> scale,
                                      int64_t layer, int64_t num_layers) {
  check_inputs(in, "attention", q, k, v, features, params);
  check_layer(in, "attention", layer, num_layers);
  // Reverse mode (an input that requires grad, grad mode on) and forward mode (a dual tensor:
  // its tangent would silently be dropped) are both refused.
  bool grad = false, tangent = false;
  auto note = [&](const at::Tensor &t) {
    grad = grad || (at::GradMode::is_enabled() && t.requires_grad());
    tangent = tangent || t._fw_grad(/*level=*/0).defined();
  };
  note(q), note(k), note(v);
  for (const auto &t : features) note(t);
  for (const auto &t : params) note(t);
  TORCH_CHECK(!tangent, prefix(in, "attention"),
              "an input carries a forward-mode tangent (a dual tensor, torch.func.jvp): the encoding is "
              "inference-only (an ape.attention_transition has no derivative); pass the primal tensors "
              "(torch.autograd.forward_ad.unpack_dual(x).primal) or call it under torch.inference_mode()");
  TORCH_CHECK(!grad, prefix(in, "attention"), "an input requires grad: ", kNoBackward);
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return std::get<0>(forward_op(in, true).call(q, k, v, features, params, resolve_scale(in, q, scale),
                                               layer, num_layers));
}

// The CompositeExplicitAutograd kernel of `attention` (reached without autograd, e.g. under
// torch.inference_mode): the forward only.
inline at::Tensor attention_forward_only(const Library &lib, const at::Tensor &q,
                                         const at::Tensor &k, const at::Tensor &v,
                                         const std::vector<at::Tensor> &features,
                                         const std::vector<at::Tensor> &params,
                                         std::optional<double> scale, int64_t layer = 0,
                                         int64_t num_layers = 0) {
  const KernelInputs &in = *lib.inputs;
  check_inputs(in, "attention", q, k, v, features, params);
  if (lib.inference_only) check_layer(in, "attention", layer, num_layers);
  if (lib.inference_only)
    return std::get<0>(forward_op(in, true).call(q, k, v, features, params, resolve_scale(in, q, scale),
                                                 layer, num_layers));
  return std::get<0>(forward_op(in).call(q, k, v, features, params, resolve_scale(in, q, scale)));
}

// ---- derived params ------------------------------------------------------------------------------
// One tensor per derived param (ParamInput::is_derived), in manifest order, from the projection
// weights (torch.nn.Linear layout: [H·D, d]); torch/derived_params.h has the math. A param that is
// not trainable is computed from the detached weight.
inline std::vector<at::Tensor> derived_params(const KernelInputs &in,
                                              const std::optional<at::Tensor> &w_q,
                                              const std::optional<at::Tensor> &w_k,
                                              const std::optional<at::Tensor> &w_v, int64_t H,
                                              int64_t D) {
  const std::string w = prefix(in, "derived_params");
  TORCH_CHECK_VALUE(H >= 1 && D >= 1, w, "heads and head_dim must be >= 1, got heads = ", H,
                    ", head_dim = ", D);
  std::vector<at::Tensor> out;
  for (int i = 0; i < in.num_params; ++i) {
    const ParamInput &p = in.params[i];
    if (!p.is_derived()) continue;
    const ape_abi::Projection proj = p.derived.projection;
    const std::optional<at::Tensor> &W =
        proj == ape_abi::Projection::Q ? w_q : proj == ape_abi::Projection::K ? w_k : w_v;
    const std::string arg = "w_" + std::string(ape_abi::name(proj));
    TORCH_CHECK_VALUE(W.has_value() && W->defined(), w, "param '", p.name,
                      "' is derived from the ", ape_abi::name(proj), " projection: pass ", arg);
    TORCH_CHECK_TYPE(at::isFloatingType(W->scalar_type()), w, arg, " has dtype ",
                     dtype_name(W->scalar_type()), "; it must be a floating-point tensor");
    // The k and v projections of grouped-query attention have H_kv·D rows (H a multiple of
    // H_kv): derived_params.h repeats each key head's param to the query heads of its group.
    const bool kv_side = proj != ape_abi::Projection::Q;
    const int64_t rows = W->dim() == 2 ? W->sym_size(0).guard_int(__FILE__, __LINE__) : -1;
    const int64_t heads = kv_side && rows > 0 && rows % D == 0 && rows / D >= 1 && H % (rows / D) == 0
                              ? rows / D
                              : H;
    TORCH_CHECK_VALUE(W->dim() == 2 && rows == heads * D && W->sym_size(1) >= p.derived.columns, w, arg,
                      " must have shape [heads*head_dim, d] = [", H * D, ", d >= ", p.derived.columns, "]",
                      kv_side ? " (or [kv_heads*head_dim, d], kv_heads dividing heads)" : "",
                      " (a torch.nn.Linear weight), got ", W->sym_sizes());
    const at::Tensor Wp = p.trainable ? *W : W->detach();
    out.push_back(p.init == ape_abi::InitKind::ProjectionPrefix
                      ? derived::projection_prefix(Wp, p.derived.columns, p.derived.scale, H, D)
                      : derived::projection_term(Wp, p.derived.columns, p.derived.start,
                                                 p.derived.step, H, D));
  }
  return out;
}

// ---- fixed initial values ------------------------------------------------------------------------
// The initial value of a param whose manifest init is alibi_slopes or sinusoidal, float64 on the
// CPU in its manifest shape: the values of vocabulary.h, the ones APE's runtime uses, so the Python
// helper (init_params) does not compute them again. Other kinds are random or trivial (zeros,
// ones, normal, constant: the helper makes them) or derived (derived_params).
inline at::Tensor init_value(const KernelInputs &in, const std::string &name, int64_t H, int64_t D) {
  const std::string w = prefix(in, "init_value");
  TORCH_CHECK_VALUE(H >= 1 && D >= 1, w, "heads and head_dim must be >= 1, got heads = ", H,
                    ", head_dim = ", D);
  const ParamInput *p = nullptr;
  std::string names;
  for (int i = 0; i < in.num_params; ++i) {
    if (name == in.params[i].name) p = &in.params[i];
    names += std::string(names.empty() ? "" : ", ") + in.params[i].name;
  }
  TORCH_CHECK_VALUE(p, w, "the encoding has no param '", name, "'; its params: [", names, "]");
  std::vector<int64_t> shape;
  for (int d = 0; d < p->rank; ++d) shape.push_back(p->dims[d].resolve(H, D));
  const ape_abi::InitKind kind = p->init;
  const bool closed_form = kind == ape_abi::InitKind::AlibiSlopes || kind == ape_abi::InitKind::Sinusoidal;
  const std::optional<std::vector<double>> init = closed_form ? initial_values(*p, H, D) : std::nullopt;
  TORCH_CHECK_VALUE(init, w, "param '", name, "' has init '", ape_abi::name(kind),
                    "': init_value computes alibi_slopes and sinusoidal ones");
  const std::vector<double> &values = *init;
  TORCH_CHECK_VALUE(static_cast<int64_t>(values.size()) == c10::multiply_integers(shape), w,
                    "param '", name, "' has shape ", at::IntArrayRef(shape), ", its init '",
                    ape_abi::name(kind), "' gives ", values.size(), " values");
  // As torch.tensor(data) makes a tensor from host data: below any Python mode (FakeTensorMode,
  // a tracer's proxy mode, functionalisation: their tensors hold no data to copy into), then
  // lifted, which such a mode turns into its constant. Eager: the plain tensor.
  at::Tensor t;
  {
    const c10::impl::ExcludeDispatchKeyGuard below_python(
        c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                             c10::DispatchKey::FuncTorchDynamicLayerFrontMode,
                             c10::DispatchKey::FuncTorchDynamicLayerBackMode}));
    t = at::tensor(values, at::TensorOptions().dtype(at::kDouble)).view(shape);
  }
  return at::lift_fresh(t);
}

// ---- boxed kernels and registration -------------------------------------------------------------
// Every kernel is one boxed functor holding the library: no per-encoding template instantiation,
// so this file is compiled once whatever the encoding (the attention schema's arity varies).
enum class Op {
  kForward, kBackward, kAttention, kAttentionNoGrad, kDerivedParams, kInitValue, kManifest,
  kCudaKernels, kCpuLevel, kBackwardStatus
};



class Kernel final : public c10::OperatorKernel {
 public:
  Kernel(const Library &lib, Op op, Where where = Where::kCpu) : lib_(lib), op_(op), where_(where) {}

  void operator()(const c10::OperatorHandle &, c10::DispatchKeySet, torch::jit::Stack *stack) {
    const KernelInputs &in = *lib_.inputs;
    const size_t nf = in.num_features, np = in.num_params;
    switch (op_) {
      case Op::kForward: {  // (q, k, v, features, params, scale[, layer, num_layers]) -> (o, lse)
        const size_t n = lib_.inference_only ? 8 : 6;
        auto a = torch::jit::last(*stack, n);
        auto [o, lse] = forward_on(where_, lib_, a[0].toTensor(), a[1].toTensor(),
                                   a[2].toTensor(), a[3].toTensorVector(), a[4].toTensorVector(),
                                   a[5].toDouble(), n == 8 ? a[6].toInt() : 0, n == 8 ? a[7].toInt() : 0);
        torch::jit::drop(*stack, n);
        torch::jit::push(*stack, std::move(o), std::move(lse));
        return;
      }
      case Op::kBackward: {  // (dout, q, k, v, o, lse, features, params, scale) -> grads
        auto a = torch::jit::last(*stack, 9);
        auto [dq, dk, dv, df, dp] =
            backward_on(where_, lib_, a[0].toTensor(), a[1].toTensor(), a[2].toTensor(),
                        a[3].toTensor(), a[4].toTensor(), a[5].toTensor(), a[6].toTensorVector(),
                        a[7].toTensorVector(), a[8].toDouble());
        torch::jit::drop(*stack, 9);
        torch::jit::push(*stack, std::move(dq), std::move(dk), std::move(dv), std::move(df),
                         std::move(dp));
        return;
      }
      case Op::kAttention:
      case Op::kAttentionNoGrad: {  // (q, k, v, features..., params..., scale?[, layer, num_layers]) -> o
        const size_t layered = lib_.inference_only ? 2 : 0, n = 3 + nf + np + 1 + layered;
        auto a = torch::jit::last(*stack, n);
        std::vector<at::Tensor> features, params;
        for (size_t i = 0; i < nf; ++i) features.push_back(a[3 + i].toTensor());
        for (size_t i = 0; i < np; ++i) params.push_back(a[3 + nf + i].toTensor());
        std::optional<double> scale = a[3 + nf + np].toOptional<double>();
        const int64_t layer = layered ? a[n - 2].toInt() : 0, num_layers = layered ? a[n - 1].toInt() : 0;
        const at::Tensor q = a[0].toTensor(), k = a[1].toTensor(), v = a[2].toTensor();
        torch::jit::drop(*stack, n);
        at::Tensor o;
        if (op_ == Op::kAttentionNoGrad)
          o = attention_forward_only(lib_, q, k, v, features, params, scale, layer, num_layers);
        else if (lib_.inference_only)
          o = attention_inference(in, q, k, v, features, params, scale, layer, num_layers);
        else
          o = attention(in, q, k, v, features, params, scale);
        torch::jit::push(*stack, std::move(o));
        return;
      }
      case Op::kDerivedParams: {  // (w_q?, w_k?, w_v?, heads, head_dim) -> Tensor[]
        auto a = torch::jit::last(*stack, 5);
        auto out = derived_params(in, a[0].toOptional<at::Tensor>(), a[1].toOptional<at::Tensor>(),
                                  a[2].toOptional<at::Tensor>(), a[3].toInt(), a[4].toInt());
        torch::jit::drop(*stack, 5);
        torch::jit::push(*stack, std::move(out));
        return;
      }
      case Op::kInitValue: {  // (name, heads, head_dim) -> Tensor
        auto a = torch::jit::last(*stack, 3);
        at::Tensor out = init_value(in, a[0].toStringRef(), a[1].toInt(), a[2].toInt());
        torch::jit::drop(*stack, 3);
        torch::jit::push(*stack, std::move(out));
        return;
      }
      case Op::kManifest:
        torch::jit::push(*stack, std::string(in.entry->manifest_json));
        return;
      case Op::kCpuLevel:  // "none" when APE_CPU_LEVEL names a level that cannot run here
        torch::jit::push(*stack, std::string(in.entry->cpu_level ? in.entry->cpu_level : "none"));
        return;
      case Op::kBackwardStatus: {  // (device?, clear) -> int
        auto a = torch::jit::last(*stack, 2);
        const std::optional<c10::Device> device = a[0].toOptional<c10::Device>();
        const bool clear = a[1].toBool();
        torch::jit::drop(*stack, 2);
        int64_t st = 0;
#ifdef APE_TORCH_OPS_CUDA
        if (!device || device->is_cuda()) st = backward_status_cuda(device ? device->index() : -1, clear);
#else
        (void)device, (void)clear;
#endif
        torch::jit::push(*stack, st);
        return;
      }
      case Op::kCudaKernels: {
        c10::List<std::string> names;
        for (auto &n : cuda_kernel_names(lib_)) names.push_back(std::move(n));
        torch::jit::push(*stack, std::move(names));
        return;
      }
    }
  }

 private:
  const Library &lib_;
  Op op_;
  Where where_;
};

inline torch::CppFunction kernel(const Library &lib, Op op, Where where = Where::kCpu) {
  return torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Kernel>(lib, op, where));
}

// Defined here, not inline: torch/ops.h declares it for NAME_ops.cpp, and this header is included
// by one file per library (ape/torch_ops.cpp).
void register_operators(const Library &lib) {
  // Alive until the process exits, as the objects of TORCH_LIBRARY / TORCH_LIBRARY_IMPL are
  // (those macros build the same torch::Library objects from a namespace known at compile time).
  static std::vector<std::unique_ptr<torch::Library>> libraries;
  const std::string ns = std::string("ape_") + lib.inputs->encoding;
  auto library = [&](torch::Library::Kind kind,
                     std::optional<c10::DispatchKey> key) -> torch::Library & {
    libraries.push_back(std::make_unique<torch::Library>(kind, ns, key, __FILE__, __LINE__));
    return *libraries.back();
  };
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};

  torch::Library &def = library(torch::Library::DEF, std::nullopt);
  def.def(lib.attention_schema, tags);
  def.def(lib.inference_only
              ? "attention_forward(Tensor q, Tensor k, Tensor v, Tensor[] features, Tensor[] params, "
                "float scale, int layer, int num_layers) -> (Tensor o, Tensor lse)"
              : "attention_forward(Tensor q, Tensor k, Tensor v, Tensor[] features, Tensor[] params, "
                "float scale) -> (Tensor o, Tensor lse)",
          tags);
  def.def("attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, "
          "Tensor[] features, Tensor[] params, float scale) -> (Tensor dq, Tensor dk, Tensor dv, "
          "Tensor[] dfeatures, Tensor[] dparams)",
          tags);
  def.def("derived_params(Tensor? w_q=None, Tensor? w_k=None, Tensor? w_v=None, *, int heads, "
          "int head_dim) -> Tensor[]",
          tags);
  def.def("init_value(str name, *, int heads, int head_dim) -> Tensor", tags);
  // No tag for the three that return strings: Dynamo compiles no operator that returns no
  // tensor (call them outside compiled code; their answers are constants of the library).
  def.def("manifest() -> str");
  def.def("cuda_kernels() -> str[]");
  def.def("cpu_level() -> str");
  def.def("backward_status(Device? device=None, bool clear=True) -> int");

  torch::Library &composite = library(torch::Library::IMPL, c10::DispatchKey::CompositeImplicitAutograd);
  composite.impl("derived_params", kernel(lib, Op::kDerivedParams));
  composite.impl("init_value", kernel(lib, Op::kInitValue));
  composite.impl("manifest", kernel(lib, Op::kManifest));
  composite.impl("cuda_kernels", kernel(lib, Op::kCudaKernels));
  composite.impl("cpu_level", kernel(lib, Op::kCpuLevel));
  composite.impl("backward_status", kernel(lib, Op::kBackwardStatus));

  torch::Library &autograd = library(torch::Library::IMPL, c10::DispatchKey::Autograd);
  autograd.impl("attention", kernel(lib, Op::kAttention));
  // The raw pair carries no gradient history: it falls through to its device kernels.
  autograd.impl("attention_forward", torch::CppFunction::makeFallthrough());
  autograd.impl("attention_backward", torch::CppFunction::makeFallthrough());

  library(torch::Library::IMPL, c10::DispatchKey::CompositeExplicitAutograd)
      .impl("attention", kernel(lib, Op::kAttentionNoGrad));

  for (auto [key, where] : {std::pair{c10::DispatchKey::CPU, Where::kCpu},
                            std::pair{c10::DispatchKey::CUDA, Where::kCuda},
                            std::pair{c10::DispatchKey::Meta, Where::kMeta}}) {
    torch::Library &m = library(torch::Library::IMPL, key);
    m.impl("attention_forward", kernel(lib, Op::kForward, where));
    m.impl("attention_backward", kernel(lib, Op::kBackward, where));
  }
}

}  // namespace ape::torch_ops
