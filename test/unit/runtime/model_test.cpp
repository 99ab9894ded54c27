// The language model (runtime/Model.h): overrides and their derived params (ExPE, ExQPE) against
// explicitly overridden inputs, absolute tables at the embedding, fixed params, per-layer and
// shared params, feature init, clear errors.
#include "runtime_fixtures.h"
#include "override_check.h"

#include "runtime/LmLoss.h"

#include <array>
#include <map>

namespace {

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
  // a + floor(n/l)·b + P[n mod l] must be docs/encodings-math.md's p_n.
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
  // The segments are sized by the longest length asked, skipped or not (16 here): every model
  // evaluated with these settings scores the same tokens (64 at each length).
  EXPECT_EQ(rows[0].tokens, 64);
  EXPECT_EQ(rows[1].tokens, 64);
  EXPECT_EQ(rows[0].segment_losses.size(), 4u);
  EXPECT_EQ(rows[1].segment_losses.size(), 4u);
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
                  "max_length 8,");
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
  bad = tiny_config("test_nope");
  bad.heads = 4, bad.kv_heads = 3;
  EXPECT_ERROR(ape::LanguageModel(testk::nope, bad), "--heads (4) must be a multiple of --kv-heads (3)");
  bad.kv_heads = 8;
  EXPECT_ERROR(ape::LanguageModel(testk::nope, bad), "--kv-heads must be a whole number in [0, 4]; got 8");
  EXPECT_ERROR(ape::LanguageModel(testk::nope, tiny_config("test_bias")), "names encoding 'test_bias' but the kernel is");
  ape::LanguageModel m(testk::nope, tiny_config("test_nope"));
  EXPECT_ERROR(m->forward(at::zeros({2, 3}, at::kInt)), "tokens must be (B, T) int64");
  static const ape::KernelEntry hinted = testk::entry<testk::Kind::Nope>(
      "test_nope", R"({"encoding": "test_nope", "head_dim": 64, "model_dim": 16})");
  EXPECT_ERROR(ape::LanguageModel(hinted, tiny_config("test_nope")),
               "'test_nope' was compiled for head_dim 64 (a shape hint of its spec); the model has 8");
}

// =====================================================================================================
// The chunked LM loss (runtime/LmLoss.h) against LibTorch's cross-entropy of the materialised
// logits in float64, forward and backward, at odd sizes and chunks of 1 row to more than N
// =====================================================================================================

// MKL's strict reproducibility, as the tools set it (runtime/Threads.h), before main and so ahead of
// MKL's first call; a value the environment gives is kept.
[[maybe_unused]] const bool kStrictMkl = [] { return ::setenv("MKL_CBWR", "AUTO,STRICT", 0) == 0; }();

struct LossCase {
  at::Tensor x, w, t;
};

LossCase loss_case(int64_t N, int64_t d, int64_t V, uint64_t seed) {
  at::manual_seed(seed);
  LossCase c;
  c.x = (at::randn({N, d}) * 2).requires_grad_();
  c.w = (at::randn({V, d}) * 0.7).requires_grad_();
  c.t = at::randint(V, {N}, at::kLong);
  return c;
}

TEST(LmLoss, MatchesTheCrossEntropyOfTheLogitsAndItsGradients) {
  for (auto [N, d, V] : {std::array<int64_t, 3>{37, 5, 11}, {130, 16, 300}, {1, 3, 2}}) {
    const LossCase c = loss_case(N, d, V, 7 + N);
    const at::Tensor xr = c.x.detach().to(at::kDouble).requires_grad_(), wr = c.w.detach().to(at::kDouble).requires_grad_();
    const at::Tensor ref = at::cross_entropy_loss(at::linear(xr, wr), c.t);
    ref.backward();
    const at::Tensor ref_rows = at::cross_entropy_loss(at::linear(xr, wr), c.t, {}, at::Reduction::None).detach();
    for (int64_t chunk : {int64_t(0), int64_t(1), int64_t(7), int64_t(16), N, N + 5}) {
      SCOPED_TRACE("N " + std::to_string(N) + " d " + std::to_string(d) + " V " + std::to_string(V) + " chunk " +
                   std::to_string(chunk));
      c.x.mutable_grad() = at::Tensor();
      c.w.mutable_grad() = at::Tensor();
      const at::Tensor loss = ape::lm_loss(c.x, c.w, c.t, chunk);
      EXPECT_EQ(loss.dim(), 0);
      EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 2e-6 * std::max(1.0, ref.item<double>()));
      (loss * 3).backward();  // the backward scales the forward's gradients by the loss's
      expect_close(c.x.grad().to(at::kDouble), xr.grad() * 3, 2e-6, "dx");
      expect_close(c.w.grad().to(at::kDouble), wr.grad() * 3, 2e-6, "dW");
      expect_close(ape::lm_token_losses(c.x, c.w, c.t, chunk).to(at::kDouble), ref_rows, 1e-5, "token losses");
    }
  }
}

TEST(LmLoss, GradientOnlyWhereAsked) {
  LossCase c = loss_case(20, 4, 9, 3);
  const at::Tensor x = c.x.detach();  // no gradient wanted for x
  ape::lm_loss(x, c.w, c.t, 8).backward();
  EXPECT_FALSE(x.grad().defined());
  ASSERT_TRUE(c.w.grad().defined());
  {
    at::NoGradGuard no_grad;
    EXPECT_FALSE(ape::lm_loss(c.x, c.w, c.t).requires_grad());
  }
}

// Rows go to threads whole, the loss sums in row order and MKL's products are strict (this test
// process starts as the tools do, with MKL_CBWR=AUTO,STRICT): the same bits on 1, 2 and 3 threads.
// Without the strict mode dW differed at this shape (V 300, d 32, chunks of 64 rows).
TEST(LmLoss, SameBitsOnAnyThreadCount) {
  const int before = at::get_num_threads();
  std::vector<std::array<at::Tensor, 3>> runs;
  for (int threads : {1, 2, 3}) {
    at::set_num_threads(threads);
    LossCase c = loss_case(700, 32, 300, 11);
    at::Tensor loss = ape::lm_loss(c.x, c.w, c.t, 64);
    loss.backward();
    runs.push_back({loss.detach(), c.x.grad(), c.w.grad()});
  }
  at::set_num_threads(before);
  for (size_t r = 1; r < runs.size(); ++r)
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(runs[r][i], runs[0][i])) << "tensor " << i << ", run " << r;
}

TEST(LmLoss, RefusesTargetsOutsideTheVocabularyAndBadShapes) {
  LossCase c = loss_case(6, 4, 5, 1);
  c.t[3] = 5;
  EXPECT_ERROR(ape::lm_loss(c.x, c.w, c.t), "target token 5 is outside the vocabulary [0, 5)");
  c.t[3] = -1;
  EXPECT_ERROR(ape::lm_token_losses(c.x, c.w, c.t), "target token -1 is outside the vocabulary [0, 5)");
  EXPECT_ERROR(ape::lm_loss(c.x, c.w.narrow(1, 0, 3), c.t), "x must be (N, d) and weight (V, d)");
  EXPECT_ERROR(ape::lm_loss(c.x, c.w, c.t.narrow(0, 0, 5)), "targets must be int64 (N) with x's N rows");
}

// The model's loss and token losses take the chunked path on the CPU: the same values and
// parameter gradients as LibTorch's cross-entropy of forward()'s logits.
TEST(LmLoss, ModelLossIsTheCrossEntropyOfItsLogits) {
  at::manual_seed(5);
  ape::LanguageModel m(testk::nope, tiny_config("test_nope"));
  const at::Tensor windows = at::randint(32, {3, 10}, at::kLong);
  const at::Tensor in = windows.narrow(1, 0, 9), tg = windows.narrow(1, 1, 9);
  const at::Tensor ref = at::cross_entropy_loss(m->forward(in).reshape({-1, 32}), tg.reshape({-1}));
  ref.backward();
  std::map<std::string, at::Tensor> want;
  for (const auto &kv : m->named_parameters()) want[kv.key()] = kv.value().grad().clone();
  m->zero_grad();
  const at::Tensor loss = m->loss(windows);
  EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-6);
  loss.backward();
  for (const auto &kv : m->named_parameters()) expect_close(kv.value().grad(), want[kv.key()], 1e-6, kv.key());
  const at::Tensor rows = m->token_losses(in, tg);
  EXPECT_EQ(rows.sizes(), tg.sizes());
  at::NoGradGuard no_grad;
  expect_close(rows, at::cross_entropy_loss(m->forward(in).reshape({-1, 32}), tg.reshape({-1}), {}, at::Reduction::None)
                         .view({3, 9}),
               1e-5, "token_losses");
}

}  // namespace
