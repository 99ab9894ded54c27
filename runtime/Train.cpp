// The training loop, its checkpoints and resuming from them.
#include "runtime/Train.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include "ape/contract/value_rules.h"
#include "runtime/AtomicFile.h"
#include "runtime/CudaAttention.h"
#include "runtime/Device.h"
#include "runtime/Distributed.h"
#include "runtime/Options.h"
#include "runtime/Threads.h"
#include "runtime/Util.h"

namespace ape {

// ---- configuration ---------------------------------------------------------------------------------

void TrainConfig::validate() const {
  require_in("--steps", steps, 0, 1000000000);
  require_in("--minutes", minutes, 0.0, 1e6);
  if (!(steps > 0 || minutes > 0))
    throw std::invalid_argument("give a budget: --steps N and/or --minutes M (both are 0)");
  require_in("--batch", batch, 1, 65536);
  require_in("--seq-len", seq_len, 1, ape_rules::kMaxLength);
  require_in("--lr", lr, 0.0, 10.0, /*open_low=*/true);
  require_in("min_lr_frac", min_lr_frac, 0.0, 1.0);
  require_in("--warmup", warmup_steps, 0, 1000000000);
  require_in("weight_decay", weight_decay, 0.0, 10.0);
  require_in("beta1", beta1, 0.0, 0.999999);
  require_in("beta2", beta2, 0.0, 0.999999);
  require_in("grad_clip", grad_clip, 0.0, 1e6, /*open_low=*/true);
  require_in("--checkpoint-every", checkpoint_every, 0, 1000000000);
  require_in("--checkpoint-minutes", checkpoint_minutes, 0.0, 1e6);
  if (divergence_factor != 0 && !(std::isfinite(divergence_factor) && divergence_factor > 1.0 && divergence_factor <= 1e6)) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "--divergence-factor must be 0 (never) or a number in (1, 1e+06]; got %.17g",
                  divergence_factor);
    throw std::invalid_argument(buf);
  }
  require_in("--threads", threads, 0, kMaxThreads);
  require_in("--world-size", world_size, 1, 1 << 20);
}

nlohmann::json TrainConfig::to_json() const {
  return {{"steps", steps},
          {"minutes", minutes},
          {"batch", batch},
          {"seq_len", seq_len},
          {"lr", lr},
          {"min_lr_frac", min_lr_frac},
          {"warmup_steps", warmup_steps},
          {"weight_decay", weight_decay},
          {"betas", {beta1, beta2}},
          {"grad_clip", grad_clip},
          {"seed", seed},
          {"checkpoint_every", checkpoint_every},
          {"checkpoint_minutes", checkpoint_minutes},
          {"divergence_factor", divergence_factor},
          {"threads", threads},
          {"world_size", world_size}};
}

namespace {
// A field of a saved training config, named in the error: an integer field must hold an integer
// (a float such as 1e308 converted to int64 is undefined behaviour), the seed one in [0, 2^63) as
// --seed takes it.
int64_t int_field(const nlohmann::json &j, const char *name, std::optional<int64_t> fallback = std::nullopt) {
  if (fallback && !j.contains(name)) return *fallback;
  const nlohmann::json &v = j.at(name);
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
    throw std::runtime_error(std::string("training config: ") + name + " must be an integer in int64's range, not " +
                             v.dump());
  return v.get<int64_t>();
}
double real_field(const nlohmann::json &j, const char *name, std::optional<double> fallback = std::nullopt) {
  if (fallback && !j.contains(name)) return *fallback;
  const nlohmann::json &v = j.at(name);
  if (!v.is_number())
    throw std::runtime_error(std::string("training config: ") + name + " must be a number, not " + v.dump());
  return v.get<double>();
}
}  // namespace

TrainConfig TrainConfig::from_json(const nlohmann::json &j) {
  TrainConfig c;
  try {
    c.steps = int_field(j, "steps");
    c.minutes = real_field(j, "minutes");
    c.batch = int_field(j, "batch");
    c.seq_len = int_field(j, "seq_len");
    c.lr = real_field(j, "lr");
    c.min_lr_frac = real_field(j, "min_lr_frac");
    c.warmup_steps = int_field(j, "warmup_steps");
    c.weight_decay = real_field(j, "weight_decay");
    const auto &b = j.at("betas");
    if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number())
      throw std::runtime_error("training config: betas must be a pair of numbers");
    c.beta1 = b[0].get<double>();
    c.beta2 = b[1].get<double>();
    c.grad_clip = real_field(j, "grad_clip");
    // Any unsigned 64-bit seed (runs before --seed took [0, 2^63) saved ones up to 2^64 - 1).
    const nlohmann::json &seed = j.at("seed");
    if (!seed.is_number_unsigned() && !(seed.is_number_integer() && seed.get<int64_t>() >= 0))
      throw std::runtime_error("training config: seed must be a non-negative integer, not " + seed.dump());
    c.seed = seed.get<uint64_t>();
    c.checkpoint_every = int_field(j, "checkpoint_every", 0);
    c.checkpoint_minutes = real_field(j, "checkpoint_minutes", 0.0);
    c.divergence_factor = real_field(j, "divergence_factor", 2.0);
    c.threads = int_field(j, "threads", 0);
    c.world_size = int_field(j, "world_size", 1);
  } catch (const nlohmann::json::exception &e) {
    throw std::runtime_error(std::string("training config JSON: ") + e.what());
  }
  c.validate();
  return c;
}

nlohmann::json TrainResult::to_json() const {
  return {{"steps", steps},
          {"seconds", seconds},
          {"tokens_per_second", tokens_per_second},
          {"first_loss", first_loss},
          {"final_loss", final_loss},
          {"skipped_steps", skipped_steps}};
}

double learning_rate(const TrainConfig &cfg, int64_t step, double progress) {
  int64_t warm = cfg.warmup_steps;
  if (cfg.steps > 0) warm = std::min<int64_t>(warm, cfg.steps / 5);
  const double w = warm > 0 ? std::min(1.0, double(step + 1) / double(warm)) : 1.0;
  const double p = std::clamp(progress, 0.0, 1.0);
  const double cosine = cfg.min_lr_frac + (1.0 - cfg.min_lr_frac) * 0.5 * (1.0 + std::cos(M_PI * p));
  return cfg.lr * w * cosine;
}

// ---- where a non-finite value comes from -------------------------------------------------------------

namespace {
bool finite(const at::Tensor &t) { return !t.defined() || t.isfinite().all().item<bool>(); }
const char *kind_of(const at::Tensor &t) { return t.isnan().any().item<bool>() ? "NaN" : "inf"; }
}  // namespace

std::string locate_nonfinite(LanguageModel &model, const at::Tensor &windows) {
  for (const auto &kv : model->named_parameters())
    if (!finite(kv.value())) return std::string("parameter '") + kv.key() + "' (" + kind_of(kv.value()) + ")";
  for (const auto &kv : model->named_buffers())
    if (!finite(kv.value())) return std::string("fixed param '") + kv.key() + "' (" + kind_of(kv.value()) + ")";
  at::NoGradGuard no_grad;
  std::string where;
  model->forward(windows.narrow(1, 0, windows.size(1) - 1).to(model->placement().device), [&](const std::string &stage, const at::Tensor &t) {
    if (where.empty() && !finite(t)) where = "the output of " + stage + " (" + kind_of(t) + ")";
  });
  return where;
}

// ---- gradient clipping without a host read ----------------------------------------------------------

at::Tensor clip_gradients(const std::vector<at::Tensor> &params, double max_norm) {
  // torch::nn::utils::clip_grad_norm_ (norm 2) step for step, so the bits are the same, but the
  // norm is returned as a tensor: on a GPU nothing here waits for the device.
  std::vector<at::Tensor> with_grad;
  for (const auto &p : params)
    if (p.grad().defined()) with_grad.push_back(p);
  if (with_grad.empty())  // on the parameters' device, like the norm it stands for
    return at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(params.empty() ? at::kCPU : params[0].device()));
  // Multi-tensor operations (one launch each on a GPU, not one per parameter); on the CPU the same
  // norm and product per tensor.
  std::vector<at::Tensor> grads;
  grads.reserve(with_grad.size());
  for (const auto &p : with_grad) grads.push_back(p.grad().data());
  const std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2);
  at::Tensor total = norms.size() == 1 ? norms[0] : at::stack(norms).norm(2);
  at::Tensor coef = at::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  at::_foreach_mul_(grads, coef);
  return total;
}

// ---- a digest of every step, for tests of bit-exact resumption ---------------------------------------

// APE_TEST_STEP_DIGEST=1 in the environment: each CPU step prints one line to `out`,
//   [digest] step N batch H grad:NAME H ... param:NAME H ...
// (H: FNV-1a of the tensor's bytes; the gradients after clipping, the parameters after the update),
// so that two runs that should agree bit for bit (test/resume/kill_loop.sh) show which tensor
// differed first when they do not: the batch, a gradient (the forward or backward), or only a
// parameter (the optimizer).
namespace {
bool step_digest_requested() {
  static const bool on = [] {
    const char *e = std::getenv("APE_TEST_STEP_DIGEST");
    return e && *e && std::string(e) != "0";
  }();
  return on;
}

std::string tensor_digest(const at::Tensor &t) {
  if (!t.defined()) return "none";
  const at::Tensor c = t.detach().to(at::kCPU).contiguous();
  const auto *b = static_cast<const unsigned char *>(c.data_ptr());
  const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}
// p's AdamW state in `states`, created as LibTorch's AdamW creates it (step 0, zero moments).
torch::optim::AdamWParamState &adam_state(
    ska::flat_hash_map<void *, std::unique_ptr<torch::optim::OptimizerParamState>> &states, const at::Tensor &p) {
  void *key = p.unsafeGetTensorImpl();
  auto it = states.find(key);
  if (it == states.end()) {
    auto st = std::make_unique<torch::optim::AdamWParamState>();
    st->step(0);
    st->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
    st->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
    it = states.emplace(key, std::move(st)).first;
  }
  return static_cast<torch::optim::AdamWParamState &>(*it->second);
}
}  // namespace

void adamw_step(torch::optim::AdamW &opt) {
  at::NoGradGuard no_grad;
  auto &states = opt.state();
  for (auto &group : opt.param_groups()) {
    const auto &o = static_cast<const torch::optim::AdamWOptions &>(group.options());
    if (o.amsgrad()) throw std::logic_error("adamw_step: amsgrad is not supported");
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    // The parameters with a gradient, by their step count after this step (in the trainer all of
    // them share one; the map keeps any mix exact).
    struct Bucket {
      std::vector<at::Tensor> params, grads, exp_avg, exp_avg_sq;
    };
    std::map<int64_t, Bucket> by_step;
    std::vector<at::Tensor> decayed;
    for (auto &p : group.params()) {
      if (!p.grad().defined()) continue;
      if (p.grad().is_sparse()) throw std::invalid_argument("adamw_step: sparse gradients are not supported");
      if (o.weight_decay() != 0) decayed.push_back(p);
      auto &st = adam_state(states, p);
      st.step(st.step() + 1);
      Bucket &b = by_step[st.step()];
      b.params.push_back(p);
      b.grads.push_back(p.grad());
      b.exp_avg.push_back(st.exp_avg());
      b.exp_avg_sq.push_back(st.exp_avg_sq());
    }
    // AdamW::step's operations in its order per parameter: the decoupled decay, the moments, the
    // denominator, the update.
    if (!decayed.empty()) at::_foreach_mul_(decayed, 1 - o.lr() * o.weight_decay());
    for (auto &[step, b] : by_step) {
      const double bc1 = 1 - std::pow(beta1, double(step)), bc2 = 1 - std::pow(beta2, double(step));
      at::_foreach_mul_(b.exp_avg, beta1);
      at::_foreach_add_(b.exp_avg, b.grads, 1 - beta1);
      at::_foreach_mul_(b.exp_avg_sq, beta2);
      at::_foreach_addcmul_(b.exp_avg_sq, b.grads, b.grads, 1 - beta2);
      std::vector<at::Tensor> denom = at::_foreach_sqrt(b.exp_avg_sq);
      at::_foreach_div_(denom, std::sqrt(bc2));
      at::_foreach_add_(denom, o.eps());
      at::_foreach_addcdiv_(b.params, b.exp_avg, denom, -(o.lr() / bc1));
    }
  }
}

// ---- the fused step, loss scaling ---------------------------------------------------------------------

void FusedAdamW::step(const std::optional<at::Tensor> &found_inf) {
  at::NoGradGuard no_grad;
  auto &states = opt_.state();
  for (auto &group : opt_.param_groups()) {
    const auto &o = static_cast<const torch::optim::AdamWOptions &>(group.options());
    if (o.amsgrad()) throw std::logic_error("FusedAdamW: amsgrad is not supported");
    std::vector<at::Tensor> params, grads, exp_avg, exp_avg_sq, steps;
    for (auto &p : group.params()) {
      if (!p.grad().defined()) continue;
      if (p.grad().is_sparse()) throw std::invalid_argument("FusedAdamW: sparse gradients are not supported");
      if (!params.empty() && (p.device() != params[0].device() || p.scalar_type() != params[0].scalar_type()))
        throw std::invalid_argument("FusedAdamW: a param group's parameters must share one device and dtype");
      void *key = p.unsafeGetTensorImpl();
      auto &st = adam_state(states, p);
      auto s = steps_.find(key);
      if (s == steps_.end())  // a fill on the device, no copy from the host
        s = steps_.emplace(key, at::full({}, double(st.step()), p.options().dtype(at::kFloat))).first;
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avg.push_back(st.exp_avg());
      exp_avg_sq.push_back(st.exp_avg_sq());
      steps.push_back(s->second);
    }
    if (params.empty()) continue;
    // As PyTorch's AdamW(fused=True) with a GradScaler: the counts advance, the kernel skips
    // everything when found_inf is 1, and the counts go back by found_inf.
    at::_foreach_add_(steps, 1);
    at::_fused_adamw_(params, grads, exp_avg, exp_avg_sq, {}, steps, o.lr(), std::get<0>(o.betas()),
                      std::get<1>(o.betas()), o.weight_decay(), o.eps(), /*amsgrad=*/false, /*maximize=*/false,
                      std::nullopt, found_inf);
    if (found_inf) at::_foreach_sub_(steps, std::vector<at::Tensor>(steps.size(), *found_inf));
  }
}

void FusedAdamW::store_steps() {
  if (steps_.empty()) return;
  std::vector<void *> keys;
  std::vector<at::Tensor> counts;
  for (const auto &[key, t] : steps_) {
    keys.push_back(key);
    counts.push_back(t.to(at::kCPU, at::kDouble));
  }
  auto &states = opt_.state();
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = states.find(keys[i]);
    if (it == states.end()) continue;
    static_cast<torch::optim::AdamWParamState &>(*it->second).step(std::llround(counts[i].item<double>()));
  }
}

void LossScaler::Options::validate() const {
  if (!(std::isfinite(init_scale) && init_scale > 0))
    throw std::invalid_argument("loss scaling: the initial scale must be finite and above 0");
  if (!(std::isfinite(growth_factor) && growth_factor > 1))
    throw std::invalid_argument("loss scaling: the growth factor must be finite and above 1");
  if (!(backoff_factor > 0 && backoff_factor < 1))
    throw std::invalid_argument("loss scaling: the backoff factor must be in (0, 1)");
  if (growth_interval < 1) throw std::invalid_argument("loss scaling: the growth interval must be at least 1");
}

LossScaler::LossScaler(const at::Device &device, const Options &options) : opt_(options) {
  opt_.validate();
  const auto f = at::TensorOptions().dtype(at::kFloat).device(device);
  scale_ = at::full({}, opt_.init_scale, f);
  growth_tracker_ = at::zeros({}, f.dtype(at::kInt));
  found_inf_ = at::zeros({}, f);
}

at::Tensor LossScaler::scale(const at::Tensor &loss) const { return loss * scale_; }

const at::Tensor &LossScaler::unscale(const std::vector<at::Tensor> &grads) {
  at::NoGradGuard no_grad;
  found_inf_.zero_();
  if (!grads.empty()) at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, scale_.reciprocal());
  return found_inf_;
}

void LossScaler::update() {
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, opt_.growth_factor, opt_.backoff_factor,
                         opt_.growth_interval);
}

std::pair<double, int64_t> LossScaler::state() const {
  return {scale_.item<double>(), static_cast<int64_t>(growth_tracker_.item<int>())};
}

void LossScaler::set_state(double scale, int64_t growth_tracker) {
  scale_.fill_(scale);
  growth_tracker_.fill_(growth_tracker);
}

// ---- the trainer -------------------------------------------------------------------------------------

struct Trainer::Impl {
  std::unique_ptr<torch::optim::AdamW> opt;
  std::unique_ptr<FusedAdamW> fused;     // the optimizer step when Trainer::fused_adamw (a GPU)
  std::unique_ptr<LossScaler> scaler;    // when Trainer::loss_scaling (float16)
  std::optional<std::pair<double, int64_t>> saved_scaler;  // a checkpoint's, for run()'s scaler
  std::vector<torch::Tensor> params;
  std::vector<std::pair<std::string, torch::Tensor>> named;  // every parameter, by name
};

namespace {
using clock_type = std::chrono::steady_clock;

std::string clock_str(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

std::string rate_str(double tps) {
  char buf[32];
  if (tps >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", tps / 1e6);
  else if (tps >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", tps / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", tps);
  return buf;
}

std::string adam_key(const std::string &param, const char *what) { return "train/adam/" + param + "/" + what; }
constexpr const char *kRngKey = "train/rng/cpu";
constexpr const char *kScaleKey = "train/scaler/scale";
constexpr const char *kGrowthKey = "train/scaler/growth_tracker";

// The gradients loss scaling unscales: every parameter's that has one.
std::vector<at::Tensor> gradients(const std::vector<at::Tensor> &params) {
  std::vector<at::Tensor> g;
  for (const auto &p : params)
    if (p.grad().defined()) g.push_back(p.grad());
  return g;
}
}  // namespace

Trainer::Trainer(LanguageModel &model, TrainSampler &sampler, const TrainConfig &cfg)
    : impl_(std::make_unique<Impl>()), model_(model), sampler_(sampler), cfg_(cfg) {
  cfg_.validate();
  warm_vector_math();  // before AdamW's first parallel sqrt (runtime/Threads.h)
  // Weight decay on the matrices (2+ dimensions) named `*.weight` only: the Linear layers', the
  // token embedding's and the token features' projection; not the learned position table
  // (`wpe`), nor an encoding's params (T5's table, FIRE's MLP; one a spec named `weight` would
  // be), nor biases and norms.
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto &kv : model->named_parameters()) {
    const std::string &name = kv.key();
    const bool is_weight = name.size() >= 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
    (is_weight && kv.value().dim() >= 2 ? decay : no_decay).push_back(kv.value());
    impl_->named.emplace_back(name, kv.value());
  }
  auto opts = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(cfg_.lr).betas({cfg_.beta1, cfg_.beta2}).eps(1e-8).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, opts(cfg_.weight_decay));
  if (!no_decay.empty()) groups.emplace_back(no_decay, opts(0.0));
  impl_->opt = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(cfg_.lr));
  impl_->params = model->parameters();
}

Trainer::~Trainer() = default;

TrainResult Trainer::result() const {
  TrainResult res;
  res.steps = state_.step;
  res.losses = state_.losses;
  res.skipped_steps = state_.skipped;
  res.seconds = state_.elapsed;
  res.tokens_per_second =
      res.seconds > 0 ? double(res.steps * cfg_.batch * cfg_.world_size * cfg_.seq_len) / res.seconds : 0.0;
  if (!res.losses.empty()) {
    res.first_loss = res.losses.front();
    const size_t n = std::min<size_t>(20, res.losses.size());
    double s = 0;
    for (size_t i = res.losses.size() - n; i < res.losses.size(); ++i) s += res.losses[i];
    res.final_loss = s / double(n);
  }
  return res;
}

// Data parallel: every rank's model and data position are the same (a fingerprint of the weights,
// the sampler's engine and the step), or GroupError naming `what`.
void Trainer::check_same_state(const std::string &what) const {
  std::vector<at::Tensor> tensors;
  for (auto &[name, t] : model_tensors(model_)) tensors.push_back(t);
  const std::string engine = sampler_.engine_state();
  const int64_t position[2] = {state_.step, sampler_.windows()};
  uint64_t h = fingerprint(tensors);
  h = fnv1a(engine.data(), engine.size(), h);
  h = fnv1a(position, sizeof position, h);
  dp_->check_same(h, what);
}

void Trainer::save(const std::string &path, const nlohmann::json &extra) const {
  const CudaSyncDebugScope waits_on_purpose(CudaSyncDebugScope::kOff);  // the state's copies to the host
  // Every rank holds the same model and data position; rank 0 writes them. Replicas that drifted
  // apart (ranks computing the same step to other bits: another ATen CPU capability, instruction
  // set or build) still get rank 0's state written, then the run stops: a first checkpoint refused
  // had lost the whole run.
  std::string drift;
  if (dp_) {
    try {
      check_same_state("the model and data position at step " + std::to_string(state_.step));
    } catch (const RanksDiffer &e) {
      drift = std::string(e.what()) +
              ". The ranks' replicas drifted apart: every rank must compute each step to the same bits (the "
              "same build, ATEN_CPU_CAPABILITY and CPU instruction set, device and --precision)";
    }
    if (!drift.empty() && dp_->rank() != 0) {
      // Waits for rank 0's write (a rank that exited first could have torchrun stop rank 0 in it).
      try {
        dp_->barrier("rank 0 saving its state after the replicas drifted apart");
      } catch (const std::exception &) {
      }
      throw RanksDiffer(drift + "; rank 0 saved its state (see its message)");
    }
    if (drift.empty() && dp_->rank() != 0) return;
  }
  if (impl_->fused) impl_->fused->store_steps();  // the counts on the device into opt.state()
  nlohmann::json samplers = nlohmann::json::array();
  for (int64_t r = 0; r < cfg_.world_size; ++r)
    samplers.push_back({{"rank", r}, {"engine", sampler_.engine_state()}, {"windows", sampler_.windows()}});
  nlohmann::json config = extra.is_object() ? extra : nlohmann::json::object();
  config["model"] = model_->config().to_json();
  config["train"] = cfg_.to_json();
  config["state"] = {{"step", state_.step},
                     {"skipped_steps", state_.skipped},
                     {"elapsed_seconds", state_.elapsed},
                     {"losses", state_.losses},
                     {"complete", state_.complete},
                     {"threads", at::get_num_threads()},
                     {"samplers", samplers}};
  if (state_.complete) config["result"] = result().to_json();
  auto tensors = model_tensors(model_);
  for (const auto &[name, p] : impl_->named) {
    auto it = impl_->opt->state().find(p.unsafeGetTensorImpl());
    if (it == impl_->opt->state().end()) continue;  // no update yet
    const auto &s = static_cast<const torch::optim::AdamWParamState &>(*it->second);
    tensors.emplace_back(adam_key(name, "exp_avg"), s.exp_avg());
    tensors.emplace_back(adam_key(name, "exp_avg_sq"), s.exp_avg_sq());
    tensors.emplace_back(adam_key(name, "step"), at::scalar_tensor(s.step(), at::kLong));
  }
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    tensors.emplace_back(kRngKey, gen.get_state());
  }
  if (impl_->scaler) {
    const auto [scale, growth] = impl_->scaler->state();
    tensors.emplace_back(kScaleKey, at::scalar_tensor(scale, at::kFloat));
    tensors.emplace_back(kGrowthKey, at::scalar_tensor(growth, at::kLong));
  }
  if (drift.empty()) {
    write_file_atomically(path, encode_checkpoint(model_->config().encoding, config, tensors),
                          "APE_TEST_KILL_DURING_CHECKPOINT");
    return;
  }
  std::string failed;  // (the others wait for this write at the barrier: it must be reached)
  try {
    write_file_atomically(path, encode_checkpoint(model_->config().encoding, config, tensors),
                          "APE_TEST_KILL_DURING_CHECKPOINT");
  } catch (const std::exception &e) {
    failed = e.what();
  }
  try {
    dp_->barrier("rank 0 saving its state after the replicas drifted apart");
  } catch (const std::exception &) {
  }
  throw RanksDiffer(drift + (failed.empty() ? "; rank 0's state is saved to " + path +
                                                  " (--resume it on ranks that compute alike, or on one process)"
                                            : "; rank 0's state could not be saved: " + failed));
}

void Trainer::restore(const Checkpoint &ckpt) {
  auto fail = [&](const std::string &why) {
    return std::runtime_error("checkpoint " + ckpt.path + ": cannot resume: " + why);
  };
  // The run's settings must be this trainer's: the resumed run takes them from the checkpoint.
  TrainConfig saved;
  try {
    saved = TrainConfig::from_json(ckpt.config.at("train"));
  } catch (const std::exception &e) {
    throw fail(std::string("bad training config: ") + e.what());
  }
  const int64_t saved_world = saved.world_size;
  if (saved.world_size != cfg_.world_size) {
    // Another number of ranks: the data position maps exactly when the global batch is the same.
    if (saved.batch * saved.world_size != cfg_.batch * cfg_.world_size)
      throw fail("it was written by " + std::to_string(saved.world_size) + " data-parallel rank(s) of batch " +
                 std::to_string(saved.batch) + " (global batch " + std::to_string(saved.batch * saved.world_size) +
                 "); this run has " + std::to_string(cfg_.world_size) + " of batch " + std::to_string(cfg_.batch) +
                 ": resume with a number of ranks that divides the global batch");
    saved.batch = cfg_.batch;
    saved.world_size = cfg_.world_size;
  }
  if (saved.to_json() != cfg_.to_json())
    throw fail("its training config differs from this run's: " + ckpt.config.at("train").dump());
  const auto st = ckpt.config.find("state");
  if (st == ckpt.config.end() || !st->is_object())
    throw fail("it holds no training state (a model-only checkpoint)");
  TrainState s;
  std::string engine;
  int64_t windows = 0;
  try {
    s.step = st->at("step").get<int64_t>();
    s.skipped = st->value("skipped_steps", int64_t{0});
    s.elapsed = st->at("elapsed_seconds").get<double>();
    s.losses = st->at("losses").get<std::vector<double>>();
    s.complete = st->at("complete").get<bool>();
    const auto &samplers = st->at("samplers");
    if (!samplers.is_array() || int64_t(samplers.size()) != saved_world)
      throw std::runtime_error("\"samplers\" must hold one entry per rank (" + std::to_string(saved_world) +
                               ", the run's world_size)");
    engine = samplers[0].at("engine").get<std::string>();
    windows = samplers[0].at("windows").get<int64_t>();
    for (int64_t r = 0; r < saved_world; ++r) {
      if (samplers[r].at("rank").get<int64_t>() != r)
        throw std::runtime_error("\"samplers\" entry " + std::to_string(r) + " is not rank " + std::to_string(r) + "'s");
      // The ranks share one window stream: their positions must be the same.
      if (samplers[r].at("engine").get<std::string>() != engine || samplers[r].at("windows").get<int64_t>() != windows)
        throw std::runtime_error("the data positions of rank 0 and rank " + std::to_string(r) + " differ");
    }
  } catch (const std::exception &e) {
    throw fail(std::string("bad training state: ") + e.what());
  }
  if (s.step < 0 || (cfg_.steps > 0 && s.step > cfg_.steps))
    throw fail("step " + std::to_string(s.step) + " is outside the budget of " + std::to_string(cfg_.steps));
  if (s.skipped < 0 || s.skipped > s.step)
    throw fail(std::to_string(s.skipped) + " skipped steps of " + std::to_string(s.step));
  if (static_cast<int64_t>(s.losses.size()) != s.step)
    throw fail(std::to_string(s.losses.size()) + " losses for " + std::to_string(s.step) + " steps");
  // A run completes at its last step, or at its time budget (--minutes) before: a complete run
  // anywhere else was never trained on (a resume "evaluated it again").
  if (s.complete && cfg_.minutes <= 0 && s.step != cfg_.steps)
    throw fail("it is marked complete at step " + std::to_string(s.step) + " of " + std::to_string(cfg_.steps) +
               " without a time budget");
  if (!(s.elapsed >= 0 && std::isfinite(s.elapsed))) throw fail("bad elapsed_seconds");
  for (double l : s.losses)
    if (!std::isfinite(l)) throw fail("a non-finite loss in the loss history");
  if (windows != s.step * cfg_.batch * cfg_.world_size)
    throw fail(std::to_string(windows) + " windows drawn in " + std::to_string(s.step) + " steps of batch " +
               std::to_string(cfg_.batch) +
               (cfg_.world_size > 1 ? " x " + std::to_string(cfg_.world_size) + " ranks" : std::string()));
  TrainSampler probe = sampler_;
  try {
    probe.restore(engine, windows);
  } catch (const std::exception &e) {
    throw fail(e.what());
  }
  // Optimizer state: every "train/" tensor must be one this model's parameters can hold.
  std::map<std::string, const torch::Tensor *> by_name;
  for (const auto &[name, p] : impl_->named) by_name.emplace(name, &p);
  std::map<std::string, std::array<const SavedTensor *, 3>> adam;
  const SavedTensor *rng = nullptr, *scale = nullptr, *growth = nullptr;
  for (const auto &t : ckpt.tensors) {
    if (t.name.rfind("train/", 0) != 0) continue;
    if (t.name == kRngKey) {
      rng = &t;
      continue;
    }
    if (t.name == kScaleKey || t.name == kGrowthKey) {
      const bool is_scale = t.name == kScaleKey;
      if (t.dtype != (is_scale ? at::kFloat : at::kLong) || !t.shape.empty())
        throw fail("loss-scaling state '" + t.name + "' has the wrong shape or dtype");
      (is_scale ? scale : growth) = &t;
      continue;
    }
    static const char *kinds[] = {"exp_avg", "exp_avg_sq", "step"};
    bool known = false;
    for (int k = 0; k < 3 && !known; ++k) {
      const std::string tail = std::string("/") + kinds[k];
      if (t.name.rfind("train/adam/", 0) != 0 || t.name.size() <= 11 + tail.size() ||
          t.name.compare(t.name.size() - tail.size(), tail.size(), tail) != 0)
        continue;
      const std::string param = t.name.substr(11, t.name.size() - 11 - tail.size());
      auto p = by_name.find(param);
      if (p == by_name.end()) throw fail("optimizer state for '" + param + "', which the model does not have");
      const bool scalar = k == 2;
      if (scalar ? (t.dtype != at::kLong || !t.shape.empty())
                 : (t.dtype != at::kFloat || at::IntArrayRef(t.shape) != p->second->sizes()))
        throw fail("optimizer state '" + t.name + "' has the wrong shape or dtype");
      adam[param][k] = &t;
      known = true;
    }
    if (!known) throw fail("unexpected training-state tensor '" + t.name + "'");
  }
  for (const auto &[param, parts] : adam) {
    if (!parts[0] || !parts[1] || !parts[2]) throw fail("incomplete optimizer state for '" + param + "'");
    int64_t step = 0;
    std::memcpy(&step, ckpt.bytes.data() + parts[2]->offset, sizeof step);
    // Every param takes every update that was not skipped (float16's loss scaling backing off):
    // another count resumed with other bias corrections, different bits without a word.
    if (step != s.step - s.skipped)
      throw fail("optimizer step " + std::to_string(step) + " of '" + param + "' (the run made " +
                 std::to_string(s.step - s.skipped) + " updates: " + std::to_string(s.step) + " steps, " +
                 std::to_string(s.skipped) + " skipped)");
    // The moments as AdamW makes them: finite, the second one >= 0 (a NaN or negative one resumed
    // and the run then stopped as "diverged", blaming the learning rate).
    const at::Tensor m = ckpt.tensor(*parts[0]), v = ckpt.tensor(*parts[1]);
    if (!at::isfinite(m).all().item<bool>() || !at::isfinite(v).all().item<bool>() || (v < 0).any().item<bool>())
      throw fail("optimizer state of '" + param + "' holds a non-finite or negative moment (a damaged file)");
  }
  std::optional<std::pair<double, int64_t>> scaler;
  if (scale || growth) {
    if (!scale || !growth) throw fail("incomplete loss-scaling state");
    const double sc = ckpt.tensor(*scale).item<double>();
    const int64_t gr = ckpt.tensor(*growth).item<int64_t>();
    if (!(std::isfinite(sc) && sc > 0) || gr < 0) throw fail("bad loss-scaling state");
    scaler.emplace(sc, gr);
  }
  auto gen = at::detail::getDefaultCPUGenerator();
  if (!rng) throw fail("no random state (" + std::string(kRngKey) + ")");
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    if (rng->dtype != at::kByte || rng->shape.size() != 1 || rng->shape[0] != gen.get_state().numel())
      throw fail("the random state has the wrong size");
  }
  try {  // its content, on a generator of its own (a bad one had thrown after the model was changed)
    at::make_generator<at::CPUGeneratorImpl>().set_state(ckpt.tensor(*rng));
  } catch (const std::exception &e) {
    throw fail("the random state (" + std::string(kRngKey) + ") is not one: " + error_text(e));
  }

  // Everything checked: now change the model, the optimizer, the sampler and the generator.
  load_state(model_, ckpt, ckpt.path);
  auto &states = impl_->opt->state();
  states.clear();
  for (const auto &[name, p] : impl_->named) {
    auto it = adam.find(name);
    if (it == adam.end()) continue;
    auto ps = std::make_unique<torch::optim::AdamWParamState>();
    int64_t step = 0;
    std::memcpy(&step, ckpt.bytes.data() + it->second[2]->offset, sizeof step);
    ps->step(step);
    ps->exp_avg(ckpt.tensor(*it->second[0]).to(p.device()));  // files are device-independent
    ps->exp_avg_sq(ckpt.tensor(*it->second[1]).to(p.device()));
    states[p.unsafeGetTensorImpl()] = std::move(ps);
  }
  if (impl_->fused) impl_->fused->reload_steps();
  impl_->saved_scaler = scaler;  // a run without loss scaling ignores it
  if (impl_->scaler) {
    if (scaler) impl_->scaler->set_state(scaler->first, scaler->second);
    else impl_->scaler = std::make_unique<LossScaler>(impl_->scaler->scale_tensor().device(), loss_scale_options);
  }
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(ckpt.tensor(*rng));
  }
  sampler_ = probe;
  state_ = s;
  // Data parallel: every rank resumed the same state (each machine reads its own copy of the
  // checkpoint; a stale copy trained on with the others' gradients until a collective broke).
  if (dp_) {
    const CudaSyncDebugScope waits_on_purpose(CudaSyncDebugScope::kOff);
    check_same_state("the state resumed from " + ckpt.path + " (step " + std::to_string(state_.step) +
                     "; every rank must resume from the same checkpoint, not an older copy or another run's)");
  }
}

void Trainer::distribute(DataParallel &dp) {
  if (dp.world_size() != cfg_.world_size)
    throw std::invalid_argument("Trainer::distribute: the group has " + std::to_string(dp.world_size()) +
                                " ranks, the training config's world_size is " + std::to_string(cfg_.world_size));
  // The same command on every rank: settings, model and encoding (a rank started with another
  // --batch or --seed would silently train something else). Threads may differ (machines differ).
  nlohmann::json train = cfg_.to_json();
  train.erase("threads");
  const nlohmann::json model = model_->config().to_json();
  const std::string settings = train.dump() + model.dump();
  try {
    dp.check_same(fnv1a(settings.data(), settings.size()), "the training settings and model config");
  } catch (const RanksDiffer &) {
    // Which one (every rank saw the mismatch; a failed group throws another GroupError): the keys
    // first (another build may have others: then no key by key comparison), then each key=value in
    // order; the first that differs is named, else the mismatch as a whole.
    std::string keys;
    for (const nlohmann::json *part : std::initializer_list<const nlohmann::json *>{&train, &model})
      for (const auto &item : part->items()) keys += item.key() + ",";
    dp.check_same(fnv1a(keys.data(), keys.size()), "the list of training settings (another build?)");
    for (const nlohmann::json *part : std::initializer_list<const nlohmann::json *>{&train, &model})
      for (const auto &item : part->items()) {
        const std::string kv = item.key() + "=" + item.value().dump();
        dp.check_same(fnv1a(kv.data(), kv.size()), std::string(part == &train ? "the training setting '"
                                                                              : "the model setting '") +
                                                        item.key() + "'");
      }
    throw;
  }
  // Where and in what precision each rank computes (an f16 rank's scaled gradients had been summed
  // with a bf16 rank's unscaled ones), then the tensors broadcast: their names, shapes and dtypes
  // (tensors of other sizes had reached Gloo, which aborted the process).
  const ComputeDevice &where = model_->placement();
  const std::string compute = std::string(where.device.is_cuda() ? "cuda" : where.device.str()) + " " +
                              std::to_string(static_cast<int>(where.precision));
  dp.check_same(fnv1a(compute.data(), compute.size()), "the device type and --precision");
  std::vector<at::Tensor> tensors;
  std::string layout;
  for (auto &[name, t] : model_tensors(model_)) {
    tensors.push_back(t);
    layout += name + ":" + std::string(c10::toString(t.scalar_type()));
    for (int64_t d : t.sizes()) layout += "," + std::to_string(d);
    layout += ";";
  }
  dp.check_same(fnv1a(layout.data(), layout.size()), "the model's tensors (names, shapes and dtypes)");
  dp.broadcast_from_root(tensors, "the initial model");
  dp_ = &dp;
}

TrainResult Trainer::run(std::ostream &out, const std::string &label, const std::string &checkpoint_path,
                         const nlohmann::json &extra) {
  const TrainConfig &cfg = cfg_;
  auto &opt = *impl_->opt;
  model_->train();
  const double budget_s = cfg.minutes * 60.0;
  const int64_t tokens_per_step = cfg.batch * cfg.world_size * cfg.seq_len;  // of all ranks
  const int64_t rank = dp_ ? dp_->rank() : 0;
  const std::string prefix = label.empty() ? "" : "[" + label + "] ";
  const std::string who = label.empty() ? std::string() : label + ": ";
  const auto t0 = clock_type::now();
  const double elapsed0 = state_.elapsed;  // trained before this run (resumed)
  const int64_t step0 = state_.step;
  auto last_print = t0 - std::chrono::seconds(10);
  double last_save = elapsed0;  // state_.elapsed at the last checkpoint
  size_t last_width = 0;
  auto end_line = [&] {
    if (cfg.progress && cfg.progress_in_place && last_width) out << "\n";
    last_width = 0;
  };
  auto since_start = [&] { return std::chrono::duration<double>(clock_type::now() - t0).count(); };
  // The step of the newest checkpoint of this run, if any (a resumed run starts from one).
  int64_t saved_step = checkpoint_path.empty() || step0 == 0 ? -1 : step0;
  auto kept = [&]() -> std::string {
    if (saved_step < 0) return "nothing was saved";
    return "the checkpoint of step " + std::to_string(saved_step) + " (" + checkpoint_path + ") is kept";
  };

  // On a GPU a step never waits for the device (Train.h): the loss and the gradient norm stay there
  // and are read `every` steps at a time (and before a checkpoint, a stop, the end; the progress
  // line shows the latest loss read),
  // then checked in step order as a CPU run checks them at once. Data parallel, the record is the
  // ranks' mean loss (from the gradients' all-reduce) and the norm of the averaged gradients: the
  // same bits on every rank, so every rank reads the same values and takes the same branch; the
  // ranks agree on the clock and on stop requests when they read (Distributed.h: "control").
  const at::Device device = model_->placement().device;
  const bool on_cpu = device.is_cpu();
  const int64_t every = read_every > 0 ? read_every : (on_cpu ? 1 : 16);
  const bool deferred = every > 1;
  // The optimizer step and loss scaling (Train.h): chosen here, once the model is placed.
  if (fused_adamw.value_or(!on_cpu)) {
    if (!impl_->fused) impl_->fused = std::make_unique<FusedAdamW>(opt);
  } else if (impl_->fused) {
    impl_->fused->store_steps();
    impl_->fused.reset();
  }
  if (loss_scaling.value_or(model_->placement().precision == Precision::F16)) {
    if (!impl_->scaler) {
      impl_->scaler = std::make_unique<LossScaler>(device, loss_scale_options);
      if (impl_->saved_scaler) impl_->scaler->set_state(impl_->saved_scaler->first, impl_->saved_scaler->second);
    }
  } else {
    impl_->scaler.reset();
  }
  LossScaler *const scaler = impl_->scaler.get();
  // found_inf: the step's overflow flag under loss scaling (the step is then skipped). FusedAdamW
  // skips on the device; adamw_step (the CPU's) is skipped by the host, which reads the flag.
  auto optimizer_step = [&](const std::optional<at::Tensor> &found_inf) {
    if (impl_->fused) impl_->fused->step(found_inf);
    else if (!found_inf || found_inf->item<float>() == 0) adamw_step(opt);
  };
  // The scale after a step: below 1, float16 cannot hold the gradients at their true size.
  auto check_scale = [&](double scale, int64_t step) {
    if (scale >= 1) return;
    end_line();
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "loss scaling: the scale fell to %g at step %lld (%lld update(s) skipped for non-finite "
                  "gradients): the gradients overflow float16 even unscaled. Training stopped; ",
                  scale, (long long)(step + 1), (long long)state_.skipped);
    throw TrainingDiverged(who + buf + kept() + ". Use --precision bf16, or a lower --lr.");
  };
  struct Pending {
    at::Tensor record;  // float64 on the device: loss, gradient norm[, found_inf, scale after the step]
    double lr;
  };
  std::vector<Pending> pending;
  double last_loss = state_.losses.empty() ? 0.0 : state_.losses.back();
  double steady_s = -1;  // since_start() once kSteadyAfter steps are done (the work on the device too)
  // A non-finite gradient norm stops training (Train.h); `now` says whether the step is current
  // (the model can still be searched for where it came from).
  // What to try: a lower learning rate, unless nothing was updated yet (the run's first step from
  // its starting weights), where the model itself computes the non-finite value.
  auto advice = [&](int64_t step) -> std::string {
    if (step > 0) return " Try a lower --lr.";
    return " No update had been applied yet, so the learning rate is not the cause: the model computes it at its "
           "initial weights (for a --spec encoding, `ape-check SPEC` compares its kernels with the reference).";
  };
  auto check_gnorm = [&](int64_t step, double l, double gnorm, const char *lr_text, bool now) {
    if (std::isfinite(gnorm)) return;
    end_line();
    std::string where;
    if (now)
      for (const auto &[name, p] : impl_->named)
        if (!finite(p.grad())) {
          where = "the gradient of '" + name + "' (" + kind_of(p.grad()) + ")";
          break;
        }
    throw TrainingDiverged(who + "gradient norm became non-finite at step " + std::to_string(step + 1) +
                           " (loss " + std::to_string(l) + ", lr " + lr_text + ")" +
                           (where.empty() ? "" : "; first non-finite value: " + where) +
                           ". Training stopped; " + kept() + "." + advice(step));
  };
  // Records one step's loss and applies the divergence rule (Train.h): the recent mean far above
  // where training started.
  auto account = [&](double l) {
    state_.losses.push_back(l);
    last_loss = l;
    constexpr size_t kWindow = 10;
    if (cfg.divergence_factor > 0 && state_.losses.size() >= kWindow) {
      double recent = 0;
      for (size_t i = state_.losses.size() - kWindow; i < state_.losses.size(); ++i) recent += state_.losses[i];
      recent /= double(kWindow);
      const double first = state_.losses.front();
      if (recent > cfg.divergence_factor * first) {
        end_line();
        char buf[320];
        std::snprintf(buf, sizeof buf,
                      "loss diverged: the mean of steps %lld-%lld is %.4g, more than %g x the first step's %.4g "
                      "(--divergence-factor). Training stopped; ",
                      (long long)(state_.losses.size() - kWindow + 1), (long long)state_.losses.size(), recent,
                      cfg.divergence_factor, first);
        throw TrainingDiverged(who + buf + kept() + ". Try a lower --lr.");
      }
    }
  };
  // What the CUDA attention backwards' status word (read with the losses) says could not be held;
  // under loss scaling an overflow of the sums is one more overflow, its step skipped.
  auto check_backward_status = [&](uint32_t word, bool skipped, int64_t by_step) {
    if (const std::string why = cuda_status_error(word); !why.empty() && !skipped)
      throw TrainingDiverged(who + "the CUDA attention backward failed by step " + std::to_string(by_step) +
                             ": " + why + ". Training stopped; " + kept() + ".");
  };
  // Reads the queued steps (one wait for the device) and checks them in order.
  auto read_pending = [&] {
    if (pending.empty()) return;
    const CudaSyncDebugScope waits_on_purpose(CudaSyncDebugScope::kOff);
    std::vector<at::Tensor> all;
    for (const auto &p : pending) all.push_back(p.record);
    const int64_t w = all.front().size(0);
    // The attention backwards' status word rides in the same copy (one wait for the device).
    const at::Tensor status = device.is_cuda() ? cuda_backward_status(device.index()) : at::Tensor();
    at::Tensor records = at::stack(all).flatten();
    if (status.defined()) records = at::cat({records, status.to(at::kDouble)});
    const at::Tensor host = records.cpu();
    const double *v = host.data_ptr<double>();
    const auto status_word = status.defined() ? static_cast<uint32_t>(v[w * int64_t(pending.size())]) : 0u;
    const int64_t first_step = int64_t(state_.losses.size());
    bool any_skipped = false;
    for (size_t i = 0; i < pending.size(); ++i) {
      const double l = v[w * i], gnorm = v[w * i + 1];
      const bool skipped = w == 4 && v[w * i + 2] != 0;
      const int64_t step = first_step + int64_t(i);
      char lr_text[32];
      std::snprintf(lr_text, sizeof lr_text, "%.3g", pending[i].lr);
      if (!std::isfinite(l)) {
        end_line();
        throw TrainingDiverged(who + "loss became " + (std::isnan(l) ? "NaN" : "inf") + " at step " +
                               std::to_string(step + 1) + " (lr " + lr_text + "; found when the queued losses were read, " +
                               std::to_string(pending.size() - i - 1) + " step(s) later). Training stopped; " +
                               kept() + "." + advice(step));
      }
      if (skipped) {  // an overflow under loss scaling: no update, the scale halved
        any_skipped = true;
        ++state_.skipped;
      } else {
        check_gnorm(step, l, gnorm, lr_text, false);
      }
      account(l);
      if (w == 4) check_scale(v[w * i + 3], step);
    }
    pending.clear();
    // What the fixed-point gradient sums of the attention kernels could not hold (the gradients
    // concerned are NaN, so the checks above stop the run first; this names the cause).
    // Under loss scaling an overflow of the sums is one more overflow: its steps were skipped.
    check_backward_status(status_word, any_skipped, state_.step);
  };

  // The clock every rank goes by: this process's, or, data parallel, the ranks' agreed one, taken
  // once a step together with the stop requests (below); the loop's branches follow it alike.
  state_.elapsed = elapsed0;
  // $APE_CUDA_SYNC_DEBUG: a wait for the GPU inside the queued steps warns or throws (the reads of
  // the queued losses and the checkpoints wait on purpose: CudaSyncDebugScope::kOff).
  std::optional<CudaSyncDebugScope> sync_check;
  if (deferred) {
    sync_check.emplace(CudaSyncDebugScope::kFromEnvironment);
    // Said once, so that a check of "no waits" knows the mode was on (scripts/gpu-check.sh).
    if (const std::string mode = cuda_sync_debug_mode(); mode != "off")
      out << prefix << "LibTorch's sync debug mode inside the queued steps: " << mode << " (APE_CUDA_SYNC_DEBUG)\n";
  }
  bool stop_asked = false;  // data parallel, deferred: a stop request held until the ranks agree
  for (;;) {
    const int64_t step = state_.step;
    if (!dp_) state_.elapsed = elapsed0 + since_start();
    const double p_steps = cfg.steps > 0 ? double(step) / double(cfg.steps) : 0.0;
    const double p_time = budget_s > 0 ? state_.elapsed / budget_s : 0.0;
    const double progress = std::max(p_steps, p_time);
    if (progress >= 1.0) break;

    const double lr = learning_rate(cfg, step, progress);
    for (auto &g : opt.param_groups()) static_cast<torch::optim::AdamWOptions &>(g.options()).lr(lr);

    // This rank's rows of the step's draw (all of it in a single process).
    torch::Tensor windows = sampler_.next(cfg.batch * cfg.world_size, cfg.seq_len + 1, rank * cfg.batch, cfg.batch);
    if (!on_cpu) windows = to_device_async(windows, device);
    opt.zero_grad();
    torch::Tensor loss = model_->loss(windows);
    char lr_text[32];
    std::snprintf(lr_text, sizeof lr_text, "%.3g", lr);
    if (deferred) {  // a GPU: the step is queued; its loss and gradient norm are read later
      (scaler ? scaler->scale(loss) : loss).backward();
      if (dp_) loss = dp_->average_gradients(impl_->params, loss, step + 1);  // the ranks' mean
      std::optional<at::Tensor> found_inf;
      if (scaler) found_inf = scaler->unscale(gradients(impl_->params));
      at::Tensor gnorm = clip_gradients(impl_->params, cfg.grad_clip);
      optimizer_step(found_inf);
      std::vector<at::Tensor> record = {loss.detach().to(at::kDouble), gnorm.detach().to(at::kDouble)};
      if (scaler) {
        scaler->update();
        record.push_back(found_inf->to(at::kDouble));  // copies: the scaler's tensors change next step
        record.push_back(scaler->scale_tensor().to(at::kDouble));
      }
      pending.push_back({at::stack(record), lr});
      state_.step = step + 1;
      // Read every `every` steps counted from the run's start (the ranks' agreement below falls on
      // the same steps, so its own wait finds the device idle), or when that many are queued.
      if ((state_.step - step0) % every == 0 || int64_t(pending.size()) >= every) read_pending();
    } else {
      double l = 0;
      if (dp_) {  // the mean loss and gradients over the ranks: every rank then decides alike
        (scaler ? scaler->scale(loss) : loss).backward();  // queued before any read of the loss
        l = dp_->average_gradients(impl_->params, loss, step + 1).item<double>();
      } else {
        l = loss.item<double>();
      }
      if (!std::isfinite(l)) {
        end_line();
        const std::string where = locate_nonfinite(model_, windows);
        throw TrainingDiverged(who + "loss became " + (std::isnan(l) ? "NaN" : "inf") + " at step " +
                               std::to_string(step + 1) + " (lr " + lr_text + ")" +
                               (where.empty() ? "" : "; first non-finite value: " + where) +
                               ". Training stopped; " + kept() + "." + advice(step));
      }
      if (!dp_) (scaler ? scaler->scale(loss) : loss).backward();
      std::optional<at::Tensor> found_inf;  // the same on every rank: the gradients were averaged
      if (scaler) found_inf = scaler->unscale(gradients(impl_->params));
      const bool skipped = found_inf && found_inf->item<float>() != 0;
      const double gnorm = clip_gradients(impl_->params, cfg.grad_clip).item<double>();
      if (!skipped) check_gnorm(step, l, gnorm, lr_text, true);
      if (device.is_cuda())  // a step at a time on a GPU (read_every = 1): its status word too
        check_backward_status(static_cast<uint32_t>(cuda_backward_status(device.index()).item<int32_t>()), skipped, step + 1);
      std::string digest;
      if (step_digest_requested()) {
        digest = "[digest] step " + std::to_string(step + 1) + " batch " + tensor_digest(windows);
        for (const auto &[name, p] : impl_->named) digest += " grad:" + name + " " + tensor_digest(p.grad());
      }
      optimizer_step(found_inf);
      if (!digest.empty()) {
        for (const auto &[name, p] : impl_->named) digest += " param:" + name + " " + tensor_digest(p);
        end_line();
        out << digest << "\n" << std::flush;
      }
      state_.step = step + 1;
      state_.skipped += skipped;
      account(l);
      if (scaler) {
        scaler->update();
        check_scale(scaler->scale_tensor().item<double>(), step);
      }
    }
    const auto now = clock_type::now();
    bool stop = false;
    if (dp_) {
      // Deferred, the ranks agree once every `every` steps (an agreement waits for the device on
      // NCCL): in between, every rank keeps the last agreed clock and asks for no stop, so all take
      // the same branches; a stop request is held until then.
      stop_asked = (interrupt && interrupt(state_)) || stop_asked;
      if (!deferred || (state_.step - step0) % every == 0) {
        const auto [seconds, any_stop] = dp_->agree(since_start(), stop_asked, state_.step);
        state_.elapsed = elapsed0 + seconds;
        stop = any_stop;
        stop_asked = false;
      }
    } else {
      state_.elapsed = elapsed0 + since_start();
    }
    const bool done_soon = (cfg.steps > 0 && state_.step >= cfg.steps) || (budget_s > 0 && state_.elapsed >= budget_s);
    if (!dp_ && !done_soon) stop = interrupt && interrupt(state_);
    if (!done_soon && stop) {
      end_line();
      read_pending();
      if (!checkpoint_path.empty()) save(checkpoint_path, extra);
      return result();
    }
    if (!checkpoint_path.empty() && !done_soon &&
        ((cfg.checkpoint_every > 0 && state_.step % cfg.checkpoint_every == 0) ||
         (cfg.checkpoint_minutes > 0 && state_.elapsed - last_save >= cfg.checkpoint_minutes * 60.0))) {
      read_pending();
      save(checkpoint_path, extra);
      saved_step = state_.step;
      last_save = state_.elapsed;
    }

    if (state_.step == step0 + kSteadyAfter) {
      read_pending();  // waits for the device: the steady rate's clock starts when its steps are done
      steady_s = since_start();
    }
    // The first progress line shows the first loss. Data parallel, every rank reads it (only rank
    // 0 prints): the ranks read at the same steps, so a NaN stops them all at the same one.
    if (state_.step == step0 + 1 && (cfg.progress || dp_)) read_pending();
    if (cfg.progress) {
      const double since = std::chrono::duration<double>(now - last_print).count();
      if (since >= (cfg.progress_in_place ? 0.2 : 15.0) || state_.step == step0 + 1 || done_soon) {
        last_print = now;
        const double run_s = since_start();
        const double tps = run_s > 0 ? double((state_.step - step0) * tokens_per_step) / run_s : 0.0;
        double left = INFINITY;
        if (cfg.steps > 0 && state_.step > step0)
          left = double(cfg.steps - state_.step) * run_s / double(state_.step - step0);
        if (budget_s > 0) left = std::min(left, budget_s - state_.elapsed);
        std::ostringstream line;
        line << prefix << "step " << state_.step;
        if (cfg.steps > 0) line << "/" << cfg.steps;
        line << "  loss " << std::fixed << std::setprecision(4) << last_loss << "  lr " << std::scientific
             << std::setprecision(2) << lr << "  " << rate_str(tps) << " tok/s  " << clock_str(state_.elapsed)
             << " elapsed, " << clock_str(std::max(0.0, left)) << " left";
        if (state_.skipped > 0) line << "  " << state_.skipped << " skipped (f16 overflow)";
        std::string s = line.str();
        if (cfg.progress_in_place) {
          const size_t w = s.size();
          if (w < last_width) s += std::string(last_width - w, ' ');
          last_width = w;
          out << "\r" << s << std::flush;
        } else {
          out << s << "\n" << std::flush;
        }
      }
    }
  }
  sync_check.reset();
  read_pending();
  end_line();
  // This run's own speed (a resumed run reports what it did itself), before the last checkpoint
  // is written; and after its first kSteadyAfter steps (allocations, library handles, autotuning).
  const double run_s = since_start();
  state_.complete = true;
  if (!checkpoint_path.empty()) save(checkpoint_path, extra);
  TrainResult res = result();
  res.tokens_per_second = run_s > 0 ? double((state_.step - step0) * tokens_per_step) / run_s : 0.0;
  if (steady_s >= 0 && run_s > steady_s && state_.step - step0 > 2 * kSteadyAfter)
    res.steady_tokens_per_second = double((state_.step - step0 - kSteadyAfter) * tokens_per_step) / (run_s - steady_s);
  return res;
}

TrainResult train(LanguageModel &model, TrainSampler &sampler, const TrainConfig &cfg, std::ostream &out,
                  const std::string &label) {
  Trainer t(model, sampler, cfg);
  return t.run(out, label);
}

}  // namespace ape
