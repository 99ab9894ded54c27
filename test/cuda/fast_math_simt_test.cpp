// An encoding marked fast_math through the CUDA kernels, on the SIMT emulator (its checks on): the
// spec test/unit/Inputs/kcable_fast.mlir (K-Cable: B_ij = -log1p((S_i - S_j)²), S the inclusive sum
// of -softplus of a per-token feature) compiled by apec for CUDA (f32 and bf16, head dim 32;
// cuda_tests.cmake), its score mod's log1p by __logf(1 + x) and the backward's division by
// __fdividef (ape/cuda/platform.cuh, approx; the emulator's intrinsics round as the hardware's
// definitions say), run through fused_attention, against a materialised reference written here in
// float64 with the exact functions: the T x T logits and softmax, and autograd for every gradient
// (q, k, v and the feature). bf16 takes the flash kernels and their feature steps, f32 the general
// ones.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include "spec_simt.h"

extern "C" const ape::KernelEntry *ape_kernel_entry_kcable_fast();

namespace {

// o = softmax(scale Q K^T + B, causal) V with B_ij = -log1p((S_i - S_j)²), S = cumsum(-softplus(f)),
// in float64; returns o and the gradients of <o, dout> w.r.t. q, k, v, f.
std::vector<at::Tensor> reference(const at::Tensor &q0, const at::Tensor &k0, const at::Tensor &v0,
                                  const at::Tensor &f0, const at::Tensor &dout, double scale) {
  const int64_t T = q0.size(2);
  auto q = q0.to(at::kDouble).requires_grad_(), k = k0.to(at::kDouble).requires_grad_(),
       v = v0.to(at::kDouble).requires_grad_(), f = f0.to(at::kDouble).requires_grad_();
  const at::Tensor S = at::cumsum(-at::softplus(f), -1);  // (B, H, T)
  const at::Tensor diff = S.unsqueeze(-1) - S.unsqueeze(-2);  // S_i - S_j
  const at::Tensor pos = at::arange(T, at::kLong);
  const at::Tensor visible = (pos.unsqueeze(1) - pos.unsqueeze(0)).ge(0);
  at::Tensor s = at::matmul(q, k.transpose(-1, -2)) * scale - at::log1p(diff * diff);
  s = s.masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity());
  const at::Tensor o = at::matmul(at::softmax(s, -1), v);
  auto g = torch::autograd::grad({o}, {q, k, v, f}, {dout.to(at::kDouble)});
  return {o.detach(), g[0], g[1], g[2], g[3]};
}

}  // namespace

TEST(FastMathSimt, ApproximateScoreModMatchesTheExactReference) {
  const ape::KernelEntry &e = *ape_kernel_entry_kcable_fast();
  const ape::Manifest &m = ape::manifest_of(e);
  const char *names[] = {"o", "dq", "dk", "dv", "dfeature"};
  // Errors relative to each output's largest value. The approximations add ~1e-7 absolute to a
  // logit: f32 measured <= 2.9e-6 (1e-5 allowed; a denominator off by 0.01 in the backward's
  // division fails it); bf16 measured <= 3.8e-3, the inputs' and o's rounding to 8 bits (2e-2
  // allowed).
  for (const auto &[dtype, tol] : {std::pair<std::string, double>{"f32", 1e-5}, {"bf16", 2e-2}})
    for (int64_t T : {1, 7, 70, 150}) {  // one row; a partial tile; several query tiles; two key blocks
      at::manual_seed(300 + T);
      const int64_t B = 2, H = 3, D = 32;
      at::Tensor q = at::randn({B, H, T, D}), k = at::randn({B, H, T, D}), v = at::randn({B, H, T, D});
      at::Tensor f = at::randn({B, H, T}) * 2, dout = at::randn({B, H, T, D});
      if (dtype == "bf16") {  // the kernel's inputs as it sees them, so the reference differs by its own rounding
        for (at::Tensor *t : {&q, &k, &v, &dout, &f}) *t = ape::test::bf16_rounded(*t);
      }
      const double scale = m.scale_for(D);
      const auto want = reference(q, k, v, f, dout, scale);
      const auto got = ape::test::run_spec(e, dtype, q, k, v, {f}, {}, dout, scale);
      const std::string at_T = " (" + dtype + ", T = " + std::to_string(T) + ")";
      for (int i = 0; i < 5; ++i) {
        ASSERT_TRUE(at::isfinite(got[i]).all().item<bool>()) << names[i] << at_T << ": a NaN or inf";
        // dq, dk and the feature's gradient are 0 at T = 1 (one key: P = 1); there their scale is dv's.
        double mag = std::max(1e-3, want[i].abs().max().item<double>());
        if (i == 1 || i == 2 || i == 4) mag = std::max(mag, want[3].abs().max().item<double>());
        const double err = (got[i].to(at::kDouble) - want[i]).abs().max().item<double>() / mag;
        EXPECT_LE(err, tol) << names[i] << at_T;
        RecordProperty(std::string(names[i]) + "_" + dtype + "_T" + std::to_string(T), std::to_string(err));
      }
    }
}
