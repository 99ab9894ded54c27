// Value rows without a score mod through the CUDA kernels, on the SIMT emulator (its checks on):
// the spec test/unit/Inputs/value_window.mlir (o_i += sum_j A_ij table[clip(i - j, 0, 8)], plain
// scaled dot-product logits) compiled by apec for CUDA (f32 and bf16, head dim 32; cuda_tests.cmake),
// run through fused_attention, against a materialised reference written here: the T x T softmax,
// its masses per table row, and autograd for every gradient. bf16 takes the flash kernels (the
// masses in shared memory, forward and backward), f32 the general ones.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include "spec_simt.h"

extern "C" const ape::KernelEntry *ape_kernel_entry_value_window();

namespace {

constexpr int64_t kRows = 9;  // the spec's table: clip(i - j, 0, 8)

// o = softmax(scale Q K^T, causal) V + sum_r mass[., r] table[r, h, :], mass[i, r] = sum_{j: r(i, j) = r} A_ij,
// in float64; returns o and the gradients of <o, dout> w.r.t. q, k, v, table.
std::vector<at::Tensor> reference(const at::Tensor &q0, const at::Tensor &k0, const at::Tensor &v0,
                                  const at::Tensor &t0, const at::Tensor &dout, double scale) {
  const int64_t T = q0.size(2);
  auto q = q0.to(at::kDouble).requires_grad_(), k = k0.to(at::kDouble).requires_grad_(),
       v = v0.to(at::kDouble).requires_grad_(), table = t0.to(at::kDouble).requires_grad_();
  const at::Tensor pos = at::arange(T, at::kLong);
  const at::Tensor dist = pos.unsqueeze(1) - pos.unsqueeze(0);  // i - j
  const at::Tensor visible = dist.ge(0);
  at::Tensor s = at::matmul(q, k.transpose(-1, -2)) * scale;
  s = s.masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity());
  const at::Tensor a = at::softmax(s, -1);
  const at::Tensor onehot = at::one_hot(dist.clamp(0, kRows - 1), kRows).to(at::kDouble);  // (T, T, rows)
  const at::Tensor mass = at::einsum("bhij,ijr->bhir", {a, onehot});
  const at::Tensor o = at::matmul(a, v) + at::einsum("bhir,rhd->bhid", {mass, table});
  auto g = torch::autograd::grad({o}, {q, k, v, table}, {dout.to(at::kDouble)});
  return {o.detach(), g[0], g[1], g[2], g[3]};
}

}  // namespace

TEST(ValueRowsSimt, ValueRowsWithoutAScoreModMatchTheMaterialisedReference) {
  const ape::KernelEntry &e = *ape_kernel_entry_value_window();
  const ape::Manifest &m = ape::manifest_of(e);
  const char *names[] = {"o", "dq", "dk", "dv", "dtable"};
  // Errors relative to each output's largest value. f32: measured <= 7.5e-7 (1e-5 allowed). bf16: o
  // rounded to 8 bits, in Delta = dO . o too (measured <= 4.9e-3; 2e-2 allowed).
  for (const auto &[dtype, tol] : {std::pair<std::string, double>{"f32", 1e-5}, {"bf16", 2e-2}})
    for (int64_t T : {1, 7, 70, 150}) {  // one row; a partial tile; several query tiles; two key blocks
      at::manual_seed(100 + T);
      const int64_t B = 2, H = 3, D = 32;
      at::Tensor q = at::randn({B, H, T, D}), k = at::randn({B, H, T, D}), v = at::randn({B, H, T, D});
      at::Tensor table = ape::init_param(m.params[0], H, D, at::kFloat), dout = at::randn({B, H, T, D});
      if (dtype == "bf16") {  // the kernel's inputs as it sees them, so the reference differs by its own rounding
        for (at::Tensor *t : {&q, &k, &v, &dout}) *t = ape::test::bf16_rounded(*t);
      }
      const double scale = m.scale_for(D);
      const auto want = reference(q, k, v, table, dout, scale);
      const auto got = ape::test::run_spec(e, dtype, q, k, v, {}, {table}, dout, scale);
      const std::string at_T = " (" + dtype + ", T = " + std::to_string(T) + ")";
      for (int i = 0; i < 5; ++i) {
        ASSERT_TRUE(at::isfinite(got[i]).all().item<bool>()) << names[i] << at_T << ": a NaN or inf";
        // dq and dk are 0 at T = 1 (one key: P = 1, dS = 0); there their scale is dv's.
        double mag = std::max(1e-3, want[i].abs().max().item<double>());
        if (i == 1 || i == 2) mag = std::max(mag, want[3].abs().max().item<double>());
        const double err = (got[i].to(at::kDouble) - want[i]).abs().max().item<double>() / mag;
        EXPECT_LE(err, tol) << names[i] << at_T;
        RecordProperty(std::string(names[i]) + "_" + dtype + "_T" + std::to_string(T), std::to_string(err));
      }
    }
}
