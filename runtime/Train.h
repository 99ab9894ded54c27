// Train: the training loop, its checkpoints and resuming from them.
//
// AdamW (weight decay on Linear/Embedding matrices only), linear warmup then cosine decay to
// min_lr_frac·lr, gradient clipping, a step and/or time budget, a one-line progress display.
//
// Checkpoints (Checkpoint.h) hold the model and, written by a Trainer, the whole training state:
//   config "train"  the TrainConfig (the resumed run uses it, not the command line)
//   config "state"  {"step": steps done, "elapsed_seconds": training time so far, "losses": one per
//                    step, "complete": the budget is spent, "threads": intra-op threads,
//                    "samplers": [{"rank": r, "engine": the data sampler's mt19937_64 state,
//                                  "windows": windows drawn}, ...]}
//                   "samplers" holds one entry per data-parallel rank, by rank (world_size of the
//                   "train" config; 1 for a single process). The ranks of a data-parallel run share
//                   one window stream (runtime/Distributed.h), so every entry is the same position:
//                   windows = step x batch x world_size; rank r keeps rows [r·batch, (r+1)·batch)
//                   of each step's draw. Before writing, the ranks check that their models and
//                   positions agree; rank 0 writes the file.
//   tensors         "train/adam/<param>/exp_avg", ".../exp_avg_sq" (AdamW's moments, f32, the
//                    param's shape) and ".../step" (i64 scalar) per parameter with optimizer state;
//                    "train/rng/cpu" (u8): LibTorch's CPU generator; with loss scaling (f16),
//                    "train/scaler/scale" (f32 scalar) and "train/scaler/growth_tracker" (i64
//                    scalar): the LossScaler's state.
// Data parallel (Trainer::distribute, runtime/Distributed.h): N ranks with `batch` each take the
// step a single process with batch N·batch takes (the same windows, the mean loss and gradient, to
// the rounding of the all-reduce). A run may resume on another number of ranks when the global
// batch stays the same (ape-train then sets batch = global / N); the data position maps exactly.
//
// A run resumed from its last checkpoint (Trainer::restore) continues with the same optimizer
// moments, step, learning-rate schedule position, data order and random state, so with a step
// budget (on any thread count: docs/reliability.md) it ends bit-identical to the run that was never interrupted
// (test/resume/kill_loop.sh kills one at random moments, mid-write too). With a time budget the
// schedule follows the clock, which no two runs share; the time already trained is restored.
//
// Devices (runtime/Device.h): the trainer runs where the model is placed (LanguageModel::place).
// On a GPU no step waits for the device: the loss and the gradient norm stay there and are read
// read_every (16) steps at a time, then checked in step order as a CPU run checks them each step
// (docs/cuda.md, "Training on a GPU"), data parallel too (the ranks' mean loss stays on the device
// and they agree on the clock and stop requests when they read); checkpoints hold CPU copies, so a
// run resumes on any device.
//
// float16 (--precision f16, runtime/Device.h): the loss is scaled dynamically (LossScaler below,
// torch.amp.GradScaler's rules): a step whose gradients overflow is skipped on the device (its
// loss is still recorded; TrainState::skipped counts them) and the scale halves; training stops
// with TrainingDiverged when the scale falls below 1 (gradients float16 cannot hold at their true
// size). On a GPU the optimizer step is FusedAdamW, which skips without the host reading anything.
//
// Divergence (documented in --help): training stops with TrainingDiverged when the loss or the
// gradient norm is NaN or inf (the message names the parameter, or the first layer output, where
// it first appears), or when the mean loss of the last 10 steps exceeds divergence_factor (2) times
// the loss of the first step: a model that does that has stopped learning and is getting worse
// than its random start.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/optim/adamw.h>

#include "runtime/Checkpoint.h"
#include "runtime/Data.h"
#include "runtime/Model.h"

namespace ape {
class DataParallel;

struct TrainConfig {
  int64_t steps = 0;        // step budget (0: none; then minutes must be > 0)
  double minutes = 0;       // wall-clock budget (0: none); with both, whichever ends first
  int64_t batch = 16;
  int64_t seq_len = 128;    // the training length L
  double lr = 3e-3;
  double min_lr_frac = 0.1; // cosine decays to lr·min_lr_frac
  int64_t warmup_steps = 30;  // capped at steps/5 when a step budget is set
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95;
  double grad_clip = 1.0;
  uint64_t seed = 1234;
  int64_t checkpoint_every = 0;    // steps between checkpoints (0: none by steps)
  double checkpoint_minutes = 10;  // minutes between checkpoints (0: none by time)
  double divergence_factor = 2.0;  // stop when the recent mean loss exceeds this x the first (0: never)
  int64_t threads = 0;             // intra-op threads the run uses (0: all); recorded for resuming
  int64_t world_size = 1;          // data-parallel ranks; `batch` is each rank's (global: batch x world_size)
  bool progress = true;       // print the progress line
  bool progress_in_place = true;  // refresh it with '\r' (a terminal); otherwise a line now and then

  void validate() const;  // throws std::invalid_argument naming the option and its range
  nlohmann::json to_json() const;
  static TrainConfig from_json(const nlohmann::json &j);  // validated; throws std::runtime_error
};

// The steps a run's steady speed leaves out (TrainResult::steady_tokens_per_second).
inline constexpr int64_t kSteadyAfter = 5;

struct TrainResult {
  int64_t steps = 0;
  double seconds = 0;
  double tokens_per_second = 0;  // of all ranks together
  // After the run's first kSteadyAfter steps (0 when it ran at most 2 kSteadyAfter steps).
  double steady_tokens_per_second = 0;
  double first_loss = 0;  // loss of the first step
  double final_loss = 0;  // mean loss of the last min(20, steps) steps
  int64_t skipped_steps = 0;  // updates skipped by loss scaling (an overflow; f16)
  std::vector<double> losses;
  nlohmann::json to_json() const;  // without the loss curve
};

// Training stopped: a non-finite loss or gradient, or the divergence rule above. The checkpoints
// written before stay as they were.
struct TrainingDiverged : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The learning rate at `step` (0-based) given the fraction of the budget used, in [0, 1].
double learning_rate(const TrainConfig &cfg, int64_t step, double progress);

// Where a non-finite value first appears for `windows`: "parameter 'block0.attn.wq.weight'", or the
// first layer output in forward order ("block 1 attention", ...); "" when every value is finite.
std::string locate_nonfinite(LanguageModel &model, const at::Tensor &windows);

// torch::nn::utils::clip_grad_norm_(params, max_norm) bit for bit (norm 2), returning the total norm
// as a tensor on the gradients' device instead of reading it (which would wait for a GPU).
at::Tensor clip_gradients(const std::vector<at::Tensor> &params, double max_norm);

// torch::optim::AdamW::step of `opt` (amsgrad off) with multi-tensor operations (at::_foreach_*):
// per param group and step count, each of AdamW's element-wise operations once for all its
// parameters. On the CPU those are the same operations per tensor (the same bits: the tests
// compare them); on a GPU they are a few kernels per group instead of about ten per parameter,
// which LibTorch's C++ loop launches one by one (PyTorch's Python AdamW takes this foreach path by
// default on CUDA). The state stays in opt.state() as AdamWParamState, as checkpoints hold it.
void adamw_step(torch::optim::AdamW &opt);

// torch::optim::AdamW's step as PyTorch's AdamW(fused=True) takes it (at::_fused_adamw_: one
// kernel per parameter chunk on a GPU), with the step counts as float32 tensors on the parameters'
// device, so that a step can be skipped there: with `found_inf` (a float32 [1] tensor on that
// device, 1 when the step's gradients overflowed under loss scaling) parameters, moments and
// counts stay as they were, and nothing reads the flag on the host. The moments live in
// opt.state() (as checkpoints hold them); the counts there are brought up to date by
// store_steps(). The same math as adamw_step, not the same roundings.
class FusedAdamW {
 public:
  explicit FusedAdamW(torch::optim::AdamW &opt) : opt_(opt) {}
  void step(const std::optional<at::Tensor> &found_inf = std::nullopt);
  // opt.state()'s step counts := the device's (reads them: waits for a GPU).
  void store_steps();
  // Drops the device's counts: the next step takes them from opt.state() (after it was replaced).
  void reload_steps() { steps_.clear(); }

 private:
  torch::optim::AdamW &opt_;
  std::map<void *, at::Tensor> steps_;  // by parameter (TensorImpl)
};

// Dynamic loss scaling for float16 training: torch.amp.GradScaler's rules with LibTorch's kernels
// for them, all on the device. The loss is multiplied by the scale before backward; unscale()
// divides the gradients by it and flags a non-finite one (at::_amp_foreach_non_finite_check_and_
// unscale_); the optimizer then skips the step (FusedAdamW); update() halves the scale after such
// a step and doubles it after growth_interval clean steps in a row (at::_amp_update_scale_). With
// a power-of-two scale and no overflow, scaling and unscaling change no bit of the gradients.
class LossScaler {
 public:
  struct Options {
    double init_scale = 65536.0;  // GradScaler's defaults
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int64_t growth_interval = 2000;
    void validate() const;  // throws std::invalid_argument
  };
  LossScaler(const at::Device &device, const Options &options);

  at::Tensor scale(const at::Tensor &loss) const;  // loss x scale
  // Unscales the gradients in place; returns the step's found_inf (float32 [1] on the device).
  const at::Tensor &unscale(const std::vector<at::Tensor> &grads);
  void update();  // after the step: the new scale from found_inf

  const at::Tensor &scale_tensor() const { return scale_; }  // float32 [1]
  const at::Tensor &found_inf() const { return found_inf_; }
  // The state checkpoints hold (read from the device) and its restoration.
  std::pair<double, int64_t> state() const;
  void set_state(double scale, int64_t growth_tracker);

 private:
  Options opt_;
  at::Tensor scale_, growth_tracker_, found_inf_;
};

// The state of a training run besides the model (see the header comment).
struct TrainState {
  int64_t step = 0;       // steps done
  int64_t skipped = 0;    // of them, steps whose update loss scaling skipped (an overflow)
  double elapsed = 0;     // seconds trained so far, over every resumed part
  std::vector<double> losses;
  bool complete = false;  // the budget is spent
};

class Trainer {
 public:
  Trainer(LanguageModel &model, TrainSampler &sampler, const TrainConfig &cfg);
  ~Trainer();
  Trainer(const Trainer &) = delete;
  Trainer &operator=(const Trainer &) = delete;

  // Continues the run `ckpt` was written by: model, optimizer moments, step, losses, time trained,
  // sampler position and random state. Everything is checked first (the encoding, the config, the
  // shapes of the optimizer state, the sampler) and a mismatch throws std::runtime_error naming
  // it; the trainer is then unchanged.
  void restore(const Checkpoint &ckpt);

  // Trains as one rank of `dp` (cfg.world_size must be its size): checks that every rank has the
  // same settings and model layout, copies rank 0's initial model to all, and from then on takes
  // this rank's shard of every batch and averages the gradients over the ranks. Call before
  // restore() and run(); `dp` must outlive the trainer. Throws GroupError (Distributed.h).
  void distribute(DataParallel &dp);

  // Trains until the budget is spent. With a `checkpoint_path`, writes a checkpoint there every
  // cfg.checkpoint_every steps and every cfg.checkpoint_minutes minutes, and at the end (complete);
  // `extra` is added to each checkpoint's config (e.g. "data"). Throws TrainingDiverged.
  TrainResult run(std::ostream &out, const std::string &label = "", const std::string &checkpoint_path = "",
                  const nlohmann::json &extra = nlohmann::json::object());

  // Writes the model and the training state now (atomically).
  void save(const std::string &path, const nlohmann::json &extra = nlohmann::json::object()) const;
  // Data parallel: GroupError naming `what` unless every rank holds the same model and data position.
  void check_same_state(const std::string &what) const;

  const TrainState &state() const { return state_; }
  TrainResult result() const;

  // Asked after every step: when it returns true, run() writes the checkpoint (if it has a path)
  // and returns early, the run not complete (ape-train: Ctrl-C / SIGTERM; tests: stop at a step).
  std::function<bool(const TrainState &)> interrupt;
  // Steps between reads of the loss and gradient norm (0: automatic, every step on the CPU, 16 on
  // a GPU, where a read waits for the device; data parallel, also the steps between the ranks'
  // agreements on the clock and stop requests). The losses, checks and bits are the same at any
  // setting; only when a divergence, a stop request or the end of a time budget is noticed changes
  // (tests set it on the CPU).
  int64_t read_every = 0;
  // Dynamic loss scaling (LossScaler): on by default when the model computes in float16. Tests
  // turn it on for float32 on the CPU, where a power-of-two scale changes no bit of the run, and
  // set the options (an overflow on purpose).
  std::optional<bool> loss_scaling;
  LossScaler::Options loss_scale_options;
  // The optimizer step: FusedAdamW (by default on a GPU) or adamw_step (by default on the CPU,
  // LibTorch's bits). Tests run the GPU's choice on the CPU.
  std::optional<bool> fused_adamw;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;  // the optimizer
  LanguageModel &model_;
  TrainSampler &sampler_;
  TrainConfig cfg_;
  TrainState state_;
  DataParallel *dp_ = nullptr;
};

// Trains in place from the start, no checkpoints (Trainer::run). `label` prefixes the progress line.
TrainResult train(LanguageModel &model, TrainSampler &sampler, const TrainConfig &cfg, std::ostream &out,
                  const std::string &label = "");

}  // namespace ape
