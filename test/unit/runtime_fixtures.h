// Shared by the runtime suites (test/unit/runtime/*_test.cpp, resume_test.cpp and the others of
// ape_runtime_test): private test kernels, their manifests, and small helpers. Everything has
// internal linkage (one copy per suite file).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "ape/cpu/kernel_entry.h"
#include "runtime/Attention.h"
#include "runtime/Data.h"
#include "runtime/Eval.h"
#include "runtime/Manifest.h"
#include "runtime/Model.h"
#include "runtime/Registry.h"
#include "runtime/Train.h"
#include <functional>

namespace fs = std::filesystem;
using ape::AttnArgs;

// =====================================================================================================
// Test-only kernels: plain loops, every (b, h) slice materialised row by row, serial.
//   logits l_ij = κ q'_i·k'_j + bias(i, j) (j <= i), q' = qmod(q), k' = kmod(k)
// Hooks: test_nope (none); test_bias: bias = w_h · g[b,h,j] (one feature g, one param w [heads]);
//        test_expe: q' = q + a_q[h] + t·b_q[h], k' = k + a_k[h] + t·b_k[h] (four [heads, head_dim]
//        params; with an override manifest this is exactly ExPE's W·φ(x, t));
//        test_expe_qkv: the same times σ (a fifth param, [1]);
//        test_exqpe: q' = q + σ·(a_q[h] + floor(t/l)·b_q[h] + P_q[t mod l, h]), k' likewise (params
//        a_q, b_q, P_q, a_k, b_k, P_k, σ; with an override manifest this is ExQPE's W·φ(x, t)).
// =====================================================================================================
namespace {  // internal linkage: each suite file has its own copy
namespace testk {

enum class Kind { Nope, Bias, Expe, ExpeS, Exqpe };
constexpr int64_t kExqpeL = 4;

// The position term of q (which = 0) or k (which = 1) at token t, coordinate (h, c), and its
// gradient into the params given the gradient g of q' (or k').
template <Kind K, class T> T pos_term(const AttnArgs<T> &a, int which, int64_t h, int64_t t, int64_t c) {
  const int64_t hc = h * a.D + c;
  if constexpr (K == Kind::Expe || K == Kind::ExpeS) {
    const T term = a.params[2 * which][hc] + T(t) * a.params[2 * which + 1][hc];
    return K == Kind::ExpeS ? a.params[4][0] * term : term;
  } else if constexpr (K == Kind::Exqpe) {
    const T *const *p = a.params + 3 * which;
    return a.params[6][0] * (p[0][hc] + T(t / kExqpeL) * p[1][hc] + p[2][(t % kExqpeL) * a.H * a.D + hc]);
  }
  return T(0);
}
template <Kind K, class T> void pos_term_grad(const AttnArgs<T> &a, int which, int64_t h, int64_t t, int64_t c, T g) {
  const int64_t hc = h * a.D + c;
  if constexpr (K == Kind::Expe || K == Kind::ExpeS) {
    const T s = K == Kind::ExpeS ? a.params[4][0] : T(1);
    a.dparams[2 * which][hc] += s * g;
    a.dparams[2 * which + 1][hc] += s * T(t) * g;
  } else if constexpr (K == Kind::Exqpe) {
    T *const *dp = a.dparams + 3 * which;
    const T s = a.params[6][0];
    dp[0][hc] += s * g;
    dp[1][hc] += s * T(t / kExqpeL) * g;
    dp[2][(t % kExqpeL) * a.H * a.D + hc] += s * g;
  }
}

template <Kind K, class T> T bias(const AttnArgs<T> &a, int64_t b, int64_t h, int64_t, int64_t j) {
  if constexpr (K == Kind::Bias) return a.params[0][h] * a.features[0][(b * a.H + h) * a.T + j];
  return T(0);
}

// q' (which = 0) or k' (which = 1) rows of one (b, h) slice: x + the position term.
template <Kind K, class T>
std::vector<T> modded(const AttnArgs<T> &a, const T *x, int64_t h, int which) {
  std::vector<T> out(x, x + a.T * a.D);
  if constexpr (K != Kind::Nope && K != Kind::Bias)
    for (int64_t t = 0; t < a.T; ++t)
      for (int64_t c = 0; c < a.D; ++c) out[t * a.D + c] += pos_term<K>(a, which, h, t, c);
  return out;
}

template <Kind K, class T> void forward(const AttnArgs<T> &a) {
  const int64_t T_ = a.T, D = a.D;
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t h = 0; h < a.H; ++h) {
      const int64_t base = (b * a.H + h) * T_ * D;
      auto q = modded<K>(a, a.q + base, h, 0);
      auto k = modded<K>(a, a.k + base, h, 1);
      const T *v = a.v + base;
      T *o = a.o + base;
      std::vector<T> s(T_);
      for (int64_t i = 0; i < T_; ++i) {
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          T d = 0;
          for (int64_t c = 0; c < D; ++c) d += q[i * D + c] * k[j * D + c];
          s[j] = a.scale * d + bias<K>(a, b, h, i, j);
          m = std::max(m, s[j]);
        }
        T l = 0;
        for (int64_t j = 0; j <= i; ++j) l += (s[j] = std::exp(s[j] - m));
        for (int64_t c = 0; c < D; ++c) {
          T acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += s[j] / l * v[j * D + c];
          o[i * D + c] = acc;
        }
        a.lse[(b * a.H + h) * T_ + i] = m + std::log(l);
      }
    }
}

template <Kind K, class T> void backward(const AttnArgs<T> &a) {
  const int64_t T_ = a.T, D = a.D, H = a.H;
  std::fill(a.dq, a.dq + a.B * H * T_ * D, T(0));
  std::fill(a.dk, a.dk + a.B * H * T_ * D, T(0));
  std::fill(a.dv, a.dv + a.B * H * T_ * D, T(0));
  if constexpr (K == Kind::Bias) {
    std::fill(a.dfeatures[0], a.dfeatures[0] + a.B * H * T_, T(0));
    std::fill(a.dparams[0], a.dparams[0] + H, T(0));
  }
  if constexpr (K == Kind::Expe || K == Kind::ExpeS)
    for (int n = 0; n < 4; ++n) std::fill(a.dparams[n], a.dparams[n] + H * D, T(0));
  if constexpr (K == Kind::Exqpe)
    for (int n = 0; n < 6; ++n) std::fill(a.dparams[n], a.dparams[n] + (n % 3 == 2 ? kExqpeL : 1) * H * D, T(0));
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t base = (b * H + h) * T_ * D;
      auto q = modded<K>(a, a.q + base, h, 0);
      auto k = modded<K>(a, a.k + base, h, 1);
      const T *v = a.v + base, *o = a.o + base, *dout = a.dout + base;
      T *dq = a.dq + base, *dk = a.dk + base, *dv = a.dv + base;
      for (int64_t i = 0; i < T_; ++i) {
        T delta = 0;
        for (int64_t c = 0; c < D; ++c) delta += dout[i * D + c] * o[i * D + c];
        for (int64_t j = 0; j <= i; ++j) {
          T d = 0, dp = 0;
          for (int64_t c = 0; c < D; ++c) {
            d += q[i * D + c] * k[j * D + c];
            dp += dout[i * D + c] * v[j * D + c];
          }
          const T p = std::exp(a.scale * d + bias<K>(a, b, h, i, j) - a.lse[(b * H + h) * T_ + i]);
          const T ds = p * (dp - delta);
          for (int64_t c = 0; c < D; ++c) {
            dv[j * D + c] += p * dout[i * D + c];
            dq[i * D + c] += a.scale * ds * k[j * D + c];
            dk[j * D + c] += a.scale * ds * q[i * D + c];
          }
          if constexpr (K == Kind::Bias) {
            a.dfeatures[0][(b * H + h) * T_ + j] += a.params[0][h] * ds;
            a.dparams[0][h] += a.features[0][(b * H + h) * T_ + j] * ds;
          }
        }
      }
      if constexpr (K != Kind::Nope && K != Kind::Bias)  // e.g. q' = q + a + t·b: da = Σ_t dq', db = Σ_t t·dq'
        for (int64_t t = 0; t < T_; ++t)
          for (int64_t c = 0; c < D; ++c) {
            pos_term_grad<K>(a, 0, h, t, c, dq[t * D + c]);
            pos_term_grad<K>(a, 1, h, t, c, dk[t * D + c]);
          }
    }
}

constexpr int64_t kExpeL = 4;
constexpr double kExpeTheta = 0.05;

const char *kNopeManifest = R"({"encoding": "test_nope", "scale": null, "causal": true,
  "features": [], "params": []})";
const char *kBiasManifest = R"({"encoding": "test_bias", "causal": true,
  "features": [{"name": "g", "weight_std": 0.5, "bias": 0.25}],
  "params": [{"name": "w", "shape": ["heads"], "init": {"kind": "constant", "value": 0.5}, "trainable": true}]})";
const char *kBiasSharedManifest = R"({"encoding": "test_bias_shared", "causal": true,
  "features": [{"name": "g", "weight_std": 0.5, "bias": 0.25}],
  "params": [{"name": "w", "shape": ["heads"], "init": {"kind": "alibi_slopes"}, "trainable": true,
              "per_layer": false}]})";
const char *kExpeManifest = R"({"encoding": "test_expe", "causal": true, "features": [],
  "params": [
    {"name": "override_q_a", "shape": ["heads", "head_dim"], "trainable": true,
     "init": {"kind": "projection_term", "projection": "q", "columns": 4, "start": 0.0, "step": 0.05}},
    {"name": "override_q_b", "shape": ["heads", "head_dim"], "trainable": true,
     "init": {"kind": "projection_term", "projection": "q", "columns": 4, "start": 0.05, "step": 0.0}},
    {"name": "override_k_a", "shape": ["heads", "head_dim"], "trainable": true,
     "init": {"kind": "projection_term", "projection": "k", "columns": 4, "start": 0.0, "step": 0.05}},
    {"name": "override_k_b", "shape": ["heads", "head_dim"], "trainable": true,
     "init": {"kind": "projection_term", "projection": "k", "columns": 4, "start": 0.05, "step": 0.0}}],
  "override": {"l": 4, "targets": "qk"}})";

// ExPE on q, k and v, with the position scale σ as a fixed param.
const char *kExpeQkvManifest = R"({"encoding": "test_expe_qkv", "causal": true, "features": [],
  "params": [
    {"name": "override_q_a", "shape": ["heads", "head_dim"], "trainable": true,
     "init": {"kind": "projection_term", "projection": "q", "columns": 4, "start": 0.0, "step": 0.05}},
    {"name": "override_q_b", "shape": ["heads", "head_dim"], "trainable": true,
     "init": {"kind": "projection_term", "projection": "q", "columns": 4, "start": 0.05, "step": 0.0}},
    {"name": "override_k_a", "shape": ["heads", "head_dim"], "trainable": true,
     "init": {"kind": "projection_term", "projection": "k", "columns": 4, "start": 0.0, "step": 0.05}},
    {"name": "override_k_b", "shape": ["heads", "head_dim"], "trainable": true,
     "init": {"kind": "projection_term", "projection": "k", "columns": 4, "start": 0.05, "step": 0.0}},
    {"name": "position_scale", "shape": ["1"], "trainable": false, "init": {"kind": "constant", "value": 1.0}}],
  "override": {"kind": "expe", "l": 4, "start": 0.0, "theta": 0.05, "targets": "qkv",
               "position_scale": "position_scale"}})";
// ExQPE (l = 4, S = 0, θ1 = 0.25, θ2 = 1: docs/encodings-math.md's hand-checked case) on q, k and v:
// a = W·(S + jθ1)_j, b = θ2·W·1, P[r] = θ2·Σ_{j<=r} W[:, j].
const char *kExqpeManifest = R"({"encoding": "test_exqpe", "causal": true, "features": [],
  "params": [
    {"name": "override_q_a", "shape": ["heads", "head_dim"], "trainable": true,
     "init": {"kind": "projection_term", "projection": "q", "columns": 4, "start": 0.0, "step": 0.25}},
    {"name": "override_q_b", "shape": ["heads", "head_dim"], "trainable": true,
     "init": {"kind": "projection_term", "projection": "q", "columns": 4, "start": 1.0, "step": 0.0}},
    {"name": "override_q_p", "shape": ["4", "heads", "head_dim"], "trainable": true,
     "init": {"kind": "projection_prefix", "projection": "q", "columns": 4, "scale": 1.0}},
    {"name": "override_k_a", "shape": ["heads", "head_dim"], "trainable": true,
     "init": {"kind": "projection_term", "projection": "k", "columns": 4, "start": 0.0, "step": 0.25}},
    {"name": "override_k_b", "shape": ["heads", "head_dim"], "trainable": true,
     "init": {"kind": "projection_term", "projection": "k", "columns": 4, "start": 1.0, "step": 0.0}},
    {"name": "override_k_p", "shape": [4, "heads", "head_dim"], "trainable": true,
     "init": {"kind": "projection_prefix", "projection": "k", "columns": 4, "scale": 1.0}},
    {"name": "position_scale", "shape": ["1"], "trainable": false, "init": {"kind": "constant", "value": 1.0}}],
  "override": {"kind": "exqpe", "l": 4, "start": 0.0, "theta1": 0.25, "theta2": 1.0, "targets": "qkv",
               "position_scale": "position_scale"}})";

template <Kind K> ape::KernelEntry entry(const char *name, const char *manifest,
                                         void (*embed_table)(int64_t, int64_t, double *) = nullptr) {
  return {name, manifest, forward<K, float>, backward<K, float>, forward<K, double>,
          backward<K, double>, embed_table};
}
const ape::KernelEntry nope = entry<Kind::Nope>("test_nope", kNopeManifest);
const ape::KernelEntry bias_entry = entry<Kind::Bias>("test_bias", kBiasManifest);
const ape::KernelEntry bias_shared = entry<Kind::Bias>("test_bias_shared", kBiasSharedManifest);
const ape::KernelEntry expe = entry<Kind::Expe>("test_expe", kExpeManifest);
const ape::KernelEntry expe_qkv = entry<Kind::ExpeS>("test_expe_qkv", kExpeQkvManifest);
const ape::KernelEntry exqpe = entry<Kind::Exqpe>("test_exqpe", kExqpeManifest);

// Absolute positions at the embedding site (the attention itself is NoPE): a fixed sinusoidal
// table (written here from docs/encodings-math.md, independently of the generated code), scaled or not,
// and a learned table of 8 positions.
void sinusoid(int64_t T, int64_t d, double *out) {
  for (int64_t n = 0; n < T; ++n)
    for (int64_t c = 0; c < d; ++c) {
      const double angle = double(n) / std::pow(10000.0, double(c - c % 2) / double(d));
      out[n * d + c] = c % 2 == 0 ? std::sin(angle) : std::cos(angle);
    }
}
const char *kTableManifest = R"({"encoding": "test_table", "causal": true,
  "embedding": {"kind": "table", "scale_embedding": false}})";
const char *kTableScaledManifest = R"({"encoding": "test_table_scaled", "causal": true,
  "embedding": {"kind": "table", "scale_embedding": true}})";
const char *kLearnedManifest = R"({"encoding": "test_learned", "causal": true,
  "embedding": {"kind": "learned", "max_length": 8, "std": 0.02, "scale_embedding": false}})";
const ape::KernelEntry table = entry<Kind::Nope>("test_table", kTableManifest, sinusoid);
const ape::KernelEntry table_scaled = entry<Kind::Nope>("test_table_scaled", kTableScaledManifest, sinusoid);
const ape::KernelEntry learned = entry<Kind::Nope>("test_learned", kLearnedManifest);
// NoPE with a fixed param the kernel ignores: a checkpoint of test_nope loads into it.
const char *kNopeFixedManifest = R"({"encoding": "test_nope_fixed", "causal": true,
  "params": [{"name": "knob", "shape": [1], "init": {"kind": "constant", "value": 3.0}}]})";
const ape::KernelEntry nope_fixed = entry<Kind::Nope>("test_nope_fixed", kNopeFixedManifest);
}  // namespace testk
}  // namespace

// ---- helpers ---------------------------------------------------------------------------------------------

namespace {

// Materialised causal attention in plain torch ops (the reference): softmax(κ q kᵀ + bias + mask) v.
at::Tensor reference_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, double scale,
                               const at::Tensor &bias = {}) {
  const int64_t T = q.size(2);
  at::Tensor s = at::matmul(q, k.transpose(-1, -2)) * scale;
  if (bias.defined()) s = s + bias;
  at::Tensor mask = at::ones({T, T}, at::kBool).triu(1);
  s = s.masked_fill(mask, -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(s, -1), v);
}

fs::path tmp_dir() { return fs::path(::testing::TempDir()) / ("ape_runtime_test_" + std::to_string(::getpid())); }

std::string tmp_path(const std::string &name) {
  fs::create_directories(tmp_dir());
  return (tmp_dir() / name).string();
}

// Removes this run's scratch folder at the end.
struct ScratchCleanup : ::testing::Environment {
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(tmp_dir(), ec);
  }
};
const auto *const scratch_cleanup = ::testing::AddGlobalTestEnvironment(new ScratchCleanup);

template <typename Fn> std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const std::exception &e) {
    return e.what();
  }
  return "<no exception>";
}

#define EXPECT_ERROR(stmt, substr)                                                              \
  do {                                                                                          \
    std::string _msg = error_of([&] { stmt; });                                                 \
    EXPECT_NE(_msg.find(substr), std::string::npos) << "message: " << _msg << "\nwanted: " << substr; \
  } while (0)

void expect_close(const at::Tensor &a, const at::Tensor &b, double tol, const std::string &what) {
  ASSERT_TRUE(a.defined()) << what << " undefined";
  ASSERT_TRUE(b.defined()) << what << " (reference) undefined";
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const double err = (a - b).abs().max().item<double>();
  EXPECT_LT(err, tol) << what << ": max abs error " << err;
}

ape::TokenSplit synthetic_split(int64_t docs, int64_t len, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ape::TokenSplit s;
  for (int64_t d = 0; d < docs; ++d) {
    std::vector<int32_t> ids(len);
    for (auto &x : ids) x = static_cast<int32_t>(rng() % vocab);
    s.add_doc("doc" + std::to_string(d) + ".txt", ids);
  }
  return s;
}

// The registered (generated) encoding `name`, or nullptr.
const ape::KernelEntry *registered(const std::string &name) {
  for (const auto &n : ape::kernel_names())
    if (n == name) return &ape::find_kernel(name);
  return nullptr;
}

// A book "a" that repeats a fixed 8-token phrase 200 times: learnable fast, far below the uniform
// ln(16) of a 16-token vocabulary.
ape::TokenSplit phrase_book() {
  ape::TokenSplit s;
  std::vector<int32_t> phrase{3, 1, 4, 15, 9, 2, 6, 5}, ids;
  for (int r = 0; r < 200; ++r) ids.insert(ids.end(), phrase.begin(), phrase.end());
  s.add_doc("a", ids);
  return s;
}

// A short training run of `model` on `split` (lr 1e-2, one worker, no in-place progress); the
// progress lines go to `out`.
ape::TrainResult train_briefly(ape::LanguageModel &model, const ape::TokenSplit &split, int64_t steps,
                               int64_t batch, int64_t seq_len, int64_t warmup_steps, std::ostream &out,
                               const std::string &label) {
  ape::TrainConfig tc;
  tc.steps = steps;
  tc.batch = batch;
  tc.seq_len = seq_len;
  tc.lr = 1e-2;
  tc.warmup_steps = warmup_steps;
  tc.progress_in_place = false;
  ape::TrainSampler sampler(split, 1);
  return ape::train(model, sampler, tc, out, label);
}

// A step budget of windows (batch, seq_len), without the progress line.
ape::TrainConfig quiet_train_config(int64_t steps, int64_t batch, int64_t seq_len) {
  ape::TrainConfig tc;
  tc.steps = steps;
  tc.batch = batch;
  tc.seq_len = seq_len;
  tc.progress = false;
  return tc;
}

ape::ModelConfig tiny_config(const std::string &enc, int64_t vocab = 32) {
  ape::ModelConfig c;
  c.encoding = enc;
  c.vocab = vocab;
  c.d_model = 16;
  c.layers = 2;
  c.heads = 2;
  return c;
}

// A tiny NoPE model whose token embedding is all NaN: its first loss is NaN.
ape::LanguageModel nan_model() {
  ape::LanguageModel model(testk::nope, tiny_config("test_nope", 16));
  torch::NoGradGuard g;
  model->wte->weight.fill_(NAN);
  return model;
}

}  // namespace

