// Shared by the runtime suites that check an override (model_test.cpp, registered_test.cpp): the
// model's attention against explicitly overridden inputs, and the ExPE / ExQPE positions of the
// encodings spec. Internal linkage, like runtime_fixtures.h.
#pragma once
#include "runtime_fixtures.h"

namespace {

// The model's attention (override + derived params in the kernel, and for "qkv" the value path)
// must equal attention on explicitly overridden inputs φ(x̃, t) = (σ·pos_t, x̃[l:]) for q and k (and
// v when `override_v`), pos (T, l) computed by the caller from the spec — forward and the gradients of
// every projection weight. σ is set through the manifest's position_scale param when `sigma` != 1.
void check_explicit_override(const ape::KernelEntry &entry, const ape::ModelConfig &cfg, const at::Tensor &pos,
                             bool override_v, double sigma, double tol) {
  const ape::Manifest &man = ape::manifest_of(entry);
  ape::EncodedAttention attn(entry, cfg, std::vector<at::Tensor>(man.params.size()));
  if (sigma != 1.0) {
    ASSERT_TRUE(man.override_ && !man.override_->position_scale.empty()) << "no position_scale";
    at::NoGradGuard ng;
    attn->stored_param(man.param_index(man.override_->position_scale)).fill_(sigma);
  }
  const int64_t B = 2, T = pos.size(0), l = pos.size(1), d = cfg.d_model, H = cfg.heads, D = cfg.head_dim();
  at::Tensor xn = at::randn({B, T, d});
  at::Tensor y = attn->forward(xn);
  at::Tensor dy = at::randn_like(y);
  auto W = std::vector<at::Tensor>{attn->wq->weight, attn->wk->weight, attn->wv->weight, attn->wo->weight};
  auto g = torch::autograd::grad({y}, W, {dy});

  at::Tensor phi = at::cat({(pos.to(at::kFloat) * sigma).unsqueeze(0).expand({B, T, l}), xn.narrow(-1, l, d - l)}, -1);
  auto heads = [&](at::Tensor t) { return t.view({B, T, H, D}).transpose(1, 2); };
  at::Tensor q = heads(at::matmul(phi, W[0].t())), k = heads(at::matmul(phi, W[1].t()));
  at::Tensor v = heads(at::matmul(override_v ? phi : xn, W[2].t()));
  at::Tensor o = reference_attention(q, k, v, 1.0 / std::sqrt(double(D)));
  at::Tensor ry = attn->wo(o.transpose(1, 2).reshape({B, T, d}));
  auto rg = torch::autograd::grad({ry}, W, {dy});
  expect_close(y, ry, tol, "output");
  const char *names[] = {"dW_q", "dW_k", "dW_v", "dW_o"};
  for (int i = 0; i < 4; ++i) expect_close(g[i], rg[i], tol, names[i]);
  // The first l columns of W_q get gradient only through the derived params.
  EXPECT_GT(g[0].narrow(1, 0, l).abs().sum().item<double>(), 0.0);
}

// ExPE positions p_{t,j} = S + θ(t + j), and ExQPE's p_{t,j} = S + jθ1 + θ2·c_j(t) with c_j(t) counted
// directly (the number of u in [0, t] with u ≡ j mod l), both straight from docs/encodings-math.md.
at::Tensor expe_positions(int64_t T, int64_t l, double start, double theta) {
  return (at::arange(T).view({T, 1}) + at::arange(l).view({1, l})).to(at::kDouble) * theta + start;
}
at::Tensor exqpe_positions(int64_t T, int64_t l, double start, double theta1, double theta2) {
  at::Tensor p = at::zeros({T, l}, at::kDouble);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < l; ++j) {
      int64_t count = 0;
      for (int64_t u = 0; u <= t; ++u) count += u % l == j;
      p[t][j] = start + double(j) * theta1 + theta2 * double(count);
    }
  return p;
}

}  // namespace
