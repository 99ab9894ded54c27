// The cumulative (per-token feature) encodings: Cable's and the forget gate's rows by hand, their
// gradient at a zero feature, K-Cable's row 3, features exactly 0 for every encoding with a
// feature (FeatureEdge), and forget_gate(g) == cable(-g).
// Regression tests for a kernel bug these tests found: forget_gate's feature gradient at g == 0
// exactly was 3x too large (ape-differentiate's tie rules for min and |x| disagreed);
// FeatureEdge.FeaturesExactlyZero/forget_gate, HandCheck.ForgetGateGradientAtZeroFeature*.
#include "harness.h"

namespace {

using namespace ape_test;

TEST(HandCheck, CableReferenceValues) {
  // f = [0,1,-1,2] -> b, S, B row 3, on the reference's pieces.
  RefInputs in;
  in.q = torch::zeros({1, 1, 4, 4}, kF64);
  in.features = {torch::tensor({0.0, 1.0, -1.0, 2.0}, kF64).view({1, 1, 4})};
  auto b = -torch::softplus(in.features[0]).flatten();
  auto S = torch::cumsum(b, 0);
  auto want_b = torch::tensor({-0.693147, -1.313262, -0.313262, -2.126928}, kF64);
  auto want_S = torch::tensor({-0.693147, -2.006409, -2.319671, -4.446599}, kF64);
  EXPECT_LT((b - want_b).abs().max().item<double>(), 1e-6);
  EXPECT_LT((S - want_S).abs().max().item<double>(), 1e-6);
  auto B = ape_test::reference_bias("cable", in);
  auto want_row3 = torch::tensor({-3.753451, -2.440190, -2.126928, 0.0}, kF64);
  EXPECT_LT((B[0][0][3] - want_row3).abs().max().item<double>(), 1e-6);
}

// Cable, 1 head, T = 4, f = [0,1,-1,2]: o[3] = softmax([-3.753451, -2.440190, -2.126928, 0]).
template <class Real> void cable_rows(double tol) {
  Problem p = make_problem("cable", 1, 1, 4, 4, 3);
  ASSERT_NE(p.entry, nullptr);
  ASSERT_EQ(p.features.size(), 1u);
  p.features[0] = torch::tensor({0.0, 1.0, -1.0, 2.0}, kF64).view({1, 1, 4});
  KernelCall<Real> kc = run_bias_probe<Real>(p);
  const Tensor o = kc.o.to(torch::kFloat64);
  auto row3 = torch::tensor({-3.753451, -2.440190, -2.126928, 0.0}, kF64);
  EXPECT_LT((o[0][0][3] - torch::softmax(row3, 0)).abs().max().item<double>(), tol) << o[0][0][3];
  EXPECT_LT((torch::log(o[0][0][3] / o[0][0][3][3]) - row3).abs().max().item<double>(), tol);
  // Rows 1 and 2 from S = [-0.693147, -2.006409, -2.319671, -4.446599].
  auto S = torch::tensor({-0.693147, -2.006409, -2.319671, -4.446599}, kF64);
  for (int64_t i = 1; i < 3; ++i) {
    auto row = S[i] - S.narrow(0, 0, i + 1);
    EXPECT_LT((o[0][0][i].narrow(0, 0, i + 1) - torch::softmax(row, 0)).abs().max().item<double>(),
              tol) << "row " << i;
  }
}
TEST(HandCheck, CableRow3F64) { cable_rows<double>(1e-5); }
TEST(HandCheck, CableRow3F32) { cable_rows<float>(1e-5); }

// Forget gate at g = 0: log sigmoid(0) = -ln 2 per step, so row 3 of the bias is
// [-3 ln 2, -2 ln 2, -ln 2, 0] = [-2.079442, -1.386294, -0.693147, 0].
template <class Real> void forget_gate_rows(double tol) {
  Problem p = make_problem("forget_gate", 1, 1, 4, 4, 4);
  ASSERT_NE(p.entry, nullptr);
  ASSERT_EQ(p.features.size(), 1u);
  p.features[0].zero_();
  KernelCall<Real> kc = run_bias_probe<Real>(p);
  const Tensor o = kc.o.to(torch::kFloat64);
  auto row3 = torch::tensor({-2.079442, -1.386294, -0.693147, 0.0}, kF64);
  EXPECT_LT((o[0][0][3] - torch::softmax(row3, 0)).abs().max().item<double>(), tol) << o[0][0][3];
  EXPECT_LT((torch::log(o[0][0][3] / o[0][0][3][3]) - row3).abs().max().item<double>(), tol);
}
TEST(HandCheck, ForgetGateRow3F64) { forget_gate_rows<double>(1e-6); }
TEST(HandCheck, ForgetGateRow3F32) { forget_gate_rows<float>(1e-5); }

// The smallest case of a gradient at a zero feature, by hand: B = H = 1, T = 2, D = 2, q = k = 0,
// v_0 = e_0, v_1 = e_1, dout_0 = 0, dout_1 = e_0, f = [0, 0]. Row 1 has logits (z, 0) with
// z = -softplus(f_1) (cable) = log sigmoid(g_1) (forget gate) = -ln 2, so P_10 = 1/3 and the loss
// o_1[0] = P_10 has d/dz = P_10 P_11 = 2/9; dz/df_1 = -sigmoid(0) = -1/2 (cable), dz/dg_1 =
// sigmoid(-0) = 1/2 (forget gate): dfeature = [0, -1/9] (cable), [0, 1/9] (forget gate).
// (With inconsistent tie rules for min and |x| at 0 the forget gate gives [0, 1/3]; see
// FeatureEdge.FeaturesExactlyZero.)
template <class Real> void zero_feature_gradient(const std::string &enc, double want, double tol) {
  Problem p = make_problem(enc, 1, 1, 2, 2, 5);
  ASSERT_NE(p.entry, nullptr);
  ASSERT_EQ(p.features.size(), 1u);
  p.q.zero_(), p.k.zero_(), p.v.zero_(), p.dout.zero_(), p.features[0].zero_();
  p.v[0][0][0][0] = 1.0, p.v[0][0][1][1] = 1.0, p.dout[0][0][1][0] = 1.0;
  KernelCall<Real> kc(p);
  kc.forward();
  kc.backward();
  const Tensor o = kc.o.to(torch::kFloat64), df = kc.dfeat[0].to(torch::kFloat64);
  EXPECT_NEAR(o[0][0][1][0].template item<double>(), 1.0 / 3.0, tol);
  EXPECT_NEAR(df[0][0][0].template item<double>(), 0.0, tol) << enc;
  EXPECT_NEAR(df[0][0][1].template item<double>(), want, tol)
      << enc << ": d o_1[0] / d f_1 at f = 0";
}
TEST(HandCheck, CableGradientAtZeroFeatureF64) {
  zero_feature_gradient<double>("cable", -1.0 / 9, 1e-12);
}
TEST(HandCheck, CableGradientAtZeroFeatureF32) {
  zero_feature_gradient<float>("cable", -1.0 / 9, 1e-6);
}
TEST(HandCheck, ForgetGateGradientAtZeroFeatureF64) {
  zero_feature_gradient<double>("forget_gate", 1.0 / 9, 1e-12);
}
TEST(HandCheck, ForgetGateGradientAtZeroFeatureF32) {
  zero_feature_gradient<float>("forget_gate", 1.0 / 9, 1e-6);
}

// K-Cable, 1 head, T = 4, f = [0,1,-1,2]: row 3 = [-2.713926, -1.939393, -1.709070, 0].
template <class Real> void kcable_row(double tol) {
  Problem p = make_problem("kcable", 1, 1, 4, 4, 38);
  ASSERT_NE(p.entry, nullptr);
  ASSERT_EQ(p.features.size(), 1u);
  p.features[0] = torch::tensor({0.0, 1.0, -1.0, 2.0}, kF64).view({1, 1, 4});
  expect_values(bias_row3<Real>(p), {-2.713926, -1.939393, -1.709070, 0}, tol, "K-Cable row 3");
  RefInputs in;
  in.q = torch::zeros({1, 1, 4, 4}, kF64);
  in.features = {p.features[0]};
  expect_values(ape_test::reference_bias("kcable", in)[0][0][3],
                {-2.713926, -1.939393, -1.709070, 0}, 5e-7, "reference row 3");
}
TEST(HandCheck, KcableRow3F64) { kcable_row<double>(5e-7); }
TEST(HandCheck, KcableRow3F32) { kcable_row<float>(5e-6); }

// Features exactly 0 (a zero-initialised feature projection gives f = bias; forget_gate's map
// log sigmoid(x) = min(x, 0) - log1p(exp(-|x|)) has kinks of min and |x| at 0 that cancel, so the
// true derivative there is sigmoid(-0) = 0.5). fp64 kernel against the reference and against a
// central difference of the kernel's own forward.
//
// Regression test (forget_gate, found by this test): ape-differentiate once took
// d min(x, 0)/dx = 1 at x = 0 (x <= 0) but d|x|/dx = +1 (x >= 0), so map_0_grad returned
// 1 + 0.5 = 1.5 instead of 0.5 and dfeature was 3x too large wherever g == 0. The derivative
// rules must pick consistent one-sided derivatives at ties.
class FeatureEdge : public ::testing::TestWithParam<std::string> {};
TEST_P(FeatureEdge, FeaturesExactlyZero) {
  Problem p = make_problem(GetParam(), 1, 2, 9, 8, case_seed("zero_" + GetParam(), 1, 2, 9, 8));
  ASSERT_NE(p.entry, nullptr);
  ASSERT_FALSE(p.features.empty());
  for (auto &f : p.features) f.zero_();
  const RefOutputs ref = ape_test::reference_attention(p.enc, ref_inputs(p), p.dout);
  KernelCall<double> kc(p);
  kc.forward();
  kc.backward();
  EXPECT_LE(normalised_error(kc.o, ref.o), 1e-10);
  for (size_t n = 0; n < kc.dfeat.size(); ++n) {
    const int64_t at = ref.dfeatures[n].abs().flatten().argmax().item<int64_t>();
    const double got = kc.dfeat[n].flatten()[at].item<double>();
    const double want = ref.dfeatures[n].flatten()[at].item<double>();
    EXPECT_LE(normalised_error(kc.dfeat[n], ref.dfeatures[n]), 1e-10)
        << "dfeature " << p.man.features[n] << " at f = 0, element " << at << ": kernel " << got
        << ", reference " << want << " (ratio " << got / want << ")";
    // Central difference of sum(o * dout) w.r.t. that element of the feature.
    const double h = 1e-6;
    auto loss = [&](double x) {
      kc.feat[n].data_ptr<double>()[at] = x;
      kc.forward();
      return (kc.o * kc.dout).sum().item<double>();
    };
    const double fd = (loss(h) - loss(-h)) / (2 * h);
    loss(0);
    EXPECT_NEAR(got, fd, 1e-6 * std::max(1.0, std::abs(fd)))
        << "d sum(o dout) / d " << p.man.features[n] << "[" << at << "] at 0 (central difference)";
  }
}
INSTANTIATE_TEST_SUITE_P(All, FeatureEdge, ::testing::ValuesIn(encodings_with_features()),
                         [](const ::testing::TestParamInfo<std::string> &info) {
                           return info.param;
                         });

// Cross-encoding identities (kernel against kernel, fp64): forget_gate(g) == cable(-g), since
// log sigmoid(g) = -softplus(-g) (gradients w.r.t. the feature flip sign); ExPE with zero
// params == NoPE.
TEST(EdgeIdentity, ForgetGateIsCableOfMinusFeature) {
  Problem fg = make_problem("forget_gate", 2, 3, 100, 16, 11);
  Problem cb = make_problem("cable", 2, 3, 100, 16, 11);
  ASSERT_TRUE(fg.entry && cb.entry);
  cb.q = fg.q, cb.k = fg.k, cb.v = fg.v, cb.dout = fg.dout;
  cb.features = {-fg.features[0]};
  KernelCall<double> a(fg), b(cb);
  a.forward(), a.backward(), b.forward(), b.backward();
  auto rel = [](const Tensor &x, const Tensor &y) { return normalised_error(x, y); };
  EXPECT_LE(rel(a.o, b.o), 1e-12);
  EXPECT_LE(rel(a.lse, b.lse), 1e-12);
  EXPECT_LE(rel(a.dq, b.dq), 1e-12);
  EXPECT_LE(rel(a.dk, b.dk), 1e-12);
  EXPECT_LE(rel(a.dv, b.dv), 1e-12);
  EXPECT_LE(rel(a.dfeat[0], -b.dfeat[0]), 1e-12);
}

}  // namespace
