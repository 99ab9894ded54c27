// Edge cases of every trainable encoding: T = 1, tile boundaries, and determinism (two runs,
// 1 vs 2 OpenMP threads).
#include "harness.h"

namespace {

using namespace ape_test;

// T = 1: one visible key with weight 1, so o = v (+ a^V_0 for Shaw) and dv = dout (to 2 ulp);
// G = P (dP - Delta) = dout.v - dout.o vanishes up to the rounding of two length-D dot products,
// |G| <= 2 D eps max|dout| max|v| =: g, hence |dq| <= kappa g max|k'|, |dk| <= kappa g max|q'|
// (|q'|, |k'| <= 2 max(|q|, |k|) here: no rotation at n = 0, ExPE shifts of ~0.02);
// lse = kappa q'.k' + B_00 (checked against the reference to D eps) and every feature gradient
// is g - g = 0; param gradients are sums of B*H such dq', dk' terms or G times the O(1)
// derivatives of B_00 (T5's table entry, FIRE's MLP at x = 0, the relative rows' q'/sqrt(D)).
template <class Real> void single_token(const std::string &enc) {
  const int64_t B = 2, H = 3, D = 16;
  Problem p = make_problem(enc, B, H, 1, D, case_seed("t1_" + enc, B, H, 1, D));
  ASSERT_NE(p.entry, nullptr);
  KernelCall<Real> kc(p);
  kc.forward();
  kc.backward();
  const double eps = std::numeric_limits<Real>::epsilon();
  // Shaw's value term: o_0 = v_0 + a^V_0 (weight 1), d a^V_0 = sum_b dout_0, the other rows 0.
  const int64_t value_table = enc == "shaw" ? param_index(p, "shaw_value") : -1;
  Tensor shift = torch::zeros({1, H, 1, D}, kF64);
  if (value_table >= 0) {
    shift = p.params[value_table][0].view({1, H, 1, D});
    const Tensor dav = kc.dprm[value_table].to(torch::kFloat64);
    EXPECT_LE(max_abs_diff(dav[0], p.dout.sum(0).select(1, 0)), 2 * B * eps * max_abs(p.dout));
    EXPECT_TRUE(all_zero(dav.narrow(0, 1, dav.size(0) - 1))) << "d a^V_r, r > 0, at T = 1";
  }
  EXPECT_LE(max_abs_diff(kc.o, kc.v.to(torch::kFloat64) + shift),
            2 * eps * (max_abs(kc.v) + max_abs(shift)));
  EXPECT_LE(max_abs_diff(kc.dv, kc.dout), 2 * eps * max_abs(kc.dout));
  const RefOutputs ref = ape_test::reference_attention(enc, ref_inputs(p), Tensor());
  EXPECT_LE(max_abs_diff(kc.lse, ref.lse), 2 * D * eps * (1 + max_abs(ref.lse)));
  const double qk = 2 * std::max(max_abs(kc.q), max_abs(kc.k));
  const double g = 2 * D * eps * max_abs(kc.dout) * max_abs(kc.v);
  EXPECT_LE(max_abs(kc.dq), p.scale * g * qk);
  EXPECT_LE(max_abs(kc.dk), p.scale * g * qk);
  for (const auto &t : kc.dfeat) EXPECT_LE(max_abs(t), 2 * g);
  for (size_t n = 0; n < kc.dprm.size(); ++n)
    if (static_cast<int64_t>(n) != value_table)
      EXPECT_LE(max_abs(kc.dprm[n]), B * H * p.scale * g * qk) << p.man.params[n].name;
}
class Edge : public ::testing::TestWithParam<std::string> {};
TEST_P(Edge, SingleTokenF32) { single_token<float>(GetParam()); }
TEST_P(Edge, SingleTokenF64) { single_token<double>(GetParam()); }

// Tile boundaries around multiples of 64 (the kernels' tile size), against the reference; D = 40
// also takes the GEMM's remainder path (a block of 32 columns and one of 8).
TEST_P(Edge, TileBoundaries) {
  for (int64_t T : {63, 64, 65, 127, 128, 130, 191, 192}) {
    SCOPED_TRACE("T = " + std::to_string(T));
    check_against_reference(
        make_problem(GetParam(), 1, 2, T, 40, case_seed("tile_" + GetParam(), 1, 2, T, 40)));
  }
}

// Odd head dims: a rotation's last coordinate without a partner (passed through), the GEMM's odd
// remainders, the half-rotation table's odd-D form (cpu/attention.h), against the reference.
TEST_P(Edge, OddHeadDims) {
  for (const auto &[T, D] : {std::pair<int64_t, int64_t>{65, 7}, {130, 33}}) {
    SCOPED_TRACE("T = " + std::to_string(T) + ", D = " + std::to_string(D));
    check_against_reference(make_problem(GetParam(), 1, 2, T, D, case_seed("odd_" + GetParam(), 1, 2, T, D)));
  }
}

// Grouped-query attention (AttnArgs::kv_heads): k and v of 2 heads (groups of 2) and of 1 (one
// group of 4, multi-query), every trainable encoding's mods, features and params per query head,
// against the reference over k and v repeated to H heads (dk, dv summed per group), fp32 and fp64.
TEST_P(Edge, GroupedQueries) {
  const int64_t B = 2, H = 4, T = 70, D = 16;
  const Problem p = make_problem(GetParam(), B, H, T, D, case_seed("gqa_" + GetParam(), B, H, T, D));
  ASSERT_NE(p.entry, nullptr);
  for (int64_t kv : {2, 1}) {
    SCOPED_TRACE("kv_heads = " + std::to_string(kv));
    check_against_reference(grouped_queries(p, kv));
  }
  expect_deterministic<float>(grouped_queries(p, 1), 0);  // the group sums' fixed order
  // kv_heads must divide H: 3 of 4, and 4 key heads for 2 query heads, are refused.
  for (auto [h, kv] : {std::pair<int64_t, int64_t>{4, 3}, {2, 4}}) {
    KernelCall<double> kc(p);
    kc.args.H = h, kc.args.kv_heads = kv;
    EXPECT_THROW(kc.forward(), std::invalid_argument) << "H " << h << ", kv_heads " << kv;
    EXPECT_THROW(kc.backward(), std::invalid_argument) << "H " << h << ", kv_heads " << kv;
  }
}

// Two runs of forward + backward give bitwise-identical outputs and gradients, and so does a run
// with one OpenMP thread (the template reduces param gradients in a fixed (b, h) order).
template <class Real> void determinism(const std::string &enc) {
  const Problem p = make_problem(enc, 2, 3, 150, 32, case_seed("det_" + enc, 2, 3, 150, 32));
  ASSERT_NE(p.entry, nullptr);
  expect_deterministic<Real>(p, 0);
}
TEST_P(Edge, DeterministicF32) { determinism<float>(GetParam()); }
TEST_P(Edge, DeterministicF64) { determinism<double>(GetParam()); }

INSTANTIATE_TEST_SUITE_P(All, Edge, ::testing::ValuesIn(trainable_encodings()),
                         [](const ::testing::TestParamInfo<std::string> &info) {
                           return info.param;
                         });

}  // namespace
