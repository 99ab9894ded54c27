// Train: the training loop and checkpoints.
//
// AdamW (weight decay on Linear/Embedding matrices only), linear warmup then cosine decay to
// min_lr_frac·lr, gradient clipping, a step and/or time budget, a one-line progress display.
//
// Checkpoint file (host byte order):
//   "APECKPT1" | u32 version | u32 n, encoding name | u64 n, config JSON | u64 n, payload
//   (torch::serialize archive of every parameter and buffer, by name) | u64 FNV-1a of all before.
// Written to a temporary file and renamed, so a crash mid-write leaves the previous file intact.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/Data.h"
#include "runtime/Model.h"

namespace ape {

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
  bool progress = true;       // print the progress line
  bool progress_in_place = true;  // refresh it with '\r' (a terminal); otherwise a line now and then

  void validate() const;  // throws std::invalid_argument
  nlohmann::json to_json() const;
};

struct TrainResult {
  int64_t steps = 0;
  double seconds = 0;
  double tokens_per_second = 0;
  double first_loss = 0;  // loss of the first step
  double final_loss = 0;  // mean loss of the last min(20, steps) steps
  std::vector<double> losses;
  nlohmann::json to_json() const;  // without the loss curve
};

// A non-finite loss or gradient: training stopped; nothing was written.
struct TrainingDiverged : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The learning rate at `step` (0-based) given the fraction of the budget used, in [0, 1].
double learning_rate(const TrainConfig &cfg, int64_t step, double progress);

// Trains in place. `label` prefixes the progress line. Throws TrainingDiverged on NaN/inf.
TrainResult train(LanguageModel &model, TrainSampler &sampler, const TrainConfig &cfg,
                  std::ostream &out, const std::string &label = "");

// ---- checkpoints ----------------------------------------------------------------------------------
constexpr uint32_t kCheckpointVersion = 1;

struct Checkpoint {
  std::string encoding;
  nlohmann::json config;  // {"model": ModelConfig, "train": TrainConfig, "result": ..., ...}
  std::string payload;    // the serialized parameters
};

// Writes atomically. `config` must hold "model" (ModelConfig::to_json); the encoding is the model's.
void save_checkpoint(const std::string &path, LanguageModel &model, const nlohmann::json &config);

// Reads and verifies the envelope (magic, version, sizes, checksum). Throws std::runtime_error
// "checkpoint <path>: <what is wrong>" for a missing, foreign, truncated or corrupt file.
Checkpoint read_checkpoint(const std::string &path);

// Copies the checkpoint's tensors into `model` (same encoding, same shapes, every parameter present;
// a buffer the checkpoint lacks, i.e. a fixed param added to the encoding since, keeps its init).
void load_state(LanguageModel &model, const Checkpoint &ckpt, const std::string &path = "<checkpoint>");

// Reads a checkpoint and rebuilds its model through the kernel registry.
LanguageModel load_model(const std::string &path, nlohmann::json *config = nullptr);

// Loads a checkpoint trained with one encoding into `model`, built from the same model config with
// another kernel (e.g. a rope checkpoint evaluated with rope_yarn). Every trainable parameter must
// match in name and shape (else an error naming the first mismatch); buffers the checkpoint holds
// with the same name and shape are copied, the others keep the model's (new encoding's) initial
// values; their names are returned. `source` is the checkpoint's kernel (default: the registry's).
std::vector<std::string> load_state_across(LanguageModel &model, const Checkpoint &ckpt,
                                           const std::string &path = "<checkpoint>",
                                           const KernelEntry *source = nullptr);

// Reads a checkpoint and builds its model with the kernel `encoding` (through the registry);
// the same as load_model when `encoding` is the checkpoint's. `kept` gets the buffers that keep
// the new encoding's initial values.
LanguageModel load_model_as(const std::string &path, const std::string &encoding,
                            nlohmann::json *config = nullptr, std::vector<std::string> *kept = nullptr);

}  // namespace ape
