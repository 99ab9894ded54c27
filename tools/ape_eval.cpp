// ape-eval: evaluate saved checkpoints at multiples of their training length.
//
//   ape-eval --checkpoint runs/rope.ckpt --checkpoint runs/cable.ckpt --csv runs/eval.csv
#include <iostream>
#include <map>
#include <thread>

#include <CLI/CLI.hpp>

#include "runtime/Data.h"
#include "runtime/Eval.h"
#include "runtime/Model.h"
#include "runtime/Threads.h"
#include "runtime/Train.h"

int main(int argc, char **argv) {
  ape::prefer_passive_openmp(argv);
  CLI::App app{"ape-eval: load ape-train checkpoints and report mean token loss / perplexity on the held-out\n"
               "test books at multiples of each checkpoint's training length."};
  std::vector<std::string> checkpoints;
  std::string multiples = "1,2,4,8";
  ape::EvalConfig ec;
  std::string data_dir = ape::default_data_dir();
  std::string cache_dir = ape::default_cache_dir();
  std::string csv;
  int64_t threads = 0;

  app.add_option("-c,--checkpoint", checkpoints, "Checkpoint written by ape-train (repeatable)")->required();
  app.add_option("--eval-multiples", multiples, "Evaluate at these multiples of the training length")
      ->capture_default_str();
  app.add_option("--eval-tokens", ec.tokens,
                 "Target tokens scored per length (the same tokens at every length)")
      ->capture_default_str();
  app.add_option("--data", data_dir, "Corpus folder holding SPLITS.tsv and clean.tar.xz")->capture_default_str();
  app.add_option("--cache-dir", cache_dir, "Cache for the unpacked books, the tokenizer and the token ids")
      ->capture_default_str();
  app.add_option("--csv", csv, "Also write the results as CSV (encoding,train_len,eval_len,multiple,loss,ppl,tokens)");
  app.add_option("--threads", threads, "CPU threads (default 0: all hardware threads)");
  CLI11_PARSE(app, argc, argv);

  try {
    ec.multiples = ape::parse_multiples(multiples);
    ape::set_threads(threads);

    // Load (and verify) every checkpoint before evaluating any.
    struct Loaded { std::string path; ape::LanguageModel model; int64_t train_len; std::string tokenizer; };
    std::vector<Loaded> models;
    for (const auto &path : checkpoints) {
      nlohmann::json config;
      ape::LanguageModel model = ape::load_model(path, &config);
      int64_t L = 0;
      try {
        L = config.at("train").at("seq_len").get<int64_t>();
      } catch (const std::exception &) {
        throw std::runtime_error("checkpoint " + path + ": config has no train.seq_len");
      }
      std::string tok;
      if (config.contains("data") && config["data"].contains("tokenizer_fnv"))
        tok = config["data"]["tokenizer_fnv"].get<std::string>();
      models.push_back({path, model, L, tok});
    }

    std::map<int64_t, ape::Corpus> corpora;  // by vocabulary size
    std::vector<ape::EvalRow> rows;
    for (auto &m : models) {
      const int64_t vocab = m.model->config().vocab;
      if (!corpora.count(vocab)) {
        ape::DataOptions dopt;
        dopt.data_dir = data_dir;
        dopt.cache_dir = cache_dir;
        dopt.vocab = vocab;
        dopt.log = &std::cout;
        corpora.emplace(vocab, ape::Corpus::open(dopt));
      }
      const ape::Corpus &corpus = corpora.at(vocab);
      if (!m.tokenizer.empty() && m.tokenizer != corpus.tokenizer_hash())
        throw std::runtime_error("checkpoint " + m.path + " was trained with a different tokenizer (" + m.tokenizer +
                                 ") than " + corpus.tokenizer_path() + " (" + corpus.tokenizer_hash() +
                                 "); pass the --cache-dir used for training");
      auto r = ape::evaluate(m.model, corpus.test(), m.train_len, ec, &std::cout);
      rows.insert(rows.end(), r.begin(), r.end());
    }
    std::cout << "\n";
    ape::print_table(std::cout, rows, "Held-out test books, cells: mean token loss / perplexity");
    if (!csv.empty()) {
      ape::write_csv(csv, rows);
      std::cout << "\nresults -> " << csv << "\n";
    }
    return 0;
  } catch (const std::exception &e) {
    std::cout << std::flush;
    std::cerr << "ape-eval: error: " << e.what() << "\n";
    return 1;
  }
}
