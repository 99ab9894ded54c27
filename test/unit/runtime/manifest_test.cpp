// The manifest (runtime/Manifest.h): the documented example, the embedding, override and init
// kinds, defaults, clear errors for malformed manifests; ALiBi's slopes and the param init kinds.
#include "runtime_fixtures.h"

namespace {

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
      // The verifier's limits (kernels/include/ape/contract/value_rules.h), the same in a manifest.
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

TEST(Manifest, TransitionAttributesAndTheNoteOfAModelTooShallow) {
  // The example's attributes reach the runtime; a model of fewer than first_layer + 1 + skip_last
  // layers has no transformed layer, and ape-eval / ape-generate say so (its numbers had equalled
  // plain RoPE's without a word).
  const ape::Manifest &m = ape::manifest_of(ape::find_kernel("rope_transition"));
  ASSERT_TRUE(m.transition.has_value());
  EXPECT_EQ(m.transition->first_layer, 1);
  EXPECT_EQ(m.transition->skip_last, 2);
  EXPECT_EQ(m.transition->intervals, 2);
  EXPECT_DOUBLE_EQ(m.transition->beta, 0.1);
  for (int64_t layers : {1, 2, 3})
    EXPECT_NE(ape::transition_noop_note(m, layers).find("so none"), std::string::npos) << layers;
  EXPECT_NE(ape::transition_noop_note(m, 2).find("at least 4 layers"), std::string::npos);
  EXPECT_EQ(ape::transition_noop_note(m, 4), "");
  EXPECT_EQ(ape::transition_noop_note(ape::manifest_of(ape::find_kernel("rope")), 2), "");
  EXPECT_FALSE(ape::manifest_of(ape::find_kernel("rope")).transition.has_value());
}

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

}  // namespace
