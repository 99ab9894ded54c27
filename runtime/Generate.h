// Generate: sampling and long-text scoring with the KV cache (Model::forward_cached,
// docs/decoding.md). Used by ape-generate.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/Model.h"

namespace ape {

struct SampleOptions {
  int64_t max_tokens = 64;   // new tokens, in [1, 2^20]
  double temperature = 1.0;  // 0: greedy (argmax); else softmax(logits / temperature), in [0, 100]
  int64_t top_k = 0;         // keep the k most likely tokens (0: all), in [0, vocab]
  uint64_t seed = 0;         // the same seed, checkpoint and prompt give the same tokens
  int64_t stop_token = -1;   // stop after sampling this id (-1: never)
  void validate(int64_t vocab) const;  // std::invalid_argument naming the option
};

struct SampleResult {
  std::vector<int64_t> tokens;  // the new tokens
  double prefill_seconds = 0;   // the prompt through the cache
  double decode_seconds = 0;    // the new tokens, one step each
};

// The next token from logits (V) under `opt` (temperature, top_k), drawn with `rng`.
int64_t sample_token(const at::Tensor &logits, const SampleOptions &opt, std::mt19937_64 &rng);

// Samples opt.max_tokens tokens after `prompt` (non-empty ids < vocab) with one cache.
SampleResult sample(LanguageModel &model, const std::vector<int64_t> &prompt, const SampleOptions &opt);

// loss[t] = -log p(tokens[t + 1] | tokens[0 .. t]) for t < tokens.size() - 1, through the cache,
// `chunk` tokens per step (1: strictly token by token). Inference only.
struct ScoreResult {
  std::vector<double> loss;
  double seconds = 0;
};
ScoreResult score_cached(LanguageModel &model, const std::vector<int64_t> &tokens, int64_t chunk);

// Mean loss per bucket of context lengths (t + 1 tokens seen): [1, L], (L, 2L], (2L, 4L], ...
// for training length L; like ape-eval's multiples.
struct ScoreBucket {
  int64_t from = 0, to = 0;  // context lengths from .. to (inclusive)
  int64_t count = 0;
  double mean_loss = 0;        // over the bucket's context lengths
  double cumulative_loss = 0;  // over every context length 1 .. min(to, scored): the loss a full
                               // forward over those tokens gives (ape-eval's cell for one window)
};
std::vector<ScoreBucket> bucket_losses(const std::vector<double> &loss, int64_t train_len);

}  // namespace ape
