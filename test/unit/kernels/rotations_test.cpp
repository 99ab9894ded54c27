// Hand-checkable values of the rotary and absolute encodings (the encodings spec), on the
// reference's pieces and recovered through the kernels: RoPE's rotation, the RoPE scalings (PI,
// NTK, dynamic NTK, YaRN, Llama-3) via the rotation angle of one coordinate pair read from the
// logits of key 0, interleaved pairs, xPos factors (and xPos at T = 16384 in fp32), the
// sinusoidal table via embed_table; the reference's neutral values and relativity; interleaved
// RoPE is rotate-half RoPE with permuted coordinates.
#include "harness.h"
#include "reference_lse.h"

namespace {

using namespace ape_test;

TEST(HandCheck, RopeReferenceRotation) {
  // Check (d=4, base 1e4, m=1, q=[1,2,3,4], theta=[1, 0.01]).
  auto x = torch::tensor({0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0}, kF64).view({2, 4});
  auto r = ape_test::rope_rotate_half(x);
  auto want = torch::tensor({-1.984111, 1.959901, 2.462378, 4.019800}, kF64);
  EXPECT_LT((r[1] - want).abs().max().item<double>(), 1e-6) << r[1];
  EXPECT_TRUE(torch::equal(r[0], x[0]));
  // Relativity: <R3 q, R1 k> = <R2 q, R0 k>.
  torch::manual_seed(7);
  auto q = torch::randn({1, 8}, kF64), k = torch::randn({1, 8}, kF64);
  auto qs = ape_test::rope_rotate_half(q.expand({4, 8}).contiguous());
  auto ks = ape_test::rope_rotate_half(k.expand({4, 8}).contiguous());
  EXPECT_NEAR((qs[3] * ks[1]).sum().item<double>(), (qs[2] * ks[0]).sum().item<double>(), 1e-12);
}

// RoPE through the kernel: batch c has T = 2, D = 4, q_1 = [1,2,3,4], k_0 = e_c, k_1 = 0,
// v_0 = e_0, v_1 = e_1. Row 1 has logits (kappa q'_1[c], 0), so q'_1[c] = log(o_10 / o_11) / kappa.
template <class Real> void rope_kernel_rotation(double tol) {
  Problem p = make_problem("rope", 4, 1, 2, 4, 1);
  ASSERT_NE(p.entry, nullptr);
  p.q.zero_(), p.k.zero_(), p.v.zero_();
  for (int64_t c = 0; c < 4; ++c) {
    p.q[c][0][1] = torch::tensor({1.0, 2.0, 3.0, 4.0}, kF64);
    p.k[c][0][0][c] = 1.0;
    p.v[c][0][0][0] = 1.0;
    p.v[c][0][1][1] = 1.0;
  }
  KernelCall<Real> kc(p);
  kc.forward();
  const Tensor o = kc.o.to(torch::kFloat64);
  std::vector<double> got;
  for (int64_t c = 0; c < 4; ++c)
    got.push_back(std::log(o[c][0][1][0].item<double>() / o[c][0][1][1].item<double>()) / p.scale);
  const std::vector<double> want = {-1.984111, 1.959901, 2.462378, 4.019800};
  for (int c = 0; c < 4; ++c) EXPECT_NEAR(got[c], want[c], tol) << "coordinate " << c;
  // Row 0 sees only key 0 (o_0 = v_0).
  for (int64_t c = 0; c < 4; ++c) EXPECT_NEAR(o[c][0][0][0].item<double>(), 1.0, tol);
}
TEST(HandCheck, RopeKernelRotationF64) { rope_kernel_rotation<double>(2e-6); }
TEST(HandCheck, RopeKernelRotationF32) { rope_kernel_rotation<float>(2e-5); }

// The spec's numbers on the reference's pieces (its values are rounded to 6 decimals: 5e-7).
TEST(HandCheck, RopeScalingReferenceValues) {
  using namespace ape_test;
  expect_values(rope_theta(4, 1e4), {1.0, 0.01}, 1e-15, "theta (d=4)");
  expect_values(rope_theta_pi(4, 1e4, 4.0), {0.25, 0.0025}, 1e-15, "PI theta (s=4)");
  EXPECT_NEAR(ntk_base(1e4, 4.0, 4), 160000.0, 1e-9);
  expect_values(rope_theta(4, ntk_base(1e4, 4.0, 4)), {1.0, 0.0025}, 1e-15, "NTK theta");
  EXPECT_NEAR(dynamic_ntk_base(1e4, 4.0, 2048, 4096, 4), 250000.0, 1e-9);
  EXPECT_NEAR(dynamic_ntk_base(1e4, 4.0, 2048, 8192, 4), 1.69e6, 1e-8);
  expect_values(rope_theta(4, dynamic_ntk_base(1e4, 4.0, 2048, 4096, 4)), {1.0, 0.002}, 1e-15,
                "dynamic NTK theta at l = 4096");
  expect_values(rope_theta(4, dynamic_ntk_base(1e4, 4.0, 2048, 8192, 4)), {1.0, 0.000769}, 5e-7,
                "dynamic NTK theta at l = 8192");
  // Up to the original length it is plain RoPE: l = max(T, L) = L gives base' = base.
  EXPECT_EQ(dynamic_ntk_base(1e4, 4.0, 2048, 1000, 4), 1e4);
  EXPECT_EQ(dynamic_ntk_base(1e4, 4.0, 2048, 2048, 4), 1e4);
  expect_values(rope_theta_yarn(4, 1e4, 4.0, 2048), {1.0, 0.00625}, 1e-15, "YaRN theta");
  EXPECT_NEAR(yarn_mscale(4.0), 1.138629, 5e-7);
  EXPECT_NEAR(yarn_mscale(4.0) * yarn_mscale(4.0), 1.296477, 5e-7);
  EXPECT_EQ(yarn_mscale(1.0), 1.0);
  EXPECT_EQ(yarn_mscale(0.5), 1.0);
  expect_values(rope_theta(4, 5e5), {1.0, 0.00141421}, 5e-9, "Llama-3 base theta");
  expect_values(rope_theta_llama3(4, 5e5, 8.0, 8192), {1.0, 0.000525}, 5e-7, "Llama-3 theta");
  // The bands: with L = 8192 wavelengths below 2048 are kept, above 8192 divided by 8.
  auto th = rope_theta(64, 5e5), th3 = rope_theta_llama3(64, 5e5, 8.0, 8192);
  auto lambda = 2 * M_PI / th;
  EXPECT_TRUE(torch::equal(th3.masked_select(lambda < 2048), th.masked_select(lambda < 2048)));
  EXPECT_TRUE(torch::allclose(th3.masked_select(lambda > 8192), th.masked_select(lambda > 8192) / 8,
                              1e-15, 0));
}

TEST(HandCheck, InterleavedAndPartialReferenceRotation) {
  using namespace ape_test;
  // Check (d=4, base 1e4, m=1, q=[1,2,3,4], theta=[1, 0.01]), interleaved pairs.
  auto x = torch::tensor({0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0}, kF64).view({2, 4});
  auto r = rope_rotate(x, rope_theta(4, 1e4), Pairing::Interleaved);
  expect_values(r[1], {-1.142640, 1.922076, 2.959851, 4.029800}, 1e-6, "interleaved q'");
  // Partial rotary (fraction 0.5, D = 8: d_r = 4): rotate-half on the first 4 coordinates with
  // theta = [1, 0.01] (the d=4 check), the last 4 pass through.
  EXPECT_EQ(rotary_dims(8, 0.5), 4);
  EXPECT_EQ(rotary_dims(10, 0.5), 4);
  auto y = torch::tensor({0., 0., 0., 0., 0., 0., 0., 0., 1., 2., 3., 4., 5., 6., 7., 8.}, kF64)
               .view({2, 8});
  auto ry = rope_rotate(y, rope_theta(rotary_dims(8, 0.5), 1e4), Pairing::Half);
  expect_values(ry[1], {-1.984111, 1.959901, 2.462378, 4.019800, 5, 6, 7, 8}, 1e-6, "partial q'");
}

TEST(HandCheck, XposReferenceFactors) {
  using namespace ape_test;
  expect_values(xpos_zeta(4), {0.285714, 0.642857}, 5e-7, "zeta (d_h=4)");
  expect_values(torch::pow(xpos_zeta(4), 3.0 / 512), {0.992686, 0.997414}, 5e-7, "m-n=3 factor");
  // Through the per-token factors: q at m = 5 and k at n = 2 (T = 8, centred at 4).
  auto f = xpos_factors(8, 4, +1)[5] * xpos_factors(8, 4, -1)[2];
  expect_values(f, {0.992686, 0.992686, 0.997414, 0.997414}, 5e-7, "per-coordinate factor");
  EXPECT_TRUE(torch::allclose(xpos_factors(8, 4, +1)[4], torch::ones({4}, kF64), 0, 0));
}

TEST(HandCheck, SinusoidalReferenceTable) {
  auto pe = ape_test::sinusoidal_table(3, 4);
  expect_values(pe[0], {0, 1, 0, 1}, 0, "PE[0]");
  expect_values(pe[1], {0.841471, 0.540302, 0.010000, 0.999950}, 5e-7, "PE[1]");
  expect_values(pe[2], {0.909297, -0.416147, 0.019999, 0.999800}, 5e-7, "PE[2]");
}

// The reference against itself (no kernel): neutral values of the new encodings' params reduce
// them to the base encodings, and the rotations keep the logits relative (q at m, k at n depend
// on m - n only).
TEST(HandCheck, ReferenceNeutralValuesAndRelativity) {
  const int64_t B = 2, H = 3, T = 50, D = 16;
  torch::manual_seed(23);
  RefInputs in;
  in.q = torch::randn({B, H, T, D}, kF64), in.k = torch::randn({B, H, T, D}, kF64);
  in.v = torch::randn({B, H, T, D}, kF64), in.scale = 0.25;
  in.features = {torch::randn({B, H, T}, kF64)};
  auto one = [](double x) { return torch::full({1}, x, kF64); };
  auto rand_hd = [&]() { return torch::randn({H, D}, kF64) * 0.1; };
  auto o_of = [&](const std::string &enc, const std::map<std::string, Tensor> &params) {
    RefInputs r = in;
    r.params = params;
    return ape_test::reference_attention(enc, r, Tensor()).o;
  };
  const Tensor rope = o_of("rope", {}), nope = o_of("nope", {}), cable = o_of("cable", {});
  auto same = [](const Tensor &a, const Tensor &b) { return normalised_error(a, b); };
  EXPECT_LE(same(o_of("rope_pi", {{"rope_factor", one(1)}}), rope), 1e-14);
  EXPECT_LE(same(o_of("rope_ntk", {{"rope_factor", one(1)}}), rope), 1e-14);
  EXPECT_LE(same(o_of("rope_yarn", {{"rope_factor", one(1)}, {"rope_original_length", one(40)}}),
                 rope), 1e-14);
  EXPECT_LE(same(o_of("rope_dynamic_ntk",
                      {{"rope_factor", one(4)}, {"rope_original_length", one(T)}}), rope), 1e-14);
  EXPECT_GT(same(o_of("rope_dynamic_ntk",
                      {{"rope_factor", one(4)}, {"rope_original_length", one(T - 1)}}), rope),
            1e-6);
  EXPECT_LE(same(o_of("rope_alibi", {{"alibi_slopes", torch::zeros({H}, kF64)}}), rope), 1e-14);
  EXPECT_LE(same(o_of("sinusoidal", {}), nope), 0);
  EXPECT_LE(same(o_of("learned_absolute", {}), nope), 0);
  const std::map<std::string, Tensor> expe_params = {
      {"override_q_a", rand_hd()}, {"override_q_b", rand_hd()}, {"override_k_a", rand_hd()},
      {"override_k_b", rand_hd()}, {"position_scale", one(0)}};
  EXPECT_LE(same(o_of("expe", expe_params), nope), 1e-14);
  EXPECT_LE(same(o_of("expe_qkv", expe_params), nope), 1e-14);
  EXPECT_LE(same(o_of("expe_cable", expe_params), cable), 1e-14);
  auto exqpe_params = expe_params;
  exqpe_params["override_q_p"] = torch::randn({16, H, D}, kF64);
  exqpe_params["override_k_p"] = torch::randn({16, H, D}, kF64);
  EXPECT_LE(same(o_of("exqpe", exqpe_params), nope), 1e-14);
  // sigma scales the whole term: ExQPE with sigma = 0.5 equals sigma = 1 with halved a, b, P.
  auto half = exqpe_params, halved = exqpe_params;
  half["position_scale"] = one(0.5), halved["position_scale"] = one(1);
  for (const char *n : {"override_q_a", "override_q_b", "override_q_p", "override_k_a",
                        "override_k_b", "override_k_p"})
    halved[n] = 0.5 * exqpe_params[n];
  EXPECT_LE(same(o_of("exqpe", half), o_of("exqpe", halved)), 1e-14);
  // Relativity: q'_m . k'_n of every rotary encoding depends on m - n only (xPos with its
  // factors too): q, k the same vectors at every position.
  RefInputs rel = in;
  rel.q = torch::randn({1, 1, 1, D}, kF64).expand({1, 1, T, D}).contiguous();
  rel.k = torch::randn({1, 1, 1, D}, kF64).expand({1, 1, T, D}).contiguous();
  rel.params = {{"rope_factor", one(2.5)}, {"rope_original_length", one(20)}};
  for (const char *enc : {"rope_interleaved", "rope_partial", "rope_pi", "rope_ntk",
                          "rope_dynamic_ntk", "rope_yarn", "rope_llama3", "xpos"}) {
    const auto [qr, kr] = ape_test::reference_qk(enc, rel);
    auto dot = [&](int64_t m, int64_t n) { return (qr[0][0][m] * kr[0][0][n]).sum().item<double>(); };
    EXPECT_NEAR(dot(30, 10), dot(20, 0), 1e-12) << enc;
    EXPECT_NEAR(dot(49, 7), dot(42, 0), 1e-12) << enc;
  }
}

// Rotation of coordinate pairs read through the kernel: for each (first, second) pair, every row
// i has q_i = e_first and key 0 is k_0 = e_first or e_second, so l_i0 / kappa =
// g_i (cos(i theta'), sin(i theta')) where g_i is what scales q'_i . k'_0 beyond the rotation
// (YaRN's mscale^2, xPos's zeta^(i/B)). Returns the angles and magnitudes [pairs, T].
template <class Real>
std::pair<Tensor, Tensor> pair_rotations(const std::string &enc, int64_t T, int64_t D,
                                         const std::vector<std::pair<int64_t, int64_t>> &pairs,
                                         const std::map<std::string, double> &fixed) {
  const int64_t np = static_cast<int64_t>(pairs.size());
  Problem p = make_problem(enc, 2 * np, 1, T, D, 21);
  if (!p.entry) return {torch::full({np, T}, NAN, kF64), torch::full({np, T}, NAN, kF64)};
  for (const auto &[name, value] : fixed) set_param(p, name, value);
  p.q.zero_(), p.k.zero_();
  for (int64_t c = 0; c < np; ++c) {
    const auto [first, second] = pairs[c];
    p.q.select(0, 2 * c).select(-1, first).fill_(1.0);
    p.q.select(0, 2 * c + 1).select(-1, first).fill_(1.0);
    p.k[2 * c][0][0][first] = 1.0;
    p.k[2 * c + 1][0][0][second] = 1.0;
  }
  const Tensor l = (key0_logits<Real>(p) / p.scale).view({np, 2, T});
  const Tensor cosine = l.select(1, 0), sine = l.select(1, 1);
  return {torch::atan2(sine, cosine), torch::sqrt(cosine * cosine + sine * sine)};
}

std::vector<std::pair<int64_t, int64_t>> half_pairs(int64_t d_r) {
  std::vector<std::pair<int64_t, int64_t>> r;
  for (int64_t k = 0; k < d_r / 2; ++k) r.push_back({k, k + d_r / 2});
  return r;
}
std::vector<std::pair<int64_t, int64_t>> interleaved_pairs(int64_t d_r) {
  std::vector<std::pair<int64_t, int64_t>> r;
  for (int64_t k = 0; k < d_r / 2; ++k) r.push_back({2 * k, 2 * k + 1});
  return r;
}

// theta'_k recovered as angle(m_k) / m_k at the row m_k = min(T-1, floor(1/want_k)) (angle <= 1
// rad: no wrap, and the long lever divides the probe's noise by m_k), checked against the spec's
// want_k to `rounding` (5e-7 for its 6-decimal numbers, 0 for exact ones) + noise / m_k.
template <class Real>
Tensor kernel_frequencies(const std::string &enc, int64_t T, int64_t D,
                          const std::map<std::string, double> &fixed,
                          const std::vector<double> &want, double rounding,
                          Tensor *magnitude = nullptr) {
  SCOPED_TRACE(enc + " at T = " + std::to_string(T));
  auto [angle, mag] = pair_rotations<Real>(enc, T, D, half_pairs(D), fixed);
  std::vector<double> theta;
  for (size_t k = 0; k < want.size(); ++k) {
    const int64_t m = std::clamp<int64_t>(static_cast<int64_t>(1.0 / want[k]), 1, T - 1);
    theta.push_back(angle[k][m].template item<double>() / static_cast<double>(m));
    EXPECT_NEAR(theta.back(), want[k], rounding + probe_noise<Real>() / static_cast<double>(m))
        << "theta'_" << k << " (from row " << m << ")";
  }
  if (magnitude) *magnitude = mag;
  return torch::tensor(theta, kF64);
}

template <class Real> void rope_pi_kernel() {
  // d=4, s=4: theta' = [0.25, 0.0025].
  kernel_frequencies<Real>("rope_pi", 401, 4, {{"rope_factor", 4.0}}, {0.25, 0.0025}, 0);
}
TEST(HandCheck, RopePiKernelFrequenciesF64) { rope_pi_kernel<double>(); }
TEST(HandCheck, RopePiKernelFrequenciesF32) { rope_pi_kernel<float>(); }

template <class Real> void rope_ntk_kernel(double base_rel_tol) {
  // d=4, s=4: base' = 160000, theta' = [1, 0.0025]; for d_r = 4, base' = theta'_1^-2.
  auto th = kernel_frequencies<Real>("rope_ntk", 401, 4, {{"rope_factor", 4.0}}, {1.0, 0.0025}, 0);
  const double base = std::pow(th[1].template item<double>(), -2.0);
  EXPECT_NEAR(base / 160000.0, 1.0, base_rel_tol) << "base' = " << base;
}
TEST(HandCheck, RopeNtkKernelBaseF64) { rope_ntk_kernel<double>(1e-9); }
TEST(HandCheck, RopeNtkKernelBaseF32) { rope_ntk_kernel<float>(1e-5); }

template <class Real> void rope_yarn_kernel() {
  // d=4, L=2048, s=4: theta' = [1, 0.00625], logits scaled by mscale^2 = 1.296477 (every row).
  Tensor mag;
  kernel_frequencies<Real>("rope_yarn", 161, 4,
                           {{"rope_factor", 4.0}, {"rope_original_length", 2048.0}},
                           {1.0, 0.00625}, 0, &mag);
  EXPECT_LT((mag - 1.296477).abs().max().item<double>(), 5e-7 + probe_noise<Real>())
      << "logit factor";
}
TEST(HandCheck, RopeYarnKernelFrequenciesF64) { rope_yarn_kernel<double>(); }
TEST(HandCheck, RopeYarnKernelFrequenciesF32) { rope_yarn_kernel<float>(); }

template <class Real> void rope_llama3_kernel() {
  // d=4, L=8192, factor 8, base 5e5: theta' = [1, 0.000525].
  kernel_frequencies<Real>("rope_llama3", 1905, 4,
                           {{"rope_factor", 8.0}, {"rope_original_length", 8192.0}},
                           {1.0, 0.000525}, 5e-7);
}
TEST(HandCheck, RopeLlama3KernelFrequenciesF64) { rope_llama3_kernel<double>(); }
TEST(HandCheck, RopeLlama3KernelFrequenciesF32) { rope_llama3_kernel<float>(); }

template <class Real> void rope_dynamic_ntk_kernel() {
  // d=4, s=4, L=2048, one kernel at three run-time lengths: l = T = 4096 -> theta'_1 = 0.002,
  // l = T = 8192 -> 0.000769; T = 2048 <= L -> plain RoPE, 0.01.
  const std::map<std::string, double> fixed = {{"rope_factor", 4.0},
                                               {"rope_original_length", 2048.0}};
  kernel_frequencies<Real>("rope_dynamic_ntk", 4096, 4, fixed, {1.0, 0.002}, 0);
  kernel_frequencies<Real>("rope_dynamic_ntk", 8192, 4, fixed, {1.0, 0.000769}, 5e-7);
  kernel_frequencies<Real>("rope_dynamic_ntk", 2048, 4, fixed, {1.0, 0.01}, 0);
}
TEST(HandCheck, RopeDynamicNtkKernelFrequenciesF64) { rope_dynamic_ntk_kernel<double>(); }
TEST(HandCheck, RopeDynamicNtkKernelFrequenciesF32) { rope_dynamic_ntk_kernel<float>(); }

template <class Real> void xpos_kernel() {
  // d_h=4: q'_m . k'_n of pair k scales by zeta_k^((m-n)/512); m-n=3: [0.992686, 0.997414];
  // the rotation is interleaved RoPE (angle 3 theta_k, theta = [1, 0.01]).
  const int64_t T = 8;
  auto [angle, mag] = pair_rotations<Real>("xpos", T, 4, interleaved_pairs(4), {});
  expect_values(mag.select(1, 3), {0.992686, 0.997414}, 5e-7 + probe_noise<Real>(),
                "xPos factor, m-n=3");
  expect_values(angle.select(1, 3), {3.0, 0.03}, probe_noise<Real>(), "xPos angle, m-n=3");
  // Every row i (key 0): zeta^(i/512), whatever the centring.
  auto want = torch::pow(ape_test::xpos_zeta(4).unsqueeze(1),
                         torch::arange(T, kF64).unsqueeze(0) / 512.0);
  EXPECT_LT((mag - want).abs().max().template item<double>(), probe_noise<Real>()) << mag;
}
TEST(HandCheck, XposKernelFactorsF64) { xpos_kernel<double>(); }
TEST(HandCheck, XposKernelFactorsF32) { xpos_kernel<float>(); }

// Interleaved RoPE through the kernel: batch c has T = 2, D = 4, q_1 = [1,2,3,4], k_0 = e_c, so
// l_10 = kappa q'_1[c].
template <class Real> void interleaved_kernel_rotation() {
  Problem p = make_problem("rope_interleaved", 4, 1, 2, 4, 1);
  ASSERT_NE(p.entry, nullptr);
  p.q.zero_(), p.k.zero_();
  for (int64_t c = 0; c < 4; ++c) {
    p.q[c][0][1] = torch::tensor({1.0, 2.0, 3.0, 4.0}, kF64);
    p.k[c][0][0][c] = 1.0;
  }
  const Tensor l = key0_logits<Real>(p) / p.scale;
  expect_values(l.select(-1, 1).flatten(), {-1.142640, 1.922076, 2.959851, 4.029800},
                5e-7 + probe_noise<Real>(), "interleaved q'_1");
}
TEST(HandCheck, InterleavedKernelRotationF64) { interleaved_kernel_rotation<double>(); }
TEST(HandCheck, InterleavedKernelRotationF32) { interleaved_kernel_rotation<float>(); }

// The sinusoidal table through entry->embed_table: d=4, PE[1], PE[2]; then whole tables against
// the reference (every element written, nothing past T*d).
TEST(HandCheck, SinusoidalEmbedTable) {
  const ape::KernelEntry *e = find_entry("sinusoidal");
  ASSERT_NE(e, nullptr);
  const auto fn = e->embed_table;
  ASSERT_NE(fn, nullptr) << "sinusoidal's embed_table is null";
  auto table = [&](int64_t T, int64_t d) {
    std::vector<double> out(T * d + 1, std::numeric_limits<double>::quiet_NaN());
    out.back() = 12345.0;  // sentinel past the end
    fn(T, d, out.data());
    EXPECT_EQ(out.back(), 12345.0) << "embed_table wrote past T*d (" << T << ", " << d << ")";
    out.pop_back();
    return torch::tensor(out, kF64).view({T, d});
  };
  const Tensor pe = table(3, 4);
  expect_values(pe[0], {0, 1, 0, 1}, 1e-15, "PE[0]");
  expect_values(pe[1], {0.841471, 0.540302, 0.010000, 0.999950}, 5e-7, "PE[1]");
  expect_values(pe[2], {0.909297, -0.416147, 0.019999, 0.999800}, 5e-7, "PE[2]");
  for (auto [T, d] : std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {7, 6}, {1000, 128}, {64, 512}}) {
    const Tensor got = table(T, d);
    EXPECT_LT((got - ape_test::sinusoidal_table(T, d)).abs().max().item<double>(), 1e-12)
        << "T = " << T << ", d = " << d;
  }
}

// Interleaved pairs are rotate-half pairs in another coordinate order: with
// x_int[2k] = x_half[k], x_int[2k+1] = x_half[k + D/2] for q and k, rope_interleaved's logits equal
// rope's, so o, lse and dv agree and dq, dk agree after the same permutation.
TEST(EdgeIdentity, InterleavedIsRopeWithPermutedCoordinates) {
  const int64_t D = 32;
  Problem half = make_problem("rope", 2, 3, 100, D, 13);
  ASSERT_NE(half.entry, nullptr);
  Problem inter = with_encoding(half, "rope_interleaved");
  ASSERT_NE(inter.entry, nullptr);
  std::vector<int64_t> perm(D);  // interleaved coordinate -> rotate-half coordinate
  for (int64_t k = 0; k < D / 2; ++k) perm[2 * k] = k, perm[2 * k + 1] = k + D / 2;
  const Tensor idx = torch::tensor(perm, torch::TensorOptions().dtype(torch::kLong));
  inter.q = half.q.index_select(-1, idx).contiguous();
  inter.k = half.k.index_select(-1, idx).contiguous();
  KernelCall<double> a(half), b(inter);
  a.forward(), a.backward(), b.forward(), b.backward();
  EXPECT_LE(normalised_error(b.o, a.o), 1e-12);
  EXPECT_LE(normalised_error(b.lse, a.lse), 1e-12);
  EXPECT_LE(normalised_error(b.dv, a.dv), 1e-12);
  EXPECT_LE(normalised_error(b.dq, a.dq.index_select(-1, idx)), 1e-12);
  EXPECT_LE(normalised_error(b.dk, a.dk.index_select(-1, idx)), 1e-12);
}

// xPos at T = 16384 in fp32 (B = H = 1, D = 16): the centred factors zeta^(+-t_c/512) stay
// within [zeta_0^16, zeta_0^-16] = [2e-9, 5e8], so o and lse are finite; fp32 against fp64 and
// both against the reference on a few rows (computed from the reference's q', k' row by row).

// xPos at T = 16384 (XposLong): fp32 against fp64 and the reference rows (normalised error of o
// and lse): measured 3.4e-6 -> 5e-5.
constexpr double kXposLongTol = 5e-5;

TEST(XposLong, T16384Fp32) {
  const int64_t T = 16384, D = 16;
  const Problem p = make_problem("xpos", 1, 1, T, D, 19);
  ASSERT_NE(p.entry, nullptr);
  KernelCall<float> f(p);
  KernelCall<double> d(p);
  f.forward(), d.forward();
  EXPECT_TRUE(torch::isfinite(f.o).all().item<bool>()) << "fp32 o not finite";
  EXPECT_TRUE(torch::isfinite(f.lse).all().item<bool>()) << "fp32 lse not finite";
  const double err_o = normalised_error(f.o, d.o), err_lse = normalised_error(f.lse, d.lse);
  auto &s = error_stats()["fp32/xpos/T16384 o,lse vs fp64"];
  if (!(std::max(err_o, err_lse) <= s.first)) s = {std::max(err_o, err_lse), current_test_name()};
  EXPECT_LE(err_o, kXposLongTol) << "fp32 vs fp64 o";
  EXPECT_LE(err_lse, kXposLongTol) << "fp32 vs fp64 lse";
  RefInputs in = ref_inputs(p);
  const auto [qr, kr] = ape_test::reference_qk("xpos", in);
  for (int64_t i : {int64_t(0), int64_t(1), T / 2 - 1, T / 2, T - 2, T - 1}) {
    SCOPED_TRACE("row " + std::to_string(i));
    auto logits = torch::matmul(kr[0][0].narrow(0, 0, i + 1), qr[0][0][i]) * p.scale;  // [i+1]
    auto o = torch::matmul(torch::softmax(logits, 0), p.v[0][0].narrow(0, 0, i + 1));
    const double lse = ape_test::reference_logsumexp(logits).item<double>();
    EXPECT_LE(normalised_error(d.o[0][0][i], o), 1e-10);
    EXPECT_NEAR(d.lse[0][0][i].item<double>(), lse, 1e-10 * std::max(1.0, std::abs(lse)));
    EXPECT_LE(normalised_error(f.o[0][0][i], o), kXposLongTol);
  }
}

}  // namespace
