// ape-eval: evaluate saved checkpoints at multiples of their training length.
//
//   ape-eval --checkpoint runs/rope.ckpt --checkpoint runs/cable.ckpt --csv runs/eval.csv
//   ape-eval --checkpoint runs/rope.ckpt --encoding rope_yarn --set rope_factor=8
//   ape-eval --checkpoint runs/exqpe.ckpt --set position_scale=0.5
//   ape-eval --checkpoint runs/my_encoding.ckpt   # trained with --spec: rebuilt from the spec it holds
//   ape-eval --checkpoint runs/rope.ckpt --split valid --eval-multiples 1   # the validation books
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>

#include "Cli.h"

#include "runtime/AtomicFile.h"
#include "runtime/Attention.h"
#include "runtime/Data.h"
#include "runtime/Device.h"
#include "runtime/Eval.h"
#include "runtime/Checkpoint.h"
#include "runtime/Model.h"
#include "runtime/Options.h"
#include "runtime/Registry.h"
#include "runtime/SpecLibrary.h"
#include "runtime/Threads.h"
#include "runtime/Train.h"
#include "runtime/Util.h"

namespace fs = std::filesystem;

static int tool_main(int argc, char **argv) {
  // Lines reach a log file as they are written (progress to follow, and every line before a crash).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  ape::prepare_threads(argv);
  ape::tune_allocator();
  CLI::App app{"ape-eval: load ape-train checkpoints and report mean token loss / perplexity on the held-out\n"
               "test books at multiples of each checkpoint's training length."};
  std::vector<std::string> checkpoints;
  std::string multiples = "1,2,4,8";
  ape::EvalConfig ec;
  std::string data_dir = ape::default_data_dir();
  std::string cache_dir = ape::default_cache_dir();
  std::string csv;
  std::string encoding;
  std::vector<std::string> set_args;
  std::vector<std::string> specs;
  int64_t threads = 0;

  app.add_option("-c,--checkpoint", checkpoints, "Checkpoint written by ape-train (repeatable)")->required();
  app.add_option("--eval-multiples", multiples, "Evaluate at these multiples of the training length, each in [1, 1024]")
      ->capture_default_str();
  app.add_option("--eval-tokens", ec.tokens,
                 "Target tokens scored per length, in [1, 10^9]: the same tokens at every length, in segments of\n"
                 "the longest length asked (so a cell compares with another run's only when both asked for the\n"
                 "same --eval-multiples and --eval-tokens: ape-train's defaults, 1,2,4,8)")
      ->capture_default_str();
  app.add_option("--data", data_dir, "Corpus folder holding SPLITS.tsv and the books, UTF-8 text (clean/pg<ID>_*.txt or clean.tar.xz)")->capture_default_str();
  app.add_option("--cache-dir", cache_dir, "Cache for the unpacked books, the tokenizer and the token ids")
      ->capture_default_str();
  std::string split = "test";
  app.add_option("--split", split,
                 "The held-out books scored: test (default) or valid (the validation books: for choosing\n"
                 "settings, e.g. a learning rate, without looking at the test books)")
      ->check(CLI::IsMember({"test", "valid"}))
      ->capture_default_str();
  app.add_option("--csv", csv,
                 "Also write the results as CSV (encoding,train_len,eval_len,multiple,loss,ppl,tokens,note,segment_losses);\n"
                 "an existing file of that form keeps its rows of the encodings this run does not evaluate, as\n"
                 "ape-train's results.csv does (another form is kept beside it as NAME.unmerged.csv); its folder is\n"
                 "created if missing");
  app.add_option("--encoding", encoding,
                 "Evaluate with the kernel NAME instead of the one each checkpoint was trained with (e.g. a\n"
                 "rope checkpoint with rope_yarn); the trainable parameters must match in name and shape, fixed\n"
                 "params the checkpoint lacks keep NAME's values")
      ->type_name("NAME");
  app.add_option("--spec", specs,
                 "Compile this spec file (repeatable; cached, as ape-train --spec) and make its encoding\n"
                 "available; a checkpoint trained from a spec of the same name must hold the same text.\n"
                 "Without it, a checkpoint trained with --spec is rebuilt from the spec text it holds")
      ->type_name("FILE");
  app.add_option("--set", set_args,
                 "NAME=VALUE (repeatable): set the fixed param NAME in every layer before evaluating, e.g.\n"
                 "rope_factor=8 or position_scale=0.5 (no recompilation; an unknown name lists the settable ones)")
      ->type_name("NAME=VALUE");
  app.add_option("--threads", threads, "CPU threads, in [0, 1024] (default 0: all hardware threads)");
  std::string device_name = "cpu", precision = "auto";
  app.add_option("--device", device_name,
                 std::string(ape::kDeviceHelp) + " (any device reads any checkpoint)")
      ->capture_default_str();
  app.add_option("--precision", precision, ape::kPrecisionHelp)->capture_default_str();
  app.footer(ape::kernel_cpu_level_help());
  APE_CLI_PARSE(app, argc, argv);

  try {
    ape::require_in("--threads", threads, 0, ape::kMaxThreads);
    ec.multiples = ape::parse_multiples(multiples);
    ec.validate();
    const std::vector<std::pair<std::string, double>> sets = ape::parse_assignments(set_args);
    ape::SpecLibraryOptions spec_opts;
    spec_opts.log = &std::cout;
    for (const auto &path : specs) ape::register_spec(path, spec_opts);
    if (!encoding.empty()) ape::find_kernel(encoding);  // unknown name: fail now, listing the names
    const ape::ComputeDevice device = ape::choose_device(device_name, precision);
    if (!csv.empty()) {  // fail now, not after the evaluation
      const fs::path c(csv);
      ape::check_writable(c.has_parent_path() ? c.parent_path().string() : ".", c.filename().string());
      // The results would replace what the user saved: a checkpoint (this run's or another) or a spec.
      if (ape::is_checkpoint_file(csv))
        throw std::runtime_error("--csv " + csv + " is a checkpoint: writing the results there would destroy it "
                                 "(choose another file)");
      std::error_code ec;
      for (const auto &s : specs)
        if (fs::equivalent(csv, s, ec))
          throw std::runtime_error("--csv " + csv + " is the spec file " + s + " (choose another file)");
    }
    ape::set_threads(threads);
    const std::string cpu_level = ape::checked_kernel_cpu_level();  // throws on a bad APE_CPU_LEVEL
    std::cout << "[cpu] kernels: " << cpu_level << "\n";

    // Load (and verify) every checkpoint before evaluating any.
    struct Loaded {
      std::string path;
      ape::LanguageModel model;
      int64_t train_len;
      std::string tokenizer;
      std::string label;
    };
    std::vector<Loaded> models;
    for (const auto &path : checkpoints) {
      nlohmann::json config;
      std::vector<std::string> kept;
      ape::register_checkpoint_spec(ape::read_checkpoint(path).config, path, spec_opts);  // trained with --spec
      ape::LanguageModel model = ape::load_model_as(path, encoding, &config, &kept);
      const std::string trained = config.at("model").at("encoding").get<std::string>();
      if (auto st = config.find("state"); st != config.end() && st->is_object() && !st->value("complete", true))
        std::cout << "[eval] note: " << path << " is an unfinished run (step " << st->value("step", int64_t{0})
                  << "); evaluating the model as it was then (ape-train --resume " << path << " continues it)\n";
      const std::string label = ape::eval_label(trained, model->config().encoding, sets);
      if (const std::string n = ape::transition_noop_note(model->manifest(), model->config().layers); !n.empty())
        std::cout << "[eval] note: " << n << "\n";
      if (!kept.empty()) {
        // Fixed params the checkpoint does not hold: say which values the evaluation starts from.
        const ape::Manifest &man = model->manifest();
        std::ostringstream s;
        std::set<std::string> seen;
        for (const auto &name : kept)
          for (size_t i = 0; i < man.params.size(); ++i) {
            const std::string &pn = man.params[i].name;
            const std::string tail = ".attn." + pn;
            const bool match = name == "shared_" + pn ||
                               (name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0);
            if (!match || !seen.insert(pn).second) continue;
            torch::Tensor t = model->blocks[0]->attn->stored_param(i);
            s << (seen.size() > 1 ? ", " : "") << pn << "=";
            if (t.numel() == 1) s << t.item<double>(); else s << "[" << t.numel() << " values]";
          }
        std::cout << "[eval] " << label << ": not in the checkpoint, " << model->config().encoding
                  << "'s initial values: " << s.str() << "\n";
      }
      for (const auto &[name, value] : sets) {
        try {
          model->set_fixed_param(name, value);
        } catch (const std::exception &e) {
          throw std::runtime_error("--set " + name + ": " + e.what());
        }
      }
      int64_t L = 0;
      try {
        L = config.at("train").at("seq_len").get<int64_t>();
      } catch (const std::exception &) {
        throw std::runtime_error("checkpoint " + path + ": config has no train.seq_len");
      }
      std::string tok;
      if (config.contains("data") && config["data"].contains("tokenizer_fnv"))
        tok = config["data"]["tokenizer_fnv"].get<std::string>();
      // Checked for the device now (throws when the encoding has no kernel there); placed there
      // when its turn comes, and released after, so that one model at a time holds its memory.
      ape::check_encoding_on(device, ape::find_kernel(model->config().encoding), model->config().head_dim(),
                             &std::cout);
      models.push_back({path, model, L, tok, label});
    }
    // Two checkpoints of one encoding and length (two seeds, two runs) would share a row of the
    // table, the second hiding the first, and be told apart in no CSV column: their rows carry
    // the checkpoint's path.
    std::vector<bool> shared(models.size(), false);
    for (size_t i = 0; i < models.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (models[i].label == models[j].label && models[i].train_len == models[j].train_len)
          shared[i] = shared[j] = true;
    for (size_t i = 0; i < models.size(); ++i)
      if (shared[i]) models[i].label += " [" + models[i].path + "]";

    // Every checkpoint's data checked before any is evaluated (a later one that cannot be
    // evaluated failed after the earlier ones' evaluations, their rows lost).
    std::map<int64_t, ape::Corpus> corpora;  // by vocabulary size
    std::vector<const ape::TokenSplit *> books_of;
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
      if (!m.tokenizer.empty() && !corpus.tokenizer_is(m.tokenizer))
        throw std::runtime_error("checkpoint " + m.path + " was trained with a different tokenizer (" + m.tokenizer +
                                 ") than " + corpus.tokenizer_path() + " (" + corpus.tokenizer_hash() +
                                 "); pass the --cache-dir used for training");
      const ape::TokenSplit &books = split == "valid" ? corpus.valid() : corpus.test();
      try {
        ape::check_eval_fits(books, m.train_len, ec, split);
      } catch (const std::exception &e) {
        throw std::runtime_error("checkpoint " + m.path + ": " + e.what());
      }
      books_of.push_back(&books);
    }
    std::vector<ape::EvalRow> rows;
    std::vector<std::string> nonfinite;
    for (size_t i = 0; i < models.size(); ++i) {
      auto &m = models[i];
      m.model->place(device, &std::cout);
      auto r = ape::evaluate(m.model, *books_of[i], m.train_len, ec, &std::cout, m.label);
      m.model = nullptr;  // its memory back before the next
      for (auto &row : r)  // a number no one can use: said in the row and by the exit status
        if (!row.skipped() && !std::isfinite(row.loss)) {
          row.note = "non-finite loss: the model computes NaN or inf at this length";
          nonfinite.push_back(row.encoding + " at length " + std::to_string(row.eval_len) + " (" +
                              std::to_string(row.multiple) + "x)");
        }
      rows.insert(rows.end(), r.begin(), r.end());
    }
    std::cout << "\n";
    ape::print_table(std::cout, rows, std::string("Held-out ") + (split == "valid" ? "validation" : "test") +
                                         " books, cells: mean token loss / perplexity");
    if (!csv.empty()) {
      ape::write_csv(csv, rows, /*keep_other_encodings=*/true);  // (a run's results.csv loses nothing)
      std::cout << "\nresults -> " << csv << "\n";
    }
    if (!nonfinite.empty()) {
      std::string where;
      for (const auto &w : nonfinite) where += (where.empty() ? "" : ", ") + w;
      std::cerr << "ape-eval: error: a non-finite loss (the model computes NaN or inf there: a fixed param set "
                   "with --set, or weights, that make it overflow): "
                << where << "\n";
      return 1;
    }
    return 0;
  } catch (const ape::Stopped &e) {  // Ctrl-C or SIGTERM reached the tokenizer first
    std::cout << std::flush;
    std::cerr << "ape-eval: stopped: " << ape::error_text(e) << "\n";
    return 130;
  } catch (const std::exception &e) {
    std::cout << std::flush;
    std::cerr << "ape-eval: error: " << ape::error_text(e) << "\n";
    return 1;
  }
}

int main(int argc, char **argv) {
  ape::ignore_broken_pipes();
  return ape::output_status(tool_main(argc, argv), "ape-eval");
}
