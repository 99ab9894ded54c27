// ape-check's comparisons (runtime/SpecCheck.h) with kernels that are wrong in one part only: the
// decode rows must fail where the KV-cache decode steps are not the spec's, while every row of the
// forward and backward still passes (the same kernel entry otherwise).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include "ape/cpu/kernel_entry.h"
#include "runtime/Registry.h"
#include "runtime/SpecCheck.h"

#include <ATen/CPUGeneratorImpl.h>
#include <cmath>
#include <limits>

namespace {

// apec --emit=reference of examples/encodings/nope.mlir.
const char *kNopeReference = R"({"causal": true, "embedding": null, "encoding": "nope", "features": [],
  "format": "ape-reference/1", "k_mods": [], "params": [], "q_mods": [], "rel_rows": [], "scale": null,
  "score_mods": [], "source": "nope.mlir", "tokens": [], "transition": null, "value_rows": null})";

ape::CheckOptions small_grid() {
  ape::CheckOptions o;
  o.grid = {{1, 1, 1, 16}, {2, 2, 70, 16}};
  return o;
}

int failed_rows(const ape::CheckReport &r, const std::string &prefix, std::string *note = nullptr) {
  int n = 0;
  for (const auto &row : r.rows)
    if (!row.pass && row.quantity.rfind(prefix, 0) == 0) {
      ++n;
      if (note) *note = row.note;
    }
  return n;
}

TEST(SpecCheck, DecodeRowsPassForTheKernelsOwnDecodeSteps) {
  const auto ref = ape::SpecReference::parse(kNopeReference, "nope");
  const ape::CheckReport r = ape::check_kernel(ape::find_kernel("nope"), ref, small_grid());
  EXPECT_TRUE(r.passed());
  int decode_rows = 0;
  for (const auto &row : r.rows) decode_rows += row.quantity.rfind("decode:", 0) == 0;
  EXPECT_EQ(decode_rows, 4);  // o and lse, fp64 and fp32
}

TEST(SpecCheck, DecodeRowsFailWhereOnlyTheDecodeStepsAreWrong) {
  const auto ref = ape::SpecReference::parse(kNopeReference, "nope");
  ape::KernelEntry wrong = ape::find_kernel("nope");
  wrong.decode = ape::find_kernel("rope").decode;  // another encoding's steps: q and k rotated
  const ape::CheckReport r = ape::check_kernel(wrong, ref, small_grid());
  EXPECT_FALSE(r.passed());
  std::string note;
  EXPECT_EQ(failed_rows(r, "decode:o", &note), 2);  // fp64 and fp32
  EXPECT_NE(note.find("decode steps of 35+1+1+33 tokens"), std::string::npos) << note;
  EXPECT_EQ(failed_rows(r, "grouped-decode:o"), 2);  // the grouped cell's steps too
  int others = 0;
  for (const auto &row : r.rows)
    others += !row.pass && row.quantity.rfind("decode:", 0) != 0 && row.quantity.rfind("grouped-decode:", 0) != 0;
  EXPECT_EQ(others, 0);

  wrong.decode = nullptr;  // no decode steps at all: said so, not skipped
  const ape::CheckReport none = ape::check_kernel(wrong, ref, small_grid());
  EXPECT_EQ(failed_rows(none, "decode:", &note), 2);
  EXPECT_NE(note.find("the kernel has no fp64 and fp32 decode steps"), std::string::npos) << note;

  ape::CheckOptions off = small_grid();  // ape-check --no-decode
  off.decode = false;
  EXPECT_TRUE(ape::check_kernel(wrong, ref, off).passed());
}

// NoPE's fp64 forward with its groups tiled (query head h reading key head h mod H_kv instead of
// h / (H / H_kv)); every other call as the kernel's.
void tiled_groups_forward_f64(const ape::AttnArgs<double> &a) {
  const ape::KernelEntry &nope = ape::find_kernel("nope");
  if (a.kv_heads == 0) return nope.forward_f64(a);
  const int64_t rows = a.T * a.D;
  std::vector<double> k(static_cast<size_t>(a.B * a.H * rows)), v(k.size());
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t h = 0; h < a.H; ++h) {
      const int64_t from = (b * a.kv_heads + h % a.kv_heads) * rows, to = (b * a.H + h) * rows;
      std::copy(a.k + from, a.k + from + rows, k.begin() + to);
      std::copy(a.v + from, a.v + from + rows, v.begin() + to);
    }
  ape::AttnArgs<double> t = a;
  t.kv_heads = 0, t.k = k.data(), t.v = v.data();
  nope.forward_f64(t);
}

// The grouped rows fail where a kernel reads the wrong key head, and only they.
TEST(SpecCheck, GroupedRowsFailWhereTheGroupsAreWrong) {
  const auto ref = ape::SpecReference::parse(kNopeReference, "nope");
  ape::KernelEntry wrong = ape::find_kernel("nope");
  wrong.forward_f64 = &tiled_groups_forward_f64;
  ape::CheckOptions o = small_grid();
  o.decode = false;
  const ape::CheckReport r = ape::check_kernel(wrong, ref, o);
  EXPECT_EQ(failed_rows(r, "grouped:o"), 1);  // fp64 (the fp32 forward is the kernel's)
  int others = 0;
  for (const auto &row : r.rows) others += !row.pass && row.quantity.rfind("grouped:", 0) != 0;
  EXPECT_EQ(others, 0);
  bool grouped_cell = false;  // the small grid's 2 heads tripled, k and v of 2 (groups of 3)
  for (const auto &row : r.rows) grouped_cell |= row.quantity == "grouped:o" && row.shape == "2x6x70x16 kv2";
  EXPECT_TRUE(grouped_cell);
}

// The central differences (Richardson-extrapolated, with L's rounding in their tolerance) still
// catch a backward that is not the forward's: nope's forward with rope's backward fails every fd row.
TEST(SpecCheck, FiniteDifferencesCatchABackwardThatIsNotTheForwards) {
  const auto ref = ape::SpecReference::parse(kNopeReference, "nope");
  ape::KernelEntry wrong = ape::find_kernel("nope");
  wrong.backward_f64 = ape::find_kernel("rope").backward_f64;
  wrong.backward_f32 = ape::find_kernel("rope").backward_f32;
  ape::CheckOptions o = small_grid();
  o.decode = false;
  const ape::CheckReport r = ape::check_kernel(wrong, ref, o);
  EXPECT_EQ(failed_rows(r, "fd:"), 3);  // q, k and v (rope's P differs from nope's)
  EXPECT_EQ(failed_rows(r, "o"), 0);
}

// The CUDA decode rows' plumbing (ape-check --cuda: CheckOptions::cuda_decode, the emulated
// decode steps in ape-check): here the "CUDA" forward is the CPU kernel (use_kernels does nothing)
// and the decode steps are stand-ins: a materialised causal attention passes, zeros fail both rows,
// a step that throws fails with its message.
TEST(SpecCheck, CudaDecodeRowsJudgeWhatTheDecodeStepsReturn) {
  const auto ref = ape::SpecReference::parse(kNopeReference, "nope");
  ape::CheckOptions o = small_grid();
  o.cuda_dtypes = {"f32"}, o.cuda_head_dims = {16};
  o.use_kernels = [](const std::string &) {};
  using Steps = std::vector<int64_t>;
  auto exact = [](const std::string &, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                  const std::vector<at::Tensor> &, const std::vector<at::Tensor> &, double scale,
                  const Steps &, int) {
    const int64_t T = q.size(2);
    const at::Tensor mask = at::ones({T, T}, at::kBool).tril().logical_not();
    const at::Tensor s = at::matmul(q, k.transpose(2, 3)).mul(scale).masked_fill(mask, -INFINITY);
    return std::make_pair(at::matmul(at::softmax(s, -1), v).to(at::kFloat), at::logsumexp(s, -1).to(at::kFloat));
  };
  std::vector<std::pair<std::string, int>> calls;  // (dtype, num_splits) of every call
  o.cuda_decode = [&](const std::string &d, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                      const std::vector<at::Tensor> &f, const std::vector<at::Tensor> &p, double scale,
                      const Steps &st, int splits) {
    calls.emplace_back(d, splits);
    return exact(d, q, k, v, f, p, scale, st, splits);
  };
  o.cuda_dtypes = {"f32", "bf16"};
  ape::CheckReport r = ape::check_kernel(ape::find_kernel("nope"), ref, o);
  EXPECT_TRUE(r.passed());
  int rows = 0;
  for (const auto &row : r.rows) rows += row.quantity.rfind("decode", 0) == 0 && row.precision != "fp64" && row.precision != "fp32";
  EXPECT_EQ(rows, 6);  // decode:o, decode:lse in cuda-f32 and cuda-bf16, decode-split:* in cuda-bf16
  // Per cell, the f32 steps once (no split path), the bf16 ones as the device decides and split in 3.
  const std::vector<std::pair<std::string, int>> want = {{"f32", 0}, {"bf16", 0}, {"bf16", 3},
                                                         {"f32", 0}, {"bf16", 0}, {"bf16", 3}};
  EXPECT_EQ(calls, want);
  o.cuda_dtypes = {"f32"};

  o.cuda_decode = [&](const std::string &d, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                      const std::vector<at::Tensor> &f, const std::vector<at::Tensor> &p, double scale,
                      const Steps &st, int splits) {
    auto [out, lse] = exact(d, q, k, v, f, p, scale, st, splits);
    return std::make_pair(at::zeros_like(out), at::zeros_like(lse));
  };
  r = ape::check_kernel(ape::find_kernel("nope"), ref, o);
  EXPECT_EQ(failed_rows(r, "decode:"), 2);

  o.cuda_decode = [](const std::string &, const at::Tensor &, const at::Tensor &, const at::Tensor &,
                     const std::vector<at::Tensor> &, const std::vector<at::Tensor> &, double,
                     const Steps &, int) -> std::pair<at::Tensor, at::Tensor> {
    throw std::runtime_error("emulated CUDA attention (nope): decode step: invalid argument");
  };
  r = ape::check_kernel(ape::find_kernel("nope"), ref, o);
  std::string note;
  EXPECT_EQ(failed_rows(r, "decode:o", &note), 1);
  EXPECT_NE(note.find("decode step: invalid argument"), std::string::npos) << note;
}

// apec --emit=reference of examples/encodings/alibi_learned.mlir (its source name shortened).
const char *kAlibiLearnedReference = R"({"causal":true,"embedding":null,"encoding":"alibi_learned","features":[],"format":"ape-reference/1","k_mods":[],"params":[{"name":"alibi_slopes","shape":["heads"],"trainable":true}],"q_mods":[],"rel_rows":[],"scale":null,"score_mods":[{"args":5,"ops":[{"op":"ape.load","operands":[2],"source":{"kind":"param","param":0},"type":"f32"},{"op":"arith.subi","operands":[3,4],"type":"index"},{"op":"arith.index_cast","operands":[6],"type":"i64"},{"op":"arith.sitofp","operands":[7],"type":"f32"},{"op":"arith.mulf","operands":[5,8],"type":"f32"},{"op":"arith.negf","operands":[9],"type":"f32"},{"op":"arith.addf","operands":[0,10],"type":"f32"}],"yield":[11]}],"source":"alibi_learned.mlir","tokens":[],"transition":null,"value_rows":null})";

// ALiBi with learned slopes, its fp32 backward writing zeros for the slopes' gradient.
void zero_slopes_backward_f32(const ape::AttnArgs<float> &a) {
  ape::find_kernel("alibi_learned").backward_f32(a);
  std::fill(a.dparams[0], a.dparams[0] + a.H, 0.f);
}

// ALiBi with learned slopes, its fp32 backward writing 1000 for the slopes' gradient at T = 1, where
// the reference's is 0.
void thousand_at_one_token_backward_f32(const ape::AttnArgs<float> &a) {
  ape::find_kernel("alibi_learned").backward_f32(a);
  if (a.T == 1) std::fill(a.dparams[0], a.dparams[0] + a.H, 1000.f);
}

// The param yardsticks' stochastic rounding: what bf16 holds stays (zeros, powers of two, P = 1,
// infinities: x + u ulp(x) rounded to nearest had moved 1.0 to 0.99609375 a quarter of the time,
// the spacing below a power of two being half the one above), and a value between two bf16
// neighbours goes to each with probability by its distance (unbiased), either sign.
TEST(SpecReference, StochasticBf16RoundingKeepsExactValuesAndIsUnbiased) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const double inf = std::numeric_limits<double>::infinity();
  const at::Tensor exact = at::tensor({0.0, -0.0, 1.0, -2.0, 0.5, 1.0078125, -std::ldexp(1.0, -126), std::ldexp(1.0, -130), inf, -inf},
                                      at::kDouble);
  for (int draw = 0; draw < 2000; ++draw) {
    const at::Tensor got = ape::round_bf16_stochastic(exact, gen);
    ASSERT_EQ(got.scalar_type(), at::kDouble);
    ASSERT_TRUE(got.equal(exact)) << got;
  }
  // 1 + 2^-9: a quarter of the way from 1 to 1 + 2^-7 (bf16's spacing there), and its negative.
  for (const double sign : {1.0, -1.0}) {
    const double x = sign * (1.0 + std::ldexp(1.0, -9));
    const at::Tensor got = ape::round_bf16_stochastic(at::full({200000}, x, at::kDouble), gen);
    const double up = got.eq(sign * (1.0 + std::ldexp(1.0, -7))).to(at::kDouble).mean().item<double>();
    const double down = got.eq(sign).to(at::kDouble).mean().item<double>();
    EXPECT_NEAR(up, 0.25, 0.005) << sign;
    EXPECT_DOUBLE_EQ(up + down, 1.0) << sign;  // one of the two neighbours, nothing else
    EXPECT_NEAR(got.mean().item<double>(), x, 2e-5) << sign;
  }
}

// ALiBi with learned slopes, its fp32 backward's slopes gradient 8% too large.
void scaled_slopes_backward_f32(const ape::AttnArgs<float> &a) {
  ape::find_kernel("alibi_learned").backward_f32(a);
  for (int64_t h = 0; h < a.H; ++h) a.dparams[0][h] *= 1.08f;
}

// A bf16 param row can fail: a kernel whose param gradient is zero fails it (the rows' floor of
// 4e-3 sqrt(pairs) had given tolerances of 0.6-1.2, above any normalised error), and the right
// kernel passes it. (The "CUDA" kernels are the CPU's here: use_kernels does nothing.)
TEST(SpecCheck, Bf16ParamRowsFailAGradientOfZeros) {
  const auto ref = ape::SpecReference::parse(kAlibiLearnedReference, "alibi_learned");
  ape::CheckOptions o = small_grid();
  o.decode = false;
  o.cuda_dtypes = {"bf16"}, o.cuda_head_dims = {16};
  o.use_kernels = [](const std::string &) {};
  auto rows = [](const ape::CheckReport &r, bool pass) {
    int n = 0;
    for (const auto &row : r.rows) n += row.quantity == "dparam:alibi_slopes" && row.precision == "cuda-bf16" && row.pass == pass;
    return n;
  };
  const ape::CheckReport right = ape::check_kernel(ape::find_kernel("alibi_learned"), ref, o);
  EXPECT_TRUE(right.passed());
  EXPECT_EQ(rows(right, true), 1);
  ape::KernelEntry wrong = ape::find_kernel("alibi_learned");
  wrong.backward_f32 = &zero_slopes_backward_f32;
  const ape::CheckReport r = ape::check_kernel(wrong, ref, o);
  EXPECT_EQ(rows(r, false), 1);
  EXPECT_EQ(rows(r, true), 0);
  // A wrong value where the reference is 0 or tiny fails: only passing rows are set apart as not
  // counted (CheckReport::unresolved), never a failing one.
  wrong.backward_f32 = &thousand_at_one_token_backward_f32;
  const ape::CheckReport big = ape::check_kernel(wrong, ref, o);
  EXPECT_EQ(rows(big, false), 1);
  EXPECT_FALSE(big.passed());
  // A gradient 8% off fails too: the root mean square of stochastic roundings' draws
  // (param_yardsticks) is steady enough for a factor of 6, where one nearest-rounded draw needed
  // 16 (a tolerance of about 0.11 at this cell).
  wrong.backward_f32 = &scaled_slopes_backward_f32;
  const ape::CheckReport scaled = ape::check_kernel(wrong, ref, o);
  EXPECT_EQ(rows(scaled, false), 1);
}

}  // namespace
