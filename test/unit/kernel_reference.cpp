// fp64 materialised reference of the encodings (see kernel_reference.h). Only LibTorch ops;
// nothing here reads the generated kernels or their code.
#include "kernel_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace ape_test {
namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);

torch::Tensor as_f64(const torch::Tensor &t) {
  return t.detach().to(torch::kFloat64).contiguous().clone();
}

const torch::Tensor &param(const std::map<std::string, torch::Tensor> &params,
                           const std::string &name) {
  auto it = params.find(name);
  if (it == params.end()) throw std::invalid_argument("reference: missing param " + name);
  return it->second;
}

// i - j as fp64 [T, T].
torch::Tensor distance(int64_t T) {
  auto n = torch::arange(T, kF64);
  return n.unsqueeze(1) - n.unsqueeze(0);
}

// B_ij = S_i - S_j for a per-token sequence S [B, H, T].
torch::Tensor difference_bias(const torch::Tensor &S) { return S.unsqueeze(-1) - S.unsqueeze(-2); }

// ExPE: x + a[h] + n b[h], a, b [H, D].
torch::Tensor expe_shift(const torch::Tensor &x, const torch::Tensor &a, const torch::Tensor &b) {
  const int64_t H = x.size(1), T = x.size(2), D = x.size(3);
  auto n = torch::arange(T, kF64).view({1, 1, T, 1});
  return x + a.view({1, H, 1, D}) + n * b.view({1, H, 1, D});
}

}  // namespace

const std::vector<std::string> &reference_encodings() {
  static const std::vector<std::string> names = {"alibi", "cable",       "expe",
                                                 "expe_rope_cable", "forget_gate", "nope",
                                                 "rope"};
  return names;
}

torch::Tensor rope_rotate_half(const torch::Tensor &x, double base) {
  const int64_t T = x.size(-2), D = x.size(-1);
  if (D % 2 != 0) throw std::invalid_argument("rope_rotate_half: odd D");
  const int64_t half = D / 2;
  // theta_k = base^(-2k/D), angle[n, k] = n theta_k.
  auto k = torch::arange(half, kF64);
  auto theta = torch::pow(torch::full({}, base, kF64), -2.0 * k / static_cast<double>(D));
  auto angle = torch::arange(T, kF64).unsqueeze(1) * theta.unsqueeze(0);  // [T, D/2]
  auto c = torch::cos(angle), s = torch::sin(angle);
  auto x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  return torch::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

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

torch::Tensor reference_bias(const std::string &encoding, const RefInputs &in) {
  const int64_t H = in.q.size(1), T = in.q.size(2);
  if (encoding == "alibi") {
    const auto &m = param(in.params, "alibi_slopes");
    return -m.view({1, H, 1, 1}) * distance(T).view({1, 1, T, T});
  }
  if (encoding == "cable" || encoding == "expe_rope_cable" || encoding == "forget_gate") {
    if (in.features.size() != 1) throw std::invalid_argument("reference: needs one feature");
    const auto &f = in.features[0];
    auto per_token = encoding == "forget_gate" ? torch::log_sigmoid(f) : -torch::softplus(f);
    return difference_bias(torch::cumsum(per_token, -1));
  }
  return {};
}

RefOutputs reference_attention(const std::string &encoding, const RefInputs &in_raw,
                               const torch::Tensor &dout) {
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

  torch::Tensor qm = in.q, km = in.k;
  if (encoding == "rope") {
    qm = rope_rotate_half(in.q);
    km = rope_rotate_half(in.k);
  } else if (encoding == "expe" || encoding == "expe_rope_cable") {
    qm = expe_shift(in.q, param(in.params, "override_q_a"), param(in.params, "override_q_b"));
    km = expe_shift(in.k, param(in.params, "override_k_a"), param(in.params, "override_k_b"));
    if (encoding == "expe_rope_cable") {  // the override acts on the input: rotate after it
      qm = rope_rotate_half(qm);
      km = rope_rotate_half(km);
    }
  }
  // kappa applied to q' ([B,H,T,D]) rather than to the [B,H,T,T] logits: same value, fewer passes.
  auto logits = torch::matmul(qm * in.scale, km.transpose(-1, -2));
  auto bias = reference_bias(encoding, in);
  if (bias.defined()) logits = logits + bias;
  auto above = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool)).triu(1);
  logits = logits.masked_fill(above, -std::numeric_limits<double>::infinity());

  RefOutputs out;
  {
    torch::NoGradGuard no_grad;
    out.lse = torch::logsumexp(logits.detach(), -1);
  }
  auto o = torch::matmul(torch::softmax(logits, -1), in.v);
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
