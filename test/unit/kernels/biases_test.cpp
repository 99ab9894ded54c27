// Hand-checkable values of the additive-bias encodings (the encodings spec), on the reference's
// pieces and through the kernels: ALiBi's slopes and rows, T5's buckets read from the last row of
// a T = 1001 call (also rope_t5), KERPLE log/power rows and clamps, FIRE's normalised inputs; and
// determinism of T5 and FIRE (B = 2, H = 4, T = 600: both FIRE branches) bitwise across two runs
// and 1 vs 2 OpenMP threads, every output and every param gradient.
#include "harness.h"

namespace {

using namespace ape_test;

TEST(HandCheck, AlibiSlopes) {
  auto s8 = ape_test::alibi_slopes(8);
  for (int h = 0; h < 8; ++h) EXPECT_DOUBLE_EQ(s8[h].item<double>(), std::pow(2.0, -(h + 1)));
  const std::vector<double> want12 = {0.5,       0.25,      0.125,      0.0625,
                                      0.03125,   0.015625,  0.0078125,  0.00390625,
                                      0.707107,  0.353553,  0.176777,   0.088388};
  auto s12 = ape_test::alibi_slopes(12);
  for (int h = 0; h < 12; ++h) EXPECT_NEAR(s12[h].item<double>(), want12[h], 1e-6) << h;
}

// ALiBi head 0 of 8, T = 4, rows [0], [-0.5, 0], [-1, -0.5, 0], [-1.5, -1, -0.5, 0]; every head h
// has slope 2^-(h+1).
template <class Real> void alibi_rows(double tol) {
  Problem p = make_problem("alibi", 1, 8, 4, 4, 2);
  ASSERT_NE(p.entry, nullptr);
  KernelCall<Real> kc = run_bias_probe<Real>(p);
  const Tensor o = kc.o.to(torch::kFloat64);
  const std::vector<std::vector<double>> rows = {
      {0}, {-0.5, 0}, {-1, -0.5, 0}, {-1.5, -1, -0.5, 0}};
  for (int64_t h = 0; h < 8; ++h) {
    const double m = std::pow(2.0, -(h + 1)) / 0.5;  // relative to head 0
    for (int64_t i = 0; i < 4; ++i) {
      auto row = torch::tensor(rows[i], kF64) * m;
      auto want = torch::softmax(row, 0);
      auto got = o[0][h][i].narrow(0, 0, i + 1);
      EXPECT_LT((got - want).abs().max().item<double>(), tol) << "head " << h << " row " << i;
      EXPECT_LT(o[0][h][i].narrow(0, i + 1, 4 - i - 1).abs().sum().item<double>(), tol)
          << "masked keys of head " << h << " row " << i;
      auto bias = torch::log(got / got[i]);
      EXPECT_LT((bias - row).abs().max().item<double>(), 10 * tol) << "head " << h << " row " << i;
    }
  }
}
TEST(HandCheck, AlibiHead0Of8F64) { alibi_rows<double>(1e-12); }
TEST(HandCheck, AlibiHead0Of8F32) { alibi_rows<float>(1e-6); }

// The spec's bucket list on the reference's bucket function.
TEST(HandCheck, T5ReferenceBuckets) {
  for (int64_t n = 0; n < 16; ++n) EXPECT_EQ(ape_test::t5_bucket(n), n);
  const std::vector<std::pair<int64_t, int64_t>> want = {
      {16, 16}, {17, 16}, {18, 16}, {19, 17}, {20, 17}, {24, 19},  {32, 21},   {48, 24},
      {64, 26}, {100, 30}, {112, 30}, {113, 31}, {128, 31}, {1000, 31}, {100000, 31}};
  for (const auto &[n, b] : want) EXPECT_EQ(ape_test::t5_bucket(n), b) << "n = " << n;
  for (int64_t n = 1; n < 2000; ++n)
    EXPECT_LE(ape_test::t5_bucket(n - 1), ape_test::t5_bucket(n)) << "monotone at " << n;
}

// T5 through the kernel: q = k = 0, table T[b, h] = -0.25 (h + 1) b, so l_{i,i-n} - l_ii =
// -0.25 (h + 1) bucket(n); buckets 16-18 -> 16, 19-20 -> 17, 24 -> 19, ..., 113, 128, 1000 -> 31.
// Also rope_t5 (q = k = 0: the rotation changes nothing).
template <class Real> void t5_kernel_buckets(const std::string &enc) {
  SCOPED_TRACE(enc);
  Problem p = make_problem(enc, 1, 2, 1001, 32, 31);
  ASSERT_NE(p.entry, nullptr);
  const int64_t t = param_index(p, "t5_table");
  ASSERT_GE(t, 0);
  ASSERT_EQ(p.params[t].sizes(), (std::vector<int64_t>{32, 2}));
  p.params[t] = -0.25 * torch::arange(32, kF64).unsqueeze(1) * torch::tensor({1.0, 2.0}, kF64);
  p.q.zero_(), p.k.zero_();
  const Tensor l = last_row_logits<Real>(p, kBucketDistances);
  const double tol = std::is_same_v<Real, float> ? 1e-4 : 1e-9;
  for (int64_t h = 0; h < 2; ++h)
    EXPECT_EQ(recovered_buckets(l[0][h], 0.25 * (h + 1), tol), spec_buckets(kBucketDistances))
        << "head " << h;
}
TEST(HandCheck, T5KernelBucketsF64) { t5_kernel_buckets<double>("t5"); }
TEST(HandCheck, T5KernelBucketsF32) { t5_kernel_buckets<float>("t5"); }
TEST(HandCheck, RopeT5KernelBucketsF64) { t5_kernel_buckets<double>("rope_t5"); }

// KERPLE, Delta = 0..3: log p = 1, a = 1: [0, -0.693147, -1.098612, -1.386294]; power a = 0.5,
// p = 1.5: [0, -0.5, -1.414214, -2.598076] (row 3, j = 3..0).
template <class Real> void kerple_rows(const std::string &enc, double p_value, double a_value,
                                       const std::vector<double> &by_distance, double tol) {
  SCOPED_TRACE(enc);
  Problem p = make_problem(enc, 1, 1, 4, 4, 33);
  ASSERT_NE(p.entry, nullptr);
  set_param(p, "kerple_p", p_value);
  set_param(p, "kerple_a", a_value);
  const Tensor row = bias_row3<Real>(p);
  expect_values(row.flip(0), by_distance, tol, enc + " B(Delta)");
}
TEST(HandCheck, KerpleLogRowF64) {
  kerple_rows<double>("kerple_log", 1.0, 1.0, {0, -0.693147, -1.098612, -1.386294}, 5e-7);
}
TEST(HandCheck, KerpleLogRowF32) {
  kerple_rows<float>("kerple_log", 1.0, 1.0, {0, -0.693147, -1.098612, -1.386294}, 5e-6);
}
TEST(HandCheck, KerplePowerRowF64) {
  kerple_rows<double>("kerple_power", 1.5, 0.5, {0, -0.5, -1.414214, -2.598076}, 5e-7);
}
TEST(HandCheck, KerplePowerRowF32) {
  kerple_rows<float>("kerple_power", 1.5, 0.5, {0, -0.5, -1.414214, -2.598076}, 5e-6);
}
// The clamps: p = 5 acts as 2 (power), p = a = -1 as 0.01, with zero gradient for the clamped
// values (kernel against the reference, which clamps the same way, and a direct value).
TEST(HandCheck, KerpleClamps) {
  Problem p = make_problem("kerple_power", 1, 1, 4, 4, 34);
  ASSERT_NE(p.entry, nullptr);
  set_param(p, "kerple_p", 5.0);
  set_param(p, "kerple_a", 0.5);
  expect_values(bias_row3<double>(p).flip(0), {0, -0.5, -2, -4.5}, 1e-12, "power, p = 5 -> 2");
  Problem q = make_problem("kerple_log", 1, 1, 4, 4, 35);
  ASSERT_NE(q.entry, nullptr);
  set_param(q, "kerple_p", -1.0);
  set_param(q, "kerple_a", -1.0);
  const std::vector<double> want = {0, -0.01 * std::log1p(0.01), -0.01 * std::log1p(0.02),
                                    -0.01 * std::log1p(0.03)};
  expect_values(bias_row3<double>(q).flip(0), want, 1e-12, "log, p = a = -1 -> 0.01");
  for (Problem *x : {&p, &q}) {
    Problem r = make_problem(x->enc, 2, 2, 9, 8, 36);
    for (size_t n = 0; n < r.params.size(); ++n) r.params[n] = x->params[n].expand({2}).clone();
    SCOPED_TRACE(r.enc + " at the clamps");
    check_against_reference(r);
    KernelCall<double> kc(r);
    kc.forward(), kc.backward();
    EXPECT_TRUE(all_zero(kc.dprm[param_index(r, "kerple_p")])) << "clamped p gets no gradient";
    if (x == &q) EXPECT_TRUE(all_zero(kc.dprm[param_index(r, "kerple_a")])) << "clamped a";
  }
}

// FIRE, i = 3, c = 0.1, L = 1 (512 L = 512): x = psi(Delta) / (psi(512) + 1e-6) =
// [0.066336, 0.046098, 0.024098, 0] (j = 0..3); with w1 = e_0, b1 = 0, w2[0, h] = 1 (other rows
// 0), b2 = 0 the bias is relu(x) = x.
template <class Real> void fire_row(double tol) {
  Problem p = make_problem("fire", 1, 1, 4, 4, 37);
  ASSERT_NE(p.entry, nullptr);
  set_param(p, "fire_c", 0.1);
  set_param(p, "fire_l_mult", 1.0);
  for (const char *name : {"fire_w1", "fire_b1", "fire_w2", "fire_b2"}) set_param(p, name, 0.0);
  p.params[param_index(p, "fire_w1")][0] = 1.0;
  p.params[param_index(p, "fire_w2")][0].fill_(1.0);
  expect_values(bias_row3<Real>(p), {0.066336, 0.046098, 0.024098, 0}, tol, "FIRE x, i = 3");
  // The reference's inputs (the same numbers).
  expect_values(ape_test::fire_inputs(4, torch::full({1}, 0.1, kF64), torch::ones({1}, kF64))[3],
                {0.066336, 0.046098, 0.024098, 0}, 5e-7, "reference x, i = 3");
}
TEST(HandCheck, FireNormalisedInputsF64) { fire_row<double>(5e-7); }
TEST(HandCheck, FireNormalisedInputsF32) { fire_row<float>(2e-6); }

// Bitwise-identical outputs and gradients (q, k, v and every param) for T5 and FIRE across two
// runs and across 1 vs 2 OpenMP threads, at a size where FIRE's max(i, 512 L) takes both branches
// (T = 600, L = 1: rows 513.. normalise by i) and every (b, h) contributes to the shared params.
template <class Real> void bias_determinism(const std::string &enc) {
  Problem p = make_problem(enc, 2, 4, 600, 16, case_seed("det_bias_" + enc, 2, 4, 600, 16));
  ASSERT_NE(p.entry, nullptr);
  if (enc == "fire") set_param(p, "fire_l_mult", 1.0);
  expect_deterministic<Real>(p, 2);
}
TEST(Determinism, T5F32) { bias_determinism<float>("t5"); }
TEST(Determinism, T5F64) { bias_determinism<double>("t5"); }
TEST(Determinism, FireF32) { bias_determinism<float>("fire"); }
TEST(Determinism, FireF64) { bias_determinism<double>("fire"); }

}  // namespace
