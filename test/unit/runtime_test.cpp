// GoogleTest suite of the LibTorch runtime (runtime/): manifest, autograd glue, model, data,
// checkpoints, training and evaluation. The kernels used here are private, naive, materialised
// test kernels (test_nope, test_bias, test_expe) defined below; the generated encodings are only
// smoke-tested (RegisteredKernels.*), so this suite does not depend on any particular encoding.
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

#include "ape/kernel_entry.h"
#include "runtime/Attention.h"
#include "runtime/Data.h"
#include "runtime/Eval.h"
#include "runtime/Manifest.h"
#include "runtime/Model.h"
#include "runtime/Registry.h"
#include "runtime/Train.h"

namespace fs = std::filesystem;
using ape::AttnArgs;

// =====================================================================================================
// Test-only kernels: plain loops, every (b, h) slice materialised row by row, serial.
//   logits l_ij = κ q'_i·k'_j + bias(i, j) (j <= i), q' = qmod(q), k' = kmod(k)
// Hooks: test_nope (none); test_bias: bias = w_h · g[b,h,j] (one feature g, one param w [heads]);
//        test_expe: q' = q + a_q[h] + t·b_q[h], k' = k + a_k[h] + t·b_k[h] (four [heads, head_dim]
//        params; with an override manifest this is exactly ExPE's W·φ(x, t)).
// =====================================================================================================
namespace testk {

enum class Kind { Nope, Bias, Expe };

template <Kind K, class T> T bias(const AttnArgs<T> &a, int64_t b, int64_t h, int64_t, int64_t j) {
  if constexpr (K == Kind::Bias) return a.params[0][h] * a.features[0][(b * a.H + h) * a.T + j];
  return T(0);
}

// q' (or k') rows of one (b, h) slice: x + params[pa][h, c] + t·params[pb][h, c] for Expe.
template <Kind K, class T>
std::vector<T> modded(const AttnArgs<T> &a, const T *x, int64_t h, int pa, int pb) {
  std::vector<T> out(x, x + a.T * a.D);
  if constexpr (K == Kind::Expe)
    for (int64_t t = 0; t < a.T; ++t)
      for (int64_t c = 0; c < a.D; ++c)
        out[t * a.D + c] += a.params[pa][h * a.D + c] + T(t) * a.params[pb][h * a.D + c];
  return out;
}

template <Kind K, class T> void forward(const AttnArgs<T> &a) {
  const int64_t T_ = a.T, D = a.D;
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t h = 0; h < a.H; ++h) {
      const int64_t base = (b * a.H + h) * T_ * D;
      auto q = modded<K>(a, a.q + base, h, 0, 1);
      auto k = modded<K>(a, a.k + base, h, 2, 3);
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
  if constexpr (K == Kind::Expe)
    for (int n = 0; n < 4; ++n) std::fill(a.dparams[n], a.dparams[n] + H * D, T(0));
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t base = (b * H + h) * T_ * D;
      auto q = modded<K>(a, a.q + base, h, 0, 1);
      auto k = modded<K>(a, a.k + base, h, 2, 3);
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
      if constexpr (K == Kind::Expe)  // q' = q + a + t·b: da = Σ_t dq', db = Σ_t t·dq'
        for (int64_t t = 0; t < T_; ++t)
          for (int64_t c = 0; c < D; ++c) {
            a.dparams[0][h * D + c] += dq[t * D + c];
            a.dparams[1][h * D + c] += T(t) * dq[t * D + c];
            a.dparams[2][h * D + c] += dk[t * D + c];
            a.dparams[3][h * D + c] += T(t) * dk[t * D + c];
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

template <Kind K> ape::KernelEntry entry(const char *name, const char *manifest) {
  return {name, manifest, forward<K, float>, backward<K, float>, forward<K, double>,
          backward<K, double>};
}
const ape::KernelEntry nope = entry<Kind::Nope>("test_nope", kNopeManifest);
const ape::KernelEntry bias_entry = entry<Kind::Bias>("test_bias", kBiasManifest);
const ape::KernelEntry bias_shared = entry<Kind::Bias>("test_bias_shared", kBiasSharedManifest);
const ape::KernelEntry expe = entry<Kind::Expe>("test_expe", kExpeManifest);
}  // namespace testk

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

ape::ModelConfig tiny_config(const std::string &enc, int64_t vocab = 32) {
  ape::ModelConfig c;
  c.encoding = enc;
  c.vocab = vocab;
  c.d_model = 16;
  c.layers = 2;
  c.heads = 2;
  return c;
}

}  // namespace

// =====================================================================================================
// Manifest
// =====================================================================================================

TEST(Manifest, ParsesTheDocumentedExample) {
  const char *text = R"({
    "encoding": "cable", "source": "examples/encodings/cable.mlir", "generator": "apec",
    "scale": null, "causal": true, "passes": 1, "tile_q": 64, "tile_k": 64,
    "features": [{"name": "cable", "weight_std": 0.02, "bias": 0.0}],
    "params": [{"name": "slopes", "shape": ["heads"], "init": {"kind": "alibi_slopes"}, "trainable": false},
               {"name": "override_q_a", "shape": ["heads", "head_dim"],
                "init": {"kind": "projection_term", "projection": "q", "columns": 8,
                         "start": 0.0, "step": 0.00048828125}, "trainable": true},
               {"name": "table", "shape": [32, "heads"], "init": {"kind": "normal", "std": 0.1},
                "trainable": true, "per_layer": false},
               {"name": "c", "shape": [1], "init": {"kind": "constant", "value": -2.5}}],
    "override": {"l": 8, "targets": "qk"},
    "grads": ["q", "k", "v", "features", "params"]})";
  ape::Manifest m = ape::Manifest::parse(text);
  EXPECT_EQ(m.encoding, "cable");
  EXPECT_EQ(m.source, "examples/encodings/cable.mlir");
  EXPECT_FALSE(m.scale.has_value());
  EXPECT_DOUBLE_EQ(m.scale_for(16), 0.25);
  EXPECT_TRUE(m.causal);
  ASSERT_EQ(m.features.size(), 1u);
  EXPECT_EQ(m.features[0].name, "cable");
  EXPECT_DOUBLE_EQ(m.features[0].weight_std, 0.02);
  ASSERT_EQ(m.params.size(), 4u);
  EXPECT_EQ(m.params[0].init.kind, ape::InitSpec::Kind::AlibiSlopes);
  EXPECT_FALSE(m.params[0].trainable);
  EXPECT_TRUE(m.params[0].per_layer);
  EXPECT_EQ(m.params[0].resolve_shape(4, 32), std::vector<int64_t>({4}));
  const auto &pt = m.params[1];
  EXPECT_EQ(pt.init.kind, ape::InitSpec::Kind::ProjectionTerm);
  EXPECT_EQ(pt.init.projection, "q");
  EXPECT_EQ(pt.init.columns, 8);
  EXPECT_DOUBLE_EQ(pt.init.step, 0.00048828125);
  EXPECT_EQ(pt.numel(4, 32), 128);
  EXPECT_EQ(m.params[2].resolve_shape(4, 32), std::vector<int64_t>({32, 4}));
  EXPECT_FALSE(m.params[2].per_layer);
  EXPECT_DOUBLE_EQ(m.params[2].init.std, 0.1);
  EXPECT_DOUBLE_EQ(m.params[3].init.value, -2.5);
  ASSERT_TRUE(m.override_.has_value());
  EXPECT_EQ(m.override_->l, 8);
  EXPECT_TRUE(m.override_->q && m.override_->k && !m.override_->v);
}

TEST(Manifest, DefaultsAndExplicitScale) {
  ape::Manifest m = ape::Manifest::parse(R"({"encoding": "nope"})");
  EXPECT_TRUE(m.causal);
  EXPECT_TRUE(m.features.empty());
  EXPECT_TRUE(m.params.empty());
  EXPECT_FALSE(m.override_.has_value());
  ape::Manifest s = ape::Manifest::parse(R"({"encoding": "k", "scale": 1.0, "causal": false,
    "override": {"l": 2, "targets": "qkv"}})");
  EXPECT_DOUBLE_EQ(s.scale_for(64), 1.0);
  EXPECT_FALSE(s.causal);
  EXPECT_TRUE(s.override_->v);
}

TEST(Manifest, MalformedManifestsGiveClearErrors) {
  struct Case { const char *json, *expect; };
  const Case cases[] = {
      {"{not json", "not valid JSON"},
      {"[1, 2]", "expected a JSON object"},
      {R"({"causal": true})", "$.encoding: missing"},
      {R"({"encoding": "x", "scale": "big"})", "$.scale: expected null or a number"},
      {R"({"encoding": "x", "scale": -1})", "$.scale: must be a positive"},
      {R"({"encoding": "x", "causal": 1})", "$.causal: expected true or false"},
      {R"({"encoding": "x", "features": {}})", "$.features: expected an array"},
      {R"({"encoding": "x", "features": [{"weight_std": 0.1}]})", "$.features[0].name: missing"},
      {R"({"encoding": "x", "params": [{"name": "p", "shape": ["rows"], "init": {"kind": "zeros"}}]})",
       "$.params[0].shape[0]: unknown shape symbol \"rows\""},
      {R"({"encoding": "x", "params": [{"name": "p", "shape": [0], "init": {"kind": "zeros"}}]})",
       "$.params[0].shape[0]: expected \"heads\""},
      {R"({"encoding": "x", "params": [{"name": "p", "shape": ["heads"]}]})", "$.params[0].init: missing"},
      {R"({"encoding": "x", "params": [{"name": "p", "shape": ["heads"], "init": {"kind": "xavier"}}]})",
       "unknown init kind \"xavier\""},
      {R"({"encoding": "x", "params": [{"name": "p", "shape": ["heads"], "init": {"kind": "constant"}}]})",
       "$.params[0].init.value: missing"},
      {R"({"encoding": "x", "params": [{"name": "p", "shape": ["heads"],
           "init": {"kind": "projection_term", "projection": "o", "columns": 2}}]})",
       "$.params[0].init.projection: expected \"q\", \"k\" or \"v\""},
      {R"({"encoding": "x", "params": [{"name": "p", "shape": ["heads"],
           "init": {"kind": "projection_term", "projection": "q", "columns": 2}}]})",
       "projection_term param must have shape [\"heads\", \"head_dim\"]"},
      {R"({"encoding": "x", "params": [{"name": "p", "shape": ["heads", "head_dim"],
           "init": {"kind": "alibi_slopes"}}]})", "alibi_slopes needs shape [\"heads\"]"},
      {R"({"encoding": "x", "params": [{"name": "p", "shape": ["heads"], "init": {"kind": "ones"}},
                                       {"name": "p", "shape": ["heads"], "init": {"kind": "ones"}}]})",
       "duplicate param \"p\""},
      {R"({"encoding": "x", "params": [{"name": "p", "shape": ["heads"], "init": {"kind": "ones"},
           "trainable": "yes"}]})", "$.params[0].trainable: expected true or false"},
      {R"({"encoding": "x", "override": {"l": 8, "targets": "q"}})", "$.override.targets: expected \"qk\" or \"qkv\""},
      {R"({"encoding": "x", "override": {"l": 0, "targets": "qk"}})", "$.override.l: must be > 0"},
      {R"({"encoding": "x", "override": {"l": 2.5, "targets": "qk"}})", "$.override.l: expected an integer"},
  };
  for (const auto &c : cases) {
    std::string msg = error_of([&] { ape::Manifest::parse(c.json, "case"); });
    EXPECT_NE(msg.find(c.expect), std::string::npos) << "json: " << c.json << "\nmessage: " << msg;
    EXPECT_NE(msg.find("manifest of '"), std::string::npos) << msg;
  }
}

// =====================================================================================================
// ALiBi slopes and parameter initialisation
// =====================================================================================================

TEST(Alibi, SlopesForEightAndTwelveHeads) {
  auto s8 = ape::alibi_slopes(8);
  ASSERT_EQ(s8.size(), 8u);
  for (int h = 0; h < 8; ++h) EXPECT_DOUBLE_EQ(s8[h], std::pow(2.0, -(h + 1))) << h;
  const double want12[] = {0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625,
                           0.707107, 0.353553, 0.176777, 0.088388};
  auto s12 = ape::alibi_slopes(12);
  ASSERT_EQ(s12.size(), 12u);
  for (int h = 0; h < 12; ++h) EXPECT_NEAR(s12[h], want12[h], 1e-6) << h;
  EXPECT_NEAR(ape::alibi_slopes(1)[0], 1.0 / 256, 1e-12);
  EXPECT_EQ(ape::alibi_slopes(6).size(), 6u);
}

TEST(Alibi, InitParamKinds) {
  ape::Manifest m = ape::Manifest::parse(R"({"encoding": "x", "params": [
    {"name": "s", "shape": ["heads"], "init": {"kind": "alibi_slopes"}},
    {"name": "c", "shape": ["heads", 3], "init": {"kind": "constant", "value": 1.5}},
    {"name": "n", "shape": [1000], "init": {"kind": "normal", "std": 0.5}},
    {"name": "z", "shape": ["head_dim"], "init": "zeros"},
    {"name": "pt", "shape": ["heads", "head_dim"],
     "init": {"kind": "projection_term", "projection": "k", "columns": 2}}]})");
  at::Tensor s = ape::init_param(m.params[0], 12, 8);
  EXPECT_EQ(s.sizes(), at::IntArrayRef({12}));
  EXPECT_NEAR(s[8].item<double>(), 0.707107, 1e-6);
  EXPECT_TRUE(ape::init_param(m.params[1], 2, 8).eq(1.5).all().item<bool>());
  EXPECT_NEAR(ape::init_param(m.params[2], 2, 8).std().item<double>(), 0.5, 0.05);
  EXPECT_EQ(ape::init_param(m.params[3], 2, 8).sizes(), at::IntArrayRef({8}));
  EXPECT_ERROR(ape::init_param(m.params[4], 2, 8), "projection_term");
}

// =====================================================================================================
// fused_attention vs the materialised reference
// =====================================================================================================

TEST(FusedAttention, NopeMatchesReferenceForwardAndGrads) {
  for (auto dtype : {at::kDouble, at::kFloat}) {
    at::manual_seed(1);
    const double tol = dtype == at::kDouble ? 1e-10 : 2e-5;
    auto opt = at::TensorOptions().dtype(dtype);
    at::Tensor q = at::randn({2, 3, 7, 4}, opt).requires_grad_(), k = at::randn({2, 3, 7, 4}, opt).requires_grad_(),
               v = at::randn({2, 3, 7, 4}, opt).requires_grad_();
    at::Tensor dout = at::randn({2, 3, 7, 4}, opt);
    const double scale = 0.5;
    at::Tensor o = ape::fused_attention(testk::nope, q, k, v, {}, {}, scale);
    auto g = torch::autograd::grad({o}, {q, k, v}, {dout});
    at::Tensor ro = reference_attention(q, k, v, scale);
    auto rg = torch::autograd::grad({ro}, {q, k, v}, {dout});
    expect_close(o, ro, tol, "o");
    expect_close(g[0], rg[0], tol, "dq");
    expect_close(g[1], rg[1], tol, "dk");
    expect_close(g[2], rg[2], tol, "dv");
    auto [o2, lse] = ape::attention_forward(testk::nope, q, k, v, {}, {}, scale);
    expect_close(o2, ro, tol, "attention_forward o");
    at::Tensor s = at::matmul(q, k.transpose(-1, -2)) * scale;
    s = s.masked_fill(at::ones({7, 7}, at::kBool).triu(1), -INFINITY);
    expect_close(lse, at::logsumexp(s, -1), tol, "lse");
  }
}

TEST(FusedAttention, FeatureAndParamGradients) {
  at::manual_seed(2);
  auto opt = at::TensorOptions().dtype(at::kDouble);
  const int64_t B = 2, H = 3, T = 6, D = 4;
  at::Tensor q = at::randn({B, H, T, D}, opt).requires_grad_(), k = at::randn({B, H, T, D}, opt).requires_grad_(),
             v = at::randn({B, H, T, D}, opt).requires_grad_();
  at::Tensor g = at::randn({B, H, T}, opt).requires_grad_();
  at::Tensor w = at::randn({H}, opt).requires_grad_();
  at::Tensor dout = at::randn({B, H, T, D}, opt);
  at::Tensor o = ape::fused_attention(testk::bias_entry, q, k, v, {g}, {w}, 0.3);
  auto grads = torch::autograd::grad({o}, {q, k, v, g, w}, {dout});
  // bias_ij = w_h · g[b,h,j]
  at::Tensor bias = (w.view({1, H, 1, 1}) * g.unsqueeze(2)).expand({B, H, T, T});
  at::Tensor ro = reference_attention(q, k, v, 0.3, bias);
  auto rgrads = torch::autograd::grad({ro}, {q, k, v, g, w}, {dout});
  expect_close(o, ro, 1e-10, "o");
  const char *names[] = {"dq", "dk", "dv", "dfeature", "dparam"};
  for (int i = 0; i < 5; ++i) expect_close(grads[i], rgrads[i], 1e-10, names[i]);

  // A param that does not require grad gets no gradient (and is not an error).
  at::Tensor w_fixed = w.detach();
  at::Tensor o2 = ape::fused_attention(testk::bias_entry, q, k, v, {g}, {w_fixed}, 0.3);
  o2.sum().backward();
  EXPECT_FALSE(w_fixed.grad().defined());
  EXPECT_TRUE(g.grad().defined());
}

TEST(FusedAttention, BadInputsGiveClearErrors) {
  auto f = at::TensorOptions().dtype(at::kFloat);
  at::Tensor q = at::randn({1, 2, 5, 4}, f);
  EXPECT_ERROR(ape::fused_attention(testk::nope, q.view({2, 5, 4}), q, q, {}, {}, 1.0),
               "q must be [B,H,T,D] float32 or float64");
  EXPECT_ERROR(ape::fused_attention(testk::nope, q.to(at::kInt), q, q, {}, {}, 1.0), "q must be [B,H,T,D]");
  EXPECT_ERROR(ape::fused_attention(testk::nope, q, q.to(at::kDouble), q, {}, {}, 1.0), "k must match q");
  EXPECT_ERROR(ape::fused_attention(testk::nope, q, q, q.narrow(2, 0, 4), {}, {}, 1.0), "v must match q");
  EXPECT_ERROR(ape::fused_attention(testk::bias_entry, q, q, q, {}, {at::ones({2}, f)}, 1.0),
               "expected 1 feature tensors");
  EXPECT_ERROR(ape::fused_attention(testk::bias_entry, q, q, q, {at::ones({1, 2, 4}, f)}, {at::ones({2}, f)}, 1.0),
               "feature 'g' must be [B,H,T] = [1, 2, 5]");
  EXPECT_ERROR(ape::fused_attention(testk::bias_entry, q, q, q, {at::ones({1, 2, 5}, f)}, {}, 1.0),
               "expected 1 param tensors");
  EXPECT_ERROR(ape::fused_attention(testk::bias_entry, q, q, q, {at::ones({1, 2, 5}, f)}, {at::ones({3}, f)}, 1.0),
               "param 'w' must have 2 Float elements (shape [heads])");
  // Non-contiguous inputs are accepted (made contiguous).
  at::Tensor qt = at::randn({1, 5, 2, 4}, f).transpose(1, 2);
  at::Tensor o = ape::fused_attention(testk::nope, qt, qt, qt, {}, {}, 0.5);
  expect_close(o, reference_attention(qt, qt, qt, 0.5), 1e-5, "non-contiguous");
}

// =====================================================================================================
// Model
// =====================================================================================================

// With an override {l, qk} and projection_term params (a = W[:, :l]·(θj)_j, b = θ·W[:, :l]·1), the
// model's attention must equal attention on explicitly overridden inputs φ(x̃, t) = (p_t, x̃[l:]),
// p_{t,j} = θ(t + j) — forward and the gradients of every projection weight.
void check_explicit_expe(const ape::KernelEntry &entry, const ape::ModelConfig &cfg, int64_t l, double theta,
                         double tol) {
  ape::EncodedAttention attn(entry, cfg, std::vector<at::Tensor>(ape::manifest_of(entry).params.size()));
  const int64_t B = 2, T = 9, d = cfg.d_model, H = cfg.heads, D = cfg.head_dim();
  at::Tensor xn = at::randn({B, T, d});
  at::Tensor y = attn->forward(xn);
  at::Tensor dy = at::randn_like(y);
  auto W = std::vector<at::Tensor>{attn->wq->weight, attn->wk->weight, attn->wv->weight, attn->wo->weight};
  auto g = torch::autograd::grad({y}, W, {dy});

  at::Tensor pos = (at::arange(T).view({T, 1}) + at::arange(l).view({1, l})).to(at::kFloat) * theta;
  at::Tensor phi = at::cat({pos.unsqueeze(0).expand({B, T, l}), xn.narrow(-1, l, d - l)}, -1);
  auto heads = [&](at::Tensor t) { return t.view({B, T, H, D}).transpose(1, 2); };
  at::Tensor q = heads(at::matmul(phi, W[0].t())), k = heads(at::matmul(phi, W[1].t()));
  at::Tensor v = heads(at::matmul(xn, W[2].t()));
  at::Tensor o = reference_attention(q, k, v, 1.0 / std::sqrt(double(D)));
  at::Tensor ry = attn->wo(o.transpose(1, 2).reshape({B, T, d}));
  auto rg = torch::autograd::grad({ry}, W, {dy});
  expect_close(y, ry, tol, "output");
  const char *names[] = {"dW_q", "dW_k", "dW_v", "dW_o"};
  for (int i = 0; i < 4; ++i) expect_close(g[i], rg[i], tol, names[i]);
  // The first l columns of W_q get gradient only through the projection terms.
  EXPECT_GT(g[0].narrow(1, 0, l).abs().sum().item<double>(), 0.0);
}

TEST(Model, OverrideAndProjectionTermsMatchExplicitExPE) {
  at::manual_seed(3);
  check_explicit_expe(testk::expe, tiny_config("test_expe"), testk::kExpeL, testk::kExpeTheta, 1e-5);
}

TEST(Model, ParamsPerLayerSharedAndFeatureInit) {
  at::manual_seed(4);
  ape::LanguageModel per_layer(testk::bias_entry, tiny_config("test_bias"));
  auto names = per_layer->named_parameters().keys();
  EXPECT_NE(std::find(names.begin(), names.end(), "block0.attn.w"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "block1.attn.w"), names.end());
  EXPECT_TRUE(per_layer->blocks[0]->attn->kernel_params()[0].eq(0.5).all().item<bool>());
  // features Linear(d, H·1): bias from the manifest, weight std from the manifest.
  at::Tensor wf = per_layer->blocks[0]->attn->wf->weight;
  EXPECT_EQ(wf.sizes(), at::IntArrayRef({2, 16}));
  EXPECT_TRUE(per_layer->blocks[0]->attn->wf->bias.eq(0.25).all().item<bool>());

  ape::LanguageModel shared(testk::bias_shared, tiny_config("test_bias_shared"));
  auto snames = shared->named_parameters().keys();
  EXPECT_NE(std::find(snames.begin(), snames.end(), "shared_w"), snames.end());
  EXPECT_EQ(std::find(snames.begin(), snames.end(), "block0.attn.w"), snames.end());
  // One tensor used by every layer; alibi init for 2 heads.
  EXPECT_EQ(shared->blocks[0]->attn->kernel_params()[0].data_ptr(),
            shared->blocks[1]->attn->kernel_params()[0].data_ptr());
  EXPECT_NEAR(shared->blocks[1]->attn->kernel_params()[0][1].item<double>(), 1.0 / 256, 1e-9);

  // The whole LM trains end to end: every parameter gets a finite gradient.
  at::Tensor windows = at::randint(32, {2, 9}, at::kLong);
  shared->loss(windows).backward();
  for (const auto &kv : shared->named_parameters()) {
    ASSERT_TRUE(kv.value().grad().defined()) << kv.key();
    EXPECT_TRUE(kv.value().grad().isfinite().all().item<bool>()) << kv.key();
  }
  EXPECT_GT(shared->named_parameters()["shared_w"].grad().abs().sum().item<double>(), 0.0);
}

TEST(Model, ErrorsNameTheProblem) {
  EXPECT_ERROR(ape::LanguageModel(tiny_config("no_such_encoding")), "unknown encoding 'no_such_encoding'; available:");
  ape::ModelConfig bad = tiny_config("test_nope");
  bad.heads = 3;
  EXPECT_ERROR(ape::LanguageModel(testk::nope, bad), "d_model (16) must be divisible by heads (3)");
  EXPECT_ERROR(ape::LanguageModel(testk::nope, tiny_config("test_bias")), "names encoding 'test_bias' but the kernel is");
  ape::LanguageModel m(testk::nope, tiny_config("test_nope"));
  EXPECT_ERROR(m->forward(at::zeros({2, 3}, at::kInt)), "tokens must be (B, T) int64");
}

// =====================================================================================================
// Data: token cache, windows, corpus errors
// =====================================================================================================

TEST(TokenCache, RoundTrip) {
  ape::TokenSplit s = synthetic_split(3, 1000, 4096, 7);
  const std::string path = tmp_path("round.bin");
  ape::write_token_cache(path, s, 4096, 0xABCDEF);
  ape::TokenSplit r = ape::read_token_cache(path, 4096, 0xABCDEF);
  EXPECT_EQ(r.names, s.names);
  EXPECT_EQ(r.offsets, s.offsets);
  EXPECT_EQ(r.ids, s.ids);
  EXPECT_FALSE(fs::exists(path + ".tmp." + std::to_string(::getpid())));
}

TEST(TokenCache, TruncatedCorruptAndStaleFilesAreDetected) {
  ape::TokenSplit s = synthetic_split(2, 500, 4096, 8);
  const std::string path = tmp_path("bad.bin");
  ape::write_token_cache(path, s, 4096, 42);
  const auto size = fs::file_size(path);
  auto expect_cache_error = [&](const std::string &substr) {
    try {
      ape::read_token_cache(path, 4096, 42);
      ADD_FAILURE() << "no error for " << substr;
    } catch (const ape::CacheError &e) {
      EXPECT_NE(std::string(e.what()).find(substr), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  };
  EXPECT_ERROR(ape::read_token_cache(path, 4096, 43), "stale");
  EXPECT_ERROR(ape::read_token_cache(path, 8000, 42), "built for vocabulary 4096, need 8000");
  for (uint64_t cut : {size - 1, size / 2, uint64_t(20), uint64_t(3), uint64_t(0)}) {
    ape::write_token_cache(path, s, 4096, 42);
    fs::resize_file(path, cut);
    expect_cache_error(cut < 8 ? "truncated" : "truncated");
  }
  // A flipped byte in the ids -> checksum; a flipped magic -> not a cache.
  for (auto [offset, substr] : {std::pair<uint64_t, const char *>{size - 100, "checksum mismatch"}, {1, "bad magic"}}) {
    ape::write_token_cache(path, s, 4096, 42);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x5A;
    f.seekp(offset);
    f.write(&c, 1);
    f.close();
    expect_cache_error(substr);
  }
  // A header claiming more books than the file holds -> no huge allocation, a clear error.
  ape::write_token_cache(path, s, 4096, 42);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t huge = uint64_t(1) << 60;
    f.seekp(8 + 4 + 4 + 8);
    f.write(reinterpret_cast<const char *>(&huge), 8);
  }
  expect_cache_error("more than the file holds");
  fs::remove(path);
  expect_cache_error("does not exist");
}

TEST(Windows, TrainSamplerStaysInsideOneBookAndIsSeeded) {
  ape::TokenSplit s;
  for (int d = 0; d < 4; ++d) {  // book d holds ids 1000·d + position
    std::vector<int32_t> ids(50 + 30 * d);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = 1000 * d + int32_t(i);
    s.add_doc("b" + std::to_string(d), ids);
  }
  ape::TrainSampler a(s, 5), b(s, 5);
  for (int it = 0; it < 20; ++it) {
    at::Tensor x = a.next(8, 40);
    EXPECT_TRUE(x.equal(b.next(8, 40)));
    auto acc = x.accessor<int64_t, 2>();
    for (int r = 0; r < 8; ++r)
      for (int t = 1; t < 40; ++t) ASSERT_EQ(acc[r][t], acc[r][t - 1] + 1);  // consecutive, same book
  }
  EXPECT_ERROR(a.next(1, 200), "no training book holds a window of 200 tokens");
}

TEST(Windows, EvalLengthsScoreTheSameTargets) {
  ape::TokenSplit s = synthetic_split(2, 3000, 1 << 20, 9);
  const int64_t L = 16, max_len = 8 * L, segments = 5;
  std::vector<int32_t> first;
  for (int64_t m : {1, 2, 4, 8}) {
    at::Tensor w = ape::eval_windows(s, L * m, max_len, segments);
    EXPECT_EQ(w.size(1), L * m + 1);
    EXPECT_EQ(w.size(0), segments * 8 / m);
    at::Tensor targets = w.narrow(1, 1, L * m).flatten();
    std::vector<int32_t> t(targets.data_ptr<int64_t>(), targets.data_ptr<int64_t>() + targets.numel());
    if (first.empty()) first = t;
    EXPECT_EQ(t, first) << "multiple " << m;
  }
  // Too many segments asked: as many as fit; too long: a clear error.
  EXPECT_EQ(ape::eval_windows(s, 1000, 1000, 100).size(0), 4);
  EXPECT_ERROR(ape::eval_windows(s, 4000, 4000, 1), "too short for one window of 4001 tokens");
}

TEST(Corpus, MissingOrCorruptDataGivesClearErrors) {
  ape::DataOptions o;
  o.cache_dir = tmp_path("cache");
  std::ostringstream log;
  o.log = &log;
  o.data_dir = tmp_path("no_such_dir");
  EXPECT_ERROR(ape::Corpus::open(o), "data folder '" + o.data_dir + "' does not exist");

  o.data_dir = tmp_path("data_no_archive");
  fs::create_directories(o.data_dir);
  std::ofstream(o.data_dir + "/SPLITS.tsv") << "id\tsplit\n1\ttrain\n2\ttest\n";
  EXPECT_ERROR(ape::Corpus::open(o), "corpus archive " + o.data_dir + "/clean.tar.xz is missing");

  std::ofstream(o.data_dir + "/clean.tar.xz") << "this is not an xz archive";
  EXPECT_ERROR(ape::Corpus::open(o), "cannot unpack corpus archive " + o.data_dir + "/clean.tar.xz");

  fs::remove(o.data_dir + "/SPLITS.tsv");
  EXPECT_ERROR(ape::Corpus::open(o), "cannot read the split list " + o.data_dir + "/SPLITS.tsv");
}

// The real corpus end to end (unpack, tokenizer, caches): ~15 s, so opt-in with APE_TEST_CORPUS=1.
// The shipped books end to end: unpack, train the tokenizer, tokenize, then reopen from the cache.
TEST(Corpus, ShippedCorpusTokenizesAndCaches) {
  ape::DataOptions o;
  o.data_dir = APE_TEST_DATA_DIR;
  o.cache_dir = tmp_path("corpus_cache");
  std::ostringstream log;
  o.log = &log;
  ape::Corpus c = ape::Corpus::open(o);
  EXPECT_EQ(c.train().num_docs(), 26);
  EXPECT_EQ(c.valid().num_docs(), 2);
  EXPECT_EQ(c.test().num_docs(), 2);
  EXPECT_GT(c.train().size(), 1000000);
  ape::Corpus again = ape::Corpus::open(o);  // everything from the cache now
  EXPECT_EQ(again.test().ids, c.test().ids);
  EXPECT_EQ(again.tokenizer_train_seconds(), 0.0);
  EXPECT_EQ(again.tokenize_seconds(), 0.0);
  std::cout << log.str();
}

// =====================================================================================================
// Checkpoints
// =====================================================================================================

TEST(Checkpoint, RoundTripRestoresEveryTensor) {
  at::manual_seed(10);
  ape::LanguageModel a(testk::bias_shared, tiny_config("test_bias_shared"));
  const std::string path = tmp_path("model.ckpt");
  ape::save_checkpoint(path, a, {{"train", {{"seq_len", 8}}}});
  at::manual_seed(11);
  ape::LanguageModel b(testk::bias_shared, tiny_config("test_bias_shared"));
  ape::Checkpoint c = ape::read_checkpoint(path);
  EXPECT_EQ(c.encoding, "test_bias_shared");
  EXPECT_EQ(c.config["train"]["seq_len"], 8);
  EXPECT_EQ(c.config["model"]["d_model"], 16);
  ape::load_state(b, c, path);
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto &kv : pa) EXPECT_TRUE(kv.value().equal(pb[kv.key()])) << kv.key();
  // Shared tensors are still shared after loading (copied in place).
  EXPECT_EQ(b->blocks[0]->attn->kernel_params()[0].data_ptr(), b->named_parameters()["shared_w"].data_ptr());
  at::Tensor x = at::randint(32, {1, 6}, at::kLong);
  EXPECT_TRUE(a->forward(x).equal(b->forward(x)));
}

TEST(Checkpoint, CorruptTruncatedOrForeignFilesGiveClearErrors) {
  ape::LanguageModel a(testk::bias_entry, tiny_config("test_bias"));
  const std::string path = tmp_path("bad.ckpt");
  ape::save_checkpoint(path, a, nlohmann::json::object());
  const auto size = fs::file_size(path);
  std::string bytes;
  {
    std::ifstream f(path, std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    bytes = s.str();
  }
  auto write = [&](const std::string &b) { std::ofstream(path, std::ios::binary | std::ios::trunc) << b; };

  std::string flipped = bytes;
  flipped[size / 2] ^= 0x40;
  write(flipped);
  EXPECT_ERROR(ape::read_checkpoint(path), "checksum mismatch");
  for (size_t cut : {size - 1, size / 2, size_t(30), size_t(9)}) {
    write(bytes.substr(0, cut));
    EXPECT_ERROR(ape::read_checkpoint(path), "truncated");
  }
  write("APECKPT0 something else entirely");
  EXPECT_ERROR(ape::read_checkpoint(path), "not an APE checkpoint");
  std::string v2 = bytes;
  v2[8] = 2;
  write(v2);
  EXPECT_ERROR(ape::read_checkpoint(path), "format version 2, this build reads version 1");
  EXPECT_ERROR(ape::read_checkpoint(tmp_path("missing.ckpt")), "cannot open");

  write(bytes);
  ape::LanguageModel other(testk::nope, tiny_config("test_nope"));
  EXPECT_ERROR(ape::load_state(other, ape::read_checkpoint(path), path),
               "it holds encoding 'test_bias', but the model is 'test_nope'");
  ape::ModelConfig wide = tiny_config("test_bias");
  wide.d_model = 32;
  ape::LanguageModel w(testk::bias_entry, wide);
  EXPECT_ERROR(ape::load_state(w, ape::read_checkpoint(path), path), "has shape");
  // Loading through the registry names the unknown encoding.
  EXPECT_ERROR(ape::load_model(path), "unknown encoding 'test_bias'");
}

TEST(Checkpoint, AnInterruptedWriteLeavesThePreviousFile) {
  ape::LanguageModel a(testk::nope, tiny_config("test_nope"));
  const std::string path = tmp_path("atomic.ckpt");
  ape::save_checkpoint(path, a, nlohmann::json::object());
  // Simulate a crash mid-write: a partial temporary file next to the good one.
  std::ofstream(path + ".tmp.999999", std::ios::binary) << "APECKPT1 partial";
  EXPECT_NO_THROW(ape::read_checkpoint(path));
  // Saving again replaces the file in one rename.
  ape::save_checkpoint(path, a, {{"again", true}});
  EXPECT_EQ(ape::read_checkpoint(path).config["again"], true);
}

// =====================================================================================================
// Training and evaluation
// =====================================================================================================

TEST(Train, LearningRateWarmupAndCosine) {
  ape::TrainConfig c;
  c.steps = 100;
  c.lr = 1.0;
  c.warmup_steps = 10;
  c.min_lr_frac = 0.1;
  EXPECT_NEAR(ape::learning_rate(c, 0, 0.0), 0.1, 1e-12);
  EXPECT_NEAR(ape::learning_rate(c, 9, 0.09), 0.5 * (1.1 + 0.9 * std::cos(M_PI * 0.09)), 1e-12);
  EXPECT_NEAR(ape::learning_rate(c, 50, 0.5), 0.55, 1e-12);
  EXPECT_NEAR(ape::learning_rate(c, 99, 1.0), 0.1, 1e-12);
  c.warmup_steps = 1000;  // capped at steps / 5
  EXPECT_NEAR(ape::learning_rate(c, 19, 0.0), 1.0, 1e-12);
  ape::TrainConfig none;
  EXPECT_ERROR(none.validate(), "give a budget");
}

TEST(Train, LossFallsOnATinyModel) {
  at::manual_seed(12);
  // Books that repeat a fixed 8-token phrase: learnable fast, far below the uniform ln(16).
  ape::TokenSplit s;
  std::vector<int32_t> phrase{3, 1, 4, 15, 9, 2, 6, 5}, ids;
  for (int r = 0; r < 200; ++r) ids.insert(ids.end(), phrase.begin(), phrase.end());
  s.add_doc("a", ids);
  ape::ModelConfig mc = tiny_config("test_nope", 16);
  ape::LanguageModel model(testk::nope, mc);
  ape::TrainConfig tc;
  tc.steps = 30;
  tc.batch = 8;
  tc.seq_len = 16;
  tc.lr = 1e-2;
  tc.warmup_steps = 3;
  tc.progress_in_place = false;
  std::ostringstream out;
  ape::TrainSampler sampler(s, 1);
  ape::TrainResult r = ape::train(model, sampler, tc, out, "tiny");
  EXPECT_EQ(r.steps, 30);
  EXPECT_EQ(r.losses.size(), 30u);
  EXPECT_NEAR(r.first_loss, std::log(16.0), 0.3);
  EXPECT_LT(r.final_loss, r.first_loss - 0.8) << out.str();
  EXPECT_NE(out.str().find("[tiny] step 30/30"), std::string::npos) << out.str();

  // And evaluation runs on it, with the same target count at every length.
  ape::EvalConfig ec;
  ec.multiples = {1, 2, 4};
  ec.tokens = 3 * 64;
  auto rows = ape::evaluate(model, s, 16, ec);
  ASSERT_EQ(rows.size(), 3u);
  for (const auto &row : rows) {
    EXPECT_EQ(row.tokens, 3 * 64);
    EXPECT_NEAR(row.ppl, std::exp(row.loss), 1e-9);
    EXPECT_EQ(row.eval_len, 16 * row.multiple);
  }
}

TEST(Train, DivergenceStopsWithAClearError) {
  ape::TokenSplit s = synthetic_split(1, 500, 16, 13);
  ape::LanguageModel model(testk::nope, tiny_config("test_nope", 16));
  {
    torch::NoGradGuard g;
    model->wte->weight.fill_(NAN);
  }
  ape::TrainConfig tc;
  tc.steps = 5;
  tc.batch = 2;
  tc.seq_len = 8;
  tc.progress = false;
  std::ostringstream out;
  ape::TrainSampler sampler(s, 1);
  try {
    ape::train(model, sampler, tc, out, "nan");
    ADD_FAILURE() << "no error";
  } catch (const ape::TrainingDiverged &e) {
    EXPECT_NE(std::string(e.what()).find("loss became NaN at step 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nothing was saved"), std::string::npos) << e.what();
  }
}

TEST(Eval, MultiplesTableAndCsv) {
  EXPECT_EQ(ape::parse_multiples("8, 1,2,4,2"), std::vector<int64_t>({1, 2, 4, 8}));
  EXPECT_ERROR(ape::parse_multiples("1,x"), "expected positive integers");
  EXPECT_ERROR(ape::parse_multiples("0"), "expected positive integers");
  std::vector<ape::EvalRow> rows;
  for (const char *enc : {"rope", "cable"})
    for (int64_t m : {1, 2}) rows.push_back({enc, 128, 128 * m, m, 4.0 + m, std::exp(4.0 + m), 1000});
  std::ostringstream out;
  ape::print_table(out, rows, "title");
  const std::string t = out.str();
  EXPECT_NE(t.find("title\n"), std::string::npos);
  EXPECT_NE(t.find("1x (128)"), std::string::npos) << t;
  EXPECT_NE(t.find("2x (256)"), std::string::npos) << t;
  EXPECT_NE(t.find("5.000 / 148.41"), std::string::npos) << t;
  EXPECT_LT(t.find("rope"), t.find("cable"));
  const std::string csv = tmp_path("r.csv");
  ape::write_csv(csv, rows);
  std::ifstream f(csv);
  std::string header, first;
  std::getline(f, header);
  std::getline(f, first);
  EXPECT_EQ(header, "encoding,train_len,eval_len,multiple,loss,ppl,tokens");
  EXPECT_EQ(first.rfind("rope,128,128,1,5.000000,148.413159,1000", 0), 0u) << first;
}

// =====================================================================================================
// Every encoding in the generated registry: its manifest parses, and a tiny model runs a training
// step with finite loss and gradients (the per-encoding numerics are tested by the kernel suites).
// =====================================================================================================

TEST(RegisteredKernels, EveryEncodingBuildsAndTakesAStep) {
  const auto names = ape::kernel_names();
  if (names.empty()) GTEST_SKIP() << "the kernel registry is empty";
  for (const auto &name : names) {
    SCOPED_TRACE(name);
    at::manual_seed(14);
    ape::ModelConfig mc = tiny_config(name);
    mc.d_model = 64;  // head_dim 32: room for overrides of l = d/8
    ape::LanguageModel model(mc);
    at::Tensor w = at::randint(32, {2, 17}, at::kLong);
    at::Tensor loss = model->loss(w);
    ASSERT_TRUE(std::isfinite(loss.item<double>()));
    loss.backward();
    for (const auto &kv : model->named_parameters()) {
      ASSERT_TRUE(kv.value().grad().defined()) << kv.key();
      EXPECT_TRUE(kv.value().grad().isfinite().all().item<bool>()) << kv.key();
    }
  }
}

// The runtime glue with real generated kernels, when those encodings are registered: the feature
// tensors reach the kernel as (B, H, T) (Cable) and the override + projection terms reproduce
// ExPE's explicit φ(x, t): the first l inputs overwritten by p_{t,i} = S + θ(t + i).
const ape::KernelEntry *registered(const std::string &name) {
  for (const auto &n : ape::kernel_names())
    if (n == name) return &ape::find_kernel(name);
  return nullptr;
}

TEST(RegisteredKernels, CableThroughFusedAttentionMatchesTheSpec) {
  const ape::KernelEntry *cable = registered("cable");
  if (!cable) GTEST_SKIP() << "no 'cable' encoding registered";
  at::manual_seed(15);
  auto opt = at::TensorOptions().dtype(at::kDouble);
  const int64_t B = 2, H = 3, T = 70, D = 8;
  at::Tensor q = at::randn({B, H, T, D}, opt).requires_grad_(), k = at::randn({B, H, T, D}, opt).requires_grad_(),
             v = at::randn({B, H, T, D}, opt).requires_grad_(), f = at::randn({B, H, T}, opt).requires_grad_();
  at::Tensor dout = at::randn({B, H, T, D}, opt);
  const double scale = 1.0 / std::sqrt(double(D));
  at::Tensor o = ape::fused_attention(*cable, q, k, v, {f}, {}, scale);
  auto g = torch::autograd::grad({o}, {q, k, v, f}, {dout});
  at::Tensor S = at::cumsum(-at::softplus(f), -1);              // (B, H, T)
  at::Tensor bias = S.unsqueeze(-1) - S.unsqueeze(-2);          // B_ij = S_i - S_j
  at::Tensor ro = reference_attention(q, k, v, scale, bias);
  auto rg = torch::autograd::grad({ro}, {q, k, v, f}, {dout});
  expect_close(o, ro, 1e-9, "o");
  const char *names[] = {"dq", "dk", "dv", "dfeature"};
  for (int i = 0; i < 4; ++i) expect_close(g[i], rg[i], 1e-9, names[i]);
}

TEST(RegisteredKernels, ExpeThroughTheModelMatchesExplicitOverride) {
  const ape::KernelEntry *expe = registered("expe");
  if (!expe) GTEST_SKIP() << "no 'expe' encoding registered";
  const ape::Manifest &m = ape::manifest_of(*expe);
  ASSERT_TRUE(m.override_.has_value());
  at::manual_seed(16);
  ape::ModelConfig cfg = tiny_config("expe");
  cfg.d_model = 64;
  check_explicit_expe(*expe, cfg, m.override_->l, m.params[0].init.step, 2e-5);
}
