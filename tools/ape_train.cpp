// ape-train: train a small decoder LM per encoding on the shipped corpus, checkpoint it, and
// evaluate it at multiples of the training length.
//
//   ape-train --encoding rope --encoding cable --minutes 2
//   ape-train --list
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <set>
#include <thread>

#include <CLI/CLI.hpp>
#include <torch/utils.h>

#include "ape/kernel_entry.h"
#include "runtime/Attention.h"
#include "runtime/Data.h"
#include "runtime/Eval.h"
#include "runtime/Model.h"
#include "runtime/Registry.h"
#include "runtime/Threads.h"
#include "runtime/Train.h"

namespace fs = std::filesystem;

int main(int argc, char **argv) {
  ape::prefer_passive_openmp(argv);
  CLI::App app{"ape-train: train a small decoder language model with each named encoding on the shipped\n"
               "pg30 books (same seed, same data order), save a checkpoint per encoding, and report loss /\n"
               "perplexity on the held-out test books at multiples of the training length."};
  std::vector<std::string> encodings;
  int64_t steps = 0;
  double minutes = 0;
  ape::ModelConfig mc;
  ape::TrainConfig tc;
  ape::EvalConfig ec;
  std::string multiples = "1,2,4,8";
  std::string out_dir = "runs";
  std::string data_dir = ape::default_data_dir();
  std::string cache_dir = ape::default_cache_dir();
  int64_t threads = 0;
  bool list = false;

  app.add_option("-e,--encoding", encodings, "Encoding to train (repeatable, or comma-separated); see --list")
      ->delimiter(',');
  auto *steps_opt = app.add_option("--steps", steps, "Training steps per encoding");
  auto *minutes_opt = app.add_option("--minutes", minutes,
                                     "Training time per encoding in minutes (default 2 when --steps is not given; "
                                     "with both, whichever ends first)");
  app.add_option("--seq-len", tc.seq_len, "Training length L (tokens per training window)")->capture_default_str();
  app.add_option("--batch", tc.batch, "Windows per step")->capture_default_str();
  app.add_option("--d-model", mc.d_model, "Model width d")->capture_default_str();
  app.add_option("--layers", mc.layers, "Number of blocks")->capture_default_str();
  app.add_option("--heads", mc.heads, "Attention heads (d-model must be divisible by it)")->capture_default_str();
  app.add_option("--vocab", mc.vocab, "SentencePiece BPE vocabulary size")->capture_default_str();
  app.add_option("--lr", tc.lr, "Peak learning rate (AdamW, warmup then cosine decay)")->capture_default_str();
  app.add_option("--warmup", tc.warmup_steps, "Linear warmup steps (at most steps/5 with --steps)")->capture_default_str();
  app.add_option("--eval-multiples", multiples, "Evaluate at these multiples of --seq-len")->capture_default_str();
  app.add_option("--eval-tokens", ec.tokens,
                 "Target tokens scored per length (the same tokens at every length)")
      ->capture_default_str();
  app.add_option("--out", out_dir, "Output folder: <encoding>.ckpt per encoding and results.csv")->capture_default_str();
  app.add_option("--data", data_dir, "Corpus folder holding SPLITS.tsv and clean.tar.xz")->capture_default_str();
  app.add_option("--cache-dir", cache_dir, "Cache for the unpacked books, the tokenizer and the token ids")
      ->capture_default_str();
  app.add_option("--seed", tc.seed, "Random seed (model init and data order)")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads (default 0: all hardware threads)");
  app.add_flag("--list", list, "List the available encodings and exit");
  app.footer(ape::kernel_cpu_level_help());
  CLI11_PARSE(app, argc, argv);

  try {
    if (list) {
      for (const auto &name : ape::kernel_names()) {
        const auto &m = ape::manifest_of(ape::find_kernel(name));
        std::cout << name;
        if (!m.source.empty()) std::cout << "  (" << m.source << ")";
        std::cout << "\n";
      }
      return 0;
    }
    if (encodings.empty()) throw std::invalid_argument("no encoding given: pass --encoding NAME (see --list)");
    std::set<std::string> seen;
    for (const auto &e : encodings) {
      if (!seen.insert(e).second) throw std::invalid_argument("encoding '" + e + "' is given twice");
      ape::find_kernel(e);  // unknown name: fail now, before any work, with the list of names
    }
    tc.steps = steps;
    tc.minutes = minutes;
    if (!*steps_opt && !*minutes_opt) tc.minutes = 2.0;
    if (*steps_opt && !*minutes_opt) tc.minutes = 0.0;
    tc.progress_in_place = ::isatty(STDOUT_FILENO);
    tc.validate();
    for (const auto &e : encodings) {  // a learned absolute table must hold the training length
      const auto &m = ape::manifest_of(ape::find_kernel(e));
      if (m.embedding && m.embedding->kind == ape::EmbeddingSpec::Kind::Learned && tc.seq_len > m.embedding->max_length)
        throw std::invalid_argument("encoding '" + e + "': learned absolute positions: sequence length " +
                                    std::to_string(tc.seq_len) + " exceeds the table's max_length " +
                                    std::to_string(m.embedding->max_length) + " (lower --seq-len)");
    }
    mc.validate();
    ec.multiples = ape::parse_multiples(multiples);
    ape::set_threads(threads);
    const std::string cpu_level = ape::checked_kernel_cpu_level();  // throws on a bad APE_CPU_LEVEL
    std::cout << "[cpu] kernels: " << cpu_level << "\n";

    ape::DataOptions dopt;
    dopt.data_dir = data_dir;
    dopt.cache_dir = cache_dir;
    dopt.vocab = mc.vocab;
    dopt.log = &std::cout;
    ape::Corpus corpus = ape::Corpus::open(dopt);
    std::cout << "[data] train " << corpus.train().size() << " tokens in " << corpus.train().num_docs()
              << " books; test " << corpus.test().size() << " tokens in " << corpus.test().num_docs()
              << " books\n";

    std::string budget;
    if (tc.steps > 0) budget = std::to_string(tc.steps) + " steps";
    if (tc.minutes > 0) {
      char b[64];
      std::snprintf(b, sizeof b, "%s%g min", budget.empty() ? "" : " or ", tc.minutes);
      budget += b;
    }
    fs::create_directories(out_dir);
    std::vector<ape::EvalRow> all_rows;
    const std::string csv = (fs::path(out_dir) / "results.csv").string();
    for (const auto &name : encodings) {
      torch::manual_seed(tc.seed);
      ape::ModelConfig cfg = mc;
      cfg.encoding = name;
      ape::LanguageModel model(cfg);
      std::cout << "\n[" << name << "] " << model->num_parameters() << " parameters; d " << cfg.d_model
                << ", " << cfg.layers << " layers, " << cfg.heads << " heads, L " << tc.seq_len << ", batch "
                << tc.batch << ", budget " << budget << "\n";
      ape::TrainSampler sampler(corpus.train(), tc.seed);
      ape::TrainResult res = ape::train(model, sampler, tc, std::cout, name);
      char summary[256];
      std::snprintf(summary, sizeof summary,
                    "[%s] %lld steps in %.1f s, %.0f tok/s, loss %.4f -> %.4f (mean of the last %lld steps)\n",
                    name.c_str(), (long long)res.steps, res.seconds, res.tokens_per_second, res.first_loss,
                    res.final_loss, (long long)std::min<int64_t>(20, res.steps));
      std::cout << summary;

      nlohmann::json config;
      config["train"] = tc.to_json();
      config["result"] = res.to_json();
      config["data"] = {{"vocab", corpus.vocab()},
                        {"tokenizer", corpus.tokenizer_path()},
                        {"tokenizer_fnv", corpus.tokenizer_hash()}};
      const std::string ckpt = (fs::path(out_dir) / (name + ".ckpt")).string();
      ape::save_checkpoint(ckpt, model, config);
      std::cout << "[" << name << "] checkpoint -> " << ckpt << "\n";

      auto rows = ape::evaluate(model, corpus.test(), tc.seq_len, ec, &std::cout);
      all_rows.insert(all_rows.end(), rows.begin(), rows.end());
      ape::write_csv(csv, all_rows);  // after every encoding, so partial results survive
    }
    std::cout << "\n";
    ape::print_table(std::cout, all_rows,
                     "Held-out test books (" + std::to_string(corpus.test().num_docs()) +
                         "), cells: mean token loss / perplexity; trained at L = " + std::to_string(tc.seq_len));
    std::cout << "\nresults -> " << csv << "\n";
    return 0;
  } catch (const std::exception &e) {
    std::cout << std::flush;
    std::cerr << "ape-train: error: " << e.what() << "\n";
    return 1;
  }
}
