// Data (runtime/Data.h): the token cache, the training and evaluation windows, the corpus and its
// errors.
#include "runtime_fixtures.h"
#include "runtime/Tokenizer.h"
#include "runtime/Util.h"

#include <sys/wait.h>
#include <algorithm>
#include <fstream>
#include <chrono>
#include <thread>
#include <csignal>
#include <unistd.h>

namespace {

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

  o.data_dir = tmp_path("a_file");
  std::ofstream(o.data_dir) << "not a folder";
  EXPECT_ERROR(ape::Corpus::open(o), "data folder '" + o.data_dir + "' is a file, not a folder");

  o.data_dir = tmp_path("data_no_archive");
  fs::create_directories(o.data_dir);
  std::ofstream(o.data_dir + "/SPLITS.tsv") << "id\tsplit\n1\ttrain\n2\ttest\n";
  EXPECT_ERROR(ape::Corpus::open(o), "corpus archive " + o.data_dir + "/clean.tar.xz is missing");

  std::ofstream(o.data_dir + "/clean.tar.xz") << "this is not an xz archive";
  // An unpacking killed before (a process that is gone) left its temporary folder: removed now;
  // a running process's (the test's parent) is left alone.
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ::waitpid(gone, nullptr, 0);
  const std::string dead = o.cache_dir + "/pg30.tmp." + std::to_string(gone);
  const std::string live = o.cache_dir + "/pg30.tmp." + std::to_string(::getppid());
  fs::create_directories(dead + "/clean");
  fs::create_directories(live);
  EXPECT_ERROR(ape::Corpus::open(o), "cannot unpack corpus archive " + o.data_dir + "/clean.tar.xz");
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));
  fs::remove_all(live);

  // A book in two splits (trained on and scored as held out) or listed twice.
  std::ofstream(o.data_dir + "/SPLITS.tsv") << "id\tsplit\n1\ttrain\n2\ttest\n1\ttest\n";
  EXPECT_ERROR(ape::Corpus::open(o), o.data_dir + "/SPLITS.tsv:4: book 1 is listed again (line 2)");

  fs::remove(o.data_dir + "/SPLITS.tsv");
  EXPECT_ERROR(ape::Corpus::open(o), "cannot read the split list " + o.data_dir + "/SPLITS.tsv");
}

// The messages of a command that failed say how (std::system's wait status: 256 is exit 1).
TEST(Util, SystemStatusSaysHowTheCommandEnded) {
  EXPECT_EQ(ape::system_status_text(std::system("exit 3")), "exited with status 3");
  EXPECT_EQ(ape::system_status_text(std::system("kill -9 $$")), "was killed by signal 9");
  EXPECT_EQ(ape::system_status_text(-1), "could not be started");
}

// The tokenizer's helper, stopped by Ctrl-C or SIGTERM, is a stop (ape::Stopped: the tools exit
// 130), not a failure with its log (std::system had ignored the caller's SIGINT and reported the
// helper's death as an error); one that fails, or cannot be run, is a failure that says so.
TEST(Tokenizer, AHelperStoppedBySignalIsAStopAndFailuresSaySo) {
  const std::string dir = tmp_path("spm_stop");
  fs::create_directories(dir);
  auto tool = [&](const std::string &name, const std::string &body) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
    fs::permissions(path, fs::perms::owner_all);
    return path;
  };
  const std::string log = dir + "/spm.log";
  auto train_with = [&](const std::string &path) {
    setenv("APE_SPM_TOOL", path.c_str(), 1);
    std::string what = "no error";
    bool stopped = false;
    try {
      ape::spm_train({"--input=x"}, log);
    } catch (const ape::Stopped &e) {
      stopped = true, what = e.what();
    } catch (const std::exception &e) {
      what = e.what();
    }
    unsetenv("APE_SPM_TOOL");
    return std::make_pair(stopped, what);
  };
  // (A signal ignored on entry stays ignored in the child, where sh cannot reset it: ctest started
  // under nohup or in a background job would ignore SIGINT.)
  auto *old_int = std::signal(SIGINT, SIG_DFL), *old_term = std::signal(SIGTERM, SIG_DFL);
  for (const char *sig : {"INT", "TERM"}) {
    const auto [stopped, what] = train_with(tool(std::string("stop_") + sig, std::string("kill -") + sig + " $$"));
    EXPECT_TRUE(stopped) << sig << ": " << what;
    EXPECT_NE(what.find("was stopped"), std::string::npos) << what;
  }
  // A stopped encode leaves neither its partial output (a checkpoint-sized token file in the
  // cache, once per stop) nor its log; a failed one keeps the log its error names.
  for (const char *end : {"kill -INT $$", "exit 3"}) {
    setenv("APE_SPM_TOOL", tool("encode_part", std::string("echo partial > \"$3\"; echo noise >&2; ") + end).c_str(), 1);
    const std::string scratch = dir + "/tokens.ids.1", elog = dir + "/encode.log";
    bool stopped = false;
    try {
      ape::spm_encode_books("model", {"book"}, scratch, elog);
    } catch (const ape::Stopped &) {
      stopped = true;
    } catch (const std::exception &) {
    }
    unsetenv("APE_SPM_TOOL");
    EXPECT_EQ(stopped, end[0] == 'k') << end;
    EXPECT_FALSE(fs::exists(scratch)) << end << ": the partial output was left";
    EXPECT_EQ(fs::exists(elog), !stopped) << end;
  }
  std::signal(SIGINT, old_int), std::signal(SIGTERM, old_term);
  // A stop asked of the caller alone (kill -TERM of ape-train's pid: its handler sets the flag)
  // ends the helper at once, where the wait had gone on to the helper's end.
  {
    const auto t0 = std::chrono::steady_clock::now();
    std::thread asker([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ape::g_stop_requested = 1;
    });
    const auto [stopped, what] = train_with(tool("long", "sleep 30"));
    asker.join();
    EXPECT_TRUE(stopped) << what;
    EXPECT_LT(ape::seconds_since(t0), 10.0) << "the helper was not ended on the stop request";
    // ...and none starts while a stop is asked for.
    const auto [stopped2, what2] = train_with(tool("never", "exit 0"));
    EXPECT_TRUE(stopped2) << what2;
    EXPECT_NE(what2.find("was not started"), std::string::npos) << what2;
    ape::g_stop_requested = 0;
  }
  const auto [stopped, what] = train_with(tool("fails", "echo broken >&2; exit 3"));
  EXPECT_FALSE(stopped);
  EXPECT_NE(what.find("exited with status 3"), std::string::npos) << what;
  EXPECT_NE(what.find("broken"), std::string::npos) << "the log's tail: " << what;
  const auto [stopped2, missing] = train_with(dir + "/no_such_tool");
  EXPECT_FALSE(stopped2);
  EXPECT_NE(missing.find("could not be run"), std::string::npos) << missing;
}

// A stop, or the caller's death by SIGKILL, ends every process the command started, not the
// command alone (run_process runs it under coreutils' timeout, one process group): a compiler
// driver's cc1plus, nvcc's ptxas and tar's xz had run on to their end after both.
TEST(Util, AStopOrTheCallersDeathEndsTheCommandsWholeTree) {
  ASSERT_TRUE(::access("/usr/bin/timeout", X_OK) == 0 || ::access("/bin/timeout", X_OK) == 0)
      << "coreutils' timeout is part of every supported system";
  const std::string dir = tmp_path("process_tree");
  fs::create_directories(dir);
  auto read_pid = [](const std::string &file) -> pid_t {
    for (int i = 0; i < 200; ++i, std::this_thread::sleep_for(std::chrono::milliseconds(25))) {
      std::ifstream in(file);
      long p = 0;
      if (in >> p && p > 0) return static_cast<pid_t>(p);
    }
    return -1;
  };
  // Dead, or a zombie its new parent has not reaped yet.
  auto gone = [](pid_t p) {
    for (int i = 0; i < 200; ++i, std::this_thread::sleep_for(std::chrono::milliseconds(25))) {
      std::ifstream st("/proc/" + std::to_string(p) + "/stat");
      std::string line;
      if (!std::getline(st, line)) return true;
      const size_t paren = line.rfind(')');
      if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z') return true;
    }
    return false;
  };
  auto tree = [](const std::string &pidfile) {
    return std::vector<std::string>{"sh", "-c", "sleep 300 & echo $! > " + pidfile + "; wait"};
  };
  auto *old_term = std::signal(SIGTERM, SIG_DFL);
  {  // a stop asked for (ape-train's Ctrl-C and SIGTERM handler)
    const std::string pidfile = dir + "/stop.pid";
    fs::remove(pidfile);
    pid_t grandchild = -1;
    std::thread asker([&] {
      grandchild = read_pid(pidfile);
      ape::g_stop_requested = 1;
    });
    bool stopped = false;
    try {
      ape::run_process(tree(pidfile), "a tree");
    } catch (const ape::Stopped &) {
      stopped = true;
    }
    asker.join();
    ape::g_stop_requested = 0;
    EXPECT_TRUE(stopped);
    ASSERT_GT(grandchild, 0);
    EXPECT_TRUE(gone(grandchild)) << "the command's own child outlived the stop";
    if (!gone(grandchild)) ::kill(grandchild, SIGKILL);
  }
  {  // the caller killed (SIGKILL: no handler runs)
    const std::string pidfile = dir + "/killed.pid";
    fs::remove(pidfile);
    const pid_t caller = ::fork();
    ASSERT_GE(caller, 0);
    if (caller == 0) {
      try {
        ape::run_process(tree(pidfile), "a tree");
      } catch (...) {
      }
      ::_exit(0);
    }
    const pid_t grandchild = read_pid(pidfile);
    ::kill(caller, SIGKILL);
    int status = 0;
    ::waitpid(caller, &status, 0);
    ASSERT_GT(grandchild, 0);
    EXPECT_TRUE(gone(grandchild)) << "the command's own child outlived its caller";
    if (!gone(grandchild)) ::kill(grandchild, SIGKILL);
  }
  // The command's own end still reads as before: its exit status, the signal that killed it.
  EXPECT_EQ(ape::system_status_text(ape::run_process({"sh", "-c", "exit 3"}, "exit")), "exited with status 3");
  EXPECT_EQ(ape::system_status_text(ape::run_process({"sh", "-c", "kill -9 $$"}, "kill")), "was killed by signal 9");
  std::signal(SIGTERM, old_term);
}

// The tools' error line: LibTorch's message without the C++ stack trace it appends.
TEST(Util, ErrorTextDropsLibTorchsStackTrace) {
  try {
    TORCH_CHECK(false, "Invalid mt19937 state");
  } catch (const std::exception &e) {
    EXPECT_NE(std::string(e.what()).find("Exception raised from"), std::string::npos) << e.what();
    EXPECT_EQ(ape::error_text(e), "Invalid mt19937 state");
  }
  EXPECT_EQ(ape::error_text(std::runtime_error("plain message\n")), "plain message");
  // c10's enforce failures (an allocation refused) list the frames instead.
  EXPECT_EQ(ape::error_text(std::runtime_error("[enforce fail at alloc_cpu.cpp:127] data. DefaultCPUAllocator: "
                                               "not enough memory\nframe #0: c10::ThrowEnforceNotMet(...)\n"
                                               "frame #1: ...\n")),
            "[enforce fail at alloc_cpu.cpp:127] data. DefaultCPUAllocator: not enough memory");
}

// ape-generate's tokenizer lookup: the cache holds one tokenizer per corpus (spm_bpe_<V>_<hash>);
// the checkpoint's is the one with its FNV-1a.
TEST(Corpus, CachedTokenizerIsFoundByItsHash) {
  const std::string dir = tmp_path("tokenizers");
  fs::remove_all(dir);
  EXPECT_ERROR(ape::find_cached_tokenizer(dir, 300, ""), "no 300-piece tokenizer in " + dir);
  fs::create_directories(dir);
  auto put = [&](const std::string &name, const std::string &bytes) {
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
    return ape::fnv1a_hex(bytes);
  };
  const std::string a = put("spm_bpe_300_0000aaaa.model", "corpus a");
  EXPECT_EQ(ape::find_cached_tokenizer(dir, 300, ""), dir + "/spm_bpe_300_0000aaaa.model");
  const std::string b = put("spm_bpe_300_0000bbbb.model", "corpus b");
  put("spm_bpe_3000_0000cccc.model", "corpus b");         // another vocabulary
  put("spm_bpe_300_0000dddd.tmp.77.model", "corpus b");  // a killed training's temporary
  EXPECT_EQ(ape::find_cached_tokenizer(dir, 300, a), dir + "/spm_bpe_300_0000aaaa.model");
  EXPECT_EQ(ape::find_cached_tokenizer(dir, 300, b), dir + "/spm_bpe_300_0000bbbb.model");
  EXPECT_ERROR(ape::find_cached_tokenizer(dir, 300, "0123456789abcdef"),
               "(spm_bpe_300_0000aaaa.model, spm_bpe_300_0000bbbb.model) is the checkpoint's");
  EXPECT_ERROR(ape::find_cached_tokenizer(dir, 300, ""), "several tokenizers in " + dir);
  put("spm_bpe_300.model", "an older cache");  // the name before the hash
  EXPECT_EQ(ape::find_cached_tokenizer(dir, 300, put("spm_bpe_300.model", "an older cache")),
            dir + "/spm_bpe_300.model");
}

// A tokenizer's identity in checkpoints (tokenizer_fingerprint): the model without the trainer's
// input paths, model prefix and thread count, which differ between cache folders and machines
// for the same pieces; every other field counts. Checkpoints that recorded the file's FNV-1a
// still match it.
TEST(Corpus, TokenizerFingerprintIgnoresWhereItWasTrained) {
  auto varint = [](uint64_t v) {
    std::string out;
    for (; v >= 0x80; v >>= 7) out += static_cast<char>((v & 0x7f) | 0x80);
    return out + static_cast<char>(v);
  };
  auto bytes = [&](int n, const std::string &payload) { return varint(uint64_t(n) << 3 | 2) + varint(payload.size()) + payload; };
  auto num = [&](int n, uint64_t v) { return varint(uint64_t(n) << 3) + varint(v); };
  auto piece = [&](const std::string &text, float score) {
    std::string f(4, '\0');
    memcpy(f.data(), &score, 4);
    return bytes(1, bytes(1, text) + varint(2 << 3 | 5) + f);
  };
  auto model = [&](const std::string &dir, int threads, int vocab, const std::string &second) {
    const std::string trainer = bytes(1, dir + "/pg1.txt") + bytes(1, dir + "/pg2.txt") + bytes(2, dir + "/spm.tmp.42") +
                                num(3, 2) + num(4, vocab) + num(16, threads);
    return piece("<unk>", 0.f) + piece("\xe2\x96\x81the", -1.f) + piece(second, -2.f) + bytes(2, trainer) +
           bytes(3, bytes(1, "nmt_nfkc") + num(3, 1));
  };
  const std::string here = model("/work/cache/text", 2, 300, "ing"), there = model("/tmp/x/text", 16, 300, "ing");
  EXPECT_NE(here, there);
  EXPECT_EQ(ape::tokenizer_fingerprint(here), ape::tokenizer_fingerprint(there));
  EXPECT_TRUE(ape::tokenizer_matches(there, ape::tokenizer_fingerprint(here)));
  EXPECT_TRUE(ape::tokenizer_matches(here, ape::fnv1a_hex(here)));  // a checkpoint of before
  EXPECT_FALSE(ape::tokenizer_matches(there, ape::fnv1a_hex(here)));
  EXPECT_NE(ape::tokenizer_fingerprint(here), ape::tokenizer_fingerprint(model("/work/cache/text", 2, 300, "ed")));
  EXPECT_NE(ape::tokenizer_fingerprint(here), ape::tokenizer_fingerprint(model("/work/cache/text", 2, 301, "ing")));
  const std::string cut = here.substr(0, here.size() - 3);  // not a whole ModelProto: its bytes
  EXPECT_EQ(ape::tokenizer_fingerprint(cut), ape::fnv1a_hex(cut));
  EXPECT_EQ(ape::tokenizer_fingerprint("not a model"), ape::fnv1a_hex("not a model"));
}

// A corpus's books are read whole: one that is not UTF-8 is refused, naming the book and the byte
// (its bytes had become <unk> tokens without a word), and one edited at the same size is
// tokenized again (the caches had been keyed by name and size: the old text was scored); an
// edited train book keeps the tokenizer (checkpoints name its bytes) with a note.
TEST(Corpus, BooksAreUtf8AndAnEditAtTheSameSizeIsSeen) {
  ape::DataOptions o;
  o.data_dir = tmp_path("edited_corpus");
  o.cache_dir = tmp_path("edited_corpus_cache");
  o.vocab = 300;
  fs::remove_all(o.data_dir), fs::remove_all(o.cache_dir);
  fs::create_directories(o.data_dir + "/clean");
  std::ofstream(o.data_dir + "/SPLITS.tsv") << "id\tsplit\n1\ttrain\n2\ttest\n";
  auto text = [](uint32_t seed, size_t words) {  // syllable words, a few sentences' worth of pieces
    const char *syl[] = {"ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "pe", "do", "gu", "fe"};
    std::string t;
    for (size_t w = 0; w < words; ++w) {
      seed = seed * 1664525u + 1013904223u;
      for (uint32_t n = 1 + (seed >> 28) % 3, x = seed; n-- > 0; x /= 12) t += syl[x % 12];
      t += (w % 11 == 10) ? ".\n" : " ";
    }
    return t;
  };
  const std::string train = o.data_dir + "/clean/pg1_train.txt", test = o.data_dir + "/clean/pg2_test.txt";
  std::ofstream(train) << text(1, 30000);
  std::ofstream(test) << text(2, 4000);
  std::ostringstream log;
  o.log = &log;
  const ape::Corpus first = ape::Corpus::open(o);
  std::string edited = ape::read_file(test);
  std::reverse(edited.begin(), edited.end() - 1);  // other text, the same size
  std::ofstream(test) << edited;
  const ape::Corpus second = ape::Corpus::open(o);
  EXPECT_NE(second.test().ids, first.test().ids);
  EXPECT_NE(log.str().find("rebuilding"), std::string::npos) << log.str();
  EXPECT_EQ(second.tokenizer_hash(), first.tokenizer_hash());
  std::string t = ape::read_file(train);
  std::swap(t[0], t[t.find_first_not_of(t[0])]);
  std::ofstream(train) << t;
  log.str("");
  const ape::Corpus third = ape::Corpus::open(o);
  EXPECT_EQ(third.tokenizer_hash(), first.tokenizer_hash());
  EXPECT_NE(log.str().find("note: the train books changed since"), std::string::npos) << log.str();
  edited[1234] = '\xe9';
  std::ofstream(test) << edited;
  EXPECT_ERROR(ape::Corpus::open(o), "the test book " + test + " is not UTF-8 text: byte 1234 (0xe9)");
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
  // A tokenizer trained again in another cache folder is the checkpoints' tokenizer still.
  o.cache_dir = tmp_path("corpus_cache_2");
  fs::remove_all(o.cache_dir);
  ape::Corpus elsewhere = ape::Corpus::open(o);
  EXPECT_GT(elsewhere.tokenizer_train_seconds(), 0.0);
  EXPECT_EQ(elsewhere.tokenizer_hash(), c.tokenizer_hash());
  EXPECT_EQ(elsewhere.test().ids, c.test().ids);
  std::cout << log.str();
}

}  // namespace
