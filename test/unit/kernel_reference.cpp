// fp64 materialised reference of the encodings (see kernel_reference.h). Only LibTorch ops;
// nothing here reads the generated kernels or their code.
#include "kernel_reference.h"
#include "reference_lse.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

namespace ape_test {
namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);
constexpr double kPi = 3.14159265358979323846;

torch::Tensor as_f64(const torch::Tensor &t) {
  return t.detach().to(torch::kFloat64).contiguous().clone();
}

const torch::Tensor &param(const std::map<std::string, torch::Tensor> &params,
                           const std::string &name) {
  auto it = params.find(name);
  if (it == params.end()) throw std::invalid_argument("reference: missing param " + name);
  return it->second;
}

// The value of a fixed scalar param (shape [1]).
double fixed_value(const std::map<std::string, torch::Tensor> &params, const std::string &name) {
  const auto &t = param(params, name);
  if (t.numel() != 1) throw std::invalid_argument("reference: param " + name + " is not a scalar");
  return t.detach().to(torch::kFloat64).flatten()[0].item<double>();
}

// i - j as fp64 [T, T].
torch::Tensor distance(int64_t T) {
  auto n = torch::arange(T, kF64);
  return n.unsqueeze(1) - n.unsqueeze(0);
}

// B_ij = S_i - S_j for a per-token sequence S [B, H, T].
torch::Tensor difference_bias(const torch::Tensor &S) { return S.unsqueeze(-1) - S.unsqueeze(-2); }

// sigma of the ExPE / ExQPE terms, as a 0-d tensor (differentiable if the param were trainable).
torch::Tensor position_scale(const std::map<std::string, torch::Tensor> &params) {
  return param(params, "position_scale").reshape({});
}

// How an encoding rotates q and k: the frequencies theta' for head dim D at length T, the
// pairing, and a factor on the whole q', k' (YaRN's mscale).
struct Rotary {
  Pairing pairing = Pairing::Half;
  torch::Tensor theta;  // [d_r/2]
  double mscale = 1.0;
};

bool is_rotary(const std::string &e) {
  return e == "rope" || e == "rope_interleaved" || e == "rope_partial" || e == "rope_pi" ||
         e == "rope_ntk" || e == "rope_dynamic_ntk" || e == "rope_yarn" || e == "rope_llama3" ||
         e == "rope_alibi" || e == "xpos" || e == "expe_rope_cable" || e == "rope_t5";
}

Rotary rotary_of(const std::string &e, const std::map<std::string, torch::Tensor> &params,
                 int64_t D, int64_t T) {
  Rotary r;
  const double base = 10000.0;
  if (e == "rope_interleaved" || e == "xpos") {
    r.pairing = Pairing::Interleaved;
    r.theta = rope_theta(rotary_dims(D, 1.0), base);
  } else if (e == "rope_partial") {
    r.theta = rope_theta(rotary_dims(D, 0.5), base);
  } else if (e == "rope_pi") {
    r.theta = rope_theta_pi(rotary_dims(D, 1.0), base, fixed_value(params, "rope_factor"));
  } else if (e == "rope_ntk") {
    const int64_t d_r = rotary_dims(D, 1.0);
    r.theta = rope_theta(d_r, ntk_base(base, fixed_value(params, "rope_factor"), d_r));
  } else if (e == "rope_dynamic_ntk") {
    const int64_t d_r = rotary_dims(D, 1.0);
    r.theta = rope_theta(d_r, dynamic_ntk_base(base, fixed_value(params, "rope_factor"),
                                               fixed_value(params, "rope_original_length"), T,
                                               d_r));
  } else if (e == "rope_yarn") {
    const double s = fixed_value(params, "rope_factor");
    r.theta = rope_theta_yarn(rotary_dims(D, 1.0), base, s,
                              fixed_value(params, "rope_original_length"));
    r.mscale = yarn_mscale(s);
  } else if (e == "rope_llama3") {
    r.theta = rope_theta_llama3(rotary_dims(D, 1.0), 500000.0, fixed_value(params, "rope_factor"),
                                fixed_value(params, "rope_original_length"));
  } else {  // rope, rope_alibi, expe_rope_cable, rope_t5
    r.theta = rope_theta(rotary_dims(D, 1.0), base);
  }
  return r;
}

}  // namespace

const std::vector<std::string> &reference_encodings() {
  static const std::vector<std::string> names = {
      "alibi",       "cable",         "expe",          "expe_cable",      "expe_qkv",
      "expe_rope_cable", "exqpe",     "forget_gate",   "learned_absolute", "nope",
      "rope",        "rope_alibi",    "rope_dynamic_ntk", "rope_interleaved", "rope_llama3",
      "rope_ntk",    "rope_partial",  "rope_pi",       "rope_yarn",       "sinusoidal",
      "xpos",        "t5",            "rope_t5",       "kerple_log",      "kerple_power",
      "fire",        "kcable",        "alibi_learned", "shaw",            "deberta",
      "transformer_xl"};
  return names;
}

// ---- RoPE -----------------------------------------------------------------------------------------

int64_t rotary_dims(int64_t D, double fraction) {
  return 2 * static_cast<int64_t>(std::floor(fraction * static_cast<double>(D) / 2.0));
}

torch::Tensor rope_theta(int64_t d_r, double base) {
  auto k = torch::arange(d_r / 2, kF64);
  return torch::pow(torch::full({}, base, kF64), -2.0 * k / static_cast<double>(d_r));
}

torch::Tensor rope_theta_pi(int64_t d_r, double base, double s) {
  return rope_theta(d_r, base) / s;
}

double ntk_base(double base, double s, int64_t d_r) {
  const double dr = static_cast<double>(d_r);
  return base * std::pow(s, dr / (dr - 2.0));
}

double dynamic_ntk_base(double base, double s, double L, int64_t T, int64_t d_r) {
  const double dr = static_cast<double>(d_r);
  const double l = std::max(static_cast<double>(T), L);
  return base * std::pow(s * l / L - (s - 1.0), dr / (dr - 2.0));
}

torch::Tensor rope_theta_yarn(int64_t d_r, double base, double s, double L, double beta_fast,
                              double beta_slow) {
  const double dr = static_cast<double>(d_r);
  auto dim_idx = [&](double R) { return dr * std::log(L / (2.0 * kPi * R)) / (2.0 * std::log(base)); };
  const double low = std::max(std::floor(dim_idx(beta_fast)), 0.0);
  double high = std::min(std::ceil(dim_idx(beta_slow)), dr - 1.0);
  if (low == high) high += 0.001;
  auto theta = rope_theta(d_r, base);
  auto k = torch::arange(d_r / 2, kF64);
  auto ramp = ((k - low) / (high - low)).clamp(0.0, 1.0);
  return theta / s * ramp + theta * (1.0 - ramp);
}

double yarn_mscale(double s) { return s <= 1.0 ? 1.0 : 0.1 * std::log(s) + 1.0; }

torch::Tensor rope_theta_llama3(int64_t d_r, double base, double s, double L,
                                double low_freq_factor, double high_freq_factor) {
  auto theta = rope_theta(d_r, base);
  auto lambda = 2.0 * kPi / theta;
  auto g = (L / lambda - low_freq_factor) / (high_freq_factor - low_freq_factor);
  auto blended = (1.0 - g) * theta / s + g * theta;
  return torch::where(lambda < L / high_freq_factor, theta,
                      torch::where(lambda > L / low_freq_factor, theta / s, blended));
}

torch::Tensor rope_rotate(const torch::Tensor &x, const torch::Tensor &theta, Pairing pairing) {
  const int64_t T = x.size(-2), D = x.size(-1), n = theta.size(0);
  if (2 * n > D) throw std::invalid_argument("rope_rotate: more pairs than coordinates");
  auto angle = torch::arange(T, kF64).unsqueeze(1) * theta.to(torch::kFloat64).unsqueeze(0);
  auto c = torch::cos(angle), s = torch::sin(angle);  // [T, n]
  auto rest = x.narrow(-1, 2 * n, D - 2 * n);
  if (pairing == Pairing::Half) {
    auto x1 = x.narrow(-1, 0, n), x2 = x.narrow(-1, n, n);
    return torch::cat({x1 * c - x2 * s, x2 * c + x1 * s, rest}, -1);
  }
  std::vector<int64_t> pairs_shape(x.sizes().begin(), x.sizes().end() - 1);
  pairs_shape.push_back(n);
  pairs_shape.push_back(2);
  auto xp = x.narrow(-1, 0, 2 * n).reshape(pairs_shape);
  auto even = xp.select(-1, 0), odd = xp.select(-1, 1);
  auto rotated = torch::stack({even * c - odd * s, odd * c + even * s}, -1);
  std::vector<int64_t> flat_shape(x.sizes().begin(), x.sizes().end() - 1);
  flat_shape.push_back(2 * n);
  return torch::cat({rotated.reshape(flat_shape), rest}, -1);
}

torch::Tensor rope_rotate_half(const torch::Tensor &x, double base) {
  const int64_t D = x.size(-1);
  if (D % 2 != 0) throw std::invalid_argument("rope_rotate_half: odd D");
  return rope_rotate(x, rope_theta(D, base), Pairing::Half);
}

// ---- xPos, sinusoidal, ExPE / ExQPE -----------------------------------------------------------------

torch::Tensor xpos_zeta(int64_t D, double gamma) {
  auto k = torch::arange(D / 2, kF64);
  return (k / (static_cast<double>(D) / 2.0) + gamma) / (1.0 + gamma);
}

torch::Tensor xpos_factors(int64_t T, int64_t D, double sign, double gamma, double scale_base) {
  auto zeta = xpos_zeta(D, gamma).repeat_interleave(2);            // [D] (pair c/2)
  if (zeta.size(0) < D)  // odd D: the last coordinate has no partner, neither rotated nor decayed
    zeta = torch::cat({zeta, torch::ones({D - zeta.size(0)}, kF64)});
  auto tc = torch::arange(T, kF64) - static_cast<double>(T / 2);   // t - floor(T/2)
  auto expo = sign * tc.unsqueeze(1) / scale_base;                 // [T, 1]
  return torch::exp(expo * torch::log(zeta).unsqueeze(0));         // [T, D]
}

torch::Tensor sinusoidal_table(int64_t T, int64_t d, double base) {
  auto c = torch::arange(d, kF64);
  auto two_k = 2.0 * torch::floor(c / 2.0);
  auto freq = torch::pow(torch::full({}, base, kF64), -two_k / static_cast<double>(d));  // [d]
  auto angle = torch::arange(T, kF64).unsqueeze(1) * freq.unsqueeze(0);                 // [T, d]
  auto even = torch::remainder(c, 2.0).eq(0).unsqueeze(0);
  return torch::where(even, torch::sin(angle), torch::cos(angle));
}

torch::Tensor expe_shift(const torch::Tensor &x, const torch::Tensor &a, const torch::Tensor &b,
                         const torch::Tensor &sigma) {
  const int64_t H = x.size(1), T = x.size(2), D = x.size(3);
  auto n = torch::arange(T, kF64).view({1, 1, T, 1});
  auto term = a.view({1, H, 1, D}) + n * b.view({1, H, 1, D});
  return x + sigma.reshape({}) * term;
}

torch::Tensor exqpe_shift(const torch::Tensor &x, const torch::Tensor &a, const torch::Tensor &b,
                          const torch::Tensor &P, const torch::Tensor &sigma) {
  const int64_t H = x.size(1), T = x.size(2), D = x.size(3), l = P.size(0);
  if (P.dim() != 3 || P.size(1) != H || P.size(2) != D)
    throw std::invalid_argument("exqpe_shift: P must be [l, H, D]");
  auto n = torch::arange(T, torch::TensorOptions().dtype(torch::kLong));
  auto block = torch::div(n, l, "floor").to(torch::kFloat64).view({1, 1, T, 1});
  auto residue_rows = P.index_select(0, torch::remainder(n, l)).permute({1, 0, 2});  // [H, T, D]
  auto term = a.view({1, H, 1, D}) + block * b.view({1, H, 1, D}) + residue_rows.unsqueeze(0);
  return x + sigma.reshape({}) * term;
}

// ---- the kernel tests' param values -----------------------------------------------------------------

std::optional<double> bias_param_std(const std::string &name) {
  static const std::map<std::string, double> stds = {
      {"t5_table", 1.0},   {"fire_w1", 1.0},     {"fire_b1", 0.5},     {"fire_w2", 0.5},
      {"fire_b2", 0.5},    {"shaw_key", 0.5},    {"shaw_value", 0.5},  {"deberta_c2p", 0.5},
      {"deberta_p2c", 0.5}, {"xl_rel", 0.5},     {"xl_v", 0.5},        {"xl_u", 0.5}};
  auto it = stds.find(name);
  return it == stds.end() ? std::nullopt : std::optional<double>(it->second);
}

torch::Tensor test_param_values(const std::string &name, const std::string &init,
                                std::optional<double> init_value, bool trainable,
                                c10::IntArrayRef shape, int64_t H, int64_t T) {
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  if (init == "alibi_slopes") return alibi_slopes(H).reshape(shape);
  if (!trainable && init == "constant") {
    if (!init_value) throw std::invalid_argument("param " + name + ": constant without value");
    return torch::full(shape, *init_value, f64);
  }
  if (!trainable && (init == "zeros" || init == "ones")) return torch::full(shape, init == "ones" ? 1.0 : 0.0, f64);
  if (trainable && init == "constant") {
    if (!init_value) throw std::invalid_argument("param " + name + ": constant without value");
    const double centre = name == "fire_l_mult" ? 0.1 : *init_value;
    return centre * (1.0 + 0.1 * torch::randn(shape, f64)).abs();
  }
  if (const auto std = bias_param_std(name)) return torch::randn(shape, f64) * *std;
  const bool per_position = name.size() > 2 && name.compare(name.size() - 2, 2, "_b") == 0;
  const double sigma = 0.02 * (per_position ? std::min(1.0, 32.0 / static_cast<double>(T)) : 1.0);
  return torch::randn(shape, f64) * sigma;
}

// ---- ALiBi and the score biases -------------------------------------------------------------------

torch::Tensor alibi_slopes(int64_t H) {
  auto pow2 = [](int64_t n) {
    std::vector<double> s;
    for (int64_t h = 0; h < n; ++h) s.push_back(std::pow(2.0, -8.0 * (h + 1) / n));
    return s;
  };
  int64_t c = 1;
  while (c * 2 <= H) c *= 2;
  std::vector<double> s = pow2(c);
  if (c != H) {
    std::vector<double> s2 = pow2(2 * c);
    for (int64_t e = 0; e < H - c; ++e) s.push_back(s2[2 * e]);
  }
  return torch::tensor(s, kF64);
}

namespace {

// max(i - j, 0) as int64 [T, T].
torch::Tensor causal_distance(int64_t T) {
  auto n = torch::arange(T, torch::TensorOptions().dtype(torch::kLong));
  return (n.unsqueeze(1) - n.unsqueeze(0)).clamp_min(0);
}

// T5's bucket of every max(i - j, 0), int64 [T, T].
torch::Tensor t5_buckets(int64_t T) {
  std::vector<int64_t> by_distance(T);
  for (int64_t n = 0; n < T; ++n) by_distance[n] = t5_bucket(n);
  return torch::tensor(by_distance, torch::TensorOptions().dtype(torch::kLong))
      .index_select(0, causal_distance(T).flatten())
      .view({T, T});
}

// rows[b, h, i, idx[i, j]] -> [B, H, T, T] for per-query rows [B, H, T, R].
torch::Tensor gather_rows(const torch::Tensor &rows, const torch::Tensor &idx) {
  const int64_t B = rows.size(0), H = rows.size(1), T = rows.size(2);
  return rows.gather(-1, idx.view({1, 1, T, T}).expand({B, H, T, T}).contiguous());
}

// rows[b, h, j, idx[i, j]] -> [B, H, T, T] for per-key rows [B, H, T, R].
torch::Tensor gather_key_rows(const torch::Tensor &rows, const torch::Tensor &idx) {
  const int64_t B = rows.size(0), H = rows.size(1), T = rows.size(2);
  return rows.transpose(-1, -2).gather(-2, idx.view({1, 1, T, T}).expand({B, H, T, T}).contiguous());
}

// x [B, H, T, D] . table[r, h] for every row r of a table [R, H, D] -> [B, H, T, R].
torch::Tensor table_rows(const torch::Tensor &x, const torch::Tensor &table) {
  return torch::einsum("bhtd,rhd->bhtr", {x, table});
}

// A per-(i, j) value [T, T, H] as a bias [1, H, T, T].
torch::Tensor per_head(const torch::Tensor &tth) { return tth.permute({2, 0, 1}).unsqueeze(0); }

// The bias, with q', k' given (the q/k-dependent encodings read them).
torch::Tensor bias_of(const std::string &encoding, const RefInputs &in, const torch::Tensor &qm,
                      const torch::Tensor &km) {
  const int64_t H = in.q.size(1), T = in.q.size(2), D = in.q.size(3);
  const double root = std::sqrt(static_cast<double>(D));
  auto dist = [&]() { return causal_distance(T).to(torch::kFloat64); };
  if (encoding == "alibi" || encoding == "rope_alibi" || encoding == "alibi_learned") {
    const auto &m = param(in.params, "alibi_slopes");
    return -m.view({1, H, 1, 1}) * distance(T).view({1, 1, T, T});
  }
  if (encoding == "cable" || encoding == "expe_rope_cable" || encoding == "expe_cable" ||
      encoding == "forget_gate" || encoding == "kcable") {
    if (in.features.size() != 1) throw std::invalid_argument("reference: needs one feature");
    const auto &f = in.features[0];
    auto per_token = encoding == "forget_gate" ? torch::log_sigmoid(f) : -torch::softplus(f);
    auto d = difference_bias(torch::cumsum(per_token, -1));
    return encoding == "kcable" ? -torch::log1p(d * d) : d;
  }
  if (encoding == "t5" || encoding == "rope_t5") {
    const auto &table = param(in.params, "t5_table");  // [32, H]
    return per_head(table.index_select(0, t5_buckets(T).flatten()).view({T, T, H}));
  }
  if (encoding == "kerple_log" || encoding == "kerple_power") {
    auto a = param(in.params, "kerple_a").clamp_min(0.01).view({1, H, 1, 1});
    auto p = param(in.params, "kerple_p").view({1, H, 1, 1});
    auto d = dist().view({1, 1, T, T});
    if (encoding == "kerple_log") return -p.clamp_min(0.01) * torch::log1p(a * d);
    auto positive = d.gt(0);
    auto powered = torch::pow(torch::where(positive, d, torch::ones_like(d)), p.clamp(0.01, 2.0));
    return -a * torch::where(positive, powered, torch::zeros_like(powered));
  }
  if (encoding == "fire") {
    auto x = fire_inputs(T, param(in.params, "fire_c"), param(in.params, "fire_l_mult"));
    const auto &w1 = param(in.params, "fire_w1"), &b1 = param(in.params, "fire_b1");
    const auto &w2 = param(in.params, "fire_w2"), &b2 = param(in.params, "fire_b2");
    auto hidden = torch::relu(x.unsqueeze(-1) * w1.view({1, 1, -1}) + b1.view({1, 1, -1}));
    return per_head(torch::matmul(hidden, w2) + b2.view({1, 1, H}));  // [T, T, H] -> bias
  }
  if (encoding == "shaw") {
    auto r = causal_distance(T).clamp_max(32);
    return gather_rows(table_rows(qm, param(in.params, "shaw_key")), r) / root;
  }
  if (encoding == "deberta") {
    auto delta = t5_buckets(T);
    auto c2p = gather_rows(table_rows(qm, param(in.params, "deberta_c2p")), delta);
    auto p2c = gather_key_rows(table_rows(km, param(in.params, "deberta_p2c")), delta);
    return (c2p + p2c) / root;
  }
  if (encoding == "transformer_xl") {
    auto r = causal_distance(T).clamp_max(256);
    const auto &v = param(in.params, "xl_v"), &u = param(in.params, "xl_u");
    auto position = gather_rows(table_rows(qm + v.view({1, H, 1, D}), param(in.params, "xl_rel")), r);
    auto global = (km * u.view({1, H, 1, D})).sum(-1).unsqueeze(-2);  // [B, H, 1, T]: u_h . k'_j
    return (position + global) / root;
  }
  return {};
}

}  // namespace

int64_t t5_bucket(int64_t n) {
  if (n < 16) return n;
  const double steps = std::floor(std::log(static_cast<double>(n) / 16.0) / std::log(8.0) * 16.0);
  return std::min<int64_t>(16 + static_cast<int64_t>(steps), 31);
}

torch::Tensor fire_inputs(int64_t T, const torch::Tensor &c, const torch::Tensor &L) {
  auto cs = c.reshape({}), Ls = L.reshape({});
  auto psi = [&](const torch::Tensor &z) { return torch::log1p(torch::abs(cs * z)); };
  auto delta = causal_distance(T).to(torch::kFloat64);
  auto norm = torch::maximum(torch::arange(T, kF64), 512.0 * Ls);  // [T]: max(i, 512 L)
  return psi(delta) / (psi(norm) + 1e-6).unsqueeze(1);
}

torch::Tensor reference_bias(const std::string &encoding, const RefInputs &in) {
  auto [qm, km] = reference_qk(encoding, in);
  return bias_of(encoding, in, qm, km);
}

// ---- attention ------------------------------------------------------------------------------------

std::pair<torch::Tensor, torch::Tensor> reference_qk(const std::string &encoding,
                                                     const RefInputs &in) {
  const int64_t T = in.q.size(2), D = in.q.size(3);
  torch::Tensor qm = in.q, km = in.k;
  // Additive override terms first: they act on the projection input, before any rotation.
  if (encoding == "expe" || encoding == "expe_qkv" || encoding == "expe_cable" ||
      encoding == "expe_rope_cable") {
    const auto sigma = position_scale(in.params);
    qm = expe_shift(qm, param(in.params, "override_q_a"), param(in.params, "override_q_b"), sigma);
    km = expe_shift(km, param(in.params, "override_k_a"), param(in.params, "override_k_b"), sigma);
  } else if (encoding == "exqpe") {
    const auto sigma = position_scale(in.params);
    qm = exqpe_shift(qm, param(in.params, "override_q_a"), param(in.params, "override_q_b"),
                     param(in.params, "override_q_p"), sigma);
    km = exqpe_shift(km, param(in.params, "override_k_a"), param(in.params, "override_k_b"),
                     param(in.params, "override_k_p"), sigma);
  }
  if (is_rotary(encoding)) {
    const Rotary r = rotary_of(encoding, in.params, D, T);
    qm = rope_rotate(qm, r.theta, r.pairing);
    km = rope_rotate(km, r.theta, r.pairing);
    if (r.mscale != 1.0) qm = qm * r.mscale, km = km * r.mscale;
  }
  if (encoding == "xpos") {
    qm = qm * xpos_factors(T, D, +1.0);
    km = km * xpos_factors(T, D, -1.0);
  }
  return {qm, km};
}

namespace {

// Straight-through rounding to `dt`: the forward value rounded, the gradient passed unchanged.
torch::Tensor round_through(const torch::Tensor &x, torch::ScalarType dt) {
  return x + (x.detach().to(dt).to(torch::kFloat64) - x.detach());
}

// Identity forward; the gradient rounded to `dt` (a kernel's dS operand).
struct RoundGrad : torch::autograd::Function<RoundGrad> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &x,
                               int64_t dtype) {
    ctx->saved_data["dtype"] = dtype;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list g) {
    const auto dt = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {g[0].to(dt).to(torch::kFloat64), torch::Tensor()};
  }
};

// o = softmax(logits) v with the kernel's rounding: P rounded for P V and dV = P^T dO, o rounded,
// and the backward's Delta_i = dO_i . o_i read from the rounded o (or from delta_o when given).
// With a value table aV
// ([R, H, D], Shaw's value term with r(i, j) = clip(i - j, 0, R - 1); empty: none), o_i also gains
// sum_j P_ij aV[r(i, j)] from the unrounded P, before o is rounded.
struct SoftmaxV : torch::autograd::Function<SoftmaxV> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &logits,
                               const torch::Tensor &v, const torch::Tensor &aV, int64_t dtype,
                               const torch::Tensor &delta_o) {
    const auto dt = static_cast<torch::ScalarType>(dtype);
    const auto P = torch::softmax(logits, -1);
    const auto Pr = P.to(dt).to(torch::kFloat64);
    auto o = torch::matmul(Pr, v);
    torch::Tensor r = torch::empty({0}, torch::kLong);
    if (aV.numel() > 0) {
      const int64_t T = logits.size(-1), R = aV.size(0);
      r = causal_distance(T).clamp_max(R - 1).view({1, 1, T, T}).expand_as(P).contiguous();
      const auto mass = torch::zeros({P.size(0), P.size(1), T, R}, kF64).scatter_add(-1, r, P);
      o = o + torch::einsum("bhtr,rhd->bhtd", {mass, aV});
    }
    o = o.to(dt).to(torch::kFloat64);
    ctx->save_for_backward({P, Pr, v, delta_o.numel() > 0 ? delta_o.to(torch::kFloat64) : o, aV, r});
    return o;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list g) {
    const auto saved = ctx->get_saved_variables();
    const auto &P = saved[0], &Pr = saved[1], &v = saved[2], &o = saved[3], &aV = saved[4],
               &r = saved[5];
    const auto dO = g[0];
    const auto dv = torch::matmul(Pr.transpose(-1, -2), dO);
    auto dP = torch::matmul(dO, v.transpose(-1, -2));
    torch::Tensor daV;
    if (aV.numel() > 0) {  // dP_ij += dO_i . aV[r(i, j)]; daV[r] = sum_i mass_i[r] dO_i
      const auto rows = torch::einsum("bhtd,rhd->bhtr", {dO, aV});
      dP = dP + rows.gather(-1, r);
      const auto mass = torch::zeros_like(rows).scatter_add(-1, r, P);
      daV = torch::einsum("bhtr,bhtd->rhd", {mass, dO});
    }
    const auto delta = (dO * o).sum(-1, /*keepdim=*/true);
    return {P * (dP - delta), dv, daV, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

RefOutputs reference_attention(const std::string &encoding, const RefInputs &in_raw,
                               const torch::Tensor &dout, const RefRounding &rounding) {
  const auto &names = reference_encodings();
  if (std::find(names.begin(), names.end(), encoding) == names.end())
    throw std::invalid_argument("reference: unknown encoding " + encoding);
  torch::AutoGradMode grad_mode(true);
  const bool backward = dout.defined();

  RefInputs in;
  in.scale = in_raw.scale;
  in.q = as_f64(in_raw.q).requires_grad_(backward);
  in.k = as_f64(in_raw.k).requires_grad_(backward);
  in.v = as_f64(in_raw.v).requires_grad_(backward);
  for (const auto &f : in_raw.features) in.features.push_back(as_f64(f).requires_grad_(backward));
  for (const auto &[name, p] : in_raw.params) {
    const bool trainable = std::find(in_raw.trainable.begin(), in_raw.trainable.end(), name) !=
                           in_raw.trainable.end();
    in.params[name] = as_f64(p).requires_grad_(backward && trainable);
  }
  const int64_t T = in.q.size(2);

  auto [qm, km] = reference_qk(encoding, in);
  const bool round = rounding.dtype != torch::kFloat64;
  torch::Tensor logits;
  if (round) {
    const int64_t dt = static_cast<int64_t>(rounding.dtype);
    auto qr = round_through(qm, rounding.dtype), kr = round_through(km, rounding.dtype);
    logits = RoundGrad::apply(torch::matmul(qr, kr.transpose(-1, -2)), dt) * in.scale;
  } else {
    // kappa applied to q' ([B,H,T,D]) rather than to the [B,H,T,T] logits: same value, fewer passes.
    logits = torch::matmul(qm * in.scale, km.transpose(-1, -2));
  }
  auto bias = bias_of(encoding, in, qm, km);
  if (bias.defined()) logits = logits + bias;
  auto above = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool)).triu(1);
  logits = logits.masked_fill(above, -std::numeric_limits<double>::infinity());

  RefOutputs out;
  {
    torch::NoGradGuard no_grad;
    out.lse = reference_logsumexp(logits);
  }
  const int64_t rdt = static_cast<int64_t>(rounding.dtype);
  // (an autograd Function takes no undefined tensor: none is empty)
  const torch::Tensor delta_o = rounding.delta_o.defined() ? rounding.delta_o : torch::empty({0}, kF64);
  auto P = torch::softmax(logits, -1);
  torch::Tensor o;
  // delta_o without rounding: the exact attention, whose Delta reads delta_o.
  const bool softmax_v = round || rounding.delta_o.defined();
  if (softmax_v && encoding == "shaw")
    o = SoftmaxV::apply(logits, in.v, param(in.params, "shaw_value"), rdt, delta_o);
  else if (softmax_v)
    o = SoftmaxV::apply(logits, in.v, torch::empty({0}, kF64), rdt, delta_o);
  else
    o = torch::matmul(P, in.v);
  if (encoding == "shaw" && !softmax_v) {
    // Value term sum_j P_ij a^V_r: the probability mass of each clipped distance r per query
    // (scatter-add of P over r), times the table.
    const int64_t B = P.size(0), H = P.size(1);
    const auto &aV = param(in.params, "shaw_value");
    auto r = causal_distance(T).clamp_max(32).view({1, 1, T, T}).expand({B, H, T, T}).contiguous();
    auto mass = torch::zeros({B, H, T, aV.size(0)}, kF64).scatter_add(-1, r, P);
    o = o + torch::einsum("bhtr,rhd->bhtd", {mass, aV});
  }
  out.o = o.detach();
  if (!backward) return out;

  std::vector<torch::Tensor> wrt = {in.q, in.k, in.v};
  for (const auto &f : in.features) wrt.push_back(f);
  std::vector<std::string> grad_params;
  for (const auto &[name, p] : in.params)
    if (p.requires_grad()) {
      wrt.push_back(p);
      grad_params.push_back(name);
    }
  auto grads = torch::autograd::grad({o}, wrt, {as_f64(dout)}, /*retain_graph=*/false,
                                     /*create_graph=*/false, /*allow_unused=*/true);
  auto or_zeros = [](const torch::Tensor &g, const torch::Tensor &like) {
    return g.defined() ? g.detach() : torch::zeros_like(like).detach();
  };
  size_t n = 0;
  out.dq = or_zeros(grads[n++], in.q);
  out.dk = or_zeros(grads[n++], in.k);
  out.dv = or_zeros(grads[n++], in.v);
  for (const auto &f : in.features) out.dfeatures.push_back(or_zeros(grads[n++], f));
  for (const auto &name : grad_params) out.dparams[name] = or_zeros(grads[n++], in.params[name]);
  return out;
}

}  // namespace ape_test
