// Eval: loss and perplexity at multiples of the training length, on the held-out test books.
//
// For train length L and multiples m (default 1, 2, 4, 8): tokens / (L·max(m)) segments of
// L·max(m) + 1 tokens are placed through the test books; each is cut into windows of L·m tokens
// (+1 target), so every length is scored on the same target tokens. Each cell is the mean next-token loss over all
// positions of all windows, and ppl = exp(loss).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "runtime/Data.h"
#include "runtime/Model.h"

namespace ape {

struct EvalConfig {
  std::vector<int64_t> multiples{1, 2, 4, 8};
  int64_t tokens = 16384;        // target tokens scored per length (at least one segment)
  int64_t batch_tokens = 16384;  // tokens per forward pass
};

struct EvalRow {
  std::string encoding;
  int64_t train_len = 0, eval_len = 0, multiple = 0;
  double loss = 0, ppl = 0;
  int64_t tokens = 0;  // target tokens scored
};

// "1,2,4,8" -> {1, 2, 4, 8}; throws std::invalid_argument on anything else.
std::vector<int64_t> parse_multiples(const std::string &text);

// Evaluates `model` (trained at `train_len`) on `split`. `log` (optional) gets a progress line per length.
std::vector<EvalRow> evaluate(LanguageModel &model, const TokenSplit &split, int64_t train_len,
                              const EvalConfig &cfg, std::ostream *log = nullptr);

// Rows = encodings (with their training length), columns = multiples, cells "loss / ppl".
void print_table(std::ostream &out, const std::vector<EvalRow> &rows, const std::string &title = "");

// encoding,train_len,eval_len,multiple,loss,ppl,tokens (written atomically).
void write_csv(const std::string &path, const std::vector<EvalRow> &rows);

}  // namespace ape
