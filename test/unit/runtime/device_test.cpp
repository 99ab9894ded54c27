// Devices (runtime/Device.h, runtime/CudaAttention.h): --device / --precision and their refusals,
// the CUDA kernels' refusals by encoding, dtype and head dim, and the trainer's GPU habits checked
// on the CPU: clipping without a host read (the bits of LibTorch's) and losses read in batches
// (the same run, the same checks, whatever the batch).
#include <cmath>
#include <cstdlib>
#include <functional>

#include <ATen/Context.h>
#include <torch/nn/utils/clip_grad.h>

#include "runtime/CudaAttention.h"
#include "runtime/Device.h"
#include "runtime_fixtures.h"

namespace {

TEST(Device, TheCpuAndItsPrecision) {
  const ape::ComputeDevice d = ape::choose_device("cpu");
  EXPECT_TRUE(d.device.is_cpu());
  EXPECT_EQ(d.precision, ape::Precision::F32);
  EXPECT_EQ(d.attention_dtype(), at::kFloat);
  EXPECT_EQ(ape::choose_device("cpu", "f32").str(), "cpu (f32)");
  EXPECT_ERROR(ape::choose_device("cpu", "bf16"), "--precision bf16: the CPU kernels compute in float32");
  EXPECT_ERROR(ape::choose_device("cpu", "f16"), "--precision f16: the CPU kernels compute in float32; f16 is for "
                                                 "--device cuda");
  EXPECT_ERROR(ape::choose_device("cpu", "fp8"), "--precision fp8: expected auto, bf16, f16 or f32");
  // The GPU's precisions, as the model and the kernels' checks see them.
  const ape::ComputeDevice half{c10::Device(c10::kCUDA, 0), ape::Precision::F16};
  EXPECT_EQ(half.attention_dtype(), at::kHalf);
  EXPECT_EQ(half.str(), "cuda:0 (f16 autocast)");
  EXPECT_EQ((ape::ComputeDevice{c10::Device(c10::kCUDA, 0), ape::Precision::BF16}.attention_dtype()), at::kBFloat16);
}

TEST(Device, BadNamesAreRefused) {
  EXPECT_ERROR(ape::choose_device("gpu"), "--device gpu: unknown device; expected cpu, cuda or cuda:N");
  EXPECT_ERROR(ape::choose_device("CPU"), "unknown device");
  EXPECT_ERROR(ape::choose_device("cuda:"), "expected cuda:N");
  EXPECT_ERROR(ape::choose_device("cuda:-1"), "expected cuda:N");
  EXPECT_ERROR(ape::choose_device("cuda:0x1"), "expected cuda:N");
}

// What --device cuda does here depends on the machine, and each case is checked: no CUDA kernels
// in the build, no GPU visible (CI), or a GPU (the one-command GPU check).
TEST(Device, CudaNeedsKernelsAndAVisibleGpu) {
  if (!ape::cuda_attention_built()) {
    EXPECT_ERROR(ape::choose_device("cuda"), "this build of APE has no CUDA kernels");
    EXPECT_TRUE(ape::cuda_attention_kernels().empty());
    return;
  }
  EXPECT_FALSE(ape::cuda_attention_kernels().empty());
  if (!at::globalContext().hasCUDA()) {
    EXPECT_ERROR(ape::choose_device("cuda"), "--device cuda: no CUDA device is visible to this process");
    EXPECT_ERROR(ape::choose_device("cuda:1", "bf16"), "no CUDA device is visible");
    return;
  }
  const ape::ComputeDevice d = ape::choose_device("cuda");
  EXPECT_TRUE(d.is_cuda());
  EXPECT_EQ(d.device.index(), 0);
  EXPECT_EQ(d.precision, ape::Precision::BF16);  // auto on a GPU
  EXPECT_EQ(d.str(), "cuda:0 (bf16 autocast)");
  EXPECT_EQ(ape::choose_device("cuda:0", "f32").attention_dtype(), at::kFloat);
  EXPECT_EQ(ape::choose_device("cuda:0", "f16").str(), "cuda:0 (f16 autocast)");
  EXPECT_ERROR(ape::choose_device("cuda:99"), "--device cuda:99: this process sees");
}

TEST(Device, EncodingsWithoutACudaKernelAreRefusedByName) {
  if (!ape::cuda_attention_built()) {
    EXPECT_NE(ape::cuda_attention_problem(ape::find_kernel("rope"), at::kBFloat16, 64).find("no CUDA kernels"),
              std::string::npos);
    return;
  }
  const ape::KernelEntry &rope = ape::find_kernel("rope");  // compiled for CUDA in every build
  EXPECT_EQ(ape::cuda_attention_problem(rope, at::kBFloat16, 64), "");
  EXPECT_EQ(ape::cuda_attention_problem(rope, at::kFloat, 32), "");
  const std::string dim = ape::cuda_attention_problem(rope, at::kBFloat16, 48);
  EXPECT_NE(dim.find("encoding 'rope' has no bf16 CUDA kernel at head dim 48 in this build (it has "),
            std::string::npos) << dim;
  EXPECT_NE(dim.find("bf16/hd64"), std::string::npos) << dim;
  EXPECT_NE(ape::cuda_attention_problem(rope, at::kDouble, 64).find("float32, float16 or bfloat16"),
            std::string::npos);
  // An encoding this build did not compile for CUDA (the default build compiles rope and cable).
  std::string built;
  for (const auto &k : ape::cuda_attention_kernels()) built += k.substr(0, k.find(':')) + " ";
  for (const auto &name : ape::kernel_names()) {
    if (built.find(name + " ") != std::string::npos) continue;
    const std::string why = ape::cuda_attention_problem(ape::find_kernel(name), at::kBFloat16, 64);
    EXPECT_NE(why.find("encoding '" + name + "' has no CUDA kernels in this build (built: "), std::string::npos)
        << why;
    EXPECT_NE(why.find("APE_CUDA_ALL_ENCODINGS=ON"), std::string::npos) << why;
    break;
  }
  // The checks a command runs before any work, on a device it was given.
  const ape::ComputeDevice gpu{c10::Device(c10::kCUDA, 0), ape::Precision::BF16};
  EXPECT_ERROR(ape::check_encoding_on(gpu, rope, 48), "--device cuda:0: encoding 'rope' has no bf16 CUDA kernel");
  EXPECT_NO_THROW(ape::check_encoding_on(gpu, rope, 64));
  const ape::ComputeDevice half{c10::Device(c10::kCUDA, 0), ape::Precision::F16};
  EXPECT_ERROR(ape::check_encoding_on(half, rope, 48), "--device cuda:0: encoding 'rope' has no f16 CUDA kernel");
  EXPECT_NO_THROW(ape::check_encoding_on(ape::choose_device("cpu"), ape::find_kernel("rope_transition"), 48));
}

// Which GPUs a build's architectures serve (APE_CUDA_ARCHS): an A100 (8.0) is refused by the
// default build's sm_90a, with the setting that fixes it; SASS serves later minors of its major,
// PTX any later device, "a" its own only.
TEST(Device, BuildArchitecturesSayWhichGpusRunThem) {
  const std::string a100 = ape::cuda_arch_problem("90a", 8, 0);
  EXPECT_NE(a100.find("compiled for sm_90a (APE_CUDA_ARCHS), which this GPU (compute capability 8.0) cannot run: "
                      "rebuild with cmake -DAPE_CUDA_ARCHS=\"80\""),
            std::string::npos) << a100;
  EXPECT_EQ(ape::cuda_arch_problem("90a", 9, 0), "");
  EXPECT_NE(ape::cuda_arch_problem("90a", 10, 0), "");      // arch-specific PTX: sm_90 only
  EXPECT_NE(ape::cuda_arch_problem("90a", 12, 0).find("-DAPE_CUDA_ARCHS=\"120\""), std::string::npos);
  EXPECT_EQ(ape::cuda_arch_problem("80;90a", 8, 6), "");    // sm_80 SASS on 8.6
  EXPECT_EQ(ape::cuda_arch_problem("80-real,90a", 8, 9), "");
  EXPECT_NE(ape::cuda_arch_problem("80-real", 9, 0), "");   // no PTX to compile
  EXPECT_EQ(ape::cuda_arch_problem("80", 9, 0), "");        // its PTX
  EXPECT_NE(ape::cuda_arch_problem("86", 8, 0), "");        // 8.6 code on 8.0
  EXPECT_EQ(ape::cuda_arch_problem("100f", 10, 3), "");
  EXPECT_NE(ape::cuda_arch_problem("", 9, 0).find("compiled for no architecture"), std::string::npos);
  EXPECT_EQ(ape::cuda_arch_problem("native", 8, 0), "");  // CMake's words: not known here
  EXPECT_EQ(ape::cuda_arch_problem("90a-real", 9, 0), "");
  if (!ape::cuda_attention_built()) EXPECT_EQ(ape::cuda_device_problem(0), "");
}

TEST(Device, FusedAttentionSaysWhichDtypesEachDeviceTakes) {
  const ape::KernelEntry &rope = ape::find_kernel("rope");
  at::Tensor q = at::randn({1, 2, 5, 64}).to(at::kBFloat16);
  EXPECT_ERROR(ape::fused_attention(rope, q, q, q, {}, {}, 0.125),
               "q must be [B,H,T,D] float32 or float64 on the CPU, or float32, float16 or bfloat16 on a GPU");
}

TEST(Device, ClippingIsLibTorchsBitForBitWithoutAHostRead) {
  at::manual_seed(3);
  std::vector<at::Tensor> a, b;
  for (auto shape : std::vector<std::vector<int64_t>>{{7, 5}, {13}, {3, 3, 2}}) {
    at::Tensor p = at::randn(shape).requires_grad_();
    p.mutable_grad() = at::randn(shape) * 4;
    at::Tensor r = p.detach().clone().requires_grad_();
    r.mutable_grad() = p.grad().clone();
    a.push_back(p);
    b.push_back(r);
  }
  at::Tensor none = at::zeros({2}).requires_grad_();  // no gradient: skipped by both
  a.push_back(none);
  b.push_back(none);
  for (double max_norm : {1.0, 1e6}) {  // clipped, and not
    const at::Tensor norm = ape::clip_gradients(a, max_norm);
    const double want = torch::nn::utils::clip_grad_norm_(b, max_norm);
    EXPECT_EQ(norm.item<double>(), want);
    for (size_t i = 0; i + 1 < a.size(); ++i) EXPECT_TRUE(at::equal(a[i].grad(), b[i].grad())) << i;
  }
  EXPECT_EQ(ape::clip_gradients({none}, 1.0).item<double>(), 0.0);
}

// The trainer's AdamW step by multi-tensor operations (adamw_step) is LibTorch's AdamW::step bit
// for bit: two groups (with and without weight decay), a parameter that misses its gradient on
// some steps (so the step counts differ and it is updated on its own count), odd sizes.
TEST(Device, ForeachAdamWIsLibTorchsBitForBit) {
  at::manual_seed(11);
  const std::vector<std::vector<int64_t>> shapes{{7, 5}, {13}, {3, 3, 2}, {1}, {33, 9}};
  auto make = [&](std::vector<at::Tensor> &ps) {
    at::manual_seed(11);
    for (const auto &shape : shapes) ps.push_back(at::randn(shape).requires_grad_());
  };
  std::vector<at::Tensor> a, b;
  make(a);
  make(b);
  auto optimizer = [](std::vector<at::Tensor> &ps) {
    auto opts = [](double wd) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(3e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(wd));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<at::Tensor>{ps[0], ps[2], ps[4]}, opts(0.1));
    groups.emplace_back(std::vector<at::Tensor>{ps[1], ps[3]}, opts(0.0));
    return std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(3e-3));
  };
  auto oa = optimizer(a), ob = optimizer(b);
  for (int step = 0; step < 9; ++step) {
    const double lr = 3e-3 * (1.0 - step / 20.0);
    for (auto *o : {oa.get(), ob.get()})
      for (auto &g : o->param_groups()) static_cast<torch::optim::AdamWOptions &>(g.options()).lr(lr);
    for (size_t i = 0; i < shapes.size(); ++i) {
      const bool skip = i == 4 && step % 3 == 1;  // no gradient this step
      at::Tensor g = skip ? at::Tensor() : at::randn(shapes[i]) * (i + 1);
      a[i].mutable_grad() = g.defined() ? g.clone() : g;
      b[i].mutable_grad() = g.defined() ? g.clone() : g;
    }
    ape::adamw_step(*oa);
    ob->step();
    for (size_t i = 0; i < shapes.size(); ++i) ASSERT_TRUE(at::equal(a[i], b[i])) << "step " << step << " param " << i;
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto &sa = static_cast<const torch::optim::AdamWParamState &>(*oa->state().at(a[i].unsafeGetTensorImpl()));
    const auto &sb = static_cast<const torch::optim::AdamWParamState &>(*ob->state().at(b[i].unsafeGetTensorImpl()));
    EXPECT_EQ(sa.step(), sb.step()) << i;
    EXPECT_TRUE(at::equal(sa.exp_avg(), sb.exp_avg())) << i;
    EXPECT_TRUE(at::equal(sa.exp_avg_sq(), sb.exp_avg_sq())) << i;
  }
  EXPECT_EQ(static_cast<const torch::optim::AdamWParamState &>(*oa->state().at(a[4].unsafeGetTensorImpl())).step(), 6);
}

// The instrument of the GPU check's training smoke (train_smoke.py): $APE_CUDA_SYNC_DEBUG turns
// LibTorch's sync debug mode on while a CudaSyncDebugScope(kFromEnvironment) lives (the trainer's
// queued steps), off inside a CudaSyncDebugScope(kOff) (the reads on purpose), and back as it was
// after each; the batches'
// copy to the device is the tensor itself on the CPU.
TEST(Device, SyncDebugModeCoversTheQueuedStepsOnly) {
  const bool built = ape::cuda_attention_built();
  ASSERT_EQ(ape::cuda_sync_debug_mode(), "off");
  ::setenv("APE_CUDA_SYNC_DEBUG", "error", 1);
  {
    const ape::CudaSyncDebugScope check(ape::CudaSyncDebugScope::kFromEnvironment);
    EXPECT_EQ(ape::cuda_sync_debug_mode(), built ? "error" : "off");
    {
      const ape::CudaSyncDebugScope allowed(ape::CudaSyncDebugScope::kOff);
      EXPECT_EQ(ape::cuda_sync_debug_mode(), "off");
    }
    EXPECT_EQ(ape::cuda_sync_debug_mode(), built ? "error" : "off");
  }
  EXPECT_EQ(ape::cuda_sync_debug_mode(), "off");
  ::setenv("APE_CUDA_SYNC_DEBUG", "warn", 1);
  {
    const ape::CudaSyncDebugScope check(ape::CudaSyncDebugScope::kFromEnvironment);
    EXPECT_EQ(ape::cuda_sync_debug_mode(), built ? "warn" : "off");
  }
  ::setenv("APE_CUDA_SYNC_DEBUG", "verbose", 1);  // not a mode: nothing
  {
    const ape::CudaSyncDebugScope check(ape::CudaSyncDebugScope::kFromEnvironment);
    EXPECT_EQ(ape::cuda_sync_debug_mode(), "off");
  }
  ::unsetenv("APE_CUDA_SYNC_DEBUG");
  const at::Tensor t = at::arange(6);
  EXPECT_TRUE(ape::to_device_async(t, at::Device(at::kCPU)).is_same(t));
}

// The trainer's reads of a GPU's losses, on the CPU: reading every 7 steps trains bit for bit like
// reading every step, and a non-finite loss stops the run with the step it happened at.
TEST(Device, LossesReadInBatchesTrainTheSameRun) {
  const ape::TokenSplit s = phrase_book();
  auto run = [&](int64_t every, std::vector<at::Tensor> *weights) {
    at::manual_seed(5);
    ape::LanguageModel model(testk::nope, tiny_config("test_nope", 16));
    model->place(ape::choose_device("cpu"));
    ape::TrainSampler sampler(s, 1);
    ape::Trainer t(model, sampler, quiet_train_config(23, 4, 16));
    t.read_every = every;
    std::ostringstream out;
    ape::TrainResult r = t.run(out, "batched");
    for (const auto &p : model->parameters()) weights->push_back(p.detach().clone());
    return r.losses;
  };
  std::vector<at::Tensor> w1, w7;
  const std::vector<double> l1 = run(1, &w1), l7 = run(7, &w7);
  ASSERT_EQ(l1.size(), 23u);
  EXPECT_EQ(l1, l7);
  ASSERT_EQ(w1.size(), w7.size());
  for (size_t i = 0; i < w1.size(); ++i) EXPECT_TRUE(at::equal(w1[i], w7[i])) << i;

  ape::TokenSplit bad = synthetic_split(1, 500, 16, 13);
  ape::LanguageModel model = nan_model();
  ape::TrainSampler sampler(bad, 1);
  ape::Trainer t(model, sampler, quiet_train_config(9, 2, 8));
  t.read_every = 4;
  std::ostringstream out;
  try {
    t.run(out, "nan");
    ADD_FAILURE() << "no error";
  } catch (const ape::TrainingDiverged &e) {
    EXPECT_NE(std::string(e.what()).find("loss became NaN at step 1 (lr"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("found when the queued losses were read, 3 step(s) later"),
              std::string::npos) << e.what();
  }
}

// ---- float16's loss scaling and the GPU's fused optimizer step, checked on the CPU ----------------

// A run of the trainer as a GPU takes it (queued reads, the fused step) or as the CPU does, with or
// without loss scaling; `hook` may replace a parameter's gradient (an overflow on purpose). With
// `stop_at` the run stops after that step (its checkpoint written); with `resume_from` a model of
// other weights and a sampler of another seed resume that checkpoint.
struct ScaledRun {
  std::vector<double> losses;
  std::vector<at::Tensor> weights;           // after the run
  std::vector<at::Tensor> wte_after_step;    // the embedding after each step but the last
  ape::TrainResult result;
  std::string checkpoint;                    // written at the end
};

ScaledRun scaled_run(bool scaling, bool gpu_habits, int64_t steps,
                     const std::function<at::Tensor(int64_t, const at::Tensor &)> &hook = nullptr,
                     const ape::LossScaler::Options &options = {}, const std::string &tag = "",
                     int64_t stop_at = 0, const std::string &resume_from = "") {
  const ape::TokenSplit s = phrase_book();
  at::manual_seed(resume_from.empty() ? 7 : 99);
  ape::LanguageModel model(testk::bias_entry, tiny_config("test_bias", 16));
  model->place(ape::choose_device("cpu"));
  ape::TrainSampler sampler(s, resume_from.empty() ? 1 : 5);
  ape::Trainer t(model, sampler, quiet_train_config(steps, 4, 16));
  t.loss_scaling = scaling;
  t.loss_scale_options = options;
  t.fused_adamw = gpu_habits;
  t.read_every = gpu_habits ? 4 : 1;
  if (!resume_from.empty()) t.restore(ape::read_checkpoint(resume_from));
  ScaledRun r;
  int64_t calls = 0;
  if (hook)
    model->wte->weight.register_hook([&calls, hook](const at::Tensor &g) { return hook(++calls, g); });
  t.interrupt = [&](const ape::TrainState &st) {
    r.wte_after_step.push_back(model->wte->weight.detach().clone());
    return st.step == stop_at;
  };
  std::ostringstream out;
  r.checkpoint = tmp_path("scaled_" + std::string(scaling ? "s" : "p") + (gpu_habits ? "g" : "c") + tag + ".ckpt");
  r.result = t.run(out, "scaled", r.checkpoint);
  r.losses = r.result.losses;
  for (const auto &p : model->parameters()) r.weights.push_back(p.detach().clone());
  return r;
}

double saved_scalar(const std::string &path, const std::string &name) {
  const ape::Checkpoint c = ape::read_checkpoint(path);
  const ape::SavedTensor *t = c.find(name);
  return t ? c.tensor(*t).item<double>() : NAN;
}

// With a power-of-two scale and no overflow, loss scaling changes no bit of a float32 run: on the
// CPU's path (adamw_step, a read per step) and on the GPU's (FusedAdamW, reads 4 steps at a time).
// The fused step is AdamW's math (LibTorch's run within float32 rounding).
TEST(Device, LossScalingChangesNoBitOfAFloat32Run) {
  for (const bool gpu_habits : {false, true}) {
    const ScaledRun plain = scaled_run(false, gpu_habits, 12), scaled = scaled_run(true, gpu_habits, 12);
    EXPECT_EQ(plain.losses, scaled.losses) << "gpu habits " << gpu_habits;
    ASSERT_EQ(plain.weights.size(), scaled.weights.size());
    for (size_t i = 0; i < plain.weights.size(); ++i)
      EXPECT_TRUE(at::equal(plain.weights[i], scaled.weights[i])) << "gpu habits " << gpu_habits << " param " << i;
    EXPECT_EQ(scaled.result.skipped_steps, 0);
    EXPECT_EQ(saved_scalar(scaled.checkpoint, "train/scaler/scale"), 65536.0);
    EXPECT_TRUE(std::isnan(saved_scalar(plain.checkpoint, "train/scaler/scale")));  // no scaler, no state
    EXPECT_EQ(saved_scalar(scaled.checkpoint, "train/adam/wte.weight/step"), 12.0);
  }
  const ScaledRun libtorch = scaled_run(false, false, 12), fused = scaled_run(false, true, 12);
  for (size_t n = 0; n < libtorch.losses.size(); ++n)
    EXPECT_NEAR(fused.losses[n], libtorch.losses[n], 1e-5 * (1 + n)) << "step " << n + 1;
  for (size_t i = 0; i < libtorch.weights.size(); ++i) expect_close(fused.weights[i], libtorch.weights[i], 1e-4, "param");
}

// An overflow (the embedding's gradient inf at steps 3 and 4) skips those updates entirely on
// either path: the weights after them are the weights after step 2, the optimizer's step counts
// miss them, the scale halves at each and doubles after `growth_interval` clean steps (GradScaler's
// rule), and the run goes on. The checks of a non-finite gradient norm do not stop it.
TEST(Device, LossScalingSkipsAnOverflowedStep) {
  auto overflow = [](int64_t call, const at::Tensor &g) {
    return (call == 3 || call == 4) ? at::full_like(g, INFINITY) : g;
  };
  ape::LossScaler::Options o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  for (const bool gpu_habits : {false, true}) {
    const ScaledRun r = scaled_run(true, gpu_habits, 10, overflow, o, "overflow");
    SCOPED_TRACE(gpu_habits ? "the GPU's path" : "the CPU's path");
    ASSERT_EQ(r.wte_after_step.size(), 9u);  // asked after every step but the last
    EXPECT_FALSE(at::equal(r.wte_after_step[1], r.wte_after_step[0]));
    EXPECT_TRUE(at::equal(r.wte_after_step[2], r.wte_after_step[1]));
    EXPECT_TRUE(at::equal(r.wte_after_step[3], r.wte_after_step[1]));
    EXPECT_FALSE(at::equal(r.wte_after_step[4], r.wte_after_step[3]));
    EXPECT_EQ(r.result.skipped_steps, 2);
    EXPECT_EQ(r.losses.size(), 10u);
    for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
    EXPECT_EQ(saved_scalar(r.checkpoint, "train/adam/wte.weight/step"), 8.0);
    // 1024 -> 512 -> 256 (steps 3, 4); clean steps 5-7: 512; 8-10: 1024.
    EXPECT_EQ(saved_scalar(r.checkpoint, "train/scaler/scale"), 1024.0);
    EXPECT_EQ(saved_scalar(r.checkpoint, "train/scaler/growth_tracker"), 0.0);
  }
}

// A gradient that overflows at every scale: the scale halves below 1 and training stops there,
// naming it, instead of skipping every update from then on.
TEST(Device, LossScaleBelowOneStopsTraining) {
  ape::LossScaler::Options o;
  o.init_scale = 4;
  for (const bool gpu_habits : {false, true}) {
    const std::string msg = error_of([&] {
      scaled_run(true, gpu_habits, 10, [](int64_t, const at::Tensor &g) { return at::full_like(g, NAN); }, o, "nan");
    });
    EXPECT_NE(msg.find("loss scaling: the scale fell to 0.5 at step 3 (3 update(s) skipped"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Use --precision bf16"), std::string::npos) << msg;
  }
  o.backoff_factor = 1;
  EXPECT_ERROR(ape::LossScaler(at::Device(at::kCPU), o), "the backoff factor must be in (0, 1)");
  o = {};
  o.init_scale = INFINITY;
  EXPECT_ERROR(ape::LossScaler(at::Device(at::kCPU), o), "the initial scale must be finite and above 0");
}

// A run stopped after an overflow and resumed from its checkpoint continues with the scaler's state
// (scale, growth tracker) and the skipped count: the same checkpoint state as the run never stopped.
TEST(Device, LossScalingStateResumes) {
  ape::LossScaler::Options o;
  o.init_scale = 1024;
  o.growth_interval = 4;
  auto overflow = [](int64_t call, const at::Tensor &g) { return call == 2 ? at::full_like(g, INFINITY) : g; };
  const ScaledRun whole = scaled_run(true, true, 9, overflow, o, "whole");
  const ScaledRun stopped = scaled_run(true, true, 9, overflow, o, "stopped", /*stop_at=*/5);
  ASSERT_EQ(stopped.losses.size(), 5u);
  // 1024 -> 512 at step 2, then three clean steps: the stopped run's state is mid-interval.
  EXPECT_EQ(saved_scalar(stopped.checkpoint, "train/scaler/scale"), 512.0);
  EXPECT_EQ(saved_scalar(stopped.checkpoint, "train/scaler/growth_tracker"), 3.0);
  const ScaledRun resumed = scaled_run(true, true, 9, nullptr, o, "resumed", 0, stopped.checkpoint);
  const ape::TrainResult &r = resumed.result;
  const std::string &path = resumed.checkpoint;
  EXPECT_EQ(r.losses, whole.losses);
  EXPECT_EQ(r.skipped_steps, 1);
  for (const char *name : {"train/scaler/scale", "train/scaler/growth_tracker", "train/adam/wte.weight/step"})
    EXPECT_EQ(saved_scalar(path, name), saved_scalar(whole.checkpoint, name)) << name;
  EXPECT_EQ(saved_scalar(path, "train/scaler/scale"), 1024.0);  // doubled after step 6 (a fresh scaler: 2048)
  for (size_t i = 0; i < resumed.weights.size(); ++i) EXPECT_TRUE(at::equal(resumed.weights[i], whole.weights[i])) << i;
}

// A run stopped while every update so far was skipped (the scale still backing off from its start)
// holds optimizer state that counts no step: it resumes, as the run never stopped.
TEST(Device, ARunWhoseEveryStepWasSkippedResumes) {
  ape::LossScaler::Options o;
  o.init_scale = 1024;
  auto overflow = [](int64_t call, const at::Tensor &g) { return call <= 2 ? at::full_like(g, INFINITY) : g; };
  const ScaledRun whole = scaled_run(true, true, 6, overflow, o, "skipped_whole");
  const ScaledRun stopped = scaled_run(true, true, 6, overflow, o, "skipped_stopped", /*stop_at=*/2);
  EXPECT_EQ(saved_scalar(stopped.checkpoint, "train/adam/wte.weight/step"), 0.0);
  const ScaledRun resumed = scaled_run(true, true, 6, nullptr, o, "skipped_resumed", 0, stopped.checkpoint);
  EXPECT_EQ(resumed.result.losses, whole.losses);
  EXPECT_EQ(resumed.result.skipped_steps, 2);
  for (size_t i = 0; i < resumed.weights.size(); ++i) EXPECT_TRUE(at::equal(resumed.weights[i], whole.weights[i])) << i;
}

}  // namespace
