// Training through the CUDA kernels (runtime/SimtAttention.h): the whole path from a spec to its
// CUDA kernels to the LibTorch runtime, on the SIMT emulator with its checks on. A few steps of
// the real training loop with the emulated kernels track the same run on the CPU kernels: the
// f32 variant step for step (different summation orders only), bf16 within its precision, f16
// with the trainer's dynamic loss scaling (its scaled gradients through the f16 backward) within
// f16's; the loss falls either way.
#include "runtime/Model.h"
#include "runtime/Registry.h"
#include "runtime/SimtAttention.h"
#include "runtime/Train.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>

namespace {

ape::TrainResult train_steps(const std::string &enc, const std::string &kernels,
                             std::vector<double> &losses, bool loss_scaling = false, int64_t kv_heads = 0) {
  ape::TokenSplit s;
  std::vector<int32_t> phrase{3, 1, 4, 15, 9, 2, 6, 5}, ids;
  for (int r = 0; r < 200; ++r) ids.insert(ids.end(), phrase.begin(), phrase.end());
  s.add_doc("a", ids);
  if (kernels == "cpu") ape::use_cpu_kernels();
  else ape::use_simt_kernels(kernels);
  at::manual_seed(21);
  ape::ModelConfig mc;
  mc.encoding = enc;
  mc.vocab = 16;
  mc.d_model = 128;  // head_dim 64: the variant every emulated encoding has
  mc.heads = 2;
  mc.kv_heads = kv_heads;  // 1: both heads read one key head (CudaAttnArgs::kv_heads)
  mc.layers = 1;
  ape::LanguageModel model(mc);
  ape::TrainConfig tc;
  tc.steps = 6;
  tc.batch = 2;
  tc.seq_len = 40;  // partial tiles
  tc.lr = 1e-2;
  tc.warmup_steps = 2;
  tc.progress_in_place = false;
  std::ostringstream out;
  ape::TrainSampler sampler(s, 1);
  ape::Trainer trainer(model, sampler, tc);
  trainer.loss_scaling = loss_scaling;  // as a float16 run on a GPU
  ape::TrainResult r = trainer.run(out, enc);
  ape::use_cpu_kernels();
  losses = r.losses;
  return r;
}

class SimtTraining : public ::testing::TestWithParam<std::string> {};

// The encodings whose every CUDA variant the emulated build has (APE_SIMT_FULL_ENCODINGS): the
// f32 and f16 runs are compared too; the others have bf16 at head dim 64.
bool has_f32(const std::string &enc) { return enc == "rope" || enc == "cable" || enc == "shaw"; }

TEST_P(SimtTraining, EmulatedCudaKernelsTrainLikeTheCpuKernels) {
  const std::string enc = GetParam();
  std::vector<double> cpu, f32, bf16, f16;
  train_steps(enc, "cpu", cpu);
  if (has_f32(enc)) train_steps(enc, "f32", f32);
  if (has_f32(enc)) {  // the loss scaled by 2^16 into the f16 backward, unscaled in float32
    const auto rh = train_steps(enc, "f16", f16, /*loss_scaling=*/true);
    EXPECT_EQ(rh.skipped_steps, 0);
    EXPECT_NEAR(f16[0], cpu[0], 2e-3 * std::abs(cpu[0])) << "f16 step 0";
    EXPECT_LT(rh.final_loss, rh.first_loss - 0.3);
  }
  const auto rb = train_steps(enc, "bf16", bf16);
  ASSERT_EQ(cpu.size(), bf16.size());
  for (size_t n = 0; n < cpu.size(); ++n) {
    std::printf("%s step %zu: cpu %.6f  cuda f32 %s  cuda bf16 %.6f  cuda f16 %s\n", enc.c_str(), n, cpu[n],
                f32.empty() ? "-" : std::to_string(f32[n]).c_str(), bf16[n],
                f16.empty() ? "-" : std::to_string(f16[n]).c_str());
    // fp32 on both sides, different summation orders, compounded over the steps.
    if (!f32.empty()) EXPECT_NEAR(f32[n], cpu[n], 1e-3 * (1 + n)) << "step " << n;
  }
  // bf16 operands (8-bit mantissas): the first step, from the same weights, within bf16's
  // precision; the next two, after updates by the bf16 backward, within 2e-2 (they differed by at
  // most 6e-3: step 0's loss is the forward's alone, so these are what sees the backward); after
  // that the trajectories part (lr 1e-2 on a loss falling fast), so only the loss's fall is compared.
  EXPECT_NEAR(bf16[0], cpu[0], 0.01 * std::abs(cpu[0])) << "step 0";
  for (size_t n = 1; n < 3; ++n) EXPECT_NEAR(bf16[n], cpu[n], 2e-2) << "step " << n;
  EXPECT_LT(rb.final_loss, rb.first_loss - 0.3);
}

// Grouped-query attention (--kv-heads 1 of 2 heads) through the emulated kernels, which read the key
// head in place (CudaAttnArgs::kv_heads) and sum each group's dk, dv: RoPE's shared k' in f32 step
// for step with the CPU kernels, ExPE's per-head k' (from a grouped W_k) in bf16 over steps 0-2.
TEST(SimtTrainingGrouped, EmulatedCudaKernelsTrainLikeTheCpuKernels) {
  std::vector<double> cpu, f32, bf16;
  train_steps("rope", "cpu", cpu, false, 1);
  train_steps("rope", "f32", f32, false, 1);
  ASSERT_EQ(cpu.size(), f32.size());
  for (size_t n = 0; n < cpu.size(); ++n) EXPECT_NEAR(f32[n], cpu[n], 1e-3 * (1 + n)) << "rope step " << n;
  train_steps("expe", "cpu", cpu, false, 1);
  const auto rb = train_steps("expe", "bf16", bf16, false, 1);
  EXPECT_NEAR(bf16[0], cpu[0], 0.01 * std::abs(cpu[0])) << "expe step 0";
  for (size_t n = 1; n < 3; ++n) EXPECT_NEAR(bf16[n], cpu[n], 2e-2) << "expe step " << n;
  EXPECT_LT(rb.final_loss, rb.first_loss - 0.3);
}

// A q/k modification with a pairing (rope), a token program with row and column sums (cable), a
// trainable table (t5), relative rows with a value term (shaw), a derived projection param (expe).
INSTANTIATE_TEST_SUITE_P(Encodings, SimtTraining,
                         ::testing::Values("rope", "cable", "t5", "shaw", "expe"));

}  // namespace

// simt_decode (ape-check --cuda's decode rows): the steps' rows are those of the emulated full
// forward over the tokens so far, the keys of the later steps split in 3 where asked (then within
// the rounding of another order of the same sums, and not bit for bit the unsplit rows: the split
// path ran; an explicit count splits the prompt's keys too).
TEST(SimtDecode, StepsSplitWhereAskedAndMatchTheForward) {
  const ape::KernelEntry &rope = ape::find_kernel("rope");
  torch::manual_seed(4);
  const int64_t B = 1, H = 2, T = 300, D = 64;
  const torch::Tensor q = torch::randn({B, H, T, D}), k = torch::randn({B, H, T, D}), v = torch::randn({B, H, T, D});
  const std::vector<int64_t> steps = {150, 1, 1, 148};
  const double scale = 0.125;
  auto [o1, lse1] = ape::simt_decode(rope, "bf16", q, k, v, {}, {}, scale, steps, 1);
  auto [o3, lse3] = ape::simt_decode(rope, "bf16", q, k, v, {}, {}, scale, steps, 3);
  EXPECT_FALSE(torch::equal(o1.narrow(2, 150, 150), o3.narrow(2, 150, 150)));
  // Another order of the same sums, with each share's P rounded to bf16 on its own scale: measured
  // 0.0039 (2^-8) at |o| up to 3.1; the bound is 2^-7, half a bf16 unit at |o| in [2, 4).
  EXPECT_LT((o1 - o3).abs().max().item<double>(), 0.0078125);
  EXPECT_LT((lse1 - lse3).abs().max().item<double>(), 1e-4);
  // The unsplit steps against the emulated full forward over each step's tokens.
  ape::use_simt_kernels("bf16");
  int64_t L0 = 0;
  for (int64_t n : steps) {
    const int64_t L = L0 + n;
    const torch::Tensor full = ape::fused_attention(rope, q.narrow(2, 0, L), k.narrow(2, 0, L), v.narrow(2, 0, L), {}, {}, scale);
    EXPECT_TRUE(torch::equal(o1.narrow(2, L0, n), full.narrow(2, L0, n).to(torch::kFloat)))
        << "step to length " << L;
    L0 = L;
  }
  ape::use_cpu_kernels();
}
