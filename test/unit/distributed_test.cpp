// GoogleTest suite of data-parallel training (runtime/Distributed.h) inside one process: two ranks
// as two threads, each joined to a fresh c10d group (TCPStore + Gloo on 127.0.0.1). The
// multi-process runs (torchrun, explicit flags, a rank killed or hung) are test/distributed.
#include <netinet/in.h>
#include <sys/socket.h>

#include <exception>
#include <optional>
#include <thread>

#include "runtime_fixtures.h"

#include "runtime/Checkpoint.h"
#include "runtime/Distributed.h"

namespace {

// A port the kernel just handed out (wildcard, as c10d's store server binds).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t n = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &n) != 0)
    throw std::runtime_error("no free port");
  ::close(fd);
  return ntohs(a.sin_port);
}

// fn(rank, group) on two threads, the ranks of one 2-rank group; rethrows the first failure.
template <class Fn> void two_ranks(Fn fn) {
  const int port = free_port();
  std::exception_ptr err[2];
  std::thread t[2];
  for (int r = 0; r < 2; ++r)
    t[r] = std::thread([&, r] {
      try {
        ape::DistConfig c;
        c.rank = r;
        c.world_size = 2;
        c.master_port = port;
        c.timeout_s = 60;
        auto dp = ape::DataParallel::join(c);
        fn(r, *dp);
      } catch (...) {
        err[r] = std::current_exception();
      }
    });
  for (auto &th : t) th.join();
  for (auto &e : err)
    if (e) std::rethrow_exception(e);
}

ape::TokenSplit counting_split() {
  ape::TokenSplit s;
  std::vector<int32_t> a, b;
  for (int i = 0; i < 300; ++i) a.push_back((i * 7 + i / 5) % 32);
  for (int i = 0; i < 200; ++i) b.push_back((i * 3 + 1) % 32);
  s.add_doc("a", a);
  s.add_doc("b", b);
  return s;
}

ape::TrainConfig tiny_train(int64_t batch, int64_t world) {
  ape::TrainConfig tc;
  tc.steps = 5;
  tc.batch = batch;
  tc.world_size = world;
  tc.seq_len = 12;
  tc.lr = 1e-2;
  tc.warmup_steps = 1;
  tc.checkpoint_minutes = 0;
  tc.progress = false;
  return tc;
}

float max_diff(ape::LanguageModel &a, ape::LanguageModel &b) {
  float d = 0;
  auto pb = b->named_parameters();
  for (const auto &kv : a->named_parameters())
    d = std::max(d, (kv.value() - pb[kv.key()]).abs().max().item<float>());
  return d;
}

}  // namespace

// The ranks' shards of a step's draw, side by side, are the single process's batch, and every
// rank's stream ends where the single process's does.
TEST(Distributed, SamplerShardsTileTheBatch) {
  const ape::TokenSplit split = counting_split();
  ape::TrainSampler one(split, 5), r0(split, 5), r1(split, 5), r2(split, 5);
  for (int step = 0; step < 3; ++step) {
    const at::Tensor all = one.next(6, 9);
    const at::Tensor parts = at::cat({r0.next(6, 9, 0, 2), r1.next(6, 9, 2, 2), r2.next(6, 9, 4, 2)});
    EXPECT_TRUE(all.equal(parts)) << "step " << step;
  }
  EXPECT_EQ(r1.windows(), one.windows());
  EXPECT_EQ(r2.engine_state(), one.engine_state());
  EXPECT_ERROR(r0.next(4, 9, 3, 2), "rows [3, 5) outside a batch of 4");
}

// A build without Gloo's headers cannot form a group (runtime/CMakeLists.txt); it says so instead.
#define REQUIRE_GLOO()                                                                   \
  do {                                                                                   \
    if (std::string why = ape::backend_unavailable("gloo"); !why.empty()) GTEST_SKIP() << why; \
  } while (0)

// Each primitive against what it must compute, on both ranks.
TEST(Distributed, CollectivesOnTwoRanks) {
  REQUIRE_GLOO();
  two_ranks([](int r, ape::DataParallel &dp) {
    EXPECT_EQ(dp.world_size(), 2);
    EXPECT_EQ(dp.backend(), "gloo");
    // Gradients: rank r holds r+1 (and 10·(r+1) in a second tensor); the mean is 1.5 (15).
    std::vector<at::Tensor> params{at::zeros({3, 4}).requires_grad_(), at::zeros({5}).requires_grad_(),
                                   at::zeros({2}).requires_grad_()};
    params[0].mutable_grad() = at::full({3, 4}, float(r + 1));
    params[1].mutable_grad() = at::full({5}, 10.0f * float(r + 1));
    // params[2] has no gradient on either rank: skipped.
    const double loss = dp.average_gradients(params, at::scalar_tensor(2.0 + r), 1).item<double>();
    EXPECT_DOUBLE_EQ(loss, 2.5);
    EXPECT_TRUE(params[0].grad().equal(at::full({3, 4}, 1.5f)));
    EXPECT_TRUE(params[1].grad().equal(at::full({5}, 15.0f)));
    EXPECT_FALSE(params[2].grad().defined());
    std::vector<double> v{double(r), 1.0};
    dp.sum(v, "a test sum");
    EXPECT_EQ(v, (std::vector<double>{1.0, 2.0}));
    const auto [seconds, stop] = dp.agree(10.0 * r, r == 1, 1);
    EXPECT_DOUBLE_EQ(seconds, 10.0);
    EXPECT_TRUE(stop);
    at::Tensor w = at::full({4}, float(r));
    dp.broadcast_from_root({w}, "a test tensor");
    EXPECT_TRUE(w.equal(at::zeros({4})));
    dp.check_same(0xabcdef0123456789ULL, "a fingerprint");  // the same: no error
    EXPECT_ERROR(dp.check_same(uint64_t(r), "the test value"), "the test value differs between the ranks");
  });
}

// Two ranks with batch 4 train what one process with batch 8 trains (to fp32 rounding), the
// checkpoint records both ranks' positions, and it resumes on one process with the global batch.
TEST(Distributed, TwoRanksEqualOneWithTheDoubledBatch) {
  REQUIRE_GLOO();
  const ape::TokenSplit split = counting_split();
  at::manual_seed(3);
  ape::LanguageModel single(testk::bias_entry, tiny_config("test_bias"));
  std::vector<ape::LanguageModel> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back(testk::bias_entry, tiny_config("test_bias"));
    at::NoGradGuard no_grad;
    auto src = single->named_parameters();
    for (auto &kv : ranks.back()->named_parameters()) kv.value().copy_(src[kv.key()]);
    if (r == 1) ranks.back()->wte->weight.add_(1.0f);  // rank 0's initial model must win
  }
  ape::TrainSampler s1(split, 9);
  ape::Trainer t1(single, s1, tiny_train(8, 1));
  std::ostringstream log;
  const ape::TrainResult want = t1.run(log);

  const std::string path = tmp_path("dist2.ckpt");
  std::vector<double> losses[2];
  two_ranks([&](int r, ape::DataParallel &dp) {
    ape::TrainSampler s(split, 9);
    ape::Trainer t(ranks[r], s, tiny_train(4, 2));
    t.distribute(dp);
    std::ostringstream out;
    losses[r] = t.run(out, "", path).losses;
  });
  ASSERT_EQ(losses[0].size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(losses[0][i], want.losses[i], 1e-5) << "step " << i + 1;
    EXPECT_EQ(losses[0][i], losses[1][i]);  // every rank records the same mean loss
  }
  EXPECT_LT(max_diff(ranks[0], single), 1e-4f);
  EXPECT_EQ(max_diff(ranks[0], ranks[1]), 0.0f);  // the replicas stay bit-identical

  const ape::Checkpoint ck = ape::read_checkpoint(path);
  EXPECT_EQ(ck.config["train"]["world_size"], 2);
  ASSERT_EQ(ck.config["state"]["samplers"].size(), 2u);
  EXPECT_EQ(ck.config["state"]["samplers"][1]["rank"], 1);
  EXPECT_EQ(ck.config["state"]["samplers"][1]["windows"], 5 * 8);
  // On one process: the global batch (8) maps exactly; another global batch is refused.
  ape::LanguageModel again(testk::bias_entry, tiny_config("test_bias"));
  ape::TrainSampler s2(split, 9);
  ape::Trainer t2(again, s2, tiny_train(8, 1));
  t2.restore(ck);
  EXPECT_EQ(t2.state().step, 5);
  EXPECT_EQ(s2.engine_state(), s1.engine_state());
  ape::Trainer t3(again, s2, tiny_train(6, 1));
  EXPECT_ERROR(t3.restore(ck), "resume with a number of ranks that divides the global batch");
  nlohmann::json forged = ck.config;
  forged["state"]["samplers"][1]["windows"] = 7;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto &st : ck.tensors) tensors.emplace_back(st.name, ck.tensor(st));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << ape::encode_checkpoint("test_bias", forged, tensors);
  EXPECT_ERROR(t2.restore(ape::read_checkpoint(path)), "the data positions of rank 0 and rank 1 differ");
}

// Data parallel with the GPU's habits on the CPU (the loss and gradient norm read 4 steps at a
// time, the ranks agreeing on the clock and stop requests only then; loss scaling, the fused AdamW
// step; rank 0 prints progress, as ape-train's): the same losses and bits as reading every step,
// on both ranks; a stop asked on one rank between reads stops both at the next one, and so does
// a spent time budget; a NaN gradient on one rank stops both with the divergence, at the same step.
TEST(Distributed, DeferredReadsTrainTheSameBits) {
  REQUIRE_GLOO();
  const ape::TokenSplit split = counting_split();
  struct Run {
    std::vector<ape::LanguageModel> models;
    std::vector<double> losses[2];
    int64_t steps[2] = {0, 0};
    std::string error[2];
  };
  // stop_at: rank 1 asks to stop after that step; nan_at: rank 1's embedding gradient is NaN there;
  // minutes: a time budget instead of the 10 steps.
  auto dp_run = [&](int64_t every, int64_t stop_at, int64_t nan_at, double minutes = 0) {
    Run run;
    at::manual_seed(3);
    for (int r = 0; r < 2; ++r) run.models.emplace_back(testk::bias_entry, tiny_config("test_bias"));
    int64_t calls = 0;
    if (nan_at > 0)
      run.models[1]->wte->weight.register_hook([&calls, nan_at](const at::Tensor &g) {
        return ++calls == nan_at ? at::full_like(g, NAN) : g;
      });
    two_ranks([&](int r, ape::DataParallel &dp) {
      ape::TrainSampler s(split, 9);
      ape::TrainConfig tc = tiny_train(4, 2);
      tc.steps = minutes > 0 ? 0 : 10;
      tc.minutes = minutes;
      tc.progress = r == 0;
      tc.progress_in_place = false;
      ape::Trainer t(run.models[r], s, tc);
      t.read_every = every;
      t.loss_scaling = nan_at == 0;  // loss scaling would skip the NaN step
      t.fused_adamw = true;
      if (r == 1 && stop_at > 0) t.interrupt = [stop_at](const ape::TrainState &st) { return st.step == stop_at; };
      t.distribute(dp);
      std::ostringstream log;
      try {
        const ape::TrainResult res = t.run(log);
        run.losses[r] = res.losses;
        run.steps[r] = res.steps;
      } catch (const ape::TrainingDiverged &e) {
        run.error[r] = e.what();
      }
    });
    return run;
  };
  Run each = dp_run(1, 0, 0), batched = dp_run(4, 0, 0), stopped = dp_run(4, 2, 0), nan = dp_run(4, 0, 1);
  // A budget of 1e-7 minutes is spent by the first agreement (step 4): until then the ranks keep
  // the clock of the start.
  Run timed = dp_run(4, 0, 0, 1e-7);
  ASSERT_EQ(each.losses[0].size(), 10u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(batched.losses[r], each.losses[0]) << "rank " << r;
    EXPECT_EQ(max_diff(batched.models[r], each.models[0]), 0.0f) << "rank " << r;
    // Asked after step 2 on rank 1; both ranks stop at step 4, where they read and agree.
    EXPECT_EQ(stopped.steps[r], 4) << "rank " << r;
    EXPECT_EQ(stopped.losses[r], std::vector<double>(each.losses[0].begin(), each.losses[0].begin() + 4));
    EXPECT_EQ(timed.steps[r], 4) << "rank " << r;
    // Rank 0 reads step 1 for its first progress line; rank 1 reads it too, and both stop there.
    EXPECT_NE(nan.error[r].find("gradient norm became non-finite at step 1"), std::string::npos)
        << "rank " << r << ": " << nan.error[r];
  }
  EXPECT_EQ(max_diff(each.models[0], each.models[1]), 0.0f);
}

// torchrun's variables, flags' ranges, and what a malformed value says.
TEST(Distributed, ConfigFromTorchrunEnvironment) {
  const char *names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"};
  std::vector<std::optional<std::string>> saved;
  for (const char *n : names) saved.push_back(std::getenv(n) ? std::optional<std::string>(std::getenv(n)) : std::nullopt);
  for (const char *n : names) ::unsetenv(n);
  ape::DistConfig base;
  EXPECT_FALSE(ape::DistConfig::from_env(base).enabled());  // not under torchrun: a single process
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("LOCAL_RANK", "1", 1);
  ::setenv("MASTER_ADDR", "node0", 1);
  ::setenv("MASTER_PORT", "29511", 1);
  const ape::DistConfig c = ape::DistConfig::from_env(base);
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.world_size, 4);
  EXPECT_EQ(c.local_rank, 1);
  EXPECT_EQ(c.master_addr, "node0");
  EXPECT_EQ(c.master_port, 29511);
  EXPECT_NO_THROW(c.validate());
  ::setenv("RANK", "4", 1);
  EXPECT_ERROR(ape::DistConfig::from_env(base), "environment variable RANK='4' must be a whole number in [0, 3]");
  ::setenv("RANK", "1", 1);
  ::setenv("MASTER_PORT", "http", 1);
  EXPECT_ERROR(ape::DistConfig::from_env(base), "MASTER_PORT='http'");
  ape::DistConfig bad = c;
  bad.backend = "mpi";
  EXPECT_ERROR(bad.validate(), "--dist-backend must be auto, gloo or nccl; got 'mpi'");
  bad = c;
  bad.timeout_s = 0;
  EXPECT_ERROR(bad.validate(), "--dist-timeout must be a number in (0, 1e+06]");
  bad = c;
  bad.rank = 4;
  EXPECT_ERROR(bad.validate(), "--rank must be a whole number in [0, 3]; got 4");
  for (size_t i = 0; i < saved.size(); ++i) {
    if (saved[i]) ::setenv(names[i], saved[i]->c_str(), 1);
    else ::unsetenv(names[i]);
  }
}
