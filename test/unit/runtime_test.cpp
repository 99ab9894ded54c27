// GoogleTest suite of the LibTorch runtime (runtime/): manifest, autograd glue, model, data,
// checkpoints, training and evaluation. The kernels used here are private, naive, materialised
// test kernels (test_nope, test_bias, test_expe) defined below; the generated encodings are only
// smoke-tested (RegisteredKernels.*), so this suite does not depend on any particular encoding.
#include "runtime_fixtures.h"
#include "runtime/Generate.h"

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

TEST(Manifest, ParsesEmbeddingOverrideKindsAndProjectionPrefix) {
  ape::Manifest t = ape::Manifest::parse(R"({"encoding": "s", "embedding": {"kind": "table", "scale_embedding": true}})");
  ASSERT_TRUE(t.embedding.has_value());
  EXPECT_EQ(t.embedding->kind, ape::EmbeddingSpec::Kind::Table);
  EXPECT_TRUE(t.embedding->scale_embedding);
  ape::Manifest l = ape::Manifest::parse(
      R"({"encoding": "l", "embedding": {"kind": "learned", "max_length": 1024, "std": 0.05}})");
  EXPECT_EQ(l.embedding->kind, ape::EmbeddingSpec::Kind::Learned);
  EXPECT_EQ(l.embedding->max_length, 1024);
  EXPECT_DOUBLE_EQ(l.embedding->std, 0.05);
  EXPECT_FALSE(l.embedding->scale_embedding);
  EXPECT_FALSE(ape::Manifest::parse(R"({"encoding": "n", "embedding": null})").embedding.has_value());

  ape::Manifest q = ape::Manifest::parse(testk::kExqpeManifest);
  ASSERT_TRUE(q.override_.has_value());
  EXPECT_EQ(q.override_->kind, ape::OverrideSpec::Kind::Exqpe);
  EXPECT_DOUBLE_EQ(q.override_->theta1, 0.25);
  EXPECT_DOUBLE_EQ(q.override_->theta2, 1.0);
  EXPECT_TRUE(q.override_->v);
  EXPECT_EQ(q.override_->position_scale, "position_scale");
  EXPECT_EQ(q.param_index("position_scale"), 6);
  EXPECT_EQ(q.param_index("nothing"), -1);
  const auto &pp = q.params[2];
  EXPECT_EQ(pp.init.kind, ape::InitSpec::Kind::ProjectionPrefix);
  EXPECT_TRUE(pp.init.derived());
  EXPECT_FALSE(pp.fixed());
  EXPECT_DOUBLE_EQ(pp.init.scale, 1.0);
  EXPECT_EQ(pp.resolve_shape(2, 8), std::vector<int64_t>({4, 2, 8}));  // "4" written as a string
  EXPECT_EQ(q.params[6].resolve_shape(2, 8), std::vector<int64_t>({1}));
  EXPECT_TRUE(q.params[6].fixed());
  ape::Manifest e = ape::Manifest::parse(testk::kExpeQkvManifest);
  EXPECT_EQ(e.override_->kind, ape::OverrideSpec::Kind::Expe);
  EXPECT_DOUBLE_EQ(e.override_->theta, 0.05);
  ape::Manifest h = ape::Manifest::parse(R"({"encoding": "h", "head_dim": 8, "model_dim": null})");
  EXPECT_EQ(h.head_dim_hint, std::optional<int64_t>(8));
  EXPECT_FALSE(h.model_dim_hint.has_value());
  // Manifests without "kind" (written before ExQPE) are ExPE.
  EXPECT_EQ(ape::Manifest::parse(testk::kExpeManifest).override_->kind, ape::OverrideSpec::Kind::Expe);
}

TEST(Manifest, DefaultsAndExplicitScale) {
  ape::Manifest m = ape::Manifest::parse(R"({"encoding": "nope"})");
  EXPECT_TRUE(m.causal);
  EXPECT_TRUE(m.features.empty());
  EXPECT_TRUE(m.params.empty());
  EXPECT_FALSE(m.override_.has_value());
  ape::Manifest s = ape::Manifest::parse(R"({"encoding": "k", "scale": 1.0, "causal": false,
    "override": {"l": 2, "targets": "qkv", "theta": 0.1}})");
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
      {R"({"encoding": "x", "override": {"l": 0, "targets": "qk"}})", "$.override.l: must be in [1, 65536]"},
      {R"({"encoding": "x", "override": {"l": 2.5, "targets": "qk"}})", "$.override.l: expected an integer"},
      {R"({"encoding": "x", "override": {"l": 2, "targets": "qk", "kind": "fire"}})",
       "$.override.kind: expected \"expe\" or \"exqpe\", got \"fire\""},
      {R"({"encoding": "x", "override": {"l": 2, "targets": "qk", "kind": "exqpe", "theta1": 0.1}})",
       "$.override.theta2: missing (an exqpe override needs a number)"},
      {R"({"encoding": "x", "override": {"l": 2, "targets": "qkv"}})",
       "$.override.theta: missing (an expe override with targets \"qkv\" needs a number)"},
      {R"({"encoding": "x", "override": {"l": 2, "targets": "qk", "kind": "expe", "theta": "big"}})",
       "$.override.theta: expected a number"},
      {R"({"encoding": "x", "override": {"l": 2, "targets": "qk", "theta": 0.1, "position_scale": "s"}})",
       "$.override.position_scale: names no param: \"s\""},
      {R"({"encoding": "x", "params": [{"name": "s", "shape": [1], "init": "ones", "trainable": true}],
           "override": {"l": 2, "targets": "qk", "theta": 0.1, "position_scale": "s"}})",
       "param \"s\" must be a fixed (not trainable, not derived) param of shape [1]"},
      {R"({"encoding": "x", "params": [{"name": "s", "shape": ["heads"], "init": "ones"}],
           "override": {"l": 2, "targets": "qk", "theta": 0.1, "position_scale": "s"}})",
       "must be a fixed (not trainable, not derived) param of shape [1]"},
      {R"({"encoding": "x", "override": {"l": 2, "targets": "qk", "theta": 0.1, "position_scale": 1}})",
       "$.override.position_scale: expected a string"},
      {R"({"encoding": "x", "params": [{"name": "p", "shape": ["4", "heads", "head_dim"],
           "init": {"kind": "projection_prefix", "projection": "q", "columns": 4}}]})",
       "$.params[0].init.scale: missing"},
      {R"({"encoding": "x", "params": [{"name": "p", "shape": ["heads", "head_dim"],
           "init": {"kind": "projection_prefix", "projection": "q", "columns": 4, "scale": 1}}]})",
       "projection_prefix param must have shape [columns, \"heads\", \"head_dim\"] = [4,"},
      {R"({"encoding": "x", "params": [{"name": "p", "shape": [3, "heads", "head_dim"],
           "init": {"kind": "projection_prefix", "projection": "q", "columns": 4, "scale": 1}}]})",
       "projection_prefix param must have shape"},
      {R"({"encoding": "x", "params": [{"name": "p", "shape": ["4", "heads", "head_dim"], "per_layer": false,
           "init": {"kind": "projection_prefix", "projection": "v", "columns": 4, "scale": 1}}]})",
       "projection_prefix param comes from a per-layer projection"},
      {R"({"encoding": "x", "params": [{"name": "p", "shape": ["-1"], "init": "zeros"}]})",
       "$.params[0].shape[0]: unknown shape symbol \"-1\""},
      {R"({"encoding": "x", "embedding": "sinusoidal"})", "$.embedding: expected null or an object"},
      {R"({"encoding": "x", "head_dim": 0})", "$.head_dim: must be > 0"},
      {R"({"encoding": "x", "model_dim": "big"})", "$.model_dim: expected an integer"},
      {R"({"encoding": "x", "embedding": {"kind": "rotary"}})",
       "$.embedding.kind: expected \"table\" or \"learned\", got \"rotary\""},
      {R"({"encoding": "x", "embedding": {"scale_embedding": false}})", "$.embedding.kind: missing"},
      {R"({"encoding": "x", "embedding": {"kind": "learned"}})", "$.embedding.max_length: missing"},
      {R"({"encoding": "x", "embedding": {"kind": "learned", "max_length": 0}})", "$.embedding.max_length: must be in [1, 16777216]"},
      {R"({"encoding": "x", "embedding": {"kind": "learned", "max_length": 8, "std": -1}})",
       "$.embedding.std: must be >= 0"},
      {R"({"encoding": "x", "embedding": {"kind": "table", "scale_embedding": "yes"}})",
       "$.embedding.scale_embedding: expected true or false"},
      // The verifier's limits (dialect/ValueRules.h), the same in a manifest.
      {R"({"encoding": "x", "params": [{"name": "t", "shape": ["70000"], "init": "zeros"}]})",
       "$.params[0].shape[0]: 70000 exceeds 65536"},
      {R"({"encoding": "x", "params": [{"name": "t", "shape": [65536, 65536], "init": "zeros"}]})",
       "the integer dimensions hold more than 268435456 elements"},
      {R"({"encoding": "x", "embedding": {"kind": "learned", "max_length": 1e30}})",
       "$.embedding.max_length: expected an integer, got 1e+30"},
      {R"({"encoding": "x", "embedding": {"kind": "learned", "max_length": 18446744073709551615}})",
       "$.embedding.max_length: integer 18446744073709551615 out of range"},
      // Value ranges of fixed params and the rotation.
      {R"({"encoding": "x", "params": [{"name": "s", "shape": [1], "init": {"kind": "constant", "value": 0},
          "range": {"min": 1, "max": 2, "integer": false}}]})",
       "$.params[0].init.value: must be a positive number in [1, 2]; got 0"},
      {R"({"encoding": "x", "params": [{"name": "s", "shape": [1], "init": {"kind": "constant", "value": 1},
          "range": {"min": 3, "max": 2}}]})", "$.params[0].range: min exceeds max"},
      {R"({"encoding": "x", "params": [{"name": "s", "shape": [1], "init": "zeros", "trainable": true,
          "range": {"min": 0, "max": 2}}]})", "a value range applies to a fixed param"},
      {R"({"encoding": "x", "params": [{"name": "s", "shape": [1], "init": "zeros", "range": [0, 1]}]})",
       "$.params[0].range: expected an object {min, max, integer}"},
      {R"({"encoding": "x", "rotation": {"pairing": "diagonal", "fraction": 1}})",
       "$.rotation.pairing: expected \"half\" or \"interleaved\", got \"diagonal\""},
      {R"({"encoding": "x", "rotation": {"pairing": "half", "fraction": 0}})", "$.rotation.fraction: must be in (0, 1]"},
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
  // sinusoidal [rows, heads, head_dim]: PE[r, h·head_dim + c] over d = heads·head_dim.
  ape::Manifest t = ape::Manifest::parse(R"({"encoding": "x", "params": [
    {"name": "pe", "shape": ["3", "heads", "head_dim"], "init": {"kind": "sinusoidal"}, "trainable": true}]})");
  at::Tensor pe = ape::init_param(t.params[0], 2, 2, at::kDouble);
  ASSERT_EQ(pe.sizes(), at::IntArrayRef({3, 2, 2}));
  expect_close(pe[1].reshape({4}), at::tensor({0.841471, 0.540302, 0.010000, 0.999950}, at::kDouble), 1e-6, "PE[1]");
  expect_close(pe[2].reshape({4}), at::tensor({0.909297, -0.416147, 0.019999, 0.999800}, at::kDouble), 1e-6, "PE[2]");
  EXPECT_ERROR(ape::Manifest::parse(R"({"encoding": "x", "params": [{"name": "pe", "shape": ["heads", "head_dim"],
                                        "init": {"kind": "sinusoidal"}}]})"),
               "sinusoidal needs shape [rows, \"heads\", \"head_dim\"]");
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

// The model's attention (override + derived params in the kernel, and for "qkv" the value path)
// must equal attention on explicitly overridden inputs φ(x̃, t) = (σ·pos_t, x̃[l:]) for q and k (and
// v when `override_v`), pos (T, l) computed by the caller from the spec — forward and the gradients of
// every projection weight. σ is set through the manifest's position_scale param when `sigma` != 1.
void check_explicit_override(const ape::KernelEntry &entry, const ape::ModelConfig &cfg, const at::Tensor &pos,
                             bool override_v, double sigma, double tol) {
  const ape::Manifest &man = ape::manifest_of(entry);
  ape::EncodedAttention attn(entry, cfg, std::vector<at::Tensor>(man.params.size()));
  if (sigma != 1.0) {
    ASSERT_TRUE(man.override_ && !man.override_->position_scale.empty()) << "no position_scale";
    at::NoGradGuard ng;
    attn->stored_param(man.param_index(man.override_->position_scale)).fill_(sigma);
  }
  const int64_t B = 2, T = pos.size(0), l = pos.size(1), d = cfg.d_model, H = cfg.heads, D = cfg.head_dim();
  at::Tensor xn = at::randn({B, T, d});
  at::Tensor y = attn->forward(xn);
  at::Tensor dy = at::randn_like(y);
  auto W = std::vector<at::Tensor>{attn->wq->weight, attn->wk->weight, attn->wv->weight, attn->wo->weight};
  auto g = torch::autograd::grad({y}, W, {dy});

  at::Tensor phi = at::cat({(pos.to(at::kFloat) * sigma).unsqueeze(0).expand({B, T, l}), xn.narrow(-1, l, d - l)}, -1);
  auto heads = [&](at::Tensor t) { return t.view({B, T, H, D}).transpose(1, 2); };
  at::Tensor q = heads(at::matmul(phi, W[0].t())), k = heads(at::matmul(phi, W[1].t()));
  at::Tensor v = heads(at::matmul(override_v ? phi : xn, W[2].t()));
  at::Tensor o = reference_attention(q, k, v, 1.0 / std::sqrt(double(D)));
  at::Tensor ry = attn->wo(o.transpose(1, 2).reshape({B, T, d}));
  auto rg = torch::autograd::grad({ry}, W, {dy});
  expect_close(y, ry, tol, "output");
  const char *names[] = {"dW_q", "dW_k", "dW_v", "dW_o"};
  for (int i = 0; i < 4; ++i) expect_close(g[i], rg[i], tol, names[i]);
  // The first l columns of W_q get gradient only through the derived params.
  EXPECT_GT(g[0].narrow(1, 0, l).abs().sum().item<double>(), 0.0);
}

// ExPE positions p_{t,j} = S + θ(t + j), and ExQPE's p_{t,j} = S + jθ1 + θ2·c_j(t) with c_j(t) counted
// directly (the number of u in [0, t] with u ≡ j mod l), both straight from encodings.md.
at::Tensor expe_positions(int64_t T, int64_t l, double start, double theta) {
  return (at::arange(T).view({T, 1}) + at::arange(l).view({1, l})).to(at::kDouble) * theta + start;
}
at::Tensor exqpe_positions(int64_t T, int64_t l, double start, double theta1, double theta2) {
  at::Tensor p = at::zeros({T, l}, at::kDouble);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < l; ++j) {
      int64_t count = 0;
      for (int64_t u = 0; u <= t; ++u) count += u % l == j;
      p[t][j] = start + double(j) * theta1 + theta2 * double(count);
    }
  return p;
}

// With an override {l, qk} and projection_term params (a = W[:, :l]·(θj)_j, b = θ·W[:, :l]·1), the
// model's attention must equal attention on explicitly overridden inputs φ(x̃, t) = (p_t, x̃[l:]),
// p_{t,j} = θ(t + j).
void check_explicit_expe(const ape::KernelEntry &entry, const ape::ModelConfig &cfg, int64_t l, double theta,
                         double tol) {
  check_explicit_override(entry, cfg, expe_positions(9, l, 0.0, theta), false, 1.0, tol);
}

TEST(Model, OverrideAndProjectionTermsMatchExplicitExPE) {
  at::manual_seed(3);
  check_explicit_expe(testk::expe, tiny_config("test_expe"), testk::kExpeL, testk::kExpeTheta, 1e-5);
}

TEST(Model, QkvOverrideValuePathEqualsTheLiteralOverride) {
  // ExPE on q, k and v with σ = 0.7: the value projection reads (σ·p_t, x̃[l:]) itself.
  at::manual_seed(30);
  check_explicit_override(testk::expe_qkv, tiny_config("test_expe_qkv"),
                          expe_positions(9, testk::kExpeL, 0.0, testk::kExpeTheta), true, 0.7, 1e-5);
  // ExQPE (l = 4, θ1 = 0.25, θ2 = 1; long enough for three periods) with σ = 1 and σ = 0.5.
  for (double sigma : {1.0, 0.5}) {
    SCOPED_TRACE(sigma);
    check_explicit_override(testk::exqpe, tiny_config("test_exqpe"),
                            exqpe_positions(11, testk::kExqpeL, 0.0, 0.25, 1.0), true, sigma, 1e-5);
  }
  // The manifest's own positions agree with the spec's.
  const auto &ov = *ape::manifest_of(testk::exqpe).override_;
  at::Tensor mine = at::tensor(ov.positions(11), at::kDouble).view({11, 4});
  expect_close(mine, exqpe_positions(11, 4, 0.0, 0.25, 1.0), 1e-15, "OverrideSpec::positions (exqpe)");
  const auto &ev = *ape::manifest_of(testk::expe_qkv).override_;
  expect_close(at::tensor(ev.positions(9), at::kDouble).view({9, 4}), expe_positions(9, 4, 0.0, 0.05), 1e-15,
               "OverrideSpec::positions (expe)");
}

TEST(Model, ProjectionPrefixIsTheScaledCumulativeSumOfW) {
  at::manual_seed(31);
  const char *manifest = R"({"encoding": "x", "params": [
    {"name": "p", "shape": [3, "heads", "head_dim"], "trainable": true,
     "init": {"kind": "projection_prefix", "projection": "k", "columns": 3, "scale": 0.5}}],
    "override": {"l": 3, "targets": "qk"}})";
  static const ape::KernelEntry e = testk::entry<testk::Kind::Nope>("x", manifest);
  ape::ModelConfig cfg = tiny_config("x");  // d 16, 2 heads of 8
  ape::EncodedAttention attn(e, cfg, std::vector<at::Tensor>(1));
  at::Tensor P = attn->kernel_params()[0];
  ASSERT_EQ(P.sizes(), at::IntArrayRef({3, 2, 8}));
  at::Tensor W = attn->wk->weight;  // (d, d)
  for (int64_t r = 0; r < 3; ++r) {
    at::Tensor want = W.narrow(1, 0, r + 1).sum(1) * 0.5;  // scale·Σ_{j<=r} W[:, j]
    expect_close(P[r].reshape({16}), want, 1e-6, "P[" + std::to_string(r) + "]");
  }
  // Derived every step: autograd carries the gradient into W[:, :3] (reverse cumulative sums).
  at::Tensor G = at::randn({3, 2, 8});
  auto g = torch::autograd::grad({(P * G).sum()}, {W})[0];
  at::Tensor Gf = G.reshape({3, 16});
  for (int64_t j = 0; j < 3; ++j)
    expect_close(g.select(1, j), Gf.narrow(0, j, 3 - j).sum(0) * 0.5, 1e-6, "dW[:, " + std::to_string(j) + "]");
  EXPECT_EQ(g.narrow(1, 3, 13).abs().sum().item<double>(), 0.0);
}

TEST(Model, ExqpeDerivedTermsReproduceTheHandCheckedPositions) {
  // l = 4, S = 0, θ1 = 0.25, θ2 = 1; W_q[:, :4] = identity on head 0, so W·p_n = p_n there and
  // a + floor(n/l)·b + P[n mod l] must be encodings.md's p_n.
  ape::ModelConfig cfg = tiny_config("test_exqpe");
  cfg.d_model = 8;  // 2 heads of 4
  ape::EncodedAttention attn(testk::exqpe, cfg, std::vector<at::Tensor>(7));
  {
    at::NoGradGuard g;
    attn->wq->weight.zero_();
    for (int i = 0; i < 4; ++i) attn->wq->weight[i][i] = 1.0;
  }
  auto kp = attn->kernel_params();
  at::Tensor a = kp[0][0], b = kp[1][0], P = kp[2].select(1, 0);  // head 0: (4), (4), (4, 4)
  const std::pair<int64_t, std::vector<double>> want[] = {
      {0, {1, .25, .5, .75}}, {1, {1, 1.25, .5, .75}}, {3, {1, 1.25, 1.5, 1.75}}, {4, {2, 1.25, 1.5, 1.75}}};
  for (const auto &[n, p] : want) {
    at::Tensor got = a + double(n / 4) * b + P[n % 4];
    expect_close(got.to(at::kDouble), at::tensor(p, at::kDouble), 1e-7, "p_" + std::to_string(n));
  }
  const auto pos = ape::manifest_of(testk::exqpe).override_->positions(5);
  EXPECT_EQ(std::vector<double>(pos.begin() + 16, pos.end()), std::vector<double>({2, 1.25, 1.5, 1.75}));
}

TEST(Model, FixedSinusoidalTableAtTheEmbedding) {
  ape::ModelConfig cfg = tiny_config("test_table");
  cfg.d_model = 4;
  cfg.heads = 1;
  ape::LanguageModel m(testk::table, cfg);
  at::Tensor tokens = at::tensor({3, 1, 4}, at::kLong).view({1, 3});
  at::Tensor pe = (m->embed(tokens) - m->wte(tokens))[0];
  expect_close(pe[1], at::tensor({0.841471, 0.540302, 0.010000, 0.999950}).to(at::kFloat), 1e-6, "PE[1]");
  expect_close(pe[2], at::tensor({0.909297, -0.416147, 0.019999, 0.999800}).to(at::kFloat), 1e-6, "PE[2]");
  expect_close(pe[0], at::tensor({0.0, 1.0, 0.0, 1.0}).to(at::kFloat), 1e-7, "PE[0]");
  // No trainable table, nothing extra in the checkpoint state; the loss runs end to end.
  EXPECT_FALSE(m->wpe.defined());
  ape::ModelConfig plain = cfg;
  plain.encoding = "test_nope";
  EXPECT_EQ(m->named_parameters().size(), ape::LanguageModel(testk::nope, plain)->named_parameters().size());
  EXPECT_TRUE(std::isfinite(m->loss(at::randint(32, {2, 9}, at::kLong)).item<double>()));
  // scale_embedding: wte·sqrt(d) + PE.
  cfg.encoding = "test_table_scaled";
  ape::LanguageModel s(testk::table_scaled, cfg);
  expect_close(s->embed(tokens)[0], (s->wte(tokens) * 2.0)[0] + pe, 1e-6, "scaled embedding");
  // A manifest asking for a table from an entry that has none is an error.
  static const ape::KernelEntry no_table = testk::entry<testk::Kind::Nope>("test_table", testk::kTableManifest);
  cfg.encoding = "test_table";
  EXPECT_ERROR(ape::LanguageModel(no_table, cfg), "entry has no embed_table");
}

TEST(Model, LearnedAbsoluteTableTrainsSavesAndRefusesLongSequences) {
  at::manual_seed(32);
  ape::LanguageModel m(testk::learned, tiny_config("test_learned"));
  ASSERT_TRUE(m->wpe.defined());
  EXPECT_EQ(m->wpe.sizes(), at::IntArrayRef({8, 16}));
  EXPECT_NEAR(m->wpe.std().item<double>(), 0.02, 0.006);
  EXPECT_EQ(m->max_length(), std::optional<int64_t>(8));
  at::Tensor tokens = at::randint(32, {2, 5}, at::kLong);
  expect_close(m->embed(tokens), m->wte(tokens) + m->wpe.narrow(0, 0, 5).unsqueeze(0), 1e-7, "wte + wpe[:T]");
  m->loss(at::randint(32, {2, 9}, at::kLong)).backward();  // T = 8: fits
  ASSERT_TRUE(m->wpe.grad().defined());
  EXPECT_GT(m->wpe.grad().abs().sum().item<double>(), 0.0);
  EXPECT_ERROR(m->forward(at::zeros({1, 9}, at::kLong)),
               "learned absolute positions: sequence length 9 exceeds the table's max_length 8");
  EXPECT_ERROR(m->loss(at::zeros({1, 12}, at::kLong)), "sequence length 11 exceeds the table's max_length 8");
  // Saved in checkpoints.
  const std::string path = tmp_path("learned.ckpt");
  ape::save_checkpoint(path, m, nlohmann::json::object());
  ape::LanguageModel r(testk::learned, tiny_config("test_learned"));
  ape::load_state(r, ape::read_checkpoint(path), path);
  EXPECT_TRUE(r->wpe.equal(m->wpe));
  // Evaluation skips the lengths the table cannot hold, with a note, in the table and the CSV.
  ape::TokenSplit split = synthetic_split(2, 400, 32, 33);
  ape::EvalConfig ec;
  ec.multiples = {1, 2, 4};
  ec.tokens = 64;
  auto rows = ape::evaluate(r, split, 4, ec);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_FALSE(rows[0].skipped());
  EXPECT_FALSE(rows[1].skipped());
  EXPECT_TRUE(std::isfinite(rows[1].loss));
  ASSERT_TRUE(rows[2].skipped());
  EXPECT_TRUE(std::isnan(rows[2].loss));
  EXPECT_NE(rows[2].note.find("sequence length 16 exceeds the table's max_length 8"), std::string::npos) << rows[2].note;
  std::ostringstream out;
  ape::print_table(out, rows);
  EXPECT_NE(out.str().find("skipped"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("test_learned @ 16 (4x): learned absolute positions"), std::string::npos) << out.str();
  const std::string csv = tmp_path("learned.csv");
  ape::write_csv(csv, rows);
  std::ifstream f(csv);
  std::string line, last;
  while (std::getline(f, line)) last = line;
  EXPECT_EQ(last, "test_learned,4,16,4,,,0,learned absolute positions: sequence length 16 exceeds the table's "
                  "max_length 8");
}

TEST(Model, SetFixedParamChangesTheModelAndRejectsOtherNames) {
  at::manual_seed(34);
  ape::LanguageModel m(testk::exqpe, tiny_config("test_exqpe"));
  EXPECT_EQ(m->settable_params(), std::vector<std::string>({"position_scale"}));
  at::Tensor tokens = at::randint(32, {2, 9}, at::kLong);
  at::NoGradGuard ng;
  at::Tensor before = m->forward(tokens);
  m->set_fixed_param("position_scale", 0.5);
  for (auto &b : m->blocks) {
    EXPECT_EQ(b->attn->stored_param(6).item<double>(), 0.5);
  }
  at::Tensor after = m->forward(tokens);
  EXPECT_GT((after - before).abs().max().item<double>(), 1e-4);
  m->set_fixed_param("position_scale", 1.0);
  expect_close(m->forward(tokens), before, 1e-6, "σ back to 1");
  EXPECT_ERROR(m->set_fixed_param("position_scal", 2.0),
               "encoding 'test_exqpe' has no param 'position_scal'; its settable (fixed) params: position_scale");
  EXPECT_ERROR(m->set_fixed_param("override_q_p", 2.0), "is derived from a projection weight");
  ape::LanguageModel bias(testk::bias_entry, tiny_config("test_bias"));
  EXPECT_ERROR(bias->set_fixed_param("w", 2.0), "param 'w' of encoding 'test_bias' is trainable");
  EXPECT_ERROR(bias->set_fixed_param("w", 2.0), "settable: (none)");
  // Fixed params are buffers: saved in checkpoints with their current value.
  m->set_fixed_param("position_scale", 0.25);
  const std::string path = tmp_path("exqpe.ckpt");
  ape::save_checkpoint(path, m, nlohmann::json::object());
  ape::LanguageModel r(testk::exqpe, tiny_config("test_exqpe"));
  ape::load_state(r, ape::read_checkpoint(path), path);
  EXPECT_EQ(r->blocks[1]->attn->stored_param(6).item<double>(), 0.25);
  auto names = r->named_buffers().keys();
  EXPECT_NE(std::find(names.begin(), names.end(), "block1.attn.position_scale"), names.end());
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
  EXPECT_ERROR(ape::LanguageModel(testk::nope, bad), "--d-model (16) must be divisible by --heads (3)");
  EXPECT_ERROR(ape::LanguageModel(testk::nope, tiny_config("test_bias")), "names encoding 'test_bias' but the kernel is");
  ape::LanguageModel m(testk::nope, tiny_config("test_nope"));
  EXPECT_ERROR(m->forward(at::zeros({2, 3}, at::kInt)), "tokens must be (B, T) int64");
  static const ape::KernelEntry hinted = testk::entry<testk::Kind::Nope>(
      "test_nope", R"({"encoding": "test_nope", "head_dim": 64, "model_dim": 16})");
  EXPECT_ERROR(ape::LanguageModel(hinted, tiny_config("test_nope")),
               "'test_nope' was compiled for head_dim 64 (a shape hint of its spec); the model has 8");
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
  std::string v3 = bytes;
  v3[8] = 3;
  write(v3);
  EXPECT_ERROR(ape::read_checkpoint(path), "format version 3, this build reads version 2");
  v3[8] = 1;
  write(v3);
  EXPECT_ERROR(ape::read_checkpoint(path), "format version 1 (written before resumable checkpoints)");
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

TEST(Checkpoint, LoadsIntoAnotherEncodingWhenTheTrainableParametersMatch) {
  at::manual_seed(40);
  ape::LanguageModel a(testk::nope, tiny_config("test_nope"));
  const std::string path = tmp_path("cross.ckpt");
  ape::save_checkpoint(path, a, {{"train", {{"seq_len", 8}}}});
  const ape::Checkpoint ckpt = ape::read_checkpoint(path);
  // test_nope_fixed: the same trainable parameters plus a fixed param the checkpoint lacks.
  ape::LanguageModel b(testk::nope_fixed, tiny_config("test_nope_fixed"));
  auto kept = ape::load_state_across(b, ckpt, path, &testk::nope);
  EXPECT_EQ(kept, std::vector<std::string>({"block0.attn.knob", "block1.attn.knob"}));
  EXPECT_EQ(b->blocks[0]->attn->stored_param(0).item<double>(), 3.0);  // the new encoding's init
  at::Tensor w = at::randint(32, {2, 9}, at::kLong);
  {
    at::NoGradGuard ng;
    EXPECT_EQ(a->loss(w).item<double>(), b->loss(w).item<double>());
  }
  // The same encoding after it gained a fixed param: the old checkpoint still loads, the new buffer
  // keeps its initial value.
  static const ape::KernelEntry grown = testk::entry<testk::Kind::Nope>(
      "test_nope", R"({"encoding": "test_nope", "params": [{"name": "knob", "shape": [1],
                      "init": {"kind": "constant", "value": 3.0}}]})");
  ape::LanguageModel g(grown, tiny_config("test_nope"));
  ape::load_state(g, ckpt, path);
  EXPECT_EQ(g->blocks[1]->attn->stored_param(0).item<double>(), 3.0);
  EXPECT_TRUE(g->wte->weight.equal(a->wte->weight));
  // Mismatches name the first parameter at fault, both ways.
  ape::LanguageModel bias(testk::bias_entry, tiny_config("test_bias"));
  EXPECT_ERROR(ape::load_state_across(bias, ckpt, path, &testk::nope),
               "trainable parameter 'block0.attn.w' of 'test_bias' is not in the checkpoint");
  ape::save_checkpoint(path, bias, nlohmann::json::object());
  ape::LanguageModel c(testk::nope, tiny_config("test_nope"));
  EXPECT_ERROR(ape::load_state_across(c, ape::read_checkpoint(path), path, &testk::bias_entry),
               "the checkpoint's trainable parameter 'block0.attn.w' has no place in 'test_nope'");
  ape::LanguageModel learned(testk::learned, tiny_config("test_learned"));
  EXPECT_ERROR(ape::load_state_across(learned, ckpt, path, &testk::nope),
               "trainable parameter 'wpe' of 'test_learned' is not in the checkpoint");
  // Through the registry, an unregistered source encoding is named.
  EXPECT_ERROR(ape::load_state_across(b, ckpt, path), "unknown encoding 'test_nope'");
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

TEST(Eval, SetArgumentsAndRowLabels) {
  EXPECT_EQ(ape::parse_assignment("rope_factor=8"), std::make_pair(std::string("rope_factor"), 8.0));
  EXPECT_EQ(ape::parse_assignment("position_scale=0.5"), std::make_pair(std::string("position_scale"), 0.5));
  EXPECT_ERROR(ape::parse_assignment("rope_factor"), "no '='");
  EXPECT_ERROR(ape::parse_assignment("=3"), "empty name");
  EXPECT_ERROR(ape::parse_assignment("x=eight"), "'eight' is not a finite number");
  EXPECT_ERROR(ape::parse_assignment("x=8x"), "not a finite number");
  EXPECT_ERROR(ape::parse_assignment("x=inf"), "not a finite number");
  EXPECT_EQ(ape::eval_label("rope", "rope", {}), "rope");
  EXPECT_EQ(ape::eval_label("rope", "", {}), "rope");
  EXPECT_EQ(ape::eval_label("rope", "rope_yarn", {{"rope_factor", 8}}), "rope->rope_yarn[rope_factor=8]");
  EXPECT_EQ(ape::eval_label("exqpe", "exqpe", {{"position_scale", 0.5}, {"x", 1e-3}}),
            "exqpe[position_scale=0.5;x=0.001]");
}

TEST(Eval, MultiplesTableAndCsv) {
  EXPECT_EQ(ape::parse_multiples("8, 1,2,4,2"), std::vector<int64_t>({1, 2, 4, 8}));
  EXPECT_ERROR(ape::parse_multiples("1,x"), "--eval-multiples: expected whole numbers in [1, 1024]");
  EXPECT_ERROR(ape::parse_multiples("0"), "--eval-multiples: expected whole numbers in [1, 1024]");
  EXPECT_ERROR(ape::parse_multiples("2048"), "--eval-multiples: expected whole numbers in [1, 1024]");
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
  EXPECT_EQ(header, "encoding,train_len,eval_len,multiple,loss,ppl,tokens,note");
  EXPECT_EQ(first, "rope,128,128,1,5.000000,148.413159,1000,") << first;
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
    if (ape::manifest_of(ape::find_kernel(name)).inference_only) {  // a transition: no backward
      EXPECT_ERROR(model->loss(w), "is inference-only (an ape.attention_transition");
      continue;
    }
    at::Tensor loss = model->loss(w);
    ASSERT_TRUE(std::isfinite(loss.item<double>()));
    loss.backward();
    for (const auto &kv : model->named_parameters()) {
      ASSERT_TRUE(kv.value().grad().defined()) << kv.key();
      EXPECT_TRUE(kv.value().grad().isfinite().all().item<bool>()) << kv.key();
    }
  }
}

// Training smoke test of every registered encoding: the same phrase-repeating books as
// Train.LossFallsOnATinyModel, 12 steps of the real training loop; the loss must fall well below
// its start (a kernel whose gradients were wrong or zero for the model would not learn).
TEST(RegisteredKernels, EveryEncodingTrainsAndItsLossFalls) {
  const auto names = ape::kernel_names();
  ASSERT_FALSE(names.empty()) << "the kernel registry is empty";
  ape::TokenSplit s;
  std::vector<int32_t> phrase{3, 1, 4, 15, 9, 2, 6, 5}, ids;
  for (int r = 0; r < 200; ++r) ids.insert(ids.end(), phrase.begin(), phrase.end());
  s.add_doc("a", ids);
  for (const auto &name : names) {
    SCOPED_TRACE(name);
    if (ape::manifest_of(ape::find_kernel(name)).inference_only) continue;  // refused (above)
    at::manual_seed(21);
    ape::ModelConfig mc = tiny_config(name, 16);
    mc.d_model = 64;  // head_dim 32: room for overrides of l = d/8
    ape::LanguageModel model(mc);
    ape::TrainConfig tc;
    tc.steps = 12;
    tc.batch = 4;
    tc.seq_len = 16;
    tc.lr = 1e-2;
    tc.warmup_steps = 2;
    tc.progress_in_place = false;
    std::ostringstream out;
    ape::TrainSampler sampler(s, 1);
    ape::TrainResult r = ape::train(model, sampler, tc, out, name);
    ASSERT_EQ(r.steps, 12);
    EXPECT_LT(r.final_loss, r.first_loss - 0.5) << out.str();
  }
}

// The runtime glue with real generated kernels, when those encodings are registered: the feature
// tensors reach the kernel as (B, H, T) (Cable) and the override + projection terms reproduce
// ExPE's explicit φ(x, t): the first l inputs overwritten by p_{t,i} = S + θ(t + i).
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
  const auto &ov = *m.override_;
  check_explicit_override(*expe, cfg, expe_positions(9, ov.l, ov.start, ov.theta), ov.v, 1.0, 2e-5);
}

// ---- the encodings of the ExPE paper and the absolute / scaled-RoPE families (examples/encodings) ----
// Each runs once its spec is in examples/encodings (then the build registers it; a spec that is
// there but not registered is a stale build and fails).
bool spec_present(const std::string &name) {
  return fs::exists(fs::path(APE_TEST_DATA_DIR) / ".." / ".." / "examples" / "encodings" / (name + ".mlir"));
}
#define REQUIRE_SPEC(var, name)                                                                  \
  if (!spec_present(name)) GTEST_SKIP() << "examples/encodings/" name ".mlir is not there yet"; \
  const ape::KernelEntry *var = registered(name);                                              \
  ASSERT_NE(var, nullptr) << name " has a spec but is not registered (re-run cmake)"

TEST(RegisteredKernels, SinusoidalTableThroughTheModel) {
  REQUIRE_SPEC(e, "sinusoidal");
  ASSERT_NE(e->embed_table, nullptr);
  ape::ModelConfig cfg = tiny_config("sinusoidal");
  cfg.d_model = 4;
  cfg.heads = 1;
  ape::LanguageModel m(cfg);
  at::Tensor tokens = at::tensor({3, 1, 4}, at::kLong).view({1, 3});
  at::Tensor pe = (m->embed(tokens) - m->wte(tokens))[0];
  expect_close(pe[1], at::tensor({0.841471, 0.540302, 0.010000, 0.999950}).to(at::kFloat), 1e-6, "PE[1]");
  expect_close(pe[2], at::tensor({0.909297, -0.416147, 0.019999, 0.999800}).to(at::kFloat), 1e-6, "PE[2]");
}

TEST(RegisteredKernels, LearnedAbsoluteRefusesSequencesPastItsTable) {
  REQUIRE_SPEC(e, "learned_absolute");
  const ape::Manifest &man = ape::manifest_of(*e);
  ASSERT_TRUE(man.embedding && man.embedding->kind == ape::EmbeddingSpec::Kind::Learned);
  const int64_t L = man.embedding->max_length;
  ape::LanguageModel m(tiny_config("learned_absolute"));
  EXPECT_EQ(m->wpe.size(0), L);
  EXPECT_ERROR(m->forward(at::zeros({1, L + 1}, at::kLong)),
               "sequence length " + std::to_string(L + 1) + " exceeds the table's max_length " + std::to_string(L));
}

TEST(RegisteredKernels, ExpeFamilyMatchesTheLiteralOverrideWithPositionScale) {
  for (const char *name : {"exqpe", "expe_qkv", "expe"}) {
    SCOPED_TRACE(name);
    if (!spec_present(name)) continue;
    const ape::KernelEntry *e = registered(name);
    ASSERT_NE(e, nullptr) << name << " has a spec but is not registered";
    const auto &ov = *ape::manifest_of(*e).override_;
    ape::ModelConfig cfg = tiny_config(name);
    cfg.d_model = 64;
    const int64_t T = 2 * ov.l + 3;
    at::Tensor pos = ov.kind == ape::OverrideSpec::Kind::Exqpe
                         ? exqpe_positions(T, ov.l, ov.start, ov.theta1, ov.theta2)
                         : expe_positions(T, ov.l, ov.start, ov.theta);
    for (double sigma : {1.0, 0.5}) {
      at::manual_seed(41);
      check_explicit_override(*e, cfg, pos, ov.v, sigma, 2e-5);
    }
  }
  if (!spec_present("exqpe") && !spec_present("expe_qkv")) GTEST_SKIP() << "neither spec is there yet";
}

TEST(RegisteredKernels, RopeCheckpointEvaluatesUnderScaledRope) {
  REQUIRE_SPEC(pi, "rope_pi");
  (void)pi;
  at::manual_seed(42);
  ape::ModelConfig cfg = tiny_config("rope");
  cfg.d_model = 32;
  ape::LanguageModel rope(cfg);
  const std::string path = tmp_path("rope.ckpt");
  ape::save_checkpoint(path, rope, {{"train", {{"seq_len", 8}}}});
  std::vector<std::string> kept;
  nlohmann::json config;
  ape::LanguageModel m = ape::load_model_as(path, "rope_pi", &config, &kept);
  EXPECT_EQ(m->config().encoding, "rope_pi");
  EXPECT_FALSE(kept.empty());  // rope_factor: rope_pi's own value
  at::Tensor w = at::randint(32, {2, 33}, at::kLong);
  at::NoGradGuard ng;
  const double want = rope->loss(w).item<double>();
  EXPECT_GT(std::abs(m->loss(w).item<double>() - want), 1e-6);  // factor 4: not RoPE
  m->set_fixed_param("rope_factor", 1.0);
  EXPECT_NEAR(m->loss(w).item<double>(), want, 1e-6);
  EXPECT_ERROR(m->set_fixed_param("rope_factr", 1.0), "its settable (fixed) params: ");
}

// Cached decoding through the model (runtime/Decode.h, docs/decoding.md), every registered
// encoding: a prompt of 5 tokens, 8 steps of one token, 6 of three, one of 40 (across the 64-key
// tile), in fp64; each step's logits against the full forward over the tokens so far (its last
// rows). Two layers, so the second layer's cache is fed by decoded outputs; one layer for dynamic
// NTK: past its original length the full forward over L tokens changes every layer's outputs at
// earlier positions (the base depends on L), so a deeper layer's cached k, v (computed from
// those outputs when they were decoded) cannot match it, as in any KV cache (docs/decoding.md).
TEST(RegisteredKernels, CachedDecodingMatchesTheFullForward) {
  const auto names = ape::kernel_names();
  ASSERT_FALSE(names.empty()) << "the kernel registry is empty";
  std::vector<int64_t> sizes = {5};
  sizes.insert(sizes.end(), 8, 1);
  sizes.insert(sizes.end(), 6, 3);
  sizes.push_back(40);
  int64_t N = 0;
  for (int64_t n : sizes) N += n;
  for (const auto &name : names) {
    SCOPED_TRACE(name);
    at::manual_seed(21);
    ape::ModelConfig mc = tiny_config(name);
    mc.d_model = 64;  // head_dim 32: room for overrides of l = d/8
    if (name == "rope_dynamic_ntk") mc.layers = 1;
    ape::LanguageModel model(mc);
    model->to(at::kDouble);
    if (name == "rope_dynamic_ntk") model->set_fixed_param("rope_original_length", 16);
    at::Tensor tokens = at::randint(32, {2, N}, at::kLong);
    ape::KvCache cache(N);
    int64_t L0 = 0;
    for (int64_t n : sizes) {
      at::Tensor got = model->forward_cached(tokens.narrow(1, L0, n), cache);
      const int64_t L = L0 + n;
      ASSERT_EQ(cache.len, L);
      at::Tensor ref;
      {
        at::NoGradGuard g;
        ref = model->forward(tokens.narrow(1, 0, L)).narrow(1, L0, n);
      }
      const double err = (got - ref).abs().max().item<double>() / std::max(1.0, ref.abs().max().item<double>());
      ASSERT_LT(err, 1e-10) << "step to length " << L;
      L0 = L;
    }
    EXPECT_THROW(model->forward_cached(tokens.narrow(1, 0, 1), cache), std::length_error);
  }
}

// The attention transition through the model (docs/decoding.md): a 6-layer fp64 model with
// rope_transition and the same weights as one with rope. At T = 70 (I = 10) layers 1..3 transform
// rows, so the logits differ from rope's; a prefill of the whole prompt equals the full forward
// (each layer gets its index and the depth); later steps attend as rope does; a forward that
// records gradients is refused.
TEST(RegisteredKernels, AttentionTransitionThroughTheModel) {
  ape::ModelConfig mc = tiny_config("rope_transition");
  mc.layers = 6;
  at::manual_seed(23);
  ape::LanguageModel model(mc);
  mc.encoding = "rope";
  at::manual_seed(23);
  ape::LanguageModel rope(mc);
  model->to(at::kDouble);
  rope->to(at::kDouble);
  at::Tensor tokens = at::randint(32, {2, 75}, at::kLong);
  at::Tensor prompt = tokens.narrow(1, 0, 70);
  at::Tensor full, plain;
  {
    at::NoGradGuard g;
    full = model->forward(prompt);
    plain = rope->forward(prompt);
    // Too short for an interval of 5 (I = floor(34 / 7) = 4): a no-op.
    EXPECT_TRUE(torch::equal(model->forward(tokens.narrow(1, 0, 34)), rope->forward(tokens.narrow(1, 0, 34))));
  }
  // Rows before the first transformed interval of layer 1 ([20, 30)) are rope's.
  EXPECT_TRUE(torch::equal(full.narrow(1, 0, 20), plain.narrow(1, 0, 20)));
  EXPECT_GT((full - plain).abs().max().item<double>(), 1e-6);  // fp64: rounding is ~1e-14
  ape::KvCache cache(75);
  at::Tensor pre = model->forward_cached(prompt, cache);
  EXPECT_LT((pre - full).abs().max().item<double>(), 1e-10);
  at::Tensor step = model->forward_cached(tokens.narrow(1, 70, 5), cache);
  // Later steps attend without the transition (checked at the kernel level:
  // TransitionDecode.PrefillIsThePromptLaterStepsAreUnchanged); here that they run.
  EXPECT_TRUE(step.isfinite().all().item<bool>());
  EXPECT_ERROR(model->forward(prompt), "is inference-only");
}

// fp32 decoding against the fp32 forward (loose), and the errors of a misused cache.
TEST(RegisteredKernels, CachedDecodingFloat32AndErrors) {
  at::manual_seed(22);
  ape::ModelConfig mc = tiny_config("cable");
  mc.d_model = 64;
  ape::LanguageModel model(mc);
  at::Tensor tokens = at::randint(32, {1, 100}, at::kLong);
  ape::KvCache cache(100);
  at::Tensor a = model->forward_cached(tokens.narrow(1, 0, 30), cache);
  at::Tensor b = model->forward_cached(tokens.narrow(1, 30, 70), cache);
  at::Tensor ref;
  {
    at::NoGradGuard g;
    ref = model->forward(tokens);
  }
  EXPECT_LT((at::cat({a, b}, 1) - ref).abs().max().item<double>(), 1e-4);
  ape::KvCache none;
  EXPECT_THROW(model->forward_cached(tokens, none), std::invalid_argument);
  // A learned absolute table refuses positions past its rows, before touching the cache.
  ape::ModelConfig lc = tiny_config("learned_absolute");
  lc.d_model = 64;
  ape::LanguageModel learned(lc);
  const int64_t max_len = *learned->max_length();
  ape::KvCache big(max_len + 8);
  learned->forward_cached(at::zeros({1, max_len}, at::kLong), big);
  EXPECT_THROW(learned->forward_cached(at::zeros({1, 1}, at::kLong), big), std::invalid_argument);
  EXPECT_EQ(big.len, max_len);
}

// ape-generate's scoring (runtime/Generate.h): the cached per-token losses, token by token and 16
// at a time, average to the full forward's loss (LanguageModel::loss, what ape-eval computes) over
// the same window, for encodings of each kind (rotary, bias, token program, relative rows); the
// buckets' cumulative losses are the losses of the windows 1..to.
TEST(Generate, CachedScoreEqualsTheFullForwardLoss) {
  for (const std::string name : {"rope", "alibi", "cable", "shaw", "expe_qkv"}) {
    SCOPED_TRACE(name);
    at::manual_seed(31);
    ape::ModelConfig mc = tiny_config(name);
    mc.d_model = 64;
    ape::LanguageModel model(mc);
    std::vector<int64_t> ids(201);
    for (auto &t : ids) t = at::randint(32, {1}, at::kLong).item<int64_t>();
    at::Tensor window = at::tensor(ids, at::kLong).view({1, -1});
    double full = 0, full50 = 0;
    {
      at::NoGradGuard g;
      full = model->loss(window).item<double>();
      full50 = model->loss(window.narrow(1, 0, 51)).item<double>();
    }
    for (int64_t chunk : {int64_t(1), int64_t(16)}) {
      ape::ScoreResult r = ape::score_cached(model, ids, chunk);
      ASSERT_EQ(r.loss.size(), 200u);
      double mean = 0;
      for (double l : r.loss) mean += l / 200.0;
      EXPECT_NEAR(mean, full, 2e-5) << "chunk " << chunk;
      auto buckets = ape::bucket_losses(r.loss, 50);
      ASSERT_EQ(buckets.size(), 3u);  // 1..50, 51..100, 101..200
      EXPECT_EQ(buckets[0].count + buckets[1].count + buckets[2].count, 200);
      EXPECT_NEAR(buckets[0].cumulative_loss, full50, 2e-5);
      EXPECT_NEAR(buckets[2].cumulative_loss, full, 2e-5);
    }
  }
}

TEST(Generate, SamplingIsSeededAndChecksItsInputs) {
  at::manual_seed(32);
  ape::ModelConfig mc = tiny_config("rope");
  mc.d_model = 64;
  ape::LanguageModel model(mc);
  ape::SampleOptions o;
  o.max_tokens = 20, o.temperature = 0.9, o.top_k = 8, o.seed = 5;
  auto a = ape::sample(model, {1, 2, 3}, o), b = ape::sample(model, {1, 2, 3}, o);
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.tokens.size(), 20u);
  o.seed = 6;
  EXPECT_NE(ape::sample(model, {1, 2, 3}, o).tokens, a.tokens);
  // Greedy sampling is the argmax of the full forward at every step.
  o.temperature = 0;
  auto g = ape::sample(model, {1, 2, 3}, o);
  std::vector<int64_t> seq = {1, 2, 3};
  for (int64_t t : g.tokens) {
    at::NoGradGuard ng;
    at::Tensor logits = model->forward(at::tensor(seq, at::kLong).view({1, -1}));
    EXPECT_EQ(logits[0][-1].argmax().item<int64_t>(), t);
    seq.push_back(t);
  }
  // top_k = 1 is greedy at any temperature.
  o.temperature = 2.0, o.top_k = 1;
  EXPECT_EQ(ape::sample(model, {1, 2, 3}, o).tokens, g.tokens);
  EXPECT_THROW(ape::sample(model, {}, o), std::invalid_argument);
  EXPECT_THROW(ape::sample(model, {1, 99}, o), std::invalid_argument);
  o.top_k = 33;
  EXPECT_THROW(ape::sample(model, {1}, o), std::invalid_argument);
  EXPECT_THROW(ape::score_cached(model, {1}, 1), std::invalid_argument);
}
