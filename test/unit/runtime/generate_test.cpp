// ape-generate (runtime/Generate.h): cached scoring equals the full forward's loss; sampling is
// seeded and checks its inputs.
#include "runtime_fixtures.h"
#include "runtime/Decode.h"
#include "runtime/Generate.h"
#include "runtime/Registry.h"
#include "runtime/Threads.h"

#include <map>
#include <thread>

namespace {

// ape-generate's scoring (runtime/Generate.h): the cached per-token losses, token by token and 16
// at a time, average to the full forward's loss (LanguageModel::loss, what ape-eval computes) over
// the same window, for encodings of each kind (rotary, bias, token program, relative rows); the
// buckets' cumulative losses are the losses of the windows 1..to. Deliberately one encoding per kind
// (token by token, each is a few seconds): every encoding's cached decoding is
// RegisteredKernels.CachedDecodingMatchesTheFullForward's. Two with grouped keys (4 heads reading
// 2 and 1 key/value heads, --kv-heads; ExPE-qkv's value override through a grouped W_v).
TEST(Generate, CachedScoreEqualsTheFullForwardLoss) {
  for (const auto &[name, kv_heads] : std::vector<std::pair<std::string, int64_t>>{
           {"rope", 0}, {"alibi", 0}, {"cable", 0}, {"shaw", 0}, {"expe_qkv", 0}, {"rope", 2}, {"expe_qkv", 1}}) {
    SCOPED_TRACE(name + " kv_heads " + std::to_string(kv_heads));
    at::manual_seed(31);
    ape::ModelConfig mc = tiny_config(name);
    mc.d_model = 64;
    if (kv_heads > 0) mc.heads = 4, mc.kv_heads = kv_heads;
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

// The CPU's threads for small work (runtime/Threads.h): when set_threads chose them, a small piece of
// work (a cached decoding step of a small model) runs on one thread, a large one keeps them all,
// the count comes back after; a count the user gave is kept. A cached decode under the chosen
// count (each step on one thread here, the prompt on all) still gives the full forward's logits.
TEST(Generate, SmallStepsTakeOneThreadWhenTheCountWasChosen) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one hardware thread: nothing to choose";
  const int before = at::get_num_threads();
  const int64_t all = ape::set_threads(0);
  ASSERT_GE(all, 2);
  {
    ape::SmallWorkThreads small(1e6);
    EXPECT_EQ(at::get_num_threads(), 1);
  }
  EXPECT_EQ(at::get_num_threads(), all);
  {
    ape::SmallWorkThreads large(1e12);
    EXPECT_EQ(at::get_num_threads(), all);
  }
  {
    ape::SmallWorkThreads two(1.5 * ape::SmallWorkThreads::kMacsPerThread);
    EXPECT_EQ(at::get_num_threads(), std::min<int64_t>(all, 2));
  }
  at::manual_seed(33);
  ape::ModelConfig mc = tiny_config("rope");
  mc.d_model = 64;
  ape::LanguageModel model(mc);
  at::Tensor tokens = at::randint(32, {1, 40}, at::kLong);
  at::NoGradGuard ng;
  const at::Tensor full = model->forward(tokens);
  ape::KvCache cache(40);
  std::vector<at::Tensor> steps = {model->forward_cached(tokens.narrow(1, 0, 30), cache)};
  EXPECT_EQ(at::get_num_threads(), all);
  for (int64_t t = 30; t < 40; ++t) {
    steps.push_back(model->forward_cached(tokens.narrow(1, t, 1), cache));
    EXPECT_EQ(ape::SmallWorkThreads::last(), 1) << "the step at " << t << " ran on more threads";
  }
  EXPECT_EQ(at::get_num_threads(), all);
  EXPECT_LT((at::cat(steps, 1) - full).abs().max().item<double>(), 1e-5);

  ape::set_threads(2);  // given by the user: kept
  {
    ape::SmallWorkThreads small(1e6);
    EXPECT_EQ(at::get_num_threads(), 2);
    EXPECT_EQ(ape::SmallWorkThreads::last(), 0);
  }
  ape::set_threads(before);
}

// The environment the tools start with (runtime/Threads.h, prepare_threads): OpenMP passive with
// a short spin, MKL's strict reproducibility; nothing the user set, nothing after the re-exec; no
// spin when several ranks share the cores.
TEST(Threads, EnvironmentSettings) {
  using Settings = std::vector<std::pair<std::string, std::string>>;
  auto with = [](std::map<std::string, std::string> env, std::vector<const char *> args = {"ape-train"}) {
    return ape::thread_env_settings(
        [&](const char *name) { return env.count(name) ? env.at(name).c_str() : nullptr; },
        static_cast<int>(args.size()), args.data());
  };
  const std::string spin = std::to_string(ape::kOpenMpSpin);
  const std::pair<std::string, std::string> passive{"OMP_WAIT_POLICY", "PASSIVE"}, strict{"MKL_CBWR", "AUTO,STRICT"};
  EXPECT_EQ(with({}), (Settings{passive, {"GOMP_SPINCOUNT", spin}, strict}));
  EXPECT_EQ(with({{"OMP_WAIT_POLICY", "passive"}}), Settings{strict});
  EXPECT_EQ(with({{"OMP_WAIT_POLICY", "passive"}, {"MKL_CBWR", "COMPATIBLE"}}), Settings{});
  EXPECT_EQ(with({{"APE_NO_REEXEC", "1"}}), Settings{});
  EXPECT_EQ(with({{"GOMP_SPINCOUNT", "0"}}), (Settings{passive, strict}));
  EXPECT_EQ(with({{"LOCAL_WORLD_SIZE", "2"}}), (Settings{passive, strict}));
  EXPECT_EQ(with({{"LOCAL_WORLD_SIZE", "1"}}), (Settings{passive, {"GOMP_SPINCOUNT", spin}, strict}));
  EXPECT_EQ(with({}, {"ape-train", "--world-size", "4", "--rank", "1"}), (Settings{passive, strict}));
  EXPECT_EQ(with({}, {"ape-train", "--world-size=2"}), (Settings{passive, strict}));
  EXPECT_EQ(with({}, {"ape-train", "--world-size", "1"}), (Settings{passive, {"GOMP_SPINCOUNT", spin}, strict}));
}

// decode_attention's refusals (runtime/Decode.h): a step's features and params against the
// manifest, with their names; a cache serves the device of its first step only (a GPU cache is its
// k, v tensors: one made here stands in for it); nothing changes on a refusal.
TEST(Decode, StepInputsAreCheckedBeforeTheCacheChanges) {
  const ape::KernelEntry &e = ape::find_kernel("cable");
  const at::Tensor q = at::randn({1, 2, 3, 8}, at::kFloat);
  const at::Tensor feat = at::randn({1, 2, 3}, at::kFloat);
  auto message = [&](ape::LayerCache &c, const std::vector<at::Tensor> &f) {
    try {
      ape::decode_attention(e, c, 16, q, q, q, f, {}, 0.3);
    } catch (const std::invalid_argument &x) {
      return std::string(x.what());
    }
    return std::string("(no error)");
  };
  ape::LayerCache cache;
  EXPECT_NE(message(cache, {}).find("expected 1 feature tensors, got 0"), std::string::npos);
  EXPECT_NE(message(cache, {feat.narrow(2, 0, 2)}).find("must be (B, H, n) = (1, 2, 3)"), std::string::npos);
  EXPECT_NE(message(cache, {feat.to(at::kDouble)}).find("of q's dtype"), std::string::npos);
  EXPECT_EQ(cache.len(), 0);
  EXPECT_EQ(message(cache, {feat}), "(no error)");
  EXPECT_EQ(cache.len(), 3);
  ape::LayerCache gpu;
  gpu.k = at::zeros({1, 2, 16, 8});
  EXPECT_NE(message(gpu, {feat}).find("the cache holds GPU steps"), std::string::npos);
  EXPECT_FALSE(gpu.f32.started());
}

// Grouped keys (k, v of H_kv heads): the CPU cache keeps them per key head (RoPE: k' too, its k mod
// reading neither the head nor the data), and its steps equal those over k, v repeated to every
// query head bit for bit; k and v whose heads do not divide q's, or differ, are refused.
TEST(Decode, GroupedKeysAreKeptPerKeyHead) {
  const ape::KernelEntry &e = ape::find_kernel("rope");
  at::manual_seed(5);
  const int64_t B = 2, H = 4, KV = 2, D = 16, C = 40;
  const at::Tensor q = at::randn({B, H, 9, D}, at::kFloat), k = at::randn({B, KV, 9, D}, at::kFloat),
                   v = at::randn({B, KV, 9, D}, at::kFloat);
  auto repeated = [&](const at::Tensor &x) { return x.repeat_interleave(H / KV, 1); };
  ape::LayerCache grouped, full;
  for (auto [r0, n] : {std::pair<int64_t, int64_t>{0, 5}, {5, 1}, {6, 3}}) {
    auto rows = [&](const at::Tensor &x) { return x.narrow(2, r0, n); };
    const at::Tensor og = ape::decode_attention(e, grouped, C, rows(q), rows(k), rows(v), {}, {}, 0.25);
    const at::Tensor of = ape::decode_attention(e, full, C, rows(q), repeated(rows(k)), repeated(rows(v)), {}, {}, 0.25);
    EXPECT_TRUE(at::equal(og, of)) << "step at " << r0;
  }
  EXPECT_EQ(grouped.f32.v.size(), static_cast<size_t>(B * KV * C * D));
  EXPECT_EQ(grouped.f32.kt.size() * H, full.f32.kt.size() * KV);
  // A step with other key heads than the cache's first is refused, the cache unchanged.
  const at::Tensor q1 = q.narrow(2, 0, 1), k1 = repeated(k.narrow(2, 0, 1)), v1 = repeated(v.narrow(2, 0, 1));
  try {
    ape::decode_attention(e, grouped, C, q1, k1, v1, {}, {}, 0.25);
    ADD_FAILURE() << "a step of 4 key heads on a cache of 2 was taken";
  } catch (const std::invalid_argument &x) {
    EXPECT_NE(std::string(x.what()).find("key heads=4, D=16 but the cache holds B=2, H=4, key heads=2"), std::string::npos)
        << x.what();
  }
  EXPECT_EQ(grouped.len(), 9);
  auto message = [&](const at::Tensor &kk, const at::Tensor &vv) {
    ape::LayerCache c;
    try {
      ape::decode_attention(e, c, C, q, kk, vv, {}, {}, 0.25);
    } catch (const std::invalid_argument &x) {
      return std::string(x.what());
    }
    return std::string("(no error)");
  };
  const at::Tensor k3 = at::randn({B, 3, 9, D});
  EXPECT_NE(message(k3, k3).find("k must match q ([2, 4, 9, 16] Float) but for its heads, a divisor of q's, got "
                                 "[2, 3, 9, 16] Float"),
            std::string::npos);
  EXPECT_NE(message(k, repeated(v)).find("v must match q"), std::string::npos);
  EXPECT_NE(message(k.narrow(2, 0, 4), v).find("k must match q"), std::string::npos);
}

}  // namespace
