// ape::fused_attention (runtime/Attention.h) with the private test kernels against the
// materialised reference: forward, input, feature and param gradients, and clear errors.
#include "reference_lse.h"
#include "runtime_fixtures.h"

namespace {

TEST(FusedAttention, NopeMatchesReferenceForwardAndGrads) {
  for (auto dtype : {at::kDouble, at::kFloat}) {
    at::manual_seed(1);
    const double tol = dtype == at::kDouble ? 1e-10 : 2e-5;
    auto opt = at::TensorOptions().dtype(dtype);
    at::Tensor q = at::randn({2, 3, 7, 4}, opt).requires_grad_(), k = at::randn({2, 3, 7, 4}, opt).requires_grad_(),
               v = at::randn({2, 3, 7, 4}, opt).requires_grad_();
    at::Tensor dout = at::randn({2, 3, 7, 4}, opt);
    const double scale = 0.5;
    at::Tensor o = ape::fused_attention(testk::nope, q, k, v, {}, {}, scale);
    auto g = torch::autograd::grad({o}, {q, k, v}, {dout});
    at::Tensor ro = reference_attention(q, k, v, scale);
    auto rg = torch::autograd::grad({ro}, {q, k, v}, {dout});
    expect_close(o, ro, tol, "o");
    expect_close(g[0], rg[0], tol, "dq");
    expect_close(g[1], rg[1], tol, "dk");
    expect_close(g[2], rg[2], tol, "dv");
    auto [o2, lse] = ape::attention_forward(testk::nope, q, k, v, {}, {}, scale);
    expect_close(o2, ro, tol, "attention_forward o");
    at::Tensor s = at::matmul(q, k.transpose(-1, -2)) * scale;
    s = s.masked_fill(at::ones({7, 7}, at::kBool).triu(1), -INFINITY);
    expect_close(lse, ape_test::reference_logsumexp(s), tol, "lse");
  }
}

TEST(FusedAttention, FeatureAndParamGradients) {
  at::manual_seed(2);
  auto opt = at::TensorOptions().dtype(at::kDouble);
  const int64_t B = 2, H = 3, T = 6, D = 4;
  at::Tensor q = at::randn({B, H, T, D}, opt).requires_grad_(), k = at::randn({B, H, T, D}, opt).requires_grad_(),
             v = at::randn({B, H, T, D}, opt).requires_grad_();
  at::Tensor g = at::randn({B, H, T}, opt).requires_grad_();
  at::Tensor w = at::randn({H}, opt).requires_grad_();
  at::Tensor dout = at::randn({B, H, T, D}, opt);
  at::Tensor o = ape::fused_attention(testk::bias_entry, q, k, v, {g}, {w}, 0.3);
  auto grads = torch::autograd::grad({o}, {q, k, v, g, w}, {dout});
  // bias_ij = w_h · g[b,h,j]
  at::Tensor bias = (w.view({1, H, 1, 1}) * g.unsqueeze(2)).expand({B, H, T, T});
  at::Tensor ro = reference_attention(q, k, v, 0.3, bias);
  auto rgrads = torch::autograd::grad({ro}, {q, k, v, g, w}, {dout});
  expect_close(o, ro, 1e-10, "o");
  const char *names[] = {"dq", "dk", "dv", "dfeature", "dparam"};
  for (int i = 0; i < 5; ++i) expect_close(grads[i], rgrads[i], 1e-10, names[i]);

  // A param that does not require grad gets no gradient (and is not an error).
  at::Tensor w_fixed = w.detach();
  at::Tensor o2 = ape::fused_attention(testk::bias_entry, q, k, v, {g}, {w_fixed}, 0.3);
  o2.sum().backward();
  EXPECT_FALSE(w_fixed.grad().defined());
  EXPECT_TRUE(g.grad().defined());
}

TEST(FusedAttention, BadInputsGiveClearErrors) {
  auto f = at::TensorOptions().dtype(at::kFloat);
  at::Tensor q = at::randn({1, 2, 5, 4}, f);
  EXPECT_ERROR(ape::fused_attention(testk::nope, q.view({2, 5, 4}), q, q, {}, {}, 1.0),
               "q must be [B,H,T,D] float32 or float64");
  EXPECT_ERROR(ape::fused_attention(testk::nope, q.to(at::kInt), q, q, {}, {}, 1.0), "q must be [B,H,T,D]");
  EXPECT_ERROR(ape::fused_attention(testk::nope, q, q.to(at::kDouble), q, {}, {}, 1.0), "k must match q");
  EXPECT_ERROR(ape::fused_attention(testk::nope, q, q, q.narrow(2, 0, 4), {}, {}, 1.0), "v must match q");
  EXPECT_ERROR(ape::fused_attention(testk::bias_entry, q, q, q, {}, {at::ones({2}, f)}, 1.0),
               "expected 1 feature tensors");
  EXPECT_ERROR(ape::fused_attention(testk::bias_entry, q, q, q, {at::ones({1, 2, 4}, f)}, {at::ones({2}, f)}, 1.0),
               "feature 'g' must be [B,H,T] = [1, 2, 5]");
  EXPECT_ERROR(ape::fused_attention(testk::bias_entry, q, q, q, {at::ones({1, 2, 5}, f)}, {}, 1.0),
               "expected 1 param tensors");
  EXPECT_ERROR(ape::fused_attention(testk::bias_entry, q, q, q, {at::ones({1, 2, 5}, f)}, {at::ones({3}, f)}, 1.0),
               "param 'w' must have 2 Float elements (shape [heads])");
  // Non-contiguous inputs are accepted (made contiguous).
  at::Tensor qt = at::randn({1, 5, 2, 4}, f).transpose(1, 2);
  at::Tensor o = ape::fused_attention(testk::nope, qt, qt, qt, {}, {}, 0.5);
  expect_close(o, reference_attention(qt, qt, qt, 0.5), 1e-5, "non-contiguous");
}

}  // namespace
