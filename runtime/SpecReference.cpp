// The reference interpreter of apec's reference data (see SpecReference.h). Only LibTorch ops;
// nothing here reads the generated kernels, their templates or their gradient regions.
#include "runtime/SpecReference.h"

#include "ape/contract/vocabulary.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>

#include <memory>
#include <optional>

#include <nlohmann/json.hpp>
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <ATen/CPUGeneratorImpl.h>

namespace ape {

at::Tensor round_bf16_stochastic(const at::Tensor &x, at::Generator &gen) {
  // float32's bits, a uniform 16-bit integer added and the low 16 bits dropped: bf16 is float32's
  // upper half, so the magnitude rounds up to the next bf16 value with probability (the dropped
  // bits) / 2^16, its distance from the lower one in that spacing (subnormals too). A value bf16
  // holds (zeros, the causal mask's P, P = 1, infinities) has no low bits: it stays.
  const at::Tensor bits = x.to(at::kFloat).contiguous().view(at::kInt);
  const at::Tensor r = at::randint(0, 1 << 16, bits.sizes(), gen, at::dtype(at::kInt));
  const at::Tensor up = at::bitwise_and(bits + r, static_cast<int64_t>(-65536));  // 0xffff0000
  return up.view(at::kFloat).to(x.scalar_type());
}


namespace abi = ::ape_abi;

using json = nlohmann::json;
using at::Tensor;
namespace I = at::indexing;

struct SpecReferenceData {
  json doc;
  std::string what;
  std::string encoding;
  std::vector<SpecReference::ParamInfo> params;
  std::vector<std::string> features;
};

namespace {

[[noreturn]] void fail(const std::string &what, const std::string &msg) {
  throw std::runtime_error("reference data of " + what + ": " + msg);
}

// A real value of the data: a number or "inf", "-inf", "nan".
double real(const json &v, const std::string &what) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  }
  fail(what, "a constant is neither a number nor \"inf\", \"-inf\", \"nan\": " + v.dump());
}

enum class Kind { Real, Int, Bool };
Kind kind_of(const std::string &type) {
  if (type == "i1") return Kind::Bool;
  if (type == "index" || (type.size() > 1 && type[0] == 'i')) return Kind::Int;
  return Kind::Real;  // f32, f64, f16, bf16: the working precision
}

// Everything a region may read: sizes, params, token slots, relative rows.
struct Env {
  int64_t B = 0, H = 0, T = 0, D = 0;
  at::ScalarType dtype = at::kDouble;
  std::vector<Tensor> params;  // spec order, working dtype
  std::vector<Tensor> tok;     // [B, H, T] per slot
  std::vector<Tensor> rows;    // [B, H, T, rows_n]
  const SpecReferenceData *data = nullptr;
};

int64_t dim_size(const std::string &dim, const Env &env) {  // checked at parse
  return abi::parse_dim(dim).value_or(abi::Dim{}).resolve(env.H, env.D);
}

Tensor scalar(double v, const Env &env) { return at::scalar_tensor(v, at::dtype(env.dtype)); }
Tensor index_scalar(int64_t v) { return at::scalar_tensor(v, at::dtype(at::kLong)); }

// The kernels' integer division and remainder (contract/int_math.h): truncation toward zero, total:
// x / 0 = 0, x % 0 = x, INT64_MIN / -1 wraps (no ZeroDivisionError, no trap).
Tensor div_trunc(const Tensor &a, const Tensor &b) {
  const Tensor zero = b.eq(0), minus_one = b.eq(-1);
  const Tensor q = at::div(a, at::where(zero.logical_or(minus_one), at::ones_like(b), b), "trunc");
  return at::where(zero, at::zeros_like(q), at::where(minus_one, a.neg(), q));
}
Tensor rem_trunc(const Tensor &a, const Tensor &b) { return a - div_trunc(a, b) * b; }
Tensor div_floor(const Tensor &a, const Tensor &b) {
  const Tensor r = rem_trunc(a, b);
  return div_trunc(a, b) - (r.ne(0).logical_and(a.lt(0).ne(b.lt(0)))).to(a.scalar_type());
}

// The unsigned integer ops read their int64 operands as uint64, as the kernels do
// (contract/int_math.h, codegen/RegionWriter.cpp): a negative value is 2^64 plus it. Flipping the
// sign bit maps uint64's order onto int64's.
Tensor unsigned_order(const Tensor &a) { return a.bitwise_xor(INT64_MIN); }
Tensor ult(const Tensor &a, const Tensor &b) { return unsigned_order(a).lt(unsigned_order(b)); }
// uint64 division with int_math::udiv's x / 0 = 0: a divisor of 2^63 or more goes once or not at
// all; a smaller one divides a / 2 (a logical shift: non-negative) and corrects the estimate,
// which is at most one short (Hacker's Delight, 9-3).
Tensor udiv(const Tensor &a, const Tensor &b) {
  const Tensor zero = b.eq(0), big = b.lt(0);
  const Tensor bs = at::where(zero.logical_or(big), at::ones_like(b), b);
  Tensor q = at::div(a.bitwise_right_shift(1).bitwise_and(INT64_MAX), bs, "trunc").mul(2);
  q = q + ult(a - q * bs, bs).logical_not().to(at::kLong);
  const Tensor once = ult(a, b).logical_not().to(at::kLong);
  return at::where(zero, at::zeros_like(q), at::where(big, once, q));
}
Tensor urem(const Tensor &a, const Tensor &b) { return at::where(b.eq(0), a, a - udiv(a, b) * b); }
// uint64 -> float: the two 32-bit halves are exact in double, their sum rounds once.
Tensor unsigned_to_real(const Tensor &a, at::ScalarType dtype) {
  const Tensor hi = a.bitwise_right_shift(32).bitwise_and(0xffffffffLL).to(at::kDouble).mul(4294967296.0);
  const Tensor lo = a.bitwise_and(0xffffffffLL).to(at::kDouble);
  return at::where(a.lt(0), hi + lo, a.to(at::kDouble)).to(dtype);
}

Tensor clamp_index(const Tensor &i, int64_t size) { return i.clamp(0, size - 1); }

// The kernels' float -> int conversion (contract/float_math.h): truncation toward zero saturated
// to int64's range, NaN -> 0.
Tensor to_int(const Tensor &x) {
  const double top = 9223372036854775808.0;  // 2^63
  const Tensor high = x >= top, low = x < -top, nan = at::isnan(x);
  const Tensor safe = at::where(high | low | nan, at::zeros_like(x), x);
  Tensor out = at::trunc(safe).to(at::kLong);
  out = at::where(high, at::full_like(out, INT64_MAX), out);
  return at::where(low, at::full_like(out, INT64_MIN), out);
}

Tensor load(const json &src, const std::vector<Tensor> &idx, const Env &env) {
  const SpecReferenceData &d = *env.data;
  const std::string kind = src.at("kind");
  if (kind == "param") {
    const size_t n = src.at("param");
    if (n >= env.params.size()) fail(d.what, "a load names param " + std::to_string(n));
    const auto &shape = d.params[n].shape;
    if (idx.size() != shape.size())
      fail(d.what, "param '" + d.params[n].name + "' loaded with " + std::to_string(idx.size()) +
                       " indices for " + std::to_string(shape.size()) + " dimensions");
    std::vector<I::TensorIndex> at;
    for (size_t k = 0; k < idx.size(); ++k) at.emplace_back(clamp_index(idx[k], dim_size(shape[k], env)));
    return env.params[n].index(at);
  }
  if (kind == "tokens") {
    const size_t s = src.at("slot");
    if (s >= env.tok.size() || !env.tok[s].defined())
      fail(d.what, "a load reads token slot " + std::to_string(s) + " before it is computed");
    if (idx.size() != 3) fail(d.what, "a token load takes [b, h, t]");
    return env.tok[s].index({clamp_index(idx[0], env.B), clamp_index(idx[1], env.H),
                             clamp_index(idx[2], env.T)});
  }
  if (kind == "rows") {
    const size_t r = src.at("rows");
    if (r >= env.rows.size() || !env.rows[r].defined())
      fail(d.what, "a load reads relative rows " + std::to_string(r) + " that are not computed");
    if (idx.size() != 4) fail(d.what, "a rows load takes [b, h, t, r]");
    const Tensor &R = env.rows[r];
    return R.index({clamp_index(idx[0], env.B), clamp_index(idx[1], env.H),
                    clamp_index(idx[2], env.T), clamp_index(idx[3], R.size(3))});
  }
  fail(d.what, "unknown load source kind '" + kind + "'");
}

Tensor compare_f(const std::string &p, const Tensor &a, const Tensor &b, const SpecReferenceData &d) {
  const Tensor unordered = at::isnan(a) | at::isnan(b);
  if (p == "false") return at::zeros_like(unordered);
  if (p == "true") return at::ones_like(unordered);
  if (p == "oeq") return a.eq(b);
  if (p == "ogt") return a.gt(b);
  if (p == "oge") return a.ge(b);
  if (p == "olt") return a.lt(b);
  if (p == "ole") return a.le(b);
  if (p == "one") return a.ne(b) & unordered.logical_not();
  if (p == "ord") return unordered.logical_not();
  if (p == "ueq") return a.eq(b) | unordered;
  if (p == "ugt") return a.gt(b) | unordered;
  if (p == "uge") return a.ge(b) | unordered;
  if (p == "ult") return a.lt(b) | unordered;
  if (p == "ule") return a.le(b) | unordered;
  if (p == "une") return a.ne(b);
  if (p == "uno") return unordered;
  fail(d.what, "unknown arith.cmpf predicate '" + p + "'");
}

// i1 as MLIR reads it: true is -1 signed (extsi, sitofp, index_cast, the signed comparisons, maxsi,
// minsi) and 1 unsigned; other integers as they are.
Tensor signed_i1(const Tensor &t) { return t.scalar_type() == at::kBool ? -t.to(at::kLong) : t; }
Tensor unsigned_i1(const Tensor &t) { return t.scalar_type() == at::kBool ? t.to(at::kLong) : t; }

Tensor compare_i(const std::string &p, const Tensor &a0, const Tensor &b0, const SpecReferenceData &d) {
  if (p == "eq") return a0.eq(b0);
  if (p == "ne") return a0.ne(b0);
  const Tensor sa = signed_i1(a0), sb = signed_i1(b0);
  if (p == "slt") return sa.lt(sb);
  if (p == "sle") return sa.le(sb);
  if (p == "sgt") return sa.gt(sb);
  if (p == "sge") return sa.ge(sb);
  const Tensor a = unsigned_order(unsigned_i1(a0)), b = unsigned_order(unsigned_i1(b0));
  if (p == "ult") return a.lt(b);
  if (p == "ule") return a.le(b);
  if (p == "ugt") return a.gt(b);
  if (p == "uge") return a.ge(b);
  fail(d.what, "unknown arith.cmpi predicate '" + p + "'");
}

// One op of a region on whole tensors (broadcasting); `x` its operands.
Tensor eval_op(const json &op, const std::vector<Tensor> &x, const Env &env) {
  const SpecReferenceData &d = *env.data;
  const std::string name = op.at("op");
  const Kind kind = kind_of(op.at("type"));
  auto need = [&](size_t n) {
    if (x.size() != n)
      fail(d.what, name + " takes " + std::to_string(n) + " operands, got " + std::to_string(x.size()));
  };
  auto to_kind = [&](const Tensor &t) {
    return kind == Kind::Real ? t.to(env.dtype) : kind == Kind::Int ? t.to(at::kLong) : t.to(at::kBool);
  };
  if (name == "arith.constant" || name == "ape.constant") {
    const json &v = op.at("value");
    if (kind == Kind::Bool) return at::scalar_tensor(v.get<bool>(), at::dtype(at::kBool));
    if (kind == Kind::Int) return index_scalar(v.get<int64_t>());
    return scalar(real(v, d.what), env);
  }
  if (name == "ape.dim") {
    const std::optional<abi::DimWhich> which = abi::parse_dim_which(op.at("which").get<std::string>());
    if (!which) fail(env.data->what, "unknown ape.dim '" + op.at("which").get<std::string>() + "'");
    return index_scalar(*which == abi::DimWhich::Heads     ? env.H
                        : *which == abi::DimWhich::HeadDim ? env.D
                                                           : env.T);
  }
  if (name == "ape.load") return load(op.at("source"), x, env);
  // Binary arithmetic (floats and integers alike where the C++ meaning is the same).
  // On i1, modulo 2: addi and subi are xor, muli is and.
  if (kind == Kind::Bool && (name == "arith.addi" || name == "arith.subi")) return need(2), x[0].logical_xor(x[1]);
  if (kind == Kind::Bool && name == "arith.muli") return need(2), x[0].logical_and(x[1]);
  if (name == "arith.addf" || name == "arith.addi") return need(2), x[0] + x[1];
  if (name == "arith.subf" || name == "arith.subi") return need(2), x[0] - x[1];
  if (name == "arith.mulf" || name == "arith.muli") return need(2), x[0] * x[1];
  if (name == "arith.divf") return need(2), x[0] / x[1];
  if (name == "arith.remf") return need(2), at::fmod(x[0], x[1]);
  if (name == "arith.negf") return need(1), -x[0];
  if (name == "arith.divsi") return need(2), div_trunc(x[0], x[1]);
  if (name == "arith.remsi") return need(2), rem_trunc(x[0], x[1]);
  if (name == "arith.floordivsi") return need(2), div_floor(x[0], x[1]);
  if (name == "arith.ceildivsi") return need(2), -div_floor(-x[0], x[1]);
  if (name == "arith.divui") return need(2), udiv(unsigned_i1(x[0]), unsigned_i1(x[1]));
  if (name == "arith.remui") return need(2), urem(unsigned_i1(x[0]), unsigned_i1(x[1]));
  if (name == "arith.maxsi") return need(2), to_kind(at::maximum(signed_i1(x[0]), signed_i1(x[1])));
  if (name == "arith.minsi") return need(2), to_kind(at::minimum(signed_i1(x[0]), signed_i1(x[1])));
  if (name == "arith.maxui" || name == "arith.minui") {
    need(2);
    const Tensor a = unsigned_i1(x[0]), b = unsigned_i1(x[1]);
    const Tensor a_less = ult(a, b);
    return to_kind(name == "arith.maxui" ? at::where(a_less, b, a) : at::where(a_less, a, b));
  }
  // maximumf / minimumf propagate NaN (at::maximum does); maxnumf / minnumf prefer the number.
  if (name == "arith.maximumf") return need(2), at::maximum(x[0], x[1]);
  if (name == "arith.minimumf") return need(2), at::minimum(x[0], x[1]);
  if (name == "arith.maxnumf") return need(2), at::fmax(x[0], x[1]);
  if (name == "arith.minnumf") return need(2), at::fmin(x[0], x[1]);
  if (name == "arith.andi") return need(2), kind == Kind::Bool ? x[0].logical_and(x[1]) : x[0].bitwise_and(x[1]);
  if (name == "arith.ori") return need(2), kind == Kind::Bool ? x[0].logical_or(x[1]) : x[0].bitwise_or(x[1]);
  if (name == "arith.xori") return need(2), kind == Kind::Bool ? x[0].logical_xor(x[1]) : x[0].bitwise_xor(x[1]);
  if (name == "arith.select") return need(3), at::where(x[0], x[1], x[2]);
  if (name == "arith.cmpf") return need(2), compare_f(op.at("predicate"), x[0], x[1], d);
  if (name == "arith.cmpi") return need(2), compare_i(op.at("predicate"), x[0], x[1], d);
  // Conversions: integers are int64 throughout; fptosi truncates toward zero.
  if (name == "arith.index_cast" || name == "arith.extsi") return need(1), to_kind(signed_i1(x[0]));
  if (name == "arith.index_castui" || name == "arith.extui") return need(1), to_kind(unsigned_i1(x[0]));
  // trunci to i1 keeps the low bit.
  if (name == "arith.trunci")
    return need(1), kind == Kind::Bool ? unsigned_i1(x[0]).bitwise_and(1).ne(0) : to_kind(x[0]);
  if (name == "arith.sitofp") return need(1), signed_i1(x[0]).to(env.dtype);
  if (name == "arith.uitofp") return need(1), unsigned_to_real(unsigned_i1(x[0]), env.dtype);
  if (name == "arith.fptosi" || name == "arith.fptoui") return need(1), to_int(x[0]);
  if (name == "arith.extf" || name == "arith.truncf") return need(1), x[0];
  // math
  if (name == "math.exp") return need(1), at::exp(x[0]);
  if (name == "math.exp2") return need(1), at::exp2(x[0]);
  if (name == "math.expm1") return need(1), at::expm1(x[0]);
  if (name == "math.log") return need(1), at::log(x[0]);
  if (name == "math.log2") return need(1), at::log2(x[0]);
  if (name == "math.log10") return need(1), at::log10(x[0]);
  if (name == "math.log1p") return need(1), at::log1p(x[0]);
  if (name == "math.sqrt") return need(1), at::sqrt(x[0]);
  if (name == "math.rsqrt") return need(1), at::rsqrt(x[0]);
  if (name == "math.sin") return need(1), at::sin(x[0]);
  if (name == "math.cos") return need(1), at::cos(x[0]);
  if (name == "math.tan") return need(1), at::tan(x[0]);
  if (name == "math.tanh") return need(1), at::tanh(x[0]);
  if (name == "math.atan") return need(1), at::atan(x[0]);
  if (name == "math.atan2") return need(2), at::atan2(x[0], x[1]);
  if (name == "math.erf") return need(1), at::erf(x[0]);
  if (name == "math.absf") return need(1), at::abs(x[0]);
  if (name == "math.floor") return need(1), at::floor(x[0]);
  if (name == "math.ceil") return need(1), at::ceil(x[0]);
  if (name == "math.trunc") return need(1), at::trunc(x[0]);
  if (name == "math.roundeven") return need(1), at::round(x[0]);
  // math.round rounds half away from zero (at::round rounds half to even).
  if (name == "math.round") return need(1), at::sign(x[0]) * at::floor(at::abs(x[0]) + 0.5);
  if (name == "math.powf") return need(2), at::pow(x[0], x[1]);
  if (name == "math.copysign") return need(2), at::copysign(x[0], x[1]);
  if (name == "math.fma") return need(3), x[0] * x[1] + x[2];
  fail(d.what, "op '" + name + "' has no reference evaluation");
}

// Reverse mode through one op with the chain rule's 0 * inf = 0: where the gradient reaching the op's
// value is exactly zero, or the op's partial derivative is, so is the gradient it passes on. A value that an arith.select discards
// gets a zero gradient, and its op would otherwise pass on 0 * f'(x), NaN where f' is infinite:
// select(a n > 0, log(a n), 0) at n = 0 gave the param a NaN gradient (0 / 0 in log's backward)
// where the kernel's derivative, taken through the select, is the kept branch's (zero there).
// The op runs on its operands broadcast to its result's shape (the outer graph sums the gradients
// back over the broadcast dims), in a graph of its own that the backward differentiates.
struct ZeroSafeInner {
  Tensor y;                // the op's value, in its own graph
  std::vector<Tensor> x;   // the leaves of that graph: the operands that require grad, broadcast
};
struct ZeroSafe : public torch::autograd::Function<ZeroSafe> {
  static Tensor forward(torch::autograd::AutogradContext *ctx, at::TensorList, const std::shared_ptr<ZeroSafeInner> &in) {
    ctx->saved_data["y"] = in->y;
    ctx->saved_data["x"] = in->x;
    return in->y.detach();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list g) {
    const Tensor y = ctx->saved_data["y"].toTensor();
    const std::vector<Tensor> x = ctx->saved_data["x"].toTensorVector();
    torch::autograd::variable_list out(x.size() + 1);
    if (!g[0].defined()) return out;
    at::AutoGradMode on(true);
    // The op is elementwise on operands of its result's shape: the gradient with respect to each
    // operand is g times the partial derivative, element by element, taken with 0 · inf = 0 on
    // either side (a zero partial: sqrt(a n) at n = 0, where g reaching a n is infinite).
    const auto d = torch::autograd::grad({y}, x, {at::ones_like(y)}, /*retain_graph=*/true,
                                         /*create_graph=*/false, /*allow_unused=*/true);
    const Tensor dead = g[0].eq(0);
    for (size_t i = 0; i < x.size(); ++i)
      if (d[i].defined()) out[i] = (g[0] * d[i]).masked_fill(dead | d[i].eq(0), 0);
    return out;
  }
};

// eval_op, through ZeroSafe where a real operand requires grad (select passes zeros on as they
// are; comparisons, loads and constants have no real gradient).
Tensor eval_op_zero_safe(const json &op, const std::vector<Tensor> &x, const Env &env) {
  const std::string name = op.at("op");
  bool grad = kind_of(op.at("type")) == Kind::Real && name != "arith.select" && name != "ape.load";
  bool any = false;
  for (const Tensor &t : x) any = any || (t.defined() && t.requires_grad() && t.is_floating_point());
  if (!grad || !any) return eval_op(op, x, env);
  std::vector<int64_t> shape;
  for (const Tensor &t : x) shape = at::infer_size(shape, t.sizes());
  auto inner = std::make_shared<ZeroSafeInner>();
  std::vector<Tensor> outer, operands;
  for (const Tensor &t : x) {
    if (t.requires_grad() && t.is_floating_point()) {
      outer.push_back(t.expand(shape));
      inner->x.push_back(outer.back().detach().requires_grad_(true));
      operands.push_back(inner->x.back());
    } else {
      operands.push_back(t);
    }
  }
  {
    at::AutoGradMode on(true);
    inner->y = eval_op(op, operands, env);
  }
  if (!inner->y.requires_grad()) return inner->y;
  return ZeroSafe::apply(at::TensorList(outer), inner);
}

// Evaluates a region {"args", "ops", "yield"} on `args`; returns the yielded values.
std::vector<Tensor> eval_region(const json &region, const std::vector<Tensor> &args, const Env &env) {
  const SpecReferenceData &d = *env.data;
  if (!region.is_object()) fail(d.what, "a region is missing");
  if (region.at("args").get<size_t>() != args.size())
    fail(d.what, "a region takes " + region.at("args").dump() + " arguments, the site gives " +
                     std::to_string(args.size()));
  std::vector<Tensor> values = args;
  for (const json &op : region.at("ops")) {
    std::vector<Tensor> operands;
    for (const json &id : op.at("operands")) {
      const size_t i = id.get<size_t>();
      if (i >= values.size()) fail(d.what, "an operand refers to a later value");
      operands.push_back(values[i]);
    }
    values.push_back(eval_op_zero_safe(op, operands, env));
  }
  std::vector<Tensor> out;
  for (const json &id : region.at("yield")) {
    const size_t i = id.get<size_t>();
    if (i >= values.size()) fail(d.what, "a region yields an undefined value");
    out.push_back(values[i]);
  }
  return out;
}

// The single real value a region yields, broadcast to `shape` in the working dtype.
Tensor yield_real(const json &region, const std::vector<Tensor> &args, const Env &env,
                  at::IntArrayRef shape) {
  auto out = eval_region(region, args, env);
  if (out.size() != 1) fail(env.data->what, "a region must yield one value");
  return out[0].to(env.dtype).expand(shape);
}

// The coordinate paired with c in a q/k mod of `pairing` and `fraction` (the first
// 2 floor(fraction D / 2) coordinates are paired, the rest are their own partner). Written here
// from the spec, not with abi::partner: the reference checks the kernels' pairing.
Tensor partner_index(abi::Pairing pairing, double fraction, int64_t D) {
  const int64_t half = static_cast<int64_t>(std::floor(fraction * static_cast<double>(D) / 2.0));
  const int64_t r = 2 * half;
  std::vector<int64_t> p(static_cast<size_t>(D));
  for (int64_t c = 0; c < D; ++c) {
    if (c >= r || pairing == abi::Pairing::None) p[c] = c;
    else if (pairing == abi::Pairing::Half) p[c] = c < half ? c + half : c - half;
    else p[c] = c ^ 1;
  }
  return at::tensor(p, at::kLong);
}

// Every q_mod (or k_mod) in order on x [B, H, T, D].
Tensor apply_mods(const json &mods, Tensor x, const Env &env) {
  const Tensor c = at::arange(env.D, at::kLong).view({1, 1, 1, env.D});
  const Tensor t = at::arange(env.T, at::kLong).view({1, 1, env.T, 1});
  const Tensor h = at::arange(env.H, at::kLong).view({1, env.H, 1, 1});
  for (const json &m : mods) {
    const std::string pairing = m.at("pairing");
    const std::optional<abi::Pairing> parsed = abi::parse_pairing(pairing);
    if (!parsed) fail(env.data->what, "unknown pairing '" + pairing + "'");
    const Tensor y = x.index_select(3, partner_index(*parsed, m.at("fraction").get<double>(), env.D));
    x = yield_real(m.at("body"), {x, y, c, t, h}, env, x.sizes());
  }
  return x;
}

// The attention transition, written from the spec's text (docs/encodings-math.md, "Attention
// transition (P)"), on the materialised weights P [B, H, T, T] of layer site.layer of
// site.num_layers: I = floor(T / (N + divisor_offset)) - (that mod 5), no-op when I < 5; layers
// first_layer .. N-1-skip_last; layer l holds `intervals` intervals [(l+1+k) I, (l+2+k) I); on
// each query row r of an interval [s, e) (r < T):
//   1. bound = alpha / e
//   2. A[r, c] = 0 where A[r, c] < bound (c < e); then A[r, 0] /= 2
//   3. E_r = 1 - sum_c A[r, c]
//   4. mask_c = 1 where A[r, c] >= bound (after 2) else 0.01 on W = [s - 2I, s);
//      avg_r = beta E_r / sum_W mask
//   5. A[r, s-I .. s) += 7 avg_r mask, A[r, s-2I .. s-I) += 3 avg_r mask; no renormalisation.
// Row by row with whole-tensor ops over (B, H); returns A (P where nothing is transformed).
Tensor apply_transition(const json &t, const Tensor &P, const SpecReference::Site &site,
                        const std::string &what) {
  const int64_t off = t.at("divisor_offset"), first = t.at("first_layer"),
                skip = t.at("skip_last"), count = t.at("intervals");
  const double alpha = real(t.at("alpha"), what), beta = real(t.at("beta"), what);
  const int64_t N = site.num_layers, l = site.layer, T = P.size(3);
  if (N <= 0 || l < first || l > N - 1 - skip || count <= 0 || N + off <= 0) return P;
  const int64_t unit = T / (N + off), width = unit - unit % 5;
  if (width < 5) return P;
  const auto opts = P.options();
  auto c = [&](double x) { return at::scalar_tensor(x, opts); };
  const Tensor keys = at::arange(T, at::kLong);
  std::vector<Tensor> rows = P.unbind(2);  // T rows of [B, H, T]
  for (int64_t k = 0; k < count; ++k) {
    const int64_t s = (l + 1 + k) * width, e = s + width;
    if (s - 2 * width < 0) fail(what, "a transition interval starts before its window (layer 0)");
    const double bound = alpha / double(e);                                        // 1.
    const Tensor in_w = keys.ge(s - 2 * width) & keys.lt(s);
    const Tensor share = at::where(keys.ge(s - width), c(7.0), c(3.0));
    for (int64_t r = s; r < std::min(e, T); ++r) {
      Tensor a = at::where(rows[r].lt(bound) & keys.lt(e), c(0.0), rows[r]);      // 2.
      a = a * at::where(keys.eq(0), c(0.5), c(1.0));
      const Tensor E = 1.0 - a.sum(-1, /*keepdim=*/true);                           // 3.
      const Tensor mask = at::where(in_w, at::where(a.ge(bound), c(1.0), c(0.01)), c(0.0));  // 4.
      const Tensor avg = beta * E / mask.sum(-1, /*keepdim=*/true);
      rows[r] = a + share * avg * mask;                                             // 5.
    }
  }
  return at::stack(rows, 2);
}

}  // namespace

SpecReference SpecReference::parse(const std::string &json_text, const std::string &what) {
  auto d = std::make_shared<SpecReferenceData>();
  d->what = what;
  try {
    d->doc = json::parse(json_text);
  } catch (const json::exception &e) {
    fail(what, std::string("not JSON: ") + e.what());
  }
  try {
    const json &doc = d->doc;
    if (doc.at("format") != "ape-reference/1")
      fail(what, "format " + doc.at("format").dump() + ", expected \"ape-reference/1\"");
    d->encoding = doc.at("encoding");
    for (const json &p : doc.at("params")) {
      ParamInfo info;
      info.name = p.at("name");
      for (const json &s : p.at("shape")) {
        const std::string dim = s;
        const std::optional<abi::Dim> d = abi::parse_dim(dim);
        if (!d || (d->is(abi::Dim::Kind::Fixed) && d->value >= 1000000000))
          fail(what, "param '" + info.name + "' has an unknown dimension '" + dim + "'");
        info.shape.push_back(dim);
      }
      info.trainable = p.at("trainable");
      d->params.push_back(info);
    }
    for (const json &f : doc.at("features")) d->features.push_back(f.at("name"));
    for (const char *key : {"tokens", "rel_rows", "q_mods", "k_mods", "score_mods"})
      if (!doc.at(key).is_array()) fail(what, std::string("\"") + key + "\" is not a list");
  } catch (const json::exception &e) {
    fail(what, std::string("malformed: ") + e.what());
  }
  SpecReference r;
  r.data_ = d;
  return r;
}

const std::string &SpecReference::encoding() const { return data_->encoding; }
const std::vector<SpecReference::ParamInfo> &SpecReference::params() const { return data_->params; }
const std::vector<std::string> &SpecReference::features() const { return data_->features; }
bool SpecReference::has_embedding_table() const {
  return data_->doc.at("embedding").is_object();
}

bool SpecReference::has_transition() const {
  return data_->doc.contains("transition") && data_->doc.at("transition").is_object();
}

SpecReference::Result SpecReference::attention(const Tensor &q_in, const Tensor &k_in,
                                               const Tensor &v_in,
                                               const std::map<std::string, Tensor> &features,
                                               const std::map<std::string, Tensor> &params,
                                               double scale, const Site &site) const {
  const SpecReferenceData &d = *data_;
  const json &doc = d.doc;
  try {
    Env env;
    env.data = &d;
    env.dtype = q_in.scalar_type();
    if (env.dtype != at::kDouble && env.dtype != at::kFloat)
      fail(d.what, "the reference runs in float64 or float32");
    if (q_in.dim() != 4) fail(d.what, "q must be [B, H, T, D]");
    env.B = q_in.size(0), env.H = q_in.size(1), env.T = q_in.size(2), env.D = q_in.size(3);
    const int64_t B = env.B, H = env.H, T = env.T, D = env.D;
    for (const ParamInfo &p : d.params) {
      auto it = params.find(p.name);
      if (it == params.end()) fail(d.what, "no value for param '" + p.name + "'");
      std::vector<int64_t> shape;
      for (const std::string &s : p.shape) shape.push_back(dim_size(s, env));
      if (it->second.numel() != c10::multiply_integers(shape))
        fail(d.what, "param '" + p.name + "' has " + std::to_string(it->second.numel()) +
                         " elements, its shape needs " +
                         std::to_string(c10::multiply_integers(shape)));
      env.params.push_back(it->second.to(env.dtype).reshape(shape));
    }
    std::vector<Tensor> feats;
    for (const std::string &f : d.features) {
      auto it = features.find(f);
      if (it == features.end()) fail(d.what, "no value for feature '" + f + "'");
      feats.push_back(it->second.to(env.dtype).reshape({B, H, T}));
    }

    // Token program.
    for (const json &t : doc.at("tokens")) {
      const std::string op = t.at("op");
      if (op == "feature") {
        env.tok.push_back(feats.at(t.at("feature").get<size_t>()));
      } else {
        const size_t in = t.at("input");
        if (in >= env.tok.size()) fail(d.what, "a token op reads a later slot");
        if (op == "map") env.tok.push_back(yield_real(t.at("body"), {env.tok[in]}, env, {B, H, T}));
        else if (op == "scan") env.tok.push_back(at::cumsum(env.tok[in], 2));
        else fail(d.what, "unknown token op '" + op + "'");
      }
    }

    // q', k' and the relative rows.
    // bf16 to nearest, or stochastically (ReferenceSite::stochastic_seed, round_bf16_stochastic).
    std::optional<at::Generator> gen;
    if (site.round_bf16 && site.stochastic_seed)
      gen = at::make_generator<at::CPUGeneratorImpl>(site.stochastic_seed);
    auto to_bf16 = [gen](const Tensor &x) {
      if (!gen) return x.to(at::kBFloat16).to(x.scalar_type());
      at::Generator g = *gen;
      return round_bf16_stochastic(x, g);
    };
    // (straight through: x + (round(x) - x), the difference constant)
    auto round = [to_bf16](const Tensor &x) { return x + (to_bf16(x.detach()) - x.detach()); };
    // The inputs' gradients as the kernels write them (a copy's hook: not the caller's tensor's);
    // k's and v's not where the caller sums them over groups first (round_kv_grads).
    auto input = [&](const Tensor &x, bool round_grad) {
      Tensor t = x.to(env.dtype);
      if (site.round_bf16 && round_grad && t.requires_grad() && at::GradMode::is_enabled()) {
        t = t.clone();
        t.register_hook([to_bf16](const Tensor &g) { return to_bf16(g); });
      }
      return t;
    };
    Tensor q = apply_mods(doc.at("q_mods"), input(q_in, true), env);
    Tensor k = apply_mods(doc.at("k_mods"), input(k_in, site.round_kv_grads), env);
    if (site.round_bf16) q = round(q), k = round(k);
    const Tensor v = input(v_in, site.round_kv_grads);
    for (const json &r : doc.at("rel_rows")) {
      const std::string side = r.at("side");
      const size_t table = r.at("table");
      if (table >= env.params.size()) fail(d.what, "rel_rows names an unknown table");
      const Tensor tab = env.params[table];
      if (tab.dim() != 3 || tab.size(1) != H || tab.size(2) != D)
        fail(d.what, "a rel_rows table must be [rows, heads, head_dim]");
      Tensor x = side == "q" ? q : k;
      if (!r.at("bias").is_null()) {
        const size_t bias = r.at("bias");
        if (bias >= env.params.size()) fail(d.what, "rel_rows names an unknown bias");
        x = x + env.params[bias].reshape({1, H, 1, D});
      }
      env.rows.push_back(at::einsum("bhtd,rhd->bhtr", {x, tab}));
    }

    // Logits on the causal pairs (i, j <= i), flattened row by row.
    const Tensor ii = at::arange(T, at::kLong).view({T, 1}).expand({T, T});
    const Tensor jj = at::arange(T, at::kLong).view({1, T}).expand({T, T});
    const Tensor causal = jj.le(ii);
    const Tensor pi = ii.masked_select(causal), pj = jj.masked_select(causal);
    const Tensor flat = pi * T + pj;
    const int64_t np = flat.numel();
    const Tensor qk = at::matmul(q, k.transpose(2, 3));
    if (site.round_bf16 && qk.requires_grad())  // dS, as the kernels round it for dQ' and dK'
      qk.register_hook([to_bf16](const Tensor &g) { return to_bf16(g); });
    Tensor s = (scale * qk).reshape({B, H, T * T}).index_select(2, flat);
    const Tensor bb = at::arange(B, at::kLong).view({B, 1, 1});
    const Tensor hh = at::arange(H, at::kLong).view({1, H, 1});
    const Tensor iv = pi.view({1, 1, np}), jv = pj.view({1, 1, np});
    for (const json &m : doc.at("score_mods")) s = yield_real(m, {s, bb, hh, iv, jv}, env, {B, H, np});
    const double neg_inf = -std::numeric_limits<double>::infinity();
    const Tensor logits = at::full({B, H, T * T}, neg_inf, at::dtype(env.dtype))
                              .scatter(2, flat.view({1, 1, np}).expand({B, H, np}), s)
                              .view({B, H, T, T});

    // Softmax; a row without a finite logit has P = 0 (and o = 0).
    Tensor m = std::get<0>(logits.detach().max(3, true));
    m = at::where(at::isfinite(m), m, at::zeros_like(m));
    const Tensor e = at::exp(logits - m);
    const Tensor sum = e.sum(3, true);
    const Tensor P = e / at::where(sum.gt(0), sum, at::ones_like(sum));
    const Tensor lse = (m + at::log(sum)).squeeze(3);
    const Tensor p_pairs = P.reshape({B, H, T * T}).index_select(2, flat);
    if (doc.contains("transition") && doc.at("transition").is_object()) {
      const Tensor A = apply_transition(doc.at("transition"), P, site, d.what);
      return {at::matmul(A, v), lse, s, p_pairs, pi};
    }
    const Tensor Pr = site.round_bf16 ? round(P) : P;
    Tensor o = at::matmul(Pr, v);

    if (doc.at("value_rows").is_object()) {  // o_i += sum_j P_ij table[r(i, j), h, :]
      const json &vr = doc.at("value_rows");
      const size_t table = vr.at("table");
      if (table >= env.params.size()) fail(d.what, "value_rows names an unknown table");
      const Tensor tab = env.params[table];
      if (tab.dim() != 3 || tab.size(1) != H || tab.size(2) != D)
        fail(d.what, "a value_rows table must be [rows, heads, head_dim]");
      auto out = eval_region(vr.at("index"), {bb, hh, iv, jv}, env);
      if (out.size() != 1) fail(d.what, "the value_rows index region must yield one index");
      const Tensor r = clamp_index(out[0].to(at::kLong), tab.size(0)).expand({B, H, np});
      const Tensor rows = tab.index({r, hh.expand({B, H, np})});  // [B, H, np, D]
      o = o.index_add(2, pi, p_pairs.unsqueeze(3) * rows);
    }
    if (site.round_bf16) {
      // o as the kernels write it, and their Delta_i = dO_i . o_i of that o, where autograd's
      // softmax backward forms sum_j P_ij dP_ij = dO_i . (P V + the value rows)_i of the
      // unrounded P (the rounding passes its gradient straight through): the logits' gradient
      // P (dP - Delta) gains P_ij dO_i . (a_i - round(o_i)), a = o + (P - round(P)) V the o that
      // autograd's Delta sees (dO from a hook on the returned o, which the backward reaches first).
      const Tensor exact = o;
      o = round(o);
      if (logits.requires_grad() && o.requires_grad()) {
        auto dout = std::make_shared<Tensor>();
        const Tensor seen = exact + at::matmul(P - Pr, v);
        const Tensor diff = (seen - o.detach()).detach();  // (o rounded)
        const Tensor Pd = P.detach();
        o.register_hook([dout](const Tensor &g) {
          *dout = g;
          return g;
        });
        logits.register_hook([dout, diff, Pd](const Tensor &g) {
          return dout->defined() ? g + Pd * (*dout * diff).sum(3, true) : g;
        });
      }
    }
    return {o, lse, s, p_pairs, pi};
  } catch (const json::exception &e) {
    fail(d.what, std::string("malformed: ") + e.what());
  }
}

Tensor SpecReference::embedding_table(int64_t T, int64_t d) const {
  const SpecReferenceData &data = *data_;
  if (!has_embedding_table()) fail(data.what, "the spec has no fixed position table");
  Env env;
  env.data = &data;
  env.dtype = at::kDouble;
  env.T = T;
  try {
    const Tensor n = at::arange(T, at::kLong).view({T, 1});
    const Tensor c = at::arange(d, at::kLong).view({1, d});
    return yield_real(data.doc.at("embedding").at("table"), {n, c, index_scalar(d)}, env, {T, d})
        .contiguous();
  } catch (const json::exception &e) {
    fail(data.what, std::string("malformed: ") + e.what());
  }
}

std::vector<Tensor> evaluate_reference_region(const std::string &region_json,
                                              const std::vector<Tensor> &args) {
  SpecReferenceData data;
  data.what = "a region";
  Env env;
  env.data = &data;
  env.dtype = at::kDouble;
  try {
    return eval_region(json::parse(region_json), args, env);
  } catch (const json::exception &e) {
    fail(data.what, std::string("malformed: ") + e.what());
  }
}

}  // namespace ape
