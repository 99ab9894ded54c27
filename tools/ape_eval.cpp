// ape-eval: evaluate saved checkpoints at multiples of their training length.
//
//   ape-eval --checkpoint runs/rope.ckpt --checkpoint runs/cable.ckpt --csv runs/eval.csv
#include <iostream>
#include <map>
#include <thread>

#include <CLI/CLI.hpp>
#include <ATen/Parallel.h>

#include "runtime/Data.h"
#include "runtime/Eval.h"
#include "runtime/Model.h"
#include "runtime/Train.h"

int main(int argc, char **argv) {
  CLI::App app{"ape-eval: load ape-train checkpoints and report mean token loss / perplexity on the held-out\n"
               "test books at multiples of each checkpoint's training length."};
  std::vector<std::string> checkpoints;
  std::string multiples = "1,2,4,8";
  ape::EvalConfig ec;
  std::string data_dir = ape::default_data_dir();
  std::string cache_dir = ape::default_cache_dir();
  std::string csv;
  int64_t threads = std::max(1u, std::thread::hardware_concurrency());

  app.add_option("-c,--checkpoint", checkpoints, "Checkpoint written by ape-train (repeatable)")->required();
  app.add_option("--eval-multiples", multiples, "Evaluate at these multiples of the training length")
      ->capture_default_str();
  app.add_option("--eval-segments", ec.segments,
                 "Evaluation segments of L x max(multiple) tokens (same target tokens at every length)")
      ->capture_default_str();
  app.add_option("--data", data_dir, "Corpus folder holding SPLITS.tsv and clean.tar.xz")->capture_default_str();
  app.add_option("--cache-dir", cache_dir, "Cache for the unpacked books, the tokenizer and the token ids")
      ->capture_default_str();
  app.add_option("--csv", csv, "Also write the results as CSV (encoding,train_len,eval_len,multiple,loss,ppl,tokens)");
  app.add_option("--threads", threads, "CPU threads (default: all hardware threads)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    ec.multiples = ape::parse_multiples(multiples);
    if (threads < 1) throw std::invalid_argument("--threads must be >= 1");
    at::set_num_threads(static_cast<int>(threads));

    // Load (and verify) every checkpoint before evaluating any.
    struct Loaded { std::string path; ape::LanguageModel model; int64_t train_len; };
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
      models.push_back({path, model, L});
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
      auto r = ape::evaluate(m.model, corpora.at(vocab).test(), m.train_len, ec, &std::cout);
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
