// Training (runtime/Train.h): the learning-rate schedule, the loss falls on a tiny model,
// divergence stops with a clear error.
#include "runtime_fixtures.h"

namespace {

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

// A saved training config (a checkpoint's "train") round-trips, and a forged field is refused by
// name: a seed --seed would refuse, a float where an integer belongs (1e308 converted to int64 is
// undefined behaviour), a string for a number.
TEST(Train, ASavedConfigIsReadBackFieldByField) {
  ape::TrainConfig c;
  c.steps = 100, c.seed = 7, c.batch = 4, c.seq_len = 64;
  const nlohmann::json j = c.to_json();
  const ape::TrainConfig back = ape::TrainConfig::from_json(j);
  EXPECT_EQ(back.to_json(), j);
  auto with = [&](const char *name, nlohmann::json value) {
    nlohmann::json k = j;
    k[name] = std::move(value);
    return k;
  };
  EXPECT_ERROR(ape::TrainConfig::from_json(with("seed", -1)), "seed must be a non-negative integer");
  EXPECT_ERROR(ape::TrainConfig::from_json(with("seed", 1e308)), "seed must be a non-negative integer");
  EXPECT_EQ(ape::TrainConfig::from_json(with("seed", UINT64_MAX)).seed, UINT64_MAX);  // saved by older runs
  EXPECT_ERROR(ape::TrainConfig::from_json(with("steps", 1e308)), "steps must be an integer");
  EXPECT_ERROR(ape::TrainConfig::from_json(with("lr", "fast")), "lr must be a number");
  EXPECT_ERROR(ape::TrainConfig::from_json(with("threads", 2.5)), "threads must be an integer");
}

TEST(Train, LossFallsOnATinyModel) {
  at::manual_seed(12);
  const ape::TokenSplit s = phrase_book();
  ape::ModelConfig mc = tiny_config("test_nope", 16);
  ape::LanguageModel model(testk::nope, mc);
  std::ostringstream out;
  ape::TrainResult r = train_briefly(model, s, 30, 8, 16, 3, out, "tiny");
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
    // One mean loss per segment of 64 targets, averaging to the cell's loss.
    ASSERT_EQ(row.segment_losses.size(), 3u);
    double mean = 0;
    for (double x : row.segment_losses) mean += x / 3;
    EXPECT_NEAR(mean, row.loss, 1e-9);
  }
  // Segment 1 at 2x, recomputed by hand: its two windows of 32 tokens through the model.
  at::NoGradGuard ng;
  model->eval();
  at::Tensor w = ape::eval_windows(s, 32, 64, 3);  // segment-major: rows 2 and 3 are segment 1
  ASSERT_EQ(w.size(0), 6);
  at::Tensor seg1 = w.narrow(0, 2, 2);
  at::Tensor logits = model->forward(seg1.narrow(1, 0, 32)).to(at::kFloat);
  const double by_hand = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}),
                                                seg1.narrow(1, 1, 32).reshape({-1}))
                             .item<double>();
  EXPECT_NEAR(rows[1].segment_losses[1], by_hand, 1e-5);
  EXPECT_NE(rows[1].segment_losses[0], rows[1].segment_losses[1]);
}

TEST(Train, DivergenceStopsWithAClearError) {
  ape::TokenSplit s = synthetic_split(1, 500, 16, 13);
  ape::LanguageModel model = nan_model();
  std::ostringstream out;
  ape::TrainSampler sampler(s, 1);
  try {
    ape::train(model, sampler, quiet_train_config(5, 2, 8), out, "nan");
    ADD_FAILURE() << "no error";
  } catch (const ape::TrainingDiverged &e) {
    EXPECT_NE(std::string(e.what()).find("loss became NaN at step 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nothing was saved"), std::string::npos) << e.what();
    // At the first step no update was applied: not the learning rate's doing.
    EXPECT_NE(std::string(e.what()).find("the learning rate is not the cause"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("Try a lower --lr"), std::string::npos) << e.what();
  }
}

}  // namespace
