// The overrides of the projections' inputs (ExPE, ExQPE): ExQPE's hand-checked positions on the
// reference's pieces and through the kernel (sigma = 1 and 0.5), and ExPE with zero params is
// NoPE.
#include "harness.h"

namespace {

using namespace ape_test;

// ExQPE check (l=4, S=0, theta1=0.25, theta2=1) through the fused form with W = I (H = 1, D = l):
// a = (j theta1)_j, b = theta2 1, P[r] = theta2 sum_{j<=r} e_j; p_n = a + floor(n/l) b + P[n mod l].
TEST(HandCheck, ExqpeReferencePositions) {
  const int64_t l = 4;
  auto a = (torch::arange(l, kF64) * 0.25).view({1, l});
  auto b = torch::ones({1, l}, kF64);
  auto P = torch::ones({l, l}, kF64).tril().view({l, 1, l});
  auto p = ape_test::exqpe_shift(torch::zeros({1, 1, 5, l}, kF64), a, b, P,
                                 torch::ones({}, kF64))[0][0];
  expect_values(p[0], {1, .25, .5, .75}, 1e-15, "p_0");
  expect_values(p[1], {1, 1.25, .5, .75}, 1e-15, "p_1");
  expect_values(p[3], {1, 1.25, 1.5, 1.75}, 1e-15, "p_3");
  expect_values(p[4], {2, 1.25, 1.5, 1.75}, 1e-15, "p_4");
  auto half = ape_test::exqpe_shift(torch::zeros({1, 1, 5, l}, kF64), a, b, P,
                                    torch::full({1}, 0.5, kF64))[0][0];
  EXPECT_TRUE(torch::allclose(half, 0.5 * p, 0, 1e-15));
}

// ExQPE through the kernel (l = 16 from the manifest, D = 16, H = 1): the W = I construction of
// HandCheck.ExqpeReferencePositions with theta1 = 0.25, theta2 = 1; q = 0 and zero k params, so
// l_n0 = kappa sigma p_{n,c} with k_0 = e_c, p_{n,j} = j theta1 + theta2 (floor(n/16) + [j <= n mod 16]).
template <class Real> void exqpe_kernel_positions(double sigma) {
  const int64_t l = 16, T = 40;
  Problem p = make_problem("exqpe", l, 1, T, l, 1);
  ASSERT_NE(p.entry, nullptr);
  ASSERT_EQ(p.man.json.at("override").at("l").get<int64_t>(), l);
  for (size_t n = 0; n < p.params.size(); ++n) p.params[n].zero_();
  const int64_t qa = param_index(p, "override_q_a"), qb = param_index(p, "override_q_b"),
                qp = param_index(p, "override_q_p");
  ASSERT_TRUE(qa >= 0 && qb >= 0 && qp >= 0);
  ASSERT_EQ(p.params[qp].sizes(), (std::vector<int64_t>{l, 1, l}));
  p.params[qa] = (torch::arange(l, kF64) * 0.25).view({1, l});
  p.params[qb] = torch::ones({1, l}, kF64);
  p.params[qp] = torch::ones({l, l}, kF64).tril().view({l, 1, l});
  set_param(p, "position_scale", sigma);
  p.q.zero_(), p.k.zero_();
  for (int64_t c = 0; c < l; ++c) p.k[c][0][0][c] = 1.0;
  const Tensor got = key0_logits<Real>(p).select(1, 0) / p.scale;  // [c, n]
  auto n = torch::arange(T, kF64).unsqueeze(0), j = torch::arange(l, kF64).unsqueeze(1);
  auto count = torch::floor(n / l) + (j <= torch::remainder(n, l)).to(torch::kFloat64);
  const Tensor want = sigma * (j * 0.25 + count);
  const double tol = std::is_same_v<Real, float> ? 1e-5 : 1e-10;
  EXPECT_LT((got - want).abs().max().template item<double>(), tol)
      << "positions p_{n,j} through the kernel (sigma " << sigma << ")";
}
TEST(HandCheck, ExqpeKernelPositionsF64) { exqpe_kernel_positions<double>(1.0); }
TEST(HandCheck, ExqpeKernelPositionsF32) { exqpe_kernel_positions<float>(1.0); }
TEST(HandCheck, ExqpeKernelPositionsSigmaHalf) { exqpe_kernel_positions<double>(0.5); }

TEST(EdgeIdentity, ExpeWithZeroParamsIsNope) {
  Problem ex = make_problem("expe", 2, 3, 100, 16, 12);
  Problem np = make_problem("nope", 2, 3, 100, 16, 12);
  ASSERT_TRUE(ex.entry && np.entry);
  np.q = ex.q, np.k = ex.k, np.v = ex.v, np.dout = ex.dout;
  for (auto &t : ex.params) t.zero_();
  KernelCall<double> a(ex), b(np);
  a.forward(), a.backward(), b.forward(), b.backward();
  EXPECT_LE(normalised_error(a.o, b.o), 1e-14);
  EXPECT_LE(normalised_error(a.dq, b.dq), 1e-14);
  EXPECT_LE(normalised_error(a.dk, b.dk), 1e-14);
  EXPECT_LE(normalised_error(a.dv, b.dv), 1e-14);
}

}  // namespace
