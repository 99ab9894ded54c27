// Sampling and cached scoring (runtime/Generate.h).
#include "runtime/Generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>

#include "runtime/Options.h"
#include "runtime/Util.h"

namespace ape {
namespace {
at::Tensor ids_tensor(const std::vector<int64_t> &ids, size_t from, size_t n) {
  return at::tensor(std::vector<int64_t>(ids.begin() + from, ids.begin() + from + n), at::kLong).view({1, int64_t(n)});
}
}  // namespace

void SampleOptions::validate(int64_t vocab) const {
  require_in("--max-tokens", max_tokens, 1, int64_t(1) << 20);
  require_in("--temperature", temperature, 0.0, 100.0);
  require_in("--top-k", top_k, 0, vocab);
}

int64_t sample_token(const at::Tensor &logits, const SampleOptions &opt, std::mt19937_64 &rng) {
  at::Tensor l = logits.to(at::kCPU, at::kDouble).contiguous().view({-1});
  const double *p = l.data_ptr<double>();
  const int64_t V = l.numel();
  for (int64_t i = 0; i < V; ++i)
    if (!std::isfinite(p[i]))
      throw std::runtime_error("the model's next-token logits hold a NaN or an infinity (token " + std::to_string(i) +
                               "): it computes no distribution to sample (a fixed param set with --set, or weights, "
                               "that make it overflow)");
  if (opt.temperature == 0) return std::max_element(p, p + V) - p;
  std::vector<int64_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  int64_t k = opt.top_k > 0 ? std::min(opt.top_k, V) : V;
  // The k largest, ties by the lower id (deterministic).
  auto before = [&](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), before);
  const double mx = p[idx[0]];
  std::vector<double> w(k);
  for (int64_t i = 0; i < k; ++i) w[i] = std::exp((p[idx[i]] - mx) / opt.temperature);
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  // A uniform draw from the generator's raw bits (std::uniform_real_distribution is not specified
  // bit for bit across standard libraries).
  const double u = double(rng() >> 11) * 0x1.0p-53 * total;
  double acc = 0;
  for (int64_t i = 0; i < k; ++i)
    if ((acc += w[i]) > u) return idx[i];
  return idx[k - 1];
}

SampleResult sample(LanguageModel &model, const std::vector<int64_t> &prompt, const SampleOptions &opt) {
  const int64_t V = model->config().vocab;
  opt.validate(V);
  if (prompt.empty()) throw std::invalid_argument("the prompt is empty (it must hold at least one token)");
  for (int64_t id : prompt)
    if (id < 0 || id >= V)
      throw std::invalid_argument("prompt token " + std::to_string(id) + " is outside the vocabulary [0, " +
                                  std::to_string(V) + ")");
  const int64_t P = static_cast<int64_t>(prompt.size());
  model->check_length(P + opt.max_tokens - 1);
  KvCache cache(P + opt.max_tokens);
  std::mt19937_64 rng(opt.seed);
  SampleResult r;
  auto t0 = std::chrono::steady_clock::now();
  at::Tensor logits = model->forward_cached(ids_tensor(prompt, 0, prompt.size()), cache);  // (1, P, V)
  r.prefill_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < opt.max_tokens; ++s) {
    const int64_t next = sample_token(logits[0][logits.size(1) - 1], opt, rng);
    r.tokens.push_back(next);
    if (next == opt.stop_token || s + 1 == opt.max_tokens) break;
    logits = model->forward_cached(at::tensor({next}, at::kLong).view({1, 1}), cache);
  }
  r.decode_seconds = seconds_since(t0);
  return r;
}

ScoreResult score_cached(LanguageModel &model, const std::vector<int64_t> &tokens, int64_t chunk) {
  namespace F = torch::nn::functional;
  require_in("--chunk", chunk, 1, int64_t(1) << 20);
  if (tokens.size() < 2) throw std::invalid_argument("scoring needs at least 2 tokens, got " + std::to_string(tokens.size()));
  const int64_t V = model->config().vocab;
  for (int64_t id : tokens)
    if (id < 0 || id >= V)
      throw std::invalid_argument("token " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  const int64_t T = static_cast<int64_t>(tokens.size()) - 1;  // inputs 0 .. T-1, targets 1 .. T
  model->check_length(T);
  KvCache cache(T);
  ScoreResult r;
  r.loss.reserve(static_cast<size_t>(T));
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t t = 0; t < T; t += chunk) {
    const int64_t n = std::min(chunk, T - t);
    at::Tensor logits = model->forward_cached(ids_tensor(tokens, size_t(t), size_t(n)), cache);  // (1, n, V)
    at::Tensor target = ids_tensor(tokens, size_t(t + 1), size_t(n)).view({n});
    at::Tensor l = F::cross_entropy(logits.view({n, V}).to(at::kCPU, at::kDouble), target,
                                    F::CrossEntropyFuncOptions().reduction(torch::kNone));
    const double *lp = l.data_ptr<double>();
    for (int64_t x = 0; x < n; ++x)
      if (!std::isfinite(lp[x]))
        throw std::runtime_error("the loss of target token " + std::to_string(t + x + 1) + " is " +
                                 (std::isnan(lp[x]) ? "NaN" : "infinite") +
                                 ": the model computes no finite distribution there (a fixed param set with --set, "
                                 "or weights, that make it overflow)");
    r.loss.insert(r.loss.end(), lp, lp + n);
  }
  r.seconds = seconds_since(t0);
  return r;
}

std::vector<ScoreBucket> bucket_losses(const std::vector<double> &loss, int64_t train_len) {
  require_in("train_len", train_len, 1, int64_t(1) << 40);
  std::vector<ScoreBucket> out;
  const int64_t n = static_cast<int64_t>(loss.size());
  for (int64_t from = 1, to = train_len; from <= n; from = to + 1, to *= 2) {
    ScoreBucket b;
    b.from = from, b.to = to;
    double sum = 0;
    for (int64_t c = from; c <= std::min(to, n); ++c) sum += loss[static_cast<size_t>(c - 1)], ++b.count;
    b.mean_loss = sum / double(b.count);
    double all = 0;
    for (int64_t c = 1; c <= std::min(to, n); ++c) all += loss[static_cast<size_t>(c - 1)];
    b.cumulative_loss = all / double(std::min(to, n));
    out.push_back(b);
  }
  return out;
}

}  // namespace ape
