// Every encoding in the generated registry through the runtime: a tiny model of each builds, takes
// a step and trains; Cable and the ExPE family against the spec; absolute tables, scaled RoPE on a
// RoPE checkpoint, cached decoding, the attention transition. (The per-encoding numerics are
// ape_kernels_test's.)
#include "runtime_fixtures.h"
#include "override_check.h"

namespace {

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
  const ape::TokenSplit s = phrase_book();
  for (const auto &name : names) {
    SCOPED_TRACE(name);
    if (ape::manifest_of(ape::find_kernel(name)).inference_only) continue;  // refused (above)
    at::manual_seed(21);
    ape::ModelConfig mc = tiny_config(name, 16);
    mc.d_model = 64;  // head_dim 32: room for overrides of l = d/8
    ape::LanguageModel model(mc);
    std::ostringstream out;
    ape::TrainResult r = train_briefly(model, s, 12, 4, 16, 2, out, name);
    ASSERT_EQ(r.steps, 12);
    EXPECT_LT(r.final_loss, r.first_loss - 0.5) << out.str();
  }
}

// The runtime glue with real generated kernels, when those encodings are registered: the feature
// tensors reach the kernel as (B, H, T) (Cable) and the override + projection terms reproduce
// ExPE's explicit φ(x, t): the first l inputs overwritten by p_{t,i} = S + θ(t + i).
TEST(RegisteredKernels, CableThroughFusedAttentionMatchesTheSpec) {
  const ape::KernelEntry *cable = registered("cable");
  ASSERT_NE(cable, nullptr) << "no 'cable' encoding registered (examples/encodings/cable.mlir)";
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
  ASSERT_NE(expe, nullptr) << "no 'expe' encoding registered (examples/encodings/expe.mlir)";
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
  ASSERT_TRUE(spec_present(name)) << "examples/encodings/" name ".mlir is missing (renamed?)"; \
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
  // Deliberately a subset of the override encodings: check_explicit_override's reference is plain
  // attention on the overridden inputs, so the compositions with Cable or RoPE are not in it.
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

}  // namespace
