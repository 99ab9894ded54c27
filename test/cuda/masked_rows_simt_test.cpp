// A -inf mask through the CUDA kernels, on the SIMT emulator (its checks on): the spec
// test/unit/Inputs/strict_window.mlir (a window of 3 keys before the query, never the query's own:
// row 0 has no key at all) compiled by apec for CUDA (f32 and bf16, head dim 32; cuda_tests.cmake),
// run through fused_attention; the emulated kernels must stay finite, give row 0 o = 0 and dq = 0,
// and match the materialised reference (test/unit/strict_window_reference.h: fp64, gradients by
// autograd, on the inputs as the variant reads them: bf16-rounded for bf16) within the variant's
// precision.
#include <algorithm>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include "../unit/strict_window_reference.h"
#include "spec_simt.h"

extern "C" const ape::KernelEntry *ape_kernel_entry_strict_window();

TEST(MaskedRowsSimt, MinusInfMaskWithAFullyMaskedRowMatchesTheReference) {
  const ape::KernelEntry &e = *ape_kernel_entry_strict_window();
  const ape::Manifest &m = ape::manifest_of(e);
  const char *names[] = {"o", "dq", "dk", "dv", "dslopes"};
  // f32: fp32 arithmetic (1e-4 of the largest value allowed); bf16: P, o and dS rounded to 8 bits
  // in the kernels' products (5e-2 allowed).
  for (const auto &[dtype, tol] : {std::pair<std::string, double>{"f32", 1e-4}, {"bf16", 5e-2}})
    for (int64_t T : {1, 7, 70}) {  // the only row masked; a partial tile; two key tiles
      at::manual_seed(T);
      const int64_t B = 2, H = 3, D = 32;
      at::Tensor q = at::randn({B, H, T, D}), k = at::randn({B, H, T, D}), v = at::randn({B, H, T, D});
      at::Tensor slopes = ape::init_param(m.params[0], H, D, at::kFloat) * 1.3, dout = at::randn({B, H, T, D});
      const double scale = m.scale_for(D);
      const auto emu = ape::test::run_spec(e, dtype, q, k, v, {}, {slopes}, dout, scale);
      // The reference on the inputs as the variant reads them.
      auto as_read = [&](const at::Tensor &t) {
        return (dtype == "bf16" ? t.to(at::kBFloat16) : t).to(at::kDouble).requires_grad_();
      };
      at::Tensor qr = as_read(q), kr = as_read(k), vr = as_read(v);
      at::Tensor sr = slopes.to(at::kDouble).requires_grad_();
      at::Tensor ro = ape_test::reference_strict_window(qr, kr, vr, sr, scale);
      auto rg = torch::autograd::grad({ro}, {qr, kr, vr, sr}, {as_read(dout).detach()});
      const at::Tensor ref[] = {ro.detach(), rg[0], rg[1], rg[2], rg[3]};
      const std::string at_T = " (" + dtype + ", T = " + std::to_string(T) + ")";
      for (int i = 0; i < 5; ++i) {
        ASSERT_TRUE(at::isfinite(emu[i]).all().item<bool>()) << names[i] << at_T << ": a NaN or inf";
        const double mag = std::max(1.0, ref[i].abs().max().item<double>());
        EXPECT_LE((emu[i].to(at::kDouble) - ref[i]).abs().max().item<double>(), tol * mag) << names[i] << at_T;
      }
      EXPECT_EQ(emu[0].select(2, 0).abs().max().item<double>(), 0.0) << "o of row 0" << at_T;
      EXPECT_EQ(emu[1].select(2, 0).abs().max().item<double>(), 0.0) << "dq of row 0" << at_T;
    }
}
