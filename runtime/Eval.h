// Eval: loss and perplexity at multiples of the training length, on the held-out test books.
//
// For train length L and multiples m (default 1, 2, 4, 8): tokens / (L·max(m)) segments of
// L·max(m) + 1 tokens are placed through the test books; each is cut into windows of L·m tokens
// (+1 target), so every length is scored on the same target tokens where m divides max(m) (the
// default and the study's multiples; with 1,3,4, the 3x cells score 3L of each 4L segment: their
// `tokens` column says how many). Each cell is the mean next-token loss over all
// positions of all windows, and ppl = exp(loss). A length the model cannot take (longer than a
// learned absolute table) is skipped: its row has no loss and a note saying why.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "runtime/Data.h"
#include "runtime/Model.h"

namespace ape {

struct EvalConfig {
  std::vector<int64_t> multiples{1, 2, 4, 8};
  int64_t tokens = 16384;        // target tokens scored per length (at least one segment)
  int64_t batch_tokens = 16384;  // tokens per forward pass

  // Throws std::invalid_argument naming the option and its range (Options.h).
  void validate() const;
};

struct EvalRow {
  std::string encoding;  // what was evaluated, e.g. "rope->rope_yarn[rope_factor=8]"
  int64_t train_len = 0, eval_len = 0, multiple = 0;
  double loss = 0, ppl = 0;
  int64_t tokens = 0;  // target tokens scored
  std::string note;    // non-empty: the cell was skipped (loss and ppl are NaN), and why
  // The mean loss of each segment (the same target tokens at every length, in the same order):
  // what a confidence interval over the evaluation tokens, or a paired difference between two
  // models or lengths, is computed from (scripts/study.py). Empty for a skipped cell.
  std::vector<double> segment_losses;
  bool skipped() const { return !note.empty(); }
};

// "1,2,4,8" -> {1, 2, 4, 8}, each in [1, 1024]; throws std::invalid_argument on anything else.
std::vector<int64_t> parse_multiples(const std::string &text);

// Data parallel (runtime/Distributed.h): rank `rank` of `world` scores windows [N·rank/world,
// N·(rank+1)/world) of each length, and `sum` adds the (loss sum, token count) pairs of all ranks
// in place (DataParallel::sum); every rank gets the same rows.
struct EvalShard {
  int64_t rank = 0, world = 1;
  std::function<void(std::vector<double> &)> sum;
};

// Evaluates `model` (trained at `train_len`) on `split`. `log` (optional) gets a progress line per length.
// Rows are labelled `label` (default: the model's encoding). With a `shard`, this rank's share only.
std::vector<EvalRow> evaluate(LanguageModel &model, const TokenSplit &split, int64_t train_len,
                              const EvalConfig &cfg, std::ostream *log = nullptr, const std::string &label = "",
                              const EvalShard *shard = nullptr);

// Throws std::invalid_argument, naming the options, when the longest evaluation window (train_len
// x the largest multiple, plus its target) fits in no book of `split` (`what`: "test"): checked
// before training, where evaluate() found it after.
void check_eval_fits(const TokenSplit &split, int64_t train_len, const EvalConfig &cfg, const std::string &what);

// "NAME=VALUE" (ape-eval --set) -> {NAME, VALUE}; throws std::invalid_argument on anything else.
std::pair<std::string, double> parse_assignment(const std::string &text);
// Every --set, in order; a name given twice is refused (which value applies would be a guess).
std::vector<std::pair<std::string, double>> parse_assignments(const std::vector<std::string> &texts);

// The row label of a checkpoint trained with `trained`, evaluated with `evaluated` and the fixed
// params `sets`: "rope", "rope->rope_yarn", "rope->rope_yarn[rope_factor=8;rope_original_length=64]".
std::string eval_label(const std::string &trained, const std::string &evaluated,
                       const std::vector<std::pair<std::string, double>> &sets);

// Rows = encodings (with their training length), columns = multiples, cells "loss / ppl" ("skipped"
// for a skipped cell; the notes follow the table).
void print_table(std::ostream &out, const std::vector<EvalRow> &rows, const std::string &title = "");

// encoding,train_len,eval_len,multiple,loss,ppl,tokens,note,segment_losses (written atomically;
// segment_losses joined by ';'); a skipped cell has empty loss, ppl and segment_losses, and its note.
// keep_other_encodings: the rows of `path` (a file of this form) of encodings that `rows` lacks stay,
// before `rows` (a resumed encoding of a run of several replaces only its own rows).
void write_csv(const std::string &path, const std::vector<EvalRow> &rows, bool keep_other_encodings = false);

}  // namespace ape
