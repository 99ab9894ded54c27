// The relative-position encodings whose bias reads q or k (Shaw, DeBERTa, Transformer-XL):
// DeBERTa's buckets through the kernel (both terms), Shaw's clip and value term,
// Transformer-XL's clip at 256 and its u . k_j term; RelativeRows: Shaw with a zero value table
// against the key-term math, neutral params give the base kernels (NoPE, RoPE, ALiBi; Shaw's
// constant value rows shift o), distances past the clips (T = 300) against the reference.
#include "harness.h"

namespace {

using namespace ape_test;

// DeBERTa's buckets through the kernel, both terms (H = 1, D = 32, T = 1001, sqrt(D) = 5.657):
// batch 0 has q_i = sqrt(D) e_0, k = 0, so l_ij = K_delta[0] (c2p); batch 1 has q = 0,
// k_j = sqrt(D) e_0, so l_ij = Q_delta[0] (p2c). K_delta[0] = -0.25 delta, Q_delta[0] = -0.5 delta,
// the other coordinates random (q and k do not see them).
template <class Real> void deberta_kernel_buckets() {
  const int64_t D = 32;
  Problem p = make_problem("deberta", 2, 1, 1001, D, 32);
  ASSERT_NE(p.entry, nullptr);
  const int64_t c2p = param_index(p, "deberta_c2p"), p2c = param_index(p, "deberta_p2c");
  ASSERT_TRUE(c2p >= 0 && p2c >= 0);
  p.params[c2p].select(-1, 0).select(-1, 0).copy_(-0.25 * torch::arange(32, kF64));
  p.params[p2c].select(-1, 0).select(-1, 0).copy_(-0.5 * torch::arange(32, kF64));
  p.q.zero_(), p.k.zero_();
  const double root = std::sqrt(static_cast<double>(D));
  p.q[0].select(-1, 0).fill_(root);
  p.k[1].select(-1, 0).fill_(root);
  const Tensor l = last_row_logits<Real>(p, kBucketDistances);
  const double tol = std::is_same_v<Real, float> ? 1e-4 : 1e-9;
  EXPECT_EQ(recovered_buckets(l[0][0], 0.25, tol), spec_buckets(kBucketDistances)) << "c2p";
  EXPECT_EQ(recovered_buckets(l[1][0], 0.5, tol), spec_buckets(kBucketDistances)) << "p2c";
}
TEST(HandCheck, DebertaKernelBucketsF64) { deberta_kernel_buckets<double>(); }
TEST(HandCheck, DebertaKernelBucketsF32) { deberta_kernel_buckets<float>(); }

// Shaw's clip at 32 through the kernel (H = 2, T = 41, D = 8): q_i = sqrt(D) e_0, k = 0, zero
// value table, a^K_r[h][0] = -0.05 (h + 1) r: l_{i,i-n} - l_ii = -0.05 (h + 1) min(n, 32).
template <class Real> void shaw_clip(double tol) {
  const int64_t D = 8;
  Problem p = make_problem("shaw", 1, 2, 41, D, 39);
  ASSERT_NE(p.entry, nullptr);
  set_param(p, "shaw_value", 0.0);
  Tensor &ak = p.params[param_index(p, "shaw_key")];
  ASSERT_EQ(ak.sizes(), (std::vector<int64_t>{33, 2, D}));
  ak.select(-1, 0).copy_(-0.05 * torch::arange(33, kF64).unsqueeze(1) *
                         torch::tensor({1.0, 2.0}, kF64));
  p.q.zero_(), p.k.zero_();
  p.q.select(-1, 0).fill_(std::sqrt(static_cast<double>(D)));
  const std::vector<int64_t> ns = {0, 1, 31, 32, 33, 40};
  const Tensor l = last_row_logits<Real>(p, ns);
  for (int64_t h = 0; h < 2; ++h) {
    std::vector<double> want;
    for (int64_t n : ns) want.push_back(-0.05 * (h + 1) * std::min<int64_t>(n, 32));
    expect_values(l[0][h], want, tol, "Shaw key term, head " + std::to_string(h));
  }
}
TEST(HandCheck, ShawKeyClipF64) { shaw_clip<double>(1e-10); }
TEST(HandCheck, ShawKeyClipF32) { shaw_clip<float>(1e-5); }

// Shaw's value term by hand: q = k = 0 and a^K = 0 give uniform weights 1/(i+1); with v = 0 and
// a^V_r = r e_0 (head 0), o_i[0] = (1/(i+1)) sum_{n<=i} min(n, 32): row 40 = (528 + 8 32)/41 =
// 784/41, row 10 = 55/11 = 5; the other coordinates 0.
template <class Real> void shaw_value_term(double tol) {
  Problem p = make_problem("shaw", 1, 1, 41, 4, 40);
  ASSERT_NE(p.entry, nullptr);
  set_param(p, "shaw_key", 0.0);
  set_param(p, "shaw_value", 0.0);
  p.params[param_index(p, "shaw_value")].select(-1, 0).select(-1, 0).copy_(torch::arange(33, kF64));
  p.q.zero_(), p.k.zero_(), p.v.zero_();
  KernelCall<Real> kc(p);
  kc.forward();
  const Tensor o = kc.o.to(torch::kFloat64)[0][0];
  expect_values(o[40], {784.0 / 41, 0, 0, 0}, tol * 20, "row 40");
  expect_values(o[10], {5.0, 0, 0, 0}, tol * 5, "row 10");
  expect_values(o[0], {0, 0, 0, 0}, tol, "row 0");
}
TEST(HandCheck, ShawValueTermF64) { shaw_value_term<double>(1e-12); }
TEST(HandCheck, ShawValueTermF32) { shaw_value_term<float>(1e-6); }

// Transformer-XL's clip at 256 through the kernel (H = 1, T = 300, D = 8): q = 0 and
// v = sqrt(D) e_0 give l_ij = P_r[0] + u . k_j / sqrt(D); P_r[0] = -0.01 r (other coordinates
// random), u = e_1. Batch 0: k = 0, so l_{i,i-n} - l_ii = -0.01 min(n, 256); batch 1:
// k_j = sqrt(D) 0.001 j e_1 adds 0.001 (j - i) = -0.001 n.
template <class Real> void xl_clip(double tol) {
  const int64_t D = 8, T = 300;
  Problem p = make_problem("transformer_xl", 2, 1, T, D, 41);
  ASSERT_NE(p.entry, nullptr);
  const double root = std::sqrt(static_cast<double>(D));
  Tensor &P = p.params[param_index(p, "xl_rel")];
  ASSERT_EQ(P.sizes(), (std::vector<int64_t>{257, 1, D}));
  P.select(-1, 0).select(-1, 0).copy_(-0.01 * torch::arange(257, kF64));
  set_param(p, "xl_v", 0.0);
  set_param(p, "xl_u", 0.0);
  p.params[param_index(p, "xl_v")][0][0] = root;
  p.params[param_index(p, "xl_u")][0][0][1] = 1.0;
  p.q.zero_(), p.k.zero_();
  p.k[1].select(-1, 1).copy_(root * 0.001 * torch::arange(T, kF64).view({1, T}));
  const std::vector<int64_t> ns = {0, 1, 100, 255, 256, 257, 299};
  const Tensor l = last_row_logits<Real>(p, ns);
  std::vector<double> want0, want1;
  for (int64_t n : ns) {
    want0.push_back(-0.01 * std::min<int64_t>(n, 256));
    want1.push_back(want0.back() - 0.001 * n);
  }
  expect_values(l[0][0], want0, tol, "XL position term");
  expect_values(l[1][0], want1, tol, "XL position + global key term");
}
TEST(HandCheck, TransformerXlClipF64) { xl_clip<double>(1e-10); }
TEST(HandCheck, TransformerXlClipF32) { xl_clip<float>(1e-5); }

// Shaw with a zero value table is its key term alone: the kernel against the reference at
// T = 100 > 32 (every gradient, the value table's included: d a^V_r = sum_i mass_ir dout_i).
TEST(RelativeRows, ShawZeroValueTableIsKeyTermOnly) {
  Problem p = make_problem("shaw", 2, 3, 100, 32, 42);
  ASSERT_NE(p.entry, nullptr);
  set_param(p, "shaw_value", 0.0);
  check_against_reference(p);
  KernelCall<double> kc(p);
  kc.forward(), kc.backward();
  EXPECT_FALSE(all_zero(kc.dprm[param_index(p, "shaw_value")])) << "d a^V at a^V = 0";
  // Key-term math directly: softmax(kappa q k^T + q a^K_r / sqrt(D)) v, row by row for a few rows.
  const Tensor &ak = p.params[param_index(p, "shaw_key")];
  for (int64_t i : {0, 31, 32, 33, 99}) {
    SCOPED_TRACE("row " + std::to_string(i));
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 3; ++h) {
        auto keys = p.k[b][h].narrow(0, 0, i + 1);
        auto logits = torch::matmul(keys, p.q[b][h][i]) * p.scale;
        std::vector<int64_t> r;
        for (int64_t j = 0; j <= i; ++j) r.push_back(std::min<int64_t>(i - j, 32));
        auto rows = ak.select(1, h).index_select(
            0, torch::tensor(r, torch::TensorOptions().dtype(torch::kLong)));
        logits = logits + torch::matmul(rows, p.q[b][h][i]) / std::sqrt(32.0);
        auto o = torch::matmul(torch::softmax(logits, 0), p.v[b][h].narrow(0, 0, i + 1));
        EXPECT_LE(normalised_error(kc.o[b][h][i], o), 1e-12);
      }
  }
}

// Kernel identities (fp64, same inputs): zero relative tables and biases give NoPE; Shaw with a
// key table of zeros and a value table equal to c_h at every r gives NoPE's o + c_h (the weights
// sum to 1), the same lse and input gradients; T5 with a zero table gives NoPE, rope_t5 RoPE;
// learned ALiBi at the standard slopes gives ALiBi.
TEST(RelativeRows, NeutralValuesGiveTheBaseKernels) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"transformer_xl", "nope"}, {"shaw", "nope"}, {"deberta", "nope"}, {"t5", "nope"},
      {"rope_t5", "rope"}};
  for (const auto &[enc, base] : cases) {
    SCOPED_TRACE(enc + " with zero params == " + base);
    Problem p = make_problem(enc, 2, 3, 300, 16, case_seed("neutral_" + enc, 2, 3, 300, 16));
    ASSERT_NE(p.entry, nullptr);
    for (auto &t : p.params) t.zero_();
    Problem b = make_problem(base, 2, 3, 300, 16, 1);
    b.q = p.q, b.k = p.k, b.v = p.v, b.dout = p.dout;
    expect_same_kernel_outputs(p, b, 1e-12);
  }
  {
    SCOPED_TRACE("alibi_learned == alibi");
    Problem p = make_problem("alibi_learned", 2, 3, 300, 16, 43);
    expect_same_kernel_outputs(p, with_encoding(p, "alibi"), 1e-12);
  }
  {
    SCOPED_TRACE("shaw, a^K = 0, a^V_r = c_h: nope + c_h");
    Problem p = make_problem("shaw", 2, 3, 100, 16, 44);
    ASSERT_NE(p.entry, nullptr);
    set_param(p, "shaw_key", 0.0);
    const Tensor c = torch::randn({1, 3, 16}, kF64);
    p.params[param_index(p, "shaw_value")].copy_(c.expand({33, 3, 16}));
    Problem b = make_problem("nope", 2, 3, 100, 16, 1);
    b.q = p.q, b.k = p.k, b.v = p.v, b.dout = p.dout;
    KernelCall<double> x(p), y(b);
    x.forward(), x.backward(), y.forward(), y.backward();
    EXPECT_LE(normalised_error(x.o, y.o + c.view({1, 3, 1, 16})), 1e-12);
    EXPECT_LE(normalised_error(x.lse, y.lse), 1e-12);
    EXPECT_LE(normalised_error(x.dq, y.dq), 1e-12);
    EXPECT_LE(normalised_error(x.dk, y.dk), 1e-12);
    EXPECT_LE(normalised_error(x.dv, y.dv), 1e-12);
    // d a^V_r summed over r is sum over tokens of dout (every row's mass sums to 1).
    EXPECT_LE(normalised_error(x.dprm[param_index(p, "shaw_value")].sum(0),
                               p.dout.sum(std::vector<int64_t>{0, 2})), 1e-12);
  }
}

// Distances beyond the clips against the reference: XL at T = 300 > 257 (rows 257..299 reach
// the clipped row 256, which then gets the gradient of every clipped pair), Shaw and DeBERTa at
// T = 300 (clip 32, bucket 31 from 113).
TEST(RelativeRows, BeyondTheClip) {
  for (const char *enc : {"transformer_xl", "shaw", "deberta"}) {
    SCOPED_TRACE(enc);
    Problem p = make_problem(enc, 1, 2, 300, 16, case_seed(std::string("clip_") + enc, 1, 2, 300, 16));
    ASSERT_NE(p.entry, nullptr);
    check_against_reference(p);
  }
  Problem p = make_problem("transformer_xl", 1, 2, 300, 16, 45);
  KernelCall<double> kc(p);
  kc.forward(), kc.backward();
  const Tensor dP = kc.dprm[param_index(p, "xl_rel")];
  EXPECT_GT(dP[256].abs().max().item<double>(), 0) << "the clipped row gets no gradient";
}

}  // namespace
