// C ABI implementation: argument checks, strided copies and the exception barrier behind every
// generated ape_NAME_* entry point (c/abi.h has the contract; docs/frameworks.md the usage).
//
// apec --emit=c-abi writes ape_NAME_c.cpp, which defines kernel_inputs() (kernel_inputs.h) and
// forwards each extern "C" function to forward() / backward() below with its ape_NAME_args.
// Every call runs inside guarded(): no exception leaves it, each failure becomes a status and a
// message for ape_NAME_last_error().
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ape/c/abi.h"
#include "ape/contract/kernel_inputs.h"
#include "ape/cpu/attention.h"
#include "ape/cpu/dispatch.h"
#include "ape/cpu/kernel_call.h"
#include "ape/cpu/kernel_entry.h"

namespace ape::c_abi {

// A failed check inside a call: its status and message.
struct Failure {
  int status;
  std::string message;
};

// The message of the last failed call on this thread is the calling library's own: the generated
// ape_NAME_c.cpp keeps it (a thread_local in its anonymous namespace) and passes it to each call.
// One variable here, shared by an inline function, was one symbol for every library linked into a
// program statically (hidden visibility separates shared objects only): ape_nope_last_error()
// then read a failed ape_rope_* call's message.

inline const char *error_string(int status) {
  switch (status) {
    case APE_OK: return "ok";
    case APE_ERROR_NULL_POINTER: return "a required pointer is NULL";
    case APE_ERROR_INVALID_SHAPE:
      return "invalid shape (B, H, T >= 0 and D >= 1 required, kv_heads 0 or a divisor of H, and "
             "B*H*T*D, its workspaces' sizes included, within int64)";
    case APE_ERROR_INVALID_VALUE:
      return "invalid value (scale finite, 0 or at least 2^-64 in magnitude, and within the kernel's "
             "float type; a layer in [0, num_layers); a fixed param within its range)";
    case APE_ERROR_OUT_OF_MEMORY: return "out of memory";
    case APE_ERROR_INTERNAL: return "internal error";
    case APE_ERROR_CPU_LEVEL: return "the instruction-set level APE_CPU_LEVEL names cannot run";
    case APE_ERROR_NOT_SUPPORTED: return "not supported (an inference-only encoding has no backward)";
    default: return "unknown status";
  }
}

// Runs fn; returns APE_OK or the status of what it threw. Never throws.
template <class Fn> int guarded(std::string &last_error, const char *function, Fn &&fn) noexcept {
  auto fail = [&](int status, const char *what) noexcept {
    try {
      last_error = std::string(function) + ": " + what;
    } catch (...) {  // no memory even for the message: the status still says it
    }
    return status;
  };
  try {
    fn();
    return APE_OK;
  } catch (const Failure &f) {
    return fail(f.status, f.message.c_str());
  } catch (const std::bad_alloc &) {
    return fail(APE_ERROR_OUT_OF_MEMORY, "out of memory");
  } catch (const CpuLevelError &e) {
    return fail(APE_ERROR_CPU_LEVEL, e.what());
  } catch (const entry_detail::InferenceOnlyError &e) {
    return fail(APE_ERROR_NOT_SUPPORTED, e.what());
  } catch (const std::exception &e) {
    return fail(APE_ERROR_INTERNAL, e.what());
  } catch (...) {
    return fail(APE_ERROR_INTERNAL, "unknown exception");
  }
}

// ape_NAME_init_param: param n's initial value for H heads of dimension D into out (its
// ape_NAME_param_numel doubles), as the runtime makes it (ape::initial_values); a random (normal)
// or derived param is APE_ERROR_NOT_SUPPORTED, its last_error saying what to do instead.
inline int init_param(const KernelInputs &in, std::string &last_error, const char *function, int n, int64_t H,
                      int64_t D, double *out) noexcept {
  return guarded(last_error, function, [&] {
    if (n < 0 || n >= in.num_params)
      throw Failure{APE_ERROR_INVALID_VALUE, "no param " + std::to_string(n) + " (the encoding has " +
                                                 std::to_string(in.num_params) + ")"};
    if (H < 1 || D < 1)
      throw Failure{APE_ERROR_INVALID_SHAPE, "H and D must be >= 1, got H=" + std::to_string(H) +
                                                 " D=" + std::to_string(D)};
    if (!out) throw Failure{APE_ERROR_NULL_POINTER, "out is NULL"};
    const ParamInput &p = in.params[n];
    if (p.init == ape_abi::InitKind::Normal) {
      char std_text[32];
      std::snprintf(std_text, sizeof std_text, "%g", p.init_arg);
      throw Failure{APE_ERROR_NOT_SUPPORTED, std::string("param '") + p.name +
                                                 "' is drawn at random, N(0, " + std_text +
                                                 "^2) per element: the caller draws it"};
    }
    if (p.is_derived())
      throw Failure{APE_ERROR_NOT_SUPPORTED, std::string("param '") + p.name +
                                                 "' is computed from a projection weight at every call (ape_" +
                                                 in.encoding + "_manifest() says how), not initialised"};
    const std::optional<std::vector<double>> v = initial_values(p, H, D);
    if (!v) throw Failure{APE_ERROR_INVALID_SHAPE, std::string("param '") + p.name + "' has no value at this H and D"};
    std::copy(v->begin(), v->end(), out);
  });
}

// Sizes of one call and the element counts derived from them.
struct Shape {
  int64_t B, H, T, D;
  int64_t qkv, rows;  // B*H*T*D and B*H*T
  int64_t KV;         // heads of k, v, dk and dv: H, or a divisor of it (ape_NAME_args::kv_heads)
};

// The shape of k, v, dk and dv: s with KV heads.
inline Shape kv_shape(const Shape &s) {
  Shape r = s;
  r.H = s.KV;
  r.rows = s.B * s.KV * s.T, r.qkv = r.rows * s.D;
  return r;
}

// a * b for sizes a, b >= 0; a shape whose element count overflows int64 is an error.
inline int64_t mul(int64_t a, int64_t b) {
  if (a != 0 && b > std::numeric_limits<int64_t>::max() / a)
    throw Failure{APE_ERROR_INVALID_SHAPE, "B*H*T*D overflows int64 (in elements or in the kernels' bytes)"};
  return a * b;
}

template <class Args> Shape check_shape(const Args *a) {
  if (!a) throw Failure{APE_ERROR_NULL_POINTER, "args is NULL"};
  if (a->B < 0 || a->H < 0 || a->T < 0 || a->D < 1)
    throw Failure{APE_ERROR_INVALID_SHAPE,
                  "B, H, T must be >= 0 and D >= 1, got B=" + std::to_string(a->B) +
                      " H=" + std::to_string(a->H) + " T=" + std::to_string(a->T) +
                      " D=" + std::to_string(a->D)};
  if (std::string why = ape_rules::check_kv_heads(a->kv_heads, a->H); !why.empty())
    throw Failure{APE_ERROR_INVALID_SHAPE, why};
  Shape s{a->B, a->H, a->T, a->D, 0, 0, a->kv_heads > 0 ? a->kv_heads : a->H};
  s.rows = mul(mul(s.B, s.H), s.T);
  s.qkv = mul(s.rows, s.D);
  // The kernels' byte counts and workspaces (a slice padded to whole tiles) stay in int64 too.
  constexpr int64_t kHalf = std::numeric_limits<int64_t>::max() / 2;
  if (s.T > kHalf || s.D > kHalf) throw Failure{APE_ERROR_INVALID_SHAPE, "T or D is too large"};
  mul(mul(mul(s.B, s.H), s.T + 64), mul(s.D + 64, 8));
  if (std::string why = ::ape_rules::check_call_scale(a->scale); !why.empty())
    throw Failure{APE_ERROR_INVALID_VALUE, why};
  return s;
}

// A double as %.9g writes it (std::to_string writes 1e300 with 301 digits).
inline std::string shown(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

// The scale in the kernel's type: a finite double beyond its range (1e39 for float) would be inf.
template <typename Real> void check_scale_range(double scale) {
  if (std::fabs(scale) > static_cast<double>(std::numeric_limits<Real>::max()))
    throw Failure{APE_ERROR_INVALID_VALUE,
                  "scale " + shown(scale) + " is beyond the range of the kernel's " +
                      (sizeof(Real) == 4 ? "float" : "double")};
}

// ---- strided views ------------------------------------------------------------------------------
// A [B, H, T, D] (rank 4) or [B, H, T] (rank 3) argument and its contiguous stand-in.
template <typename Real> struct View {
  const ape_tensor *t;
  int64_t sizes[4];
  int rank;
  Real *direct = nullptr;  // the caller's data, when the view is contiguous
  std::vector<Real> copy;  // a contiguous stand-in, when it is strided

  Real *ptr() { return direct ? direct : copy.data(); }

  bool contiguous() const {
    if (!t->strides) return true;
    int64_t expect = 1;
    for (int d = rank - 1; d >= 0; --d) {
      if (sizes[d] != 1 && t->strides[d] != expect) return false;
      expect *= sizes[d];
    }
    return true;
  }

  // Visits every element in row-major order: f(pointer into the strided data, flat index).
  template <class F> void each(F &&f) const {
    Real *base = static_cast<Real *>(t->data);
    int64_t idx[4] = {0, 0, 0, 0};
    const int64_t total = [&] {
      int64_t n = 1;
      for (int d = 0; d < rank; ++d) n *= sizes[d];
      return n;
    }();
    for (int64_t flat = 0; flat < total; ++flat) {
      int64_t off = 0;
      for (int d = 0; d < rank; ++d) off += idx[d] * t->strides[d];
      f(base + off, flat);
      for (int d = rank - 1; d >= 0; --d) {
        if (++idx[d] < sizes[d]) break;
        idx[d] = 0;
      }
    }
  }
};

template <typename Real>
View<Real> view(const ape_tensor &t, const Shape &s, int rank, const std::string &what) {
  View<Real> v{&t, {s.B, s.H, s.T, s.D}, rank, nullptr, {}};
  const int64_t n = rank == 4 ? s.qkv : s.rows;
  if (!t.data && n > 0) throw Failure{APE_ERROR_NULL_POINTER, what + ".data is NULL"};
  return v;
}

// An input: the data itself when contiguous, else a contiguous copy.
template <typename Real>
View<Real> input(const ape_tensor &t, const Shape &s, int rank, const std::string &what) {
  View<Real> v = view<Real>(t, s, rank, what);
  if (v.contiguous()) {
    v.direct = static_cast<Real *>(t.data);
  } else {
    v.copy.resize(static_cast<std::size_t>(rank == 4 ? s.qkv : s.rows));
    v.each([&](Real *p, int64_t i) { v.copy[i] = *p; });
  }
  return v;
}

// An output: written in place when contiguous, else into a buffer that finish() scatters.
template <typename Real>
View<Real> output(const ape_tensor &t, const Shape &s, int rank, const std::string &what) {
  View<Real> v = view<Real>(t, s, rank, what);
  if (v.contiguous())
    v.direct = static_cast<Real *>(t.data);
  else
    v.copy.resize(static_cast<std::size_t>(rank == 4 ? s.qkv : s.rows));
  return v;
}

// Scatters a strided output's buffer into the caller's view.
template <typename Real> void finish(View<Real> &v) {
  if (!v.direct && !v.copy.empty()) v.each([&](Real *p, int64_t i) { *p = v.copy[i]; });
}

// ---- features and params ------------------------------------------------------------------------
template <typename Real>
std::vector<View<Real>> features(const KernelInputs &in, const Shape &s, const ape_tensor *arr,
                                 bool is_output, const char *field) {
  std::vector<View<Real>> out;
  if (in.num_features == 0) return out;
  if (!arr)
    throw Failure{APE_ERROR_NULL_POINTER, std::string(field) + " is NULL but the encoding has " +
                                              std::to_string(in.num_features) + " feature(s)"};
  for (int n = 0; n < in.num_features; ++n) {
    const std::string what =
        std::string(field) + "[" + std::to_string(n) + "] ('" + in.feature_names[n] + "')";
    out.push_back(is_output ? output<Real>(arr[n], s, 3, what) : input<Real>(arr[n], s, 3, what));
  }
  return out;
}

template <typename P>
std::vector<P> params(const KernelInputs &in, const Shape &s, const P *arr, const char *field) {
  std::vector<P> out;
  if (in.num_params == 0) return out;
  if (!arr)
    throw Failure{APE_ERROR_NULL_POINTER, std::string(field) + " is NULL but the encoding has " +
                                              std::to_string(in.num_params) + " param(s)"};
  for (int n = 0; n < in.num_params; ++n) {
    const int64_t numel = param_numel(in.params[n], s.H, s.D);
    if (numel < 0)
      throw Failure{APE_ERROR_INVALID_SHAPE, std::string(field) + "[" + std::to_string(n) + "] ('" +
                                                 in.params[n].name + "') would have more elements than int64 holds"};
    if (!arr[n] && numel > 0)
      throw Failure{APE_ERROR_NULL_POINTER, std::string(field) + "[" + std::to_string(n) +
                                                "] ('" + in.params[n].name + "') is NULL"};
    out.push_back(arr[n]);
  }
  return out;
}

// The fixed params' values against their ranges (param_range_problem): a rope_factor of 0 made
// every output NaN.
template <typename Real>
void check_param_values(const KernelInputs &in, const Shape &s, const std::vector<const void *> &p) {
  for (int n = 0; n < in.num_params; ++n) {
    const std::string why =
        param_range_problem(in.params[n], static_cast<const Real *>(p[n]), param_numel(in.params[n], s.H, s.D));
    if (!why.empty()) throw Failure{APE_ERROR_INVALID_VALUE, "params[" + std::to_string(n) + "]: " + why};
  }
}

inline void require(const void *p, int64_t n, const char *what) {
  if (!p && n > 0) throw Failure{APE_ERROR_NULL_POINTER, std::string(what) + " is NULL"};
}

// ---- an inference-only encoding's layer ---------------------------------------------------------
// The args of an inference-only encoding (an attention transition) also hold the layer the call
// computes, 0-based, of a model of num_layers layers (ape_NAME.h); the others have no such fields.
template <class Args, class = void> struct HasLayer : std::false_type {};
template <class Args>
struct HasLayer<Args, std::void_t<decltype(std::declval<const Args &>().num_layers)>> : std::true_type {};

// (layer, num_layers) of a call: checked where the args hold them, (0, 0) elsewhere.
template <class Args> std::pair<int64_t, int64_t> layer_of(const Args *a) {
  if constexpr (HasLayer<Args>::value) {
    const int64_t l = a->layer, n = a->num_layers;
    if (n < 0 || n > 100000 || (n == 0 ? l != 0 : (l < 0 || l >= n)))
      throw Failure{APE_ERROR_INVALID_VALUE, "layer must be in [0, num_layers) with num_layers in [0, 100000] "
                                             "(layer 0 when num_layers is 0), got layer=" +
                                                 std::to_string(l) + " num_layers=" + std::to_string(n)};
    return {l, n};
  } else {
    return {0, 0};
  }
}

// ---- the entry points ---------------------------------------------------------------------------
template <typename Real, class Args>
int forward(const KernelInputs &in, std::string &last_error, const char *function, const Args *a) noexcept {
  return guarded(last_error, function, [&] {
    const Shape s = check_shape(a);
    check_scale_range<Real>(a->scale);
    const auto [layer, num_layers] = layer_of(a);
    const Shape kvs = kv_shape(s);
    View<Real> q = input<Real>(a->q, s, 4, "q"), k = input<Real>(a->k, kvs, 4, "k"),
               v = input<Real>(a->v, kvs, 4, "v");
    std::vector<View<Real>> f = features<Real>(in, s, a->features, false, "features");
    std::vector<const void *> p = params(in, s, a->params, "params");
    check_param_values<Real>(in, s, p);
    View<Real> o = output<Real>(a->o, s, 4, "o");
    require(a->lse, s.rows, "lse");

    std::vector<const Real *> fp, pp;
    for (auto &x : f) fp.push_back(x.ptr());
    for (const void *x : p) pp.push_back(static_cast<const Real *>(x));
    entry_forward<Real>(*in.entry)(forward_args<Real>({s.B, s.H, s.T, s.D, s.KV}, a->scale, q.ptr(),
                                                      k.ptr(), v.ptr(), fp.data(), pp.data(),
                                                      o.ptr(), static_cast<Real *>(a->lse), layer,
                                                      num_layers));
    finish(o);
  });
}

template <typename Real, class Args>
int backward(const KernelInputs &in, std::string &last_error, const char *function, const Args *a) noexcept {
  return guarded(last_error, function, [&] {
    if constexpr (HasLayer<Args>::value)
      throw Failure{APE_ERROR_NOT_SUPPORTED,
                    "the encoding is inference-only (an ape.attention_transition has no derivative): "
                    "train with the encoding without the transition"};
    const Shape s = check_shape(a);
    check_scale_range<Real>(a->scale);
    const Shape kvs = kv_shape(s);
    View<Real> q = input<Real>(a->q, s, 4, "q"), k = input<Real>(a->k, kvs, 4, "k"),
               v = input<Real>(a->v, kvs, 4, "v"), o = input<Real>(a->o, s, 4, "o"),
               dout = input<Real>(a->dout, s, 4, "dout");
    require(a->lse, s.rows, "lse");
    std::vector<View<Real>> f = features<Real>(in, s, a->features, false, "features");
    std::vector<const void *> p = params(in, s, a->params, "params");
    check_param_values<Real>(in, s, p);
    View<Real> dq = output<Real>(a->dq, s, 4, "dq"), dk = output<Real>(a->dk, kvs, 4, "dk"),
               dv = output<Real>(a->dv, kvs, 4, "dv");
    std::vector<View<Real>> df = features<Real>(in, s, a->dfeatures, true, "dfeatures");
    std::vector<void *> dp = params(in, s, a->dparams, "dparams");

    std::vector<const Real *> fp, pp;
    std::vector<Real *> dfp, dpp;
    for (auto &x : f) fp.push_back(x.ptr());
    for (const void *x : p) pp.push_back(static_cast<const Real *>(x));
    for (auto &x : df) dfp.push_back(x.ptr());
    for (void *x : dp) dpp.push_back(static_cast<Real *>(x));
    entry_backward<Real>(*in.entry)(backward_args(
        forward_args<Real>({s.B, s.H, s.T, s.D, s.KV}, a->scale, q.ptr(), k.ptr(), v.ptr(), fp.data(),
                           pp.data(), o.ptr(), static_cast<Real *>(a->lse)),
        dout.ptr(), dq.ptr(), dk.ptr(), dv.ptr(), dfp.data(), dpp.data()));
    finish(dq), finish(dk), finish(dv);
    for (auto &x : df) finish(x);
  });
}

}  // namespace ape::c_abi
