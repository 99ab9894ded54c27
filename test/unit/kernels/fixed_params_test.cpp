// Fixed params ("rope_factor", "rope_original_length", "position_scale") are read at run time:
// neutral values give the base kernel, non-default values match the reference and central
// differences for every encoding with a fixed param; dynamic NTK follows the run-time length.
#include "harness.h"

namespace {

using namespace ape_test;

// Fixed params are read at run time: values that make an encoding reduce to another one give
// that one's kernel outputs (fp64, same inputs).
TEST(FixedParams, NeutralValuesGiveTheBaseKernel) {
  struct Case {
    std::string enc, base;
    std::map<std::string, double> fixed;
  };
  const std::vector<Case> cases = {
      {"rope_pi", "rope", {{"rope_factor", 1.0}}},
      {"rope_ntk", "rope", {{"rope_factor", 1.0}}},
      {"rope_yarn", "rope", {{"rope_factor", 1.0}, {"rope_original_length", 40.0}}},
      {"rope_dynamic_ntk", "rope", {{"rope_original_length", 1000.0}}},  // T <= L
      {"expe", "nope", {{"position_scale", 0.0}}},
      {"expe_qkv", "nope", {{"position_scale", 0.0}}},
      {"exqpe", "nope", {{"position_scale", 0.0}}},
      {"expe_cable", "cable", {{"position_scale", 0.0}}},
      {"rope_alibi", "rope", {{"alibi_slopes", 0.0}}},
      {"sinusoidal", "nope", {}},
      {"learned_absolute", "nope", {}},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.enc + " with its fixed params neutral == " + c.base);
    Problem p = make_problem(c.enc, 2, 3, 100, 32, case_seed("neutral_" + c.enc, 2, 3, 100, 32));
    ASSERT_NE(p.entry, nullptr);
    for (const auto &[name, value] : c.fixed) set_param(p, name, value);
    const Problem b = with_encoding(p, c.base);
    ASSERT_NE(b.entry, nullptr);
    expect_same_kernel_outputs(p, b, 1e-12);
    // ... and the default values differ from the base (the values are not compiled in).
    if (!c.fixed.empty() && c.enc != "rope_dynamic_ntk") {
      Problem d = make_problem(c.enc, 2, 3, 100, 32, case_seed("neutral_" + c.enc, 2, 3, 100, 32));
      KernelCall<double> x(d), y(b);
      x.forward(), y.forward();
      EXPECT_GT(normalised_error(x.o, y.o), 1e-6) << "default fixed params change nothing";
    }
  }
}

// Non-default values of the fixed params against the reference (fp32 and fp64) and against
// central differences (fp64): s = 2.5 and sigma = 0.5 everywhere; L = 40 with T = 100 and L = 4
// with T = 17, so the dynamic NTK base moves (T > L) and YaRN / Llama-3 get other ramps and bands
// (L = 4: YaRN's low == high case, every Llama-3 wavelength divided).
class FixedParamValues : public ::testing::TestWithParam<std::string> {};
TEST_P(FixedParamValues, MatchReference) {
  const std::string enc = GetParam();
  Problem p = make_problem(enc, 2, 3, 100, 32, case_seed("fixed_" + enc, 2, 3, 100, 32));
  ASSERT_NE(p.entry, nullptr);
  set_fixed_params(p, {{"rope_factor", 2.5}, {"rope_original_length", 40.0}, {"position_scale", 0.5}});
  check_against_reference(p);
}
TEST_P(FixedParamValues, FiniteDifferences) {
  const std::string enc = GetParam();
  Problem p = make_problem(enc, 2, 2, 17, 16, case_seed("fixed_fd_" + enc, 2, 2, 17, 16));
  ASSERT_NE(p.entry, nullptr);
  for (size_t n = 0; n < p.params.size(); ++n)
    if (p.man.params[n].trainable) p.params[n] = torch::randn_like(p.params[n]) * 0.1;
  set_fixed_params(p, {{"rope_factor", 2.5}, {"rope_original_length", 4.0}, {"position_scale", 0.5}});
  finite_difference_check(p);
}
INSTANTIATE_TEST_SUITE_P(All, FixedParamValues,
                         ::testing::ValuesIn(encodings_with_fixed_params()),
                         [](const ::testing::TestParamInfo<std::string> &info) {
                           return info.param;
                         });

// Dynamic NTK: one compiled kernel, two run-time lengths (L = 16, T = 32 and 64): each call
// matches the reference at its own l = T; the first 32 rows of the T = 64 call differ from the
// T = 32 call on the same tokens (a causal kernel of a length-independent encoding would repeat
// them), and both differ from RoPE; at T <= L the kernel is RoPE's.
TEST(DynamicNtk, OneKernelTwoRunTimeLengths) {
  Problem p64 = make_problem("rope_dynamic_ntk", 2, 2, 64, 32, 17);
  ASSERT_NE(p64.entry, nullptr);
  set_param(p64, "rope_original_length", 16.0);
  const Problem p32 = prefix(p64, 32);
  {
    SCOPED_TRACE("T = 32");
    check_against_reference(p32);
  }
  {
    SCOPED_TRACE("T = 64");
    check_against_reference(p64);
  }
  KernelCall<double> k64(p64), k32(p32);
  k64.forward(), k32.forward();
  EXPECT_GT(normalised_error(k64.o.narrow(2, 0, 32), k32.o), 1e-3)
      << "rows < 32 do not depend on the run-time length";
  for (const Problem *p : std::vector<const Problem *>{&p32, &p64}) {
    KernelCall<double> a(*p), r(with_encoding(*p, "rope"));
    a.forward(), r.forward();
    EXPECT_GT(normalised_error(a.o, r.o), 1e-3) << "T = " << p->T << " > L equals RoPE";
  }
  for (int64_t T : {7, 16}) {
    SCOPED_TRACE("T = " + std::to_string(T) + " <= L");
    const Problem p = prefix(p64, T);
    expect_same_kernel_outputs(p, with_encoding(p, "rope"), 1e-12);
  }
}

}  // namespace
