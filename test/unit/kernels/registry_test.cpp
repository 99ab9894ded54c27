// The registry and the manifests: the registry holds exactly the specs of examples/encodings/,
// every manifest parses and names its encoding, declares the inputs of its spec, and the
// absolute encodings declare their embedding.
#include "harness.h"

#include <filesystem>

namespace {

using namespace ape_test;

// ---- the registry and the manifests -------------------------------------------------------------

// The registry holds one entry per spec of examples/encodings/ (a spec file's stem is its
// encoding's name), each with all four kernels and the decode steps; the encoding lists of this
// suite (harness.h) are the registry's, split by the manifests' "inference_only".
TEST(Registry, ContainsExactlyTheExampleSpecs) {
  std::multiset<std::string> names;
  for (const ape::KernelEntry *e : registry()) {
    ASSERT_NE(e, nullptr);
    ASSERT_NE(e->name, nullptr);
    names.insert(e->name);
    EXPECT_TRUE(e->forward_f32 && e->backward_f32 && e->forward_f64 && e->backward_f64) << e->name;
    EXPECT_TRUE(e->decode && e->decode->step_f32 && e->decode->step_f64) << e->name;
  }
  std::multiset<std::string> specs;
  for (const auto &f : std::filesystem::directory_iterator(APE_EXAMPLE_SPECS_DIR))
    if (f.path().extension() == ".mlir") specs.insert(f.path().stem().string());
  EXPECT_FALSE(specs.empty()) << "no specs in " << APE_EXAMPLE_SPECS_DIR;
  EXPECT_EQ(names, specs);
  for (const auto &enc : specs) EXPECT_EQ(names.count(enc), 1u) << "kernel " << enc;
  std::multiset<std::string> split(trainable_encodings().begin(), trainable_encodings().end());
  split.insert(inference_only_encodings().begin(), inference_only_encodings().end());
  EXPECT_EQ(split, names);
  EXPECT_FALSE(trainable_encodings().empty());
}

TEST(Registry, ManifestsParseAndNameTheirEncoding) {
  for (const ape::KernelEntry *e : registry()) {
    SCOPED_TRACE(e->name);
    ASSERT_NE(e->manifest_json, nullptr);
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(e->manifest_json));
    EXPECT_EQ(j.at("encoding").get<std::string>(), e->name);
    EXPECT_EQ(j.at("causal"), true);
    EXPECT_TRUE(j.at("features").is_array());
    EXPECT_TRUE(j.at("params").is_array());
    EXPECT_TRUE(j.at("scale").is_null() || j.at("scale").is_number());
  }
}

struct WantParam {
  std::string name;
  std::vector<std::string> shape;
  bool trainable;
  std::string init;
  std::optional<double> value = std::nullopt;
};

// The manifest of `enc` declares exactly these params (any order) with these properties.
void expect_params(const std::string &enc, const std::vector<WantParam> &want) {
  SCOPED_TRACE(enc);
  const ape::KernelEntry *e = find_entry(enc);
  ASSERT_NE(e, nullptr) << "no kernel named " << enc;
  const auto got = parse_manifest(*e).params;
  std::multiset<std::string> got_names, want_names;
  for (const auto &p : got) got_names.insert(p.name);
  for (const auto &w : want) want_names.insert(w.name);
  EXPECT_EQ(got_names, want_names);
  for (const auto &w : want)
    for (const auto &p : got)
      if (p.name == w.name) {
        EXPECT_EQ(p.shape, w.shape) << w.name;
        EXPECT_EQ(p.trainable, w.trainable) << w.name;
        EXPECT_EQ(p.init, w.init) << w.name;
        if (w.value) {
          EXPECT_TRUE(p.init_value.has_value()) << w.name << ": init without value";
          EXPECT_EQ(p.init_value.value_or(NAN), *w.value) << w.name;
        }
      }
}

// The manifests declare the inputs the reference expects (the grid feeds the kernels by manifest
// order and the reference by name, so a reordering shows there).
TEST(Registry, ManifestInputsMatchTheSpecs) {
  auto features = [](const std::string &enc) {
    const ape::KernelEntry *e = find_entry(enc);
    return e ? parse_manifest(*e).features.size() : size_t(-1);
  };
  for (const auto &enc : trainable_encodings()) {
    ASSERT_NE(find_entry(enc), nullptr) << enc;
    const bool cumulative = enc == "cable" || enc == "forget_gate" || enc == "expe_cable" ||
                            enc == "expe_rope_cable" || enc == "kcable";
    EXPECT_EQ(features(enc), cumulative ? 1u : 0u) << enc;
  }
  const std::vector<std::string> hw = {"heads", "head_dim"};
  const std::vector<WantParam> override_terms = {
      {"override_q_a", hw, true, "projection_term"},
      {"override_q_b", hw, true, "projection_term"},
      {"override_k_a", hw, true, "projection_term"},
      {"override_k_b", hw, true, "projection_term"}};
  for (const char *enc : {"nope", "rope", "cable", "forget_gate"}) expect_params(enc, {});
  expect_params("alibi", {{"alibi_slopes", {"heads"}, false, "alibi_slopes"}});
  const WantParam sigma = {"position_scale", {"1"}, false, "constant", 1.0};
  auto with = [](std::vector<WantParam> a, const std::vector<WantParam> &b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  for (const char *enc : {"expe", "expe_qkv", "expe_cable", "expe_rope_cable"})
    expect_params(enc, with(override_terms, {sigma}));
  const std::vector<std::string> lhw = {"16", "heads", "head_dim"};
  expect_params("exqpe", with(override_terms, {{"override_q_p", lhw, true, "projection_prefix"},
                                               {"override_k_p", lhw, true, "projection_prefix"},
                                               sigma}));
  for (const char *enc : {"rope_interleaved", "rope_partial", "xpos", "sinusoidal",
                          "learned_absolute"})
    expect_params(enc, {});
  auto factor = [](double s) { return WantParam{"rope_factor", {"1"}, false, "constant", s}; };
  const WantParam length = {"rope_original_length", {"1"}, false, "constant", 128.0};
  expect_params("rope_pi", {factor(4.0)});
  expect_params("rope_ntk", {factor(4.0)});
  expect_params("rope_dynamic_ntk", {factor(4.0), length});
  expect_params("rope_yarn", {factor(4.0), length});
  expect_params("rope_llama3", {factor(8.0), length});
  expect_params("rope_alibi", {{"alibi_slopes", {"heads"}, false, "alibi_slopes"}});
  // Overrides: l = 16 everywhere, expe_qkv also overrides the value projection's input.
  for (const char *enc : {"expe", "expe_qkv", "expe_cable", "expe_rope_cable", "exqpe"}) {
    const nlohmann::json ov = parse_manifest(*find_entry(enc)).json.at("override");
    EXPECT_EQ(ov.at("l").get<int64_t>(), 16) << enc;
    EXPECT_EQ(ov.at("targets").get<std::string>(), std::string(enc) == "expe_qkv" ? "qkv" : "qk")
        << enc;
    EXPECT_EQ(ov.at("position_scale"), "position_scale") << enc << ": sigma's param";
  }
  // The bias and relative-position encodings (docs/internals.md, dialect/components/ and the specs).
  const WantParam t5_table = {"t5_table", {"32", "heads"}, true, "normal"};
  expect_params("t5", {t5_table});
  expect_params("rope_t5", {t5_table});
  expect_params("kerple_log", {{"kerple_p", {"heads"}, true, "constant", 1.0},
                               {"kerple_a", {"heads"}, true, "constant", 1.0}});
  expect_params("kerple_power", {{"kerple_p", {"heads"}, true, "constant", 1.0},
                                 {"kerple_a", {"heads"}, true, "constant", 0.5}});
  expect_params("fire", {{"fire_c", {"1"}, true, "constant", 0.1},
                         {"fire_l_mult", {"1"}, true, "constant", 1.0},
                         {"fire_w1", {"32"}, true, "normal"},
                         {"fire_b1", {"32"}, true, "zeros"},
                         {"fire_w2", {"32", "heads"}, true, "normal"},
                         {"fire_b2", {"heads"}, true, "zeros"}});
  expect_params("kcable", {});
  expect_params("alibi_learned", {{"alibi_slopes", {"heads"}, true, "alibi_slopes"}});
  const std::vector<std::string> r33 = {"33", "heads", "head_dim"},
                                 r32 = {"32", "heads", "head_dim"};
  expect_params("shaw", {{"shaw_key", r33, true, "normal"}, {"shaw_value", r33, true, "normal"}});
  expect_params("deberta", {{"deberta_c2p", r32, true, "normal"},
                            {"deberta_p2c", r32, true, "normal"}});
  expect_params("transformer_xl", {{"xl_rel", {"257", "heads", "head_dim"}, true, "sinusoidal"},
                                   {"xl_v", hw, true, "zeros"},
                                   {"xl_u", {"1", "heads", "head_dim"}, true, "zeros"}});
  // T5's table and KERPLE's scalars are one tensor shared by every layer.
  // (The manifest is held: a range over at() of a temporary would outlive it; ASan found that.)
  for (const char *enc : {"t5", "rope_t5", "kerple_log", "kerple_power"}) {
    const auto manifest = parse_manifest(*find_entry(enc));
    for (const auto &p : manifest.json.at("params"))
      EXPECT_EQ(p.value("per_layer", true), false) << enc << ": " << p.at("name");
  }
  // ExPE's terms keep this order (q before k, a before b).
  std::vector<std::string> order;
  for (const auto &p : parse_manifest(*find_entry("expe")).params)
    if (p.name.rfind("override_", 0) == 0) order.push_back(p.name);
  EXPECT_EQ(order, (std::vector<std::string>{"override_q_a", "override_q_b", "override_k_a",
                                             "override_k_b"}));
}

// Absolute encodings: "embedding" in the manifest, and an embed_table exactly for the fixed one.
TEST(Registry, EmbeddingsAndEmbedTables) {
  for (const ape::KernelEntry *e : registry()) {
    SCOPED_TRACE(e->name);
    const std::string name = e->name;
    EXPECT_EQ(e->embed_table != nullptr, name == "sinusoidal");
    const nlohmann::json j = nlohmann::json::parse(e->manifest_json);
    const bool has = j.contains("embedding") && !j.at("embedding").is_null();
    EXPECT_EQ(has, name == "sinusoidal" || name == "learned_absolute");
    if (name == "sinusoidal") {
      EXPECT_EQ(j.at("embedding"), nlohmann::json::parse(
                                       R"({"kind": "table", "scale_embedding": false})"));
    }
    if (name == "learned_absolute") {
      EXPECT_EQ(j.at("embedding"),
                nlohmann::json::parse(R"({"kind": "learned", "max_length": 1024, "std": 0.02,
                                          "scale_embedding": false})"));
    }
  }
}

}  // namespace
