// GoogleTest suite of resuming and of bad input to the runtime: every class of corrupt checkpoint
// (truncated, flipped bytes, a header forged against its tensors, absurd configs), durable atomic
// writes, training stopped and resumed in process (bit-identical), a restore that does not fit, the
// divergence rule and where NaN/inf first appears, and the range of every option. The kill -9 loop
// across processes is test/resume/kill_loop.sh.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "runtime_fixtures.h"

#include "runtime/AtomicFile.h"
#include "runtime/Checkpoint.h"
#include "runtime/Options.h"
#include "runtime/Util.h"

namespace {

std::string read_bytes(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_bytes(const std::string &path, const std::string &bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The same bytes with a correct trailing checksum: a forged file that passes the envelope check.
std::string reseal(std::string b) {
  b.resize(b.size() - 8);
  const uint64_t h = ape::fnv1a(b.data(), b.size());
  b.append(reinterpret_cast<const char *>(&h), 8);
  return b;
}

// Offset of the tensor count field (after magic, version, name, config).
size_t tensor_table_offset(const std::string &b) {
  uint32_t n = 0;
  uint64_t cfg = 0;
  std::memcpy(&n, b.data() + 12, 4);
  std::memcpy(&cfg, b.data() + 16 + n, 8);
  return 16 + n + 8 + cfg;
}

// Books that repeat an 8-token phrase (learnable) and the tiny training config of these tests.
ape::TokenSplit phrase_split() {
  ape::TokenSplit s;
  std::vector<int32_t> phrase{3, 1, 4, 15, 9, 2, 6, 5}, ids;
  for (int r = 0; r < 200; ++r) ids.insert(ids.end(), phrase.begin(), phrase.end());
  s.add_doc("a", ids);
  s.add_doc("b", std::vector<int32_t>(ids.rbegin(), ids.rend()));
  return s;
}

ape::TrainConfig tiny_train(int64_t steps) {
  ape::TrainConfig tc;
  tc.steps = steps;
  tc.batch = 4;
  tc.seq_len = 12;
  tc.lr = 1e-2;
  tc.warmup_steps = 2;
  tc.checkpoint_minutes = 0;
  tc.progress = false;
  return tc;
}

// Every model tensor and the whole training state of a trainer, as checkpoint bytes (minus the
// clock fields): two runs are bit-identical when these are.
std::vector<std::pair<std::string, std::string>> state_bytes(const ape::Trainer &t, const std::string &path) {
  t.save(path);
  const ape::Checkpoint c = ape::read_checkpoint(path);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto &s : c.tensors) out.emplace_back(s.name, c.bytes.substr(s.offset, s.nbytes));
  nlohmann::json st = c.config.at("state");
  st.erase("elapsed_seconds");
  out.emplace_back("state", st.dump());
  return out;
}

}  // namespace

// =====================================================================================================
// Corrupt checkpoints: every class gets a clear error, none a crash
// =====================================================================================================

TEST(CorruptCheckpoint, EveryTruncationIsReported) {
  at::manual_seed(50);
  ape::LanguageModel m(testk::bias_entry, tiny_config("test_bias"));
  const std::string path = tmp_path("cut.ckpt");
  ape::save_checkpoint(path, m, {{"train", {{"seq_len", 8}}}});
  const std::string bytes = read_bytes(path);
  int checked = 0;
  for (size_t cut = 0; cut < bytes.size(); cut += cut < 128 ? 1 : 257) {
    write_bytes(path, bytes.substr(0, cut));
    const std::string msg = error_of([&] { ape::read_checkpoint(path); });
    const bool named = msg.find(cut < 8 ? "not an APE checkpoint" : "truncated") != std::string::npos;
    EXPECT_TRUE(named) << "cut at " << cut << ": " << msg;
    ++checked;
  }
  EXPECT_GT(checked, 150);
}

TEST(CorruptCheckpoint, EveryFlippedByteIsCaught) {
  at::manual_seed(51);
  ape::LanguageModel m(testk::bias_entry, tiny_config("test_bias"));
  const std::string path = tmp_path("flip.ckpt");
  ape::save_checkpoint(path, m, {{"train", {{"seq_len", 8}}}});
  const std::string bytes = read_bytes(path);
  for (size_t pos = 0; pos < bytes.size(); pos += pos < 256 ? 1 : 211) {
    std::string b = bytes;
    b[pos] = static_cast<char>(b[pos] ^ 0x5a);
    write_bytes(path, b);
    const std::string msg = error_of([&] { ape::read_checkpoint(path); });
    EXPECT_EQ(msg.rfind("checkpoint " + path + ": ", 0), 0u) << "byte " << pos << ": " << msg;
    // Printable, whatever the damaged bytes were (a NUL in a name had ended the message there).
    for (const char ch : msg)
      ASSERT_TRUE(ch >= 0x20 && ch < 0x7f) << "byte " << pos << ": a raw byte " << int(ch) << " in: " << msg;
  }
  // A copy that converted line ends (FTP's ASCII mode, git's autocrlf): named as damage, with the
  // checksum's word, not only as the nonsense field it happens to reach first.
  std::string crlf;
  for (const char ch : bytes) crlf += ch == '\n' ? std::string("\r\n") : std::string(1, ch);
  write_bytes(path, crlf);
  const std::string msg = error_of([&] { ape::read_checkpoint(path); });
  EXPECT_NE(msg.find("its checksum does not match either: the file was damaged or cut short"), std::string::npos)
      << msg;
}

TEST(CorruptCheckpoint, AHeaderForgedAgainstItsTensorsIsRefused) {
  at::manual_seed(52);
  ape::LanguageModel bias(testk::bias_entry, tiny_config("test_bias"));
  ape::LanguageModel nope(testk::nope, tiny_config("test_nope"));
  const std::string path = tmp_path("forged.ckpt");
  nlohmann::json cfg = {{"model", tiny_config("test_nope").to_json()}, {"train", {{"seq_len", 8}}}};

  // The header and config say test_nope; the tensors are test_bias's (checksum recomputed).
  write_bytes(path, ape::encode_checkpoint("test_nope", cfg, ape::model_tensors(bias)));
  EXPECT_ERROR(ape::load_state(nope, ape::read_checkpoint(path), path),
               "tensor 'block0.attn.w' is not part of a 'test_nope' model");
  // The header against the config.
  write_bytes(path, ape::encode_checkpoint("test_bias", cfg, ape::model_tensors(nope)));
  EXPECT_ERROR(ape::checked_model_config(ape::read_checkpoint(path)),
               "header says encoding 'test_bias' but the config says 'test_nope'");
  // A tensor missing, or of another dtype or shape.
  auto tensors = ape::model_tensors(nope);
  auto without = tensors;
  without.erase(without.begin());
  write_bytes(path, ape::encode_checkpoint("test_nope", cfg, without));
  EXPECT_ERROR(ape::load_state(nope, ape::read_checkpoint(path), path), "missing tensor '" + tensors[0].first + "'");
  auto doubled = tensors;
  doubled[0].second = doubled[0].second.to(at::kDouble);
  write_bytes(path, ape::encode_checkpoint("test_nope", cfg, doubled));
  EXPECT_ERROR(ape::load_state(nope, ape::read_checkpoint(path), path), "Double, the model expects");
  auto reshaped = tensors;
  reshaped[0].second = reshaped[0].second.flatten();
  write_bytes(path, ape::encode_checkpoint("test_nope", cfg, reshaped));
  EXPECT_ERROR(ape::load_state(nope, ape::read_checkpoint(path), path), "has shape");
  // Nothing was copied by the failed loads.
  at::Tensor before = nope->wte->weight.clone();
  EXPECT_TRUE(nope->wte->weight.equal(before));

  // Tensor headers forged byte by byte (checksum recomputed): each named.
  const std::string good = ape::encode_checkpoint("test_nope", cfg, tensors);
  const size_t table = tensor_table_offset(good);
  uint32_t n0 = 0;
  std::memcpy(&n0, good.data() + table + 8, 4);
  const size_t dtype_at = table + 8 + 4 + n0, rank_at = dtype_at + 1, dim0_at = rank_at + 1;
  auto forge = [&](size_t at, const void *v, size_t n) {
    std::string b = good;
    std::memcpy(b.data() + at, v, n);
    write_bytes(path, reseal(b));
    return error_of([&] { ape::read_checkpoint(path); });
  };
  const uint8_t bad_dtype = 9, rank9 = 9;
  const int64_t negative = -4, huge = int64_t(1) << 62;
  const uint64_t many = uint64_t(1) << 60;
  const uint32_t long_name = 1u << 30;
  EXPECT_NE(forge(dtype_at, &bad_dtype, 1).find("unknown dtype code 9"), std::string::npos);
  EXPECT_NE(forge(rank_at, &rank9, 1).find("has rank 9"), std::string::npos);
  EXPECT_NE(forge(dim0_at, &negative, 8).find("negative dimension"), std::string::npos);
  EXPECT_NE(forge(dim0_at, &huge, 8).find("needs more bytes than remain"), std::string::npos);
  EXPECT_NE(forge(table, &many, 8).find("tensors cannot fit"), std::string::npos);
  EXPECT_NE(forge(table + 8, &long_name, 4).find("corrupt name length"), std::string::npos);
  // Two tensors of one name.
  auto twice = tensors;
  twice[1].first = twice[0].first;
  std::string dup;
  try {
    dup = ape::encode_checkpoint("test_nope", cfg, twice);
  } catch (const std::logic_error &) {  // the writer refuses; forge it by hand
    std::string b = good;
    const size_t second = dim0_at + 8 * tensors[0].second.dim() + tensors[0].second.numel() * 4;
    uint32_t n1 = 0;
    std::memcpy(&n1, b.data() + second, 4);
    ASSERT_EQ(n1, tensors[1].first.size());
    b.replace(second, 4 + n1, std::string(reinterpret_cast<const char *>(&n0), 4) + tensors[0].first);
    dup = reseal(b);
  }
  write_bytes(path, dup);
  EXPECT_ERROR(ape::read_checkpoint(path), "appears twice");
}

TEST(CorruptCheckpoint, AbsurdConfigsAreRefusedBeforeAnythingIsAllocated) {
  const std::string path = tmp_path("absurd.ckpt");
  ape::ModelConfig mc = tiny_config("nope");
  if (!registered("nope")) GTEST_SKIP() << "nope is not registered";
  ape::LanguageModel m(mc);
  const auto tensors = ape::model_tensors(m);
  auto with = [&](const std::function<void(nlohmann::json &)> &edit) {
    nlohmann::json cfg = {{"model", mc.to_json()}, {"train", {{"seq_len", 8}}}};
    edit(cfg);
    write_bytes(path, ape::encode_checkpoint("nope", cfg, tensors));
    return error_of([&] { ape::load_model(path); });
  };
  EXPECT_EQ(with([](nlohmann::json &) {}), "<no exception>");
  auto expect = [](const std::string &msg, const std::string &want) {
    EXPECT_NE(msg.find(want), std::string::npos) << "message: " << msg << "\nwanted: " << want;
  };
  expect(with([](nlohmann::json &c) { c["train"]["seq_len"] = 0; }),
         "--seq-len must be a whole number in [1, 16777216]; got 0");
  expect(with([](nlohmann::json &c) { c["train"]["seq_len"] = "long"; }), "train.seq_len is not an integer");
  expect(with([](nlohmann::json &c) { c["model"]["layers"] = 1000000000; }),
         "--layers must be a whole number in [1, 1024]; got 1000000000");
  expect(with([](nlohmann::json &c) { c["model"]["layers"] = 1000; }),
         "the config describes a model of at least");
  expect(with([](nlohmann::json &c) { c["model"]["d_model"] = 65536; }), "the config is damaged or forged");
  expect(with([](nlohmann::json &c) { c["model"]["vocab"] = 0; }), "--vocab must be a whole number in [2, 1048576]; got 0");
  expect(with([](nlohmann::json &c) { c["model"]["heads"] = 0; }), "--heads must be a whole number in [1, 16]; got 0");
  expect(with([](nlohmann::json &c) { c["model"]["heads"] = 3; }), "must be divisible by --heads (3)");
  expect(with([](nlohmann::json &c) { c["model"]["kv_heads"] = 3; }), "--kv-heads must be a whole number in [0, 2]; got 3");
  expect(with([](nlohmann::json &c) { c["model"]["init_std"] = -1; }), "init_std must be a number in (0, 1]");
  expect(with([](nlohmann::json &c) { c["model"].erase("heads"); }), "bad model config");
  expect(with([](nlohmann::json &c) { c.erase("model"); }), "config has no \"model\" section");
  expect(with([](nlohmann::json &c) { c["model"]["encoding"] = "rope"; }),
         "header says encoding 'nope' but the config says 'rope'");
  // Not JSON at all (checksum right).
  std::string b = ape::encode_checkpoint("nope", {{"model", mc.to_json()}}, tensors);
  b[16 + 4 + 8] = '#';
  write_bytes(path, reseal(b));
  expect(error_of([&] { ape::load_model(path); }), "config is not valid JSON");
}

// Values no model computes with (checksum and shapes right): a NaN weight, a fixed param outside
// the range its spec value was checked against (ape-eval --set's rule). Both evaluated to a NaN
// loss with exit status 0.
TEST(CorruptCheckpoint, NonFiniteWeightsAndFixedParamsOutOfRangeAreRefused) {
  if (!registered("rope_pi")) GTEST_SKIP() << "rope_pi is not registered";
  const std::string path = tmp_path("values.ckpt");
  ape::ModelConfig mc = tiny_config("rope_pi");
  auto saved_with = [&](const std::function<void(ape::LanguageModel &)> &edit) {
    ape::LanguageModel m(mc);
    {
      at::NoGradGuard no_grad;
      edit(m);
    }
    ape::save_checkpoint(path, m, {{"train", {{"seq_len", 8}}}});
    return error_of([&] { ape::load_model(path); });
  };
  EXPECT_EQ(saved_with([](ape::LanguageModel &) {}), "<no exception>");
  const std::string nan = saved_with([](ape::LanguageModel &m) { m->blocks[0]->attn->wq->weight[0][1] = NAN; });
  EXPECT_NE(nan.find("tensor 'block0.attn.wq.weight' holds a NaN or an infinity"), std::string::npos) << nan;
  const std::string zero = saved_with([](ape::LanguageModel &m) {
    m->blocks[0]->attn->stored_param(static_cast<size_t>(m->manifest().param_index("rope_factor"))).fill_(0);
  });
  EXPECT_NE(zero.find("fixed param 'rope_factor' must be a positive number in [5.96046448e-08, 16777216]; got 0"),
            std::string::npos) << zero;
}

TEST(CorruptCheckpoint, AFolderOrAMissingFileIsNamed) {
  const std::string dir = tmp_path("a_folder.ckpt");
  fs::create_directories(dir);
  EXPECT_ERROR(ape::read_checkpoint(dir), "is a folder, not a checkpoint file");
  EXPECT_ERROR(ape::read_checkpoint(tmp_path("nowhere.ckpt")), "cannot open: No such file");
}

// =====================================================================================================
// Durable atomic writes
// =====================================================================================================

TEST(AtomicFile, StaleTemporariesGoAndErrorsKeepTheirCause) {
  const std::string path = tmp_path("atomic.bin");
  // A writer that died: a child that exits at once leaves a pid nobody has.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  // A live pid that holds no lock (pids are reused: not a writer of ours), and a writer still
  // writing: a child holding the flock a writer holds, until we close the pipe it waits on.
  const std::string dead = path + ".tmp." + std::to_string(child), mine = path + ".tmp." + std::to_string(::getpid()),
                    reused = path + ".tmp." + std::to_string(::getppid()), other = path + ".tmpx";
  for (const auto &f : {dead, mine, reused, other}) write_bytes(f, "partial");
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const pid_t writer = ::fork();
  if (writer == 0) {
    ::close(pipefd[1]);
    const int fd = ::open((path + ".tmp." + std::to_string(::getpid())).c_str(), O_WRONLY | O_CREAT, 0644);
    ::flock(fd, LOCK_EX);
    char c = 0;
    (void)!::read(pipefd[0], &c, 1);  // until the parent closes its end
    ::_exit(0);
  }
  ::close(pipefd[0]);
  const std::string writing = path + ".tmp." + std::to_string(writer);
  for (int i = 0; i < 500; ++i) {  // the child has created and locked its temporary
    const int fd = ::open(writing.c_str(), O_RDONLY);
    const bool locked = fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0;
    if (fd >= 0) ::close(fd);
    if (locked) break;
    ::usleep(10000);
  }
  ape::write_file_atomically(path, "new contents");
  EXPECT_EQ(read_bytes(path), "new contents");
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_FALSE(fs::exists(mine));
  EXPECT_FALSE(fs::exists(reused));
  EXPECT_TRUE(fs::exists(writing));  // its writer is still writing
  EXPECT_TRUE(fs::exists(other));
  ::close(pipefd[1]);
  ::waitpid(writer, nullptr, 0);
  ape::write_file_atomically(path, "newer contents");
  EXPECT_FALSE(fs::exists(writing));  // its writer died without finishing
  // A folder where the file should go: named before anything is written, with the real reason.
  const std::string dir = tmp_path("is_a_folder.ckpt");
  fs::create_directories(dir);
  EXPECT_ERROR(ape::write_file_atomically(dir, "x"), "cannot replace " + dir + ": it is a folder, not a file");
  EXPECT_ERROR(ape::check_writable(tmp_dir().string(), "is_a_folder.ckpt"), "is a folder; it must be a file");
  EXPECT_ERROR(ape::check_writable(path, "x.ckpt"), "output folder " + path + " cannot be created");
  EXPECT_NO_THROW(ape::check_writable(tmp_path("fresh_out"), "rope.ckpt"));
}

// A file made read-only is not replaced (a rename ignores the file's own mode: a chmod a-w
// checkpoint, or another user's in a shared folder, was replaced silently), at startup
// (check_writable) or at a write; a file that is replaced keeps its permissions.
TEST(AtomicFile, AWriteProtectedFileIsRefusedAndModesAreKept) {
  const std::string out = tmp_path("protected_out");
  fs::create_directories(out);
  const std::string path = (fs::path(out) / "rope.ckpt").string();
  ape::write_file_atomically(path, "finished model");
  ASSERT_EQ(::chmod(path.c_str(), 0444), 0);
  EXPECT_ERROR(ape::check_writable(out, "rope.ckpt"), "cannot replace " + path + ": it is write-protected");
  EXPECT_ERROR(ape::write_file_atomically(path, "x"), "cannot replace " + path + ": it is write-protected");
  EXPECT_EQ(read_bytes(path), "finished model");
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  ape::write_file_atomically(path, "new model");
  EXPECT_EQ(read_bytes(path), "new model");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u) << "the replaced file's permissions were not kept";
}

// =====================================================================================================
// Resuming: bit-identical in process, and a restore that does not fit changes nothing
// =====================================================================================================

TEST(Resume, StoppedAndResumedTrainingIsBitIdentical) {
  const ape::TokenSplit split = phrase_split();
  const ape::TrainConfig tc = tiny_train(14);
  std::ostringstream log;
  // The run never interrupted.
  at::manual_seed(60);
  ape::LanguageModel a(testk::bias_shared, tiny_config("test_bias_shared", 16));
  ape::TrainSampler sa(split, tc.seed);
  ape::Trainer ta(a, sa, tc);
  const ape::TrainResult ra = ta.run(log, "a");
  ASSERT_EQ(ra.steps, 14);
  // The same run stopped after step 6 with a checkpoint ...
  at::manual_seed(60);
  ape::LanguageModel b(testk::bias_shared, tiny_config("test_bias_shared", 16));
  ape::TrainSampler sb(split, tc.seed);
  ape::Trainer tb(b, sb, tc);
  tb.interrupt = [](const ape::TrainState &s) { return s.step == 6; };
  const std::string path = tmp_path("stopped.ckpt");
  tb.run(log, "b", path);
  ASSERT_EQ(tb.state().step, 6);
  ASSERT_FALSE(tb.state().complete);
  // ... and resumed in a fresh model (other init, other RNG state) and sampler.
  at::manual_seed(999);
  ape::LanguageModel c(testk::bias_shared, tiny_config("test_bias_shared", 16));
  ape::TrainSampler sc(split, 4242);
  ape::Trainer tc2(c, sc, tc);
  tc2.restore(ape::read_checkpoint(path));
  EXPECT_EQ(tc2.state().step, 6);
  const ape::TrainResult rc = tc2.run(log, "c");
  EXPECT_EQ(rc.losses, ra.losses);  // every step's loss, exactly
  EXPECT_EQ(rc.final_loss, ra.final_loss);
  for (const auto &kv : a->named_parameters()) EXPECT_TRUE(kv.value().equal(c->named_parameters()[kv.key()])) << kv.key();
  const auto want = state_bytes(ta, tmp_path("a.ckpt")), got = state_bytes(tc2, tmp_path("c.ckpt"));
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(want[i].first, got[i].first);
    EXPECT_TRUE(want[i].second == got[i].second) << want[i].first << " differs";
  }
}

TEST(Resume, ARestoreThatDoesNotFitChangesNothing) {
  const ape::TokenSplit split = phrase_split();
  const ape::TrainConfig tc = tiny_train(8);
  std::ostringstream log;
  at::manual_seed(61);
  ape::LanguageModel m(testk::bias_entry, tiny_config("test_bias", 16));
  ape::TrainSampler s(split, tc.seed);
  ape::Trainer t(m, s, tc);
  t.interrupt = [](const ape::TrainState &st) { return st.step == 3; };
  const std::string path = tmp_path("fit.ckpt");
  t.run(log, "", path);
  const ape::Checkpoint good = ape::read_checkpoint(path);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto &st : good.tensors) tensors.emplace_back(st.name, good.tensor(st));

  at::manual_seed(62);
  ape::LanguageModel fresh(testk::bias_entry, tiny_config("test_bias", 16));
  const at::Tensor before = fresh->wte->weight.clone();
  ape::TrainSampler fs_(split, tc.seed);
  ape::Trainer target(fresh, fs_, tc);
  auto attempt = [&](const nlohmann::json &cfg, const std::vector<std::pair<std::string, at::Tensor>> &ts) {
    write_bytes(path, ape::encode_checkpoint("test_bias", cfg, ts));
    return error_of([&] { target.restore(ape::read_checkpoint(path)); });
  };
  auto edited = [&](const std::function<void(nlohmann::json &)> &edit) {
    nlohmann::json cfg = good.config;
    edit(cfg);
    return attempt(cfg, tensors);
  };
  auto expect = [](const std::string &msg, const std::string &want) {
    EXPECT_NE(msg.find(want), std::string::npos) << "message: " << msg << "\nwanted: " << want;
  };
  expect(edited([](nlohmann::json &c) { c.erase("state"); }), "it holds no training state");
  expect(edited([](nlohmann::json &c) { c["train"]["lr"] = 0.5; }), "its training config differs from this run's");
  expect(edited([](nlohmann::json &c) { c["train"]["batch"] = 0; }), "--batch must be a whole number in [1, 65536]; got 0");
  expect(edited([](nlohmann::json &c) { c["state"]["step"] = 99; }), "step 99 is outside the budget of 8");
  expect(edited([](nlohmann::json &c) { c["state"]["losses"].push_back(1.0); }), "4 losses for 3 steps");
  expect(edited([](nlohmann::json &c) { c["state"]["samplers"][0]["windows"] = 5; }), "5 windows drawn in 3 steps");
  expect(edited([](nlohmann::json &c) { c["state"]["samplers"][0]["engine"] = "1 2 three"; }),
         "not an mt19937_64 state");
  expect(edited([](nlohmann::json &c) { c["state"]["samplers"].push_back(c["state"]["samplers"][0]); }),
         "\"samplers\" must hold one entry");
  // Complete before its last step without a time budget (it had been "evaluated again", never
  // trained on).
  expect(edited([](nlohmann::json &c) { c["state"]["complete"] = true; }),
         "it is marked complete at step 3 of 8 without a time budget");
  auto ts = tensors;
  ts.emplace_back("train/adam/block9.attn.w/exp_avg", at::zeros({2}));
  expect(attempt(good.config, ts), "optimizer state for 'block9.attn.w', which the model does not have");
  ts = tensors;
  for (auto &[name, t] : ts)
    if (name == "train/adam/wte.weight/exp_avg") t = t.narrow(0, 0, 2).clone();
  expect(attempt(good.config, ts), "optimizer state 'train/adam/wte.weight/exp_avg' has the wrong shape or dtype");
  ts = tensors;
  for (auto &[name, t] : ts)
    if (name == "train/rng/cpu") t = t.narrow(0, 0, 10).clone();
  expect(attempt(good.config, ts), "the random state has the wrong size");
  ts = tensors;
  ts.emplace_back("train/schedule", at::zeros({1}));
  expect(attempt(good.config, ts), "unexpected training-state tensor 'train/schedule'");
  // A forged state of the right shapes (a rewritten file, its checksum made again): named, before
  // anything changes (a NaN moment had resumed and stopped as "diverged"; a bad random state had
  // thrown after the model was loaded).
  for (const double bad : {std::nan(""), -1.0}) {
    ts = tensors;
    for (auto &[name, t] : ts)
      if (name == "train/adam/wte.weight/exp_avg_sq") t = t.clone().fill_(bad);
    expect(attempt(good.config, ts), "optimizer state of 'wte.weight' holds a non-finite or negative moment");
  }
  // An optimizer step count other than the updates made (other bias corrections, other bits).
  for (const int64_t bad : {0, 2, 4}) {
    ts = tensors;
    for (auto &[name, t] : ts)
      if (name == "train/adam/wte.weight/step") t = at::scalar_tensor(bad, at::kLong);
    expect(attempt(good.config, ts), "optimizer step " + std::to_string(bad) + " of 'wte.weight' (the run made 3 updates");
  }
  ts = tensors;
  for (auto &[name, t] : ts)
    if (name == "train/rng/cpu") t = at::full_like(t, 255);
  expect(attempt(good.config, ts), "the random state (train/rng/cpu) is not one");
  // None of these touched the model or the trainer.
  EXPECT_TRUE(fresh->wte->weight.equal(before));
  EXPECT_EQ(target.state().step, 0);
  // The good one restores.
  write_bytes(path, ape::encode_checkpoint("test_bias", good.config, tensors));
  target.restore(ape::read_checkpoint(path));
  EXPECT_EQ(target.state().step, 3);
  EXPECT_TRUE(fresh->wte->weight.equal(m->wte->weight));
}

// =====================================================================================================
// Divergence: the documented rule, and where NaN/inf first appears
// =====================================================================================================

TEST(Divergence, ALossRisingFarAboveItsStartStops) {
  // A learning rate far too high on the phrase books: the loss climbs above twice its start
  // without becoming NaN.
  const ape::TokenSplit split = phrase_split();
  ape::TrainConfig tc = tiny_train(200);
  tc.lr = 10.0;
  tc.warmup_steps = 0;
  tc.grad_clip = 1e6;
  at::manual_seed(70);
  ape::LanguageModel m(testk::nope, tiny_config("test_nope", 16));
  ape::TrainSampler s(split, 1);
  std::ostringstream log;
  const std::string msg = error_of([&] { ape::train(m, s, tc, log, "hot"); });
  EXPECT_NE(msg.find("hot: loss diverged: the mean of steps"), std::string::npos) << msg;
  EXPECT_NE(msg.find("more than 2 x the first step's"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nothing was saved"), std::string::npos) << msg;
  // The rule can be turned off.
  tc.divergence_factor = 0;
  tc.steps = 30;
  ape::LanguageModel m2(testk::nope, tiny_config("test_nope", 16));
  ape::TrainSampler s2(split, 1);
  EXPECT_NE(error_of([&] { ape::train(m2, s2, tc, log); }).find("<no exception>"), std::string::npos);
}

TEST(Divergence, NonFiniteValuesNameWhereTheyFirstAppear) {
  const ape::TokenSplit split = phrase_split();
  ape::TrainConfig tc = tiny_train(3);
  std::ostringstream log;
  {  // a parameter
    ape::LanguageModel m(testk::nope, tiny_config("test_nope", 16));
    at::NoGradGuard g;
    m->blocks[1]->attn->wq->weight[0][0] = INFINITY;
    at::Tensor w = at::randint(16, {2, 9}, at::kLong);
    EXPECT_EQ(ape::locate_nonfinite(m, w), "parameter 'block1.attn.wq.weight' (inf)");
  }
  {  // a layer's output, all parameters finite: the MLP of block 0 overflows f32
    ape::LanguageModel m(testk::nope, tiny_config("test_nope", 16));
    {
      at::NoGradGuard g;
      m->blocks[0]->fc->weight.fill_(1e30);
      m->blocks[0]->proj->weight.fill_(1e30);
    }
    ape::TrainSampler s(split, 1);
    const std::string msg = error_of([&] { ape::train(m, s, tc, log, "mlp"); });
    EXPECT_NE(msg.find("first non-finite value: the output of block 0 MLP (inf)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("at step 1"), std::string::npos) << msg;
  }
  {  // a fixed param (a buffer)
    ape::LanguageModel m(testk::nope_fixed, tiny_config("test_nope_fixed", 16));
    m->set_fixed_param("knob", 2.0);
    at::NoGradGuard g;
    m->blocks[0]->attn->stored_param(0).fill_(NAN);
    EXPECT_EQ(ape::locate_nonfinite(m, at::randint(16, {1, 5}, at::kLong)), "fixed param 'block0.attn.knob' (NaN)");
  }
  {  // everything finite
    ape::LanguageModel m(testk::nope, tiny_config("test_nope", 16));
    EXPECT_EQ(ape::locate_nonfinite(m, at::randint(16, {1, 5}, at::kLong)), "");
  }
}

// =====================================================================================================
// Options: every bad value names its option and the accepted range
// =====================================================================================================

TEST(Options, EveryBadValueNamesItsOptionAndRange) {
  auto train_error = [](const std::function<void(ape::TrainConfig &)> &edit) {
    ape::TrainConfig c;
    c.steps = 10;
    edit(c);
    return error_of([&] { c.validate(); });
  };
  const std::pair<std::function<void(ape::TrainConfig &)>, std::string> train_cases[] = {
      {[](auto &c) { c.batch = 0; }, "--batch must be a whole number in [1, 65536]; got 0"},
      {[](auto &c) { c.steps = -1; }, "--steps must be a whole number in [0, 1000000000]; got -1"},
      {[](auto &c) { c.steps = int64_t(1) << 40; }, "--steps must be a whole number in [0, 1000000000]"},
      {[](auto &c) { c.minutes = 1e12; }, "--minutes must be a number in [0, 1e+06]; got 1000000000000"},
      {[](auto &c) { c.seq_len = 0; }, "--seq-len must be a whole number in [1, 16777216]; got 0"},
      {[](auto &c) { c.lr = 0; }, "--lr must be a number in (0, 10]; got 0"},
      {[](auto &c) { c.lr = NAN; }, "--lr must be a number in (0, 10]; got nan"},
      {[](auto &c) { c.warmup_steps = -5; }, "--warmup must be a whole number in [0, 1000000000]; got -5"},
      {[](auto &c) { c.threads = -3; }, "--threads must be a whole number in [0, 1024]; got -3"},
      {[](auto &c) { c.checkpoint_every = -1; }, "--checkpoint-every must be a whole number"},
      {[](auto &c) { c.checkpoint_minutes = -1; }, "--checkpoint-minutes must be a number in [0, 1e+06]"},
      {[](auto &c) { c.divergence_factor = 0.5; }, "--divergence-factor must be 0 (never) or a number in (1, 1e+06]; got 0.5"},
      {[](auto &c) { c.steps = 0; }, "give a budget"},
  };
  for (const auto &[edit, want] : train_cases) {
    const std::string msg = train_error(edit);
    EXPECT_NE(msg.find(want), std::string::npos) << "message: " << msg << "\nwanted: " << want;
  }
  auto model_error = [](const std::function<void(ape::ModelConfig &)> &edit) {
    ape::ModelConfig c = tiny_config("x");
    edit(c);
    return error_of([&] { c.validate(); });
  };
  EXPECT_NE(model_error([](auto &c) { c.layers = 0; }).find("--layers must be a whole number in [1, 1024]; got 0"),
            std::string::npos);
  EXPECT_NE(model_error([](auto &c) { c.d_model = 70000; }).find("--d-model must be a whole number in [1, 65536]"),
            std::string::npos);
  EXPECT_NE(model_error([](auto &c) { c.heads = 32; }).find("--heads must be a whole number in [1, 16]; got 32"),
            std::string::npos);
  ape::EvalConfig e;
  e.tokens = 0;
  EXPECT_ERROR(e.validate(), "--eval-tokens must be a whole number in [1, 1000000000]; got 0");
  e.tokens = -1;
  EXPECT_ERROR(e.validate(), "got -1");
  e.tokens = 100;
  e.multiples = {1, 4096};
  EXPECT_ERROR(e.validate(), "--eval-multiples must be a whole number in [1, 1024]; got 4096");
  e.multiples = {2, 1, 2};
  EXPECT_ERROR(e.validate(), "--eval-multiples lists 2 twice");
  // evaluate() refuses a training length of 0 (a forged checkpoint's) instead of dividing by it.
  ape::LanguageModel m(testk::nope, tiny_config("test_nope"));
  ape::EvalConfig ok;
  EXPECT_ERROR(ape::evaluate(m, phrase_split(), 0, ok), "the training length must be a whole number in [1, 16777216]; got 0");
  // --set: the verifier's rule, carried by the manifest.
  static const ape::KernelEntry ranged = testk::entry<testk::Kind::Nope>(
      "test_ranged", R"({"encoding": "test_ranged", "params": [{"name": "factor", "shape": [1],
        "init": {"kind": "constant", "value": 4}, "range": {"min": 1.17549435e-38, "max": 3.40282347e+38}},
        {"name": "length", "shape": [1], "init": {"kind": "constant", "value": 64},
         "range": {"min": 1, "max": 16777216, "integer": true}}]})");
  ape::LanguageModel r(ranged, tiny_config("test_ranged"));
  EXPECT_ERROR(r->set_fixed_param("factor", 0), "param 'factor' of encoding 'test_ranged' must be a positive number");
  EXPECT_ERROR(r->set_fixed_param("factor", -1), "got -1");
  EXPECT_ERROR(r->set_fixed_param("length", 2.5), "must be a whole number in [1, 16777216]; got 2.5");
  EXPECT_NO_THROW(r->set_fixed_param("factor", 8));
  EXPECT_NO_THROW(r->set_fixed_param("length", 128));
}

TEST(Options, AModelWhoseHeadDimCannotRotateIsRefused) {
  static const ape::KernelEntry rotary = testk::entry<testk::Kind::Nope>(
      "test_rotary", R"({"encoding": "test_rotary", "rotation": {"pairing": "half", "fraction": 1.0}})");
  static const ape::KernelEntry partial = testk::entry<testk::Kind::Nope>(
      "test_partial", R"({"encoding": "test_partial", "rotation": {"pairing": "half", "fraction": 0.5}})");
  ape::ModelConfig c = tiny_config("test_rotary");
  for (int64_t d : {1, 3}) {
    c.d_model = d;
    c.heads = 1;
    EXPECT_ERROR(ape::LanguageModel(rotary, c), "encoding 'test_rotary' rotates q/k pairs: fraction 1 of head_dim " +
                                                    std::to_string(d));
  }
  c.d_model = 2;
  EXPECT_NO_THROW(ape::LanguageModel(rotary, c));
  c.encoding = "test_partial";
  EXPECT_ERROR(ape::LanguageModel(partial, c), "gives 1 rotated coordinates");
  c.d_model = 6;
  EXPECT_ERROR(ape::LanguageModel(partial, c), "gives 3 rotated coordinates");
  c.d_model = 8;
  EXPECT_NO_THROW(ape::LanguageModel(partial, c));
}

// =====================================================================================================
// Determinism: the same bits on any thread count (runtime/Model.cpp: LayerNormFn)
// =====================================================================================================

TEST(Determinism, TrainingIsTheSameOnAnyThreadCount) {
  const ape::TokenSplit split = phrase_split();
  const ape::TrainConfig tc = tiny_train(6);
  std::vector<const ape::KernelEntry *> entries{&testk::bias_shared};
  for (const char *name : {"t5", "cable"})  // generated kernels: OpenMP over (batch, head)
    if (const ape::KernelEntry *e = registered(name)) entries.push_back(e);
  const int64_t before = at::get_num_threads();
  for (const ape::KernelEntry *e : entries) {
    SCOPED_TRACE(e->name);
    std::vector<std::vector<std::pair<std::string, std::string>>> runs;
    for (int threads : {1, 2}) {
      at::set_num_threads(threads);
      at::manual_seed(80);
      ape::ModelConfig mc = tiny_config(e->name, 16);
      mc.d_model = 32;
      ape::LanguageModel m(*e, mc);
      ape::TrainSampler s(split, tc.seed);
      ape::Trainer t(m, s, tc);
      std::ostringstream log;
      t.run(log);
      auto bytes = state_bytes(t, tmp_path("threads.ckpt"));
      bytes.pop_back();  // the state records the thread count itself
      runs.push_back(bytes);
    }
    for (size_t r = 1; r < runs.size(); ++r) {
      ASSERT_EQ(runs[r].size(), runs[0].size());
      for (size_t i = 0; i < runs[0].size(); ++i)
        EXPECT_TRUE(runs[r][i].second == runs[0][i].second) << runs[0][i].first << " differs on " << r + 1 << " threads";
    }
  }
  at::set_num_threads(static_cast<int>(before));
}
