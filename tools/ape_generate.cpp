// ape-generate: sample text from an ape-train checkpoint, or score a long text, with the KV cache
// (docs/decoding.md).
//
//   ape-generate -c runs/rope.ckpt --prompt "It was a dark" --max-tokens 100 --temperature 0.8 --top-k 40 --seed 1
//   ape-generate -c runs/rope.ckpt --score book.txt --score-tokens 4096
//   ape-generate -c runs/my_encoding.ckpt --prompt "It was"   # trained with --spec: rebuilt from the spec it holds
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <exception>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>

#include <unistd.h>

#include <CLI/CLI.hpp>

#include "Cli.h"

#include "runtime/Attention.h"
#include "runtime/Checkpoint.h"
#include "runtime/Data.h"
#include "runtime/Device.h"
#include "runtime/Eval.h"
#include "runtime/Generate.h"
#include "runtime/Model.h"
#include "runtime/Options.h"
#include "runtime/Registry.h"
#include "runtime/SpecLibrary.h"
#include "runtime/Threads.h"
#include "runtime/Tokenizer.h"
#include "runtime/Util.h"

namespace fs = std::filesystem;

static int tool_main(int argc, char **argv) {
  ape::prepare_threads(argv);
  ape::tune_allocator();
  CLI::App app{"ape-generate: sample text from an ape-train checkpoint, or report the per-token loss of a long\n"
               "text at context lengths beyond training, decoding with the KV cache."};
  std::string checkpoint, prompt, prompt_file, score_file, tokenizer, encoding;
  std::string cache_dir = ape::default_cache_dir();
  std::vector<std::string> set_args;
  std::vector<std::string> specs;
  ape::SampleOptions so;
  int64_t score_tokens = 0, chunk = 1, threads = 0;
  bool show_ids = false;
  app.add_option("-c,--checkpoint", checkpoint, "Checkpoint written by ape-train")->required();
  auto *po = app.add_option("-p,--prompt", prompt, "Text to continue");
  auto *pf = app.add_option("--prompt-file", prompt_file, "Read the prompt from this file");
  auto *sf = app.add_option("--score", score_file,
                            "Instead of sampling: tokenize FILE and report the mean next-token loss per bucket of\n"
                            "context lengths (1..L, L+1..2L, 2L+1..4L, ... for training length L), decoding it\n"
                            "token by token with the cache")
                 ->type_name("FILE");
  po->excludes(pf), po->excludes(sf), pf->excludes(sf);
  auto *n_opt = app.add_option("-n,--max-tokens", so.max_tokens, "Tokens to sample, in [1, 2^20]")
      ->capture_default_str();
  auto *t_opt = app.add_option("-t,--temperature", so.temperature, "Sampling temperature in [0, 100]; 0: greedy")
      ->capture_default_str();
  auto *k_opt = app.add_option("-k,--top-k", so.top_k, "Sample among the k most likely tokens (0: all), in [0, vocab]")
      ->capture_default_str();
  // Sampling options mean nothing to --score (their values went unchecked there); --seed,
  // --stop-at-eos and --ids likewise (below).
  sf->excludes(n_opt)->excludes(t_opt)->excludes(k_opt);
  int64_t seed = static_cast<int64_t>(so.seed);  // (signed: a negative one is refused, not wrapped)
  auto *seed_opt = app.add_option("--seed", seed,
                                  "Random seed in [0, 2^63): the same seed, checkpoint and prompt give the same text")
                       ->capture_default_str();
  bool stop_paragraph = false;
  auto *eos_opt = app.add_flag("--stop-at-eos", stop_paragraph, "Stop after a paragraph break (the tokenizer's </s>)");
  auto *ids_opt = app.add_flag("--ids", show_ids, "Also print the token ids");
  sf->excludes(seed_opt)->excludes(eos_opt)->excludes(ids_opt);
  // Scoring options mean nothing to sampling: they need --score.
  app.add_option("--score-tokens", score_tokens,
                 "With --score: score at most this many target tokens of FILE (0: all of it), in [0, 2^24]")
      ->capture_default_str()
      ->needs(sf);
  app.add_option("--chunk", chunk,
                 "With --score: tokens per cached step, in [1, 2^20] (1: strictly token by token; larger\n"
                 "is faster and, for encodings that do not read the sequence length, gives the same losses)")
      ->capture_default_str()
      ->needs(sf);
  app.add_option("--tokenizer", tokenizer,
                 "SentencePiece model (default: the checkpoint's, found in --cache-dir by its FNV-1a)");
  app.add_option("--cache-dir", cache_dir, "ape-train's cache folder (for the tokenizer)")->capture_default_str();
  app.add_option("--encoding", encoding, "Decode with the kernel NAME instead of the checkpoint's (as ape-eval)")
      ->type_name("NAME");
  app.add_option("--set", set_args, "NAME=VALUE (repeatable): set a fixed param, e.g. rope_factor=8 (as ape-eval)")
      ->type_name("NAME=VALUE");
  app.add_option("--spec", specs,
                 "Compile this spec file (repeatable; cached, as ape-train --spec) and make its encoding\n"
                 "available (as ape-eval). Without it, a checkpoint trained with --spec is rebuilt from the\n"
                 "spec text it holds")
      ->type_name("FILE");
  app.add_option("--threads", threads, "CPU threads, in [0, 1024] (default 0: all hardware threads for the prompt, "
                 "and for each cached step one per 8M multiply-adds it does: small models decode faster on one)");
  std::string device_name = "cpu", precision = "auto";
  app.add_option("--device", device_name,
                 std::string(ape::kDeviceHelp) + "; the KV cache lives there (any device reads any checkpoint)")
      ->capture_default_str();
  app.add_option("--precision", precision, ape::kPrecisionHelp)->capture_default_str();
  app.footer(ape::kernel_cpu_level_help());
  APE_CLI_PARSE(app, argc, argv);

  try {
    ape::require_in("--threads", threads, 0, ape::kMaxThreads);
    ape::require_in("--seed", seed, 0, INT64_MAX);
    so.seed = static_cast<uint64_t>(seed);
    ape::require_in("--score-tokens", score_tokens, 0, int64_t(1) << 24);
    ape::require_in("--chunk", chunk, 1, int64_t(1) << 20);
    // (before the checkpoint is read; --top-k against its vocabulary after)
    ape::require_in("--max-tokens", so.max_tokens, 1, int64_t(1) << 20);
    ape::require_in("--temperature", so.temperature, 0.0, 100.0);
    if (so.top_k < 0)
      throw std::invalid_argument("--top-k must be a whole number in [0, vocab]; got " + std::to_string(so.top_k));
    if (score_file.empty() && prompt_file.empty() && po->count() == 0)
      throw std::invalid_argument("give a --prompt, a --prompt-file or --score FILE");
    const std::vector<std::pair<std::string, double>> sets = ape::parse_assignments(set_args);
    ape::SpecLibraryOptions spec_opts;
    spec_opts.log = &std::cout;
    for (const auto &path : specs) ape::register_spec(path, spec_opts);
    if (!encoding.empty()) ape::find_kernel(encoding);
    const ape::ComputeDevice device = ape::choose_device(device_name, precision);
    ape::set_threads(threads);
    const std::string cpu_level = ape::checked_kernel_cpu_level();  // throws on a bad APE_CPU_LEVEL
    std::cout << "[cpu] kernels: " << cpu_level << "\n";

    if (!fs::exists(checkpoint)) throw std::runtime_error("no checkpoint at " + checkpoint);
    ape::register_checkpoint_spec(ape::read_checkpoint(checkpoint).config, checkpoint, spec_opts);  // trained with --spec
    nlohmann::json config;
    ape::LanguageModel model = ape::load_model_as(checkpoint, encoding, &config, nullptr);
    model->eval();
    model->place(device, &std::cout);  // throws when the encoding has no kernel there
    if (const std::string n = ape::transition_noop_note(model->manifest(), model->config().layers); !n.empty())
      std::cout << "[note] " << n << "\n";
    for (const auto &[name, value] : sets) {
      try {
        model->set_fixed_param(name, value);
      } catch (const std::exception &e) {
        throw std::runtime_error("--set " + name + ": " + e.what());
      }
    }
    const int64_t vocab = model->config().vocab;
    int64_t train_len = 0;
    if (config.contains("train") && config["train"].contains("seq_len"))
      train_len = config["train"]["seq_len"].get<int64_t>();
    if (tokenizer.empty()) {
      std::string fnv;
      if (config.contains("data") && config["data"].contains("tokenizer_fnv"))
        fnv = config["data"]["tokenizer_fnv"].get<std::string>();
      tokenizer = ape::find_cached_tokenizer(cache_dir, vocab, fnv);
    }
    if (!fs::exists(tokenizer))
      throw std::runtime_error("no tokenizer at " + tokenizer + " (pass --tokenizer, or the --cache-dir ape-train used)");
    if (!fs::is_regular_file(tokenizer))
      throw std::runtime_error("--tokenizer " + tokenizer + " is not a file (a SentencePiece model, spm_bpe_*.model)");
    {
      std::ifstream f(tokenizer, std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      if (config.contains("data") && config["data"].contains("tokenizer_fnv") &&
          !ape::tokenizer_matches(bytes, config["data"]["tokenizer_fnv"].get<std::string>()))
        throw std::runtime_error("checkpoint " + checkpoint + " was trained with another tokenizer (" +
                                 config["data"]["tokenizer_fnv"].get<std::string>() + ") than " + tokenizer + " (" +
                                 ape::tokenizer_fingerprint(bytes) + ")");
    }
    const std::string scratch = (fs::temp_directory_path() / ("ape-generate-" + std::to_string(::getpid()))).string();
    const std::string log = scratch + ".log";
    // The scratch files go whether this succeeds or fails (a tokenizer that failed on a full disk
    // left them, and then the disk stayed full), but for the tokenizer's log after a failure,
    // which its error names.
    struct RemoveScratch {
      std::string stem;
      int unwinding = std::uncaught_exceptions();
      ~RemoveScratch() {
        std::error_code ec;
        for (const char *ext : {".bin", ".prompt", ".ids", ".txt"}) fs::remove(stem + ext, ec);
        if (std::uncaught_exceptions() == unwinding) fs::remove(stem + ".log", ec);
      }
    } remove_scratch{scratch};
    auto encode = [&](const std::string &file) {
      ape::EncodedBooks e = ape::spm_encode_books(tokenizer, {file}, scratch + ".bin", log);
      if (e.pieces != vocab)
        throw std::runtime_error("the tokenizer " + tokenizer + " has " + std::to_string(e.pieces) +
                                 " pieces, the model a vocabulary of " + std::to_string(vocab));
      return e;
    };

    if (!score_file.empty()) {
      std::error_code sec;
      if (!fs::exists(score_file, sec)) throw std::runtime_error("cannot read --score file " + score_file + ": it does not exist");
      if (!fs::is_regular_file(score_file, sec))
        throw std::runtime_error("cannot read --score file " + score_file +
                                 ": not a regular file (a folder, pipe or device; the tokenizer reads a file)");
      {
        std::ifstream f(score_file, std::ios::binary);
        std::ostringstream ss;
        ss << f.rdbuf();
        ape::require_utf8(ss.str(), "--score file " + score_file);
      }
      ape::EncodedBooks e = encode(score_file);
      std::vector<int64_t> ids(e.books[0].begin(), e.books[0].end());
      if (score_tokens > 0 && int64_t(ids.size()) > score_tokens + 1) ids.resize(size_t(score_tokens + 1));
      if (ids.size() < 2) throw std::runtime_error(score_file + " holds " + std::to_string(ids.size()) + " tokens; scoring needs at least 2");
      std::cout << "[score] " << score_file << ": " << ids.size() - 1 << " target tokens, " << model->config().encoding
                << ", training length " << train_len << ", " << chunk << " token(s) per cached step\n";
      if (ape::manifest_of(ape::find_kernel(model->config().encoding)).inference_only)
        std::cout << "[score] " << model->config().encoding << " has an attention transition, which transforms "
                  << "the prompt only: the first step (" << std::min<int64_t>(chunk, int64_t(ids.size()) - 1)
                  << " tokens) is the prompt, later steps attend without it"
                  << (chunk < int64_t(ids.size()) - 1 ? " (--chunk >= the tokens scores the whole text as one prompt)"
                                                      : "")
                  << "\n";
      ape::ScoreResult r = ape::score_cached(model, ids, chunk);
      std::cout << "[score] " << r.loss.size() << (r.loss.size() == 1 ? " token in " : " tokens in ") << std::fixed << std::setprecision(2) << r.seconds
                << " s (" << std::setprecision(1) << double(r.loss.size()) / std::max(r.seconds, 1e-9) << " tokens/s)\n\n";
      std::cout << "  context       tokens    loss   ppl      cumulative loss (over 1..to; docs/decoding.md)\n";
      for (const auto &b : ape::bucket_losses(r.loss, train_len > 0 ? train_len : int64_t(r.loss.size()))) {
        std::ostringstream range;
        range << b.from << ".." << std::min<int64_t>(b.to, int64_t(r.loss.size()));  // the last bucket ends with the text
        std::cout << "  " << std::left << std::setw(13) << range.str() << std::right << std::setw(7) << b.count << "  "
                  << std::setprecision(4) << std::setw(7) << b.mean_loss << "  " << std::setprecision(1) << std::setw(7)
                  << std::exp(b.mean_loss) << "  " << std::setprecision(4) << std::setw(9) << b.cumulative_loss << "\n";
      }
      return 0;
    }

    if (!prompt_file.empty()) {
      std::error_code ec;
      if (fs::is_directory(prompt_file, ec)) throw std::runtime_error("--prompt-file " + prompt_file + " is a folder, not a file");
      std::ifstream f(prompt_file, std::ios::binary);
      if (!f) throw std::runtime_error("cannot read --prompt-file " + prompt_file);
      std::ostringstream ss;
      ss << f.rdbuf();
      prompt = ss.str();
    }
    if (prompt.find_first_not_of(" \t\r\n") == std::string::npos)
      throw std::invalid_argument("the prompt is empty (give some text to continue)");
    ape::require_utf8(prompt, prompt_file.empty() ? std::string("the prompt") : "--prompt-file " + prompt_file);
    const std::string prompt_path = scratch + ".prompt";
    {
      std::ofstream f(prompt_path, std::ios::trunc);
      f << prompt;
      f.close();
      if (!f) throw std::runtime_error("cannot write the prompt to " + prompt_path + " (a full disk?)");
    }
    ape::EncodedBooks e = encode(prompt_path);
    std::error_code ec;
    fs::remove(prompt_path, ec);
    std::vector<int64_t> ids(e.books[0].begin(), e.books[0].end());
    if (!ids.empty() && ids.back() == e.eos) ids.pop_back();  // the paragraph break after the last paragraph
    if (ids.empty()) throw std::invalid_argument("the prompt tokenizes to nothing");
    if (stop_paragraph) so.stop_token = e.eos;
    ape::SampleResult r = ape::sample(model, ids, so);
    std::vector<int32_t> all(ids.begin(), ids.end());
    all.insert(all.end(), r.tokens.begin(), r.tokens.end());
    const std::string text = ape::spm_decode(tokenizer, all, scratch, log);
    fs::remove(log, ec);
    std::cout << "\n" << text << "\n\n";
    if (show_ids) {
      std::cout << "[ids]";
      for (int64_t id : r.tokens) std::cout << " " << id;
      std::cout << "\n";
    }
    std::cout << std::fixed << std::setprecision(1) << "[generate] prompt " << ids.size() << " tokens (prefill "
              << std::setprecision(3) << r.prefill_seconds << " s), " << r.tokens.size() << " new tokens";
    // The first new token is sampled from the prefill's logits: the cached steps are one fewer.
    const int64_t steps = static_cast<int64_t>(r.tokens.size()) - 1;
    if (steps > 0)
      std::cout << ", " << steps << (steps == 1 ? " cached step in " : " cached steps in ") << r.decode_seconds
                << " s: " << std::setprecision(1) << double(steps) / std::max(r.decode_seconds, 1e-9) << " tokens/s\n";
    else
      std::cout << " (from the prefill: no cached step)\n";
    return 0;
  } catch (const ape::Stopped &e) {  // Ctrl-C or SIGTERM reached the tokenizer first
    std::cout << std::flush;
    std::cerr << "ape-generate: stopped: " << ape::error_text(e) << "\n";
    return 130;
  } catch (const std::exception &e) {
    std::cout << std::flush;
    std::cerr << "ape-generate: error: " << ape::error_text(e) << "\n";
    return 1;
  }
}

int main(int argc, char **argv) {
  ape::ignore_broken_pipes();
  return ape::output_status(tool_main(argc, argv), "ape-generate");
}
