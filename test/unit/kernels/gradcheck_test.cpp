// Central finite differences of the fp64 kernel itself (harness.h: finite_difference_check) for
// every trainable encoding at T in {1, 5, 17}, D in {8, 16}, and also T = 40 for t5, shaw and
// deberta (past the exact buckets and Shaw's clip).
#include "harness.h"

namespace {

using namespace ape_test;

using GradCase = std::tuple<std::string, int64_t, int64_t>;  // enc, T, D
class KernelGradCheck : public ::testing::TestWithParam<GradCase> {};

// FIRE's hidden units are ReLUs of w1_k x_ij + b1_k: central differences straddling a kink
// (|w1_k x_ij + b1_k| < h |d/dtheta|) measure the average of two slopes (seen: fire, T = 17,
// D = 8, one pair at 1.5e-6 from the kink of unit 13). Moves b1_k by steps of 0.01 until every
// unit is at least 1e-3 from its kink on every pair (j <= i) of p.
void keep_fire_off_kinks(Problem &p) {
  if (p.enc != "fire") return;
  const Tensor x = ape_test::fire_inputs(p.T, p.params[param_index(p, "fire_c")],
                                         p.params[param_index(p, "fire_l_mult")]);
  const Tensor visible = x.masked_select(torch::ones({p.T, p.T}, torch::kBool).tril());
  Tensor &b1 = p.params[param_index(p, "fire_b1")];
  const Tensor &w1 = p.params[param_index(p, "fire_w1")];
  for (int64_t k = 0; k < b1.numel(); ++k)
    while ((visible * w1[k] + b1[k]).abs().min().item<double>() < 1e-3) b1[k] += 0.01;
}

TEST_P(KernelGradCheck, FiniteDifferences) {
  const auto &[enc, T, D] = GetParam();
  const int64_t B = 2, H = 2;
  Problem p = make_problem(enc, B, H, T, D, case_seed("fd_" + enc, B, H, T, D));
  ASSERT_NE(p.entry, nullptr);
  // Larger trainable params than in the grid so that their gradients matter at small T; the bias
  // encodings' params keep make_problem's values (already O(0.5..1); KERPLE's and FIRE's scalars
  // near their inits: N(0, 0.1) would put them on the clamps, where the gradient is zero).
  for (size_t n = 0; n < p.params.size(); ++n) {
    const ParamInfo &info = p.man.params[n];
    if (info.trainable && info.init != "constant" && info.init != "alibi_slopes" &&
        !bias_param_std(info.name))
      p.params[n] = torch::randn_like(p.params[n]) * 0.1;
  }
  keep_fire_off_kinks(p);
  finite_difference_check(p);
}

std::string grad_case_name(const ::testing::TestParamInfo<GradCase> &info) {
  const auto &[enc, T, D] = info.param;
  return enc + "_T" + std::to_string(T) + "_D" + std::to_string(D);
}

INSTANTIATE_TEST_SUITE_P(
    All, KernelGradCheck,
    ::testing::Combine(::testing::ValuesIn(trainable_encodings()), ::testing::Values<int64_t>(1, 5, 17),
                       ::testing::Values<int64_t>(8, 16)),
    grad_case_name);
// Deliberately a subset: the encodings with distance classes past T = 17, past the exact buckets (T5, DeBERTa: distances up to 39 reach bucket 20) and Shaw's clip at 32.
INSTANTIATE_TEST_SUITE_P(Long, KernelGradCheck,
                         ::testing::Combine(::testing::Values("t5", "shaw", "deberta"),
                                            ::testing::Values<int64_t>(40),
                                            ::testing::Values<int64_t>(8)),
                         grad_case_name);

}  // namespace
