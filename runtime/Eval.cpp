// Length-extrapolation evaluation, its table and its CSV.
#include "runtime/Eval.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <torch/nn/functional/loss.h>

#include "ape/contract/value_rules.h"
#include "runtime/AtomicFile.h"
#include "runtime/Options.h"
#include "runtime/Util.h"

namespace ape {

std::vector<int64_t> parse_multiples(const std::string &text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception &) {
      used = 0;
    }
    while (used < item.size() && std::isspace(static_cast<unsigned char>(item[used]))) ++used;
    if (used == 0 || used != item.size() || v <= 0 || v > 1024)
      throw std::invalid_argument("--eval-multiples: expected whole numbers in [1, 1024] like 1,2,4,8, got '" +
                                  text + "'");
    out.push_back(v);
  }
  if (out.empty()) throw std::invalid_argument("--eval-multiples: empty list");
  if (text.back() == ',')  // (getline drops the empty item after it, as 1,,2's is not)
    throw std::invalid_argument("--eval-multiples: expected whole numbers in [1, 1024] like 1,2,4,8, got '" + text +
                                "' (an empty item at its end)");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void EvalConfig::validate() const {
  require_in("--eval-tokens", tokens, 1, 1000000000);
  require_in("batch_tokens", batch_tokens, 1, 1000000000);
  if (multiples.empty()) throw std::invalid_argument("--eval-multiples: empty list");
  for (size_t i = 0; i < multiples.size(); ++i) {
    require_in("--eval-multiples", multiples[i], 1, 1024);
    for (size_t j = 0; j < i; ++j)  // (a length scored twice, its column twice in the table)
      if (multiples[j] == multiples[i])
        throw std::invalid_argument("--eval-multiples lists " + std::to_string(multiples[i]) + " twice");
  }
}

std::pair<std::string, double> parse_assignment(const std::string &text) {
  const size_t eq = text.find('=');
  auto bad = [&](const std::string &why) {
    return std::invalid_argument("--set '" + text + "': " + why + " (expected NAME=VALUE, e.g. rope_factor=8)");
  };
  if (eq == std::string::npos) throw bad("no '='");
  std::string name = text.substr(0, eq), value = text.substr(eq + 1);
  if (name.empty()) throw bad("empty name");
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(value, &used);
  } catch (const std::exception &) {
    used = 0;
  }
  // (decimal only, as the options: std::stod also reads 0x10 and leading spaces)
  if (value.empty() || !is_decimal_real(value) || used != value.size() || !std::isfinite(v))
    throw bad("'" + value + "' is not a finite number");
  return {name, v};
}

std::vector<std::pair<std::string, double>> parse_assignments(const std::vector<std::string> &texts) {
  std::vector<std::pair<std::string, double>> out;
  for (size_t k = 0; k < texts.size(); ++k) {
    auto a = parse_assignment(texts[k]);
    for (size_t e = 0; e < out.size(); ++e)
      if (out[e].first == a.first)
        throw std::invalid_argument("--set " + a.first + " is given twice (" + texts[e].substr(a.first.size() + 1) +
                                    " and " + texts[k].substr(a.first.size() + 1) + "); give each param once");
    out.push_back(std::move(a));
  }
  return out;
}

std::string eval_label(const std::string &trained, const std::string &evaluated,
                       const std::vector<std::pair<std::string, double>> &sets) {
  std::string s = trained;
  if (!evaluated.empty() && evaluated != trained) s += "->" + evaluated;
  if (!sets.empty()) {
    s += "[";
    for (size_t i = 0; i < sets.size(); ++i) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.10g", sets[i].second);
      s += (i ? ";" : "") + sets[i].first + "=" + buf;
    }
    s += "]";
  }
  return s;
}

void check_eval_fits(const TokenSplit &split, int64_t train_len, const EvalConfig &cfg, const std::string &what) {
  cfg.validate();
  const int64_t longest = *std::max_element(cfg.multiples.begin(), cfg.multiples.end());
  const int64_t window = train_len * longest + 1;
  if (split.num_docs() == 0)
    throw std::invalid_argument("the corpus has no " + what + " book to evaluate on (does its SPLITS.tsv list none?)");
  int64_t book = 0;
  for (int64_t i = 0; i < split.num_docs(); ++i) book = std::max(book, split.doc_size(i));
  if (window > book)
    throw std::invalid_argument(
        "--eval-multiples " + std::to_string(longest) + " x the training length " + std::to_string(train_len) +
        " needs a window of " + std::to_string(window) + " tokens, and the longest " + what + " book holds " +
        std::to_string(book) + ": " +
        (longest > 1 ? "choose smaller multiples, or a corpus with longer books"
                     : "the training length is longer than every book; use a corpus with longer books") +
        " (or, training, a shorter --seq-len)");
}

std::vector<EvalRow> evaluate(LanguageModel &model, const TokenSplit &split, int64_t train_len,
                              const EvalConfig &cfg, std::ostream *log, const std::string &label,
                              const EvalShard *shard) {
  cfg.validate();
  require_in("the training length", train_len, 1, ape_rules::kMaxLength);
  const int64_t longest = *std::max_element(cfg.multiples.begin(), cfg.multiples.end());
  if (train_len * longest > ape_rules::kMaxLength)
    throw std::invalid_argument("evaluate: " + std::to_string(longest) + " x the training length " +
                                std::to_string(train_len) + " exceeds " + std::to_string(ape_rules::kMaxLength) +
                                " tokens");
  torch::NoGradGuard no_grad;
  model->eval();
  // Every length scores the same segments of max_len tokens (at least one), sized by the longest
  // length asked whether or not this model can run it (a learned table's end): so every model
  // evaluated with the same settings scores the same target tokens, which the study pairs.
  const int64_t max_len = train_len * *std::max_element(cfg.multiples.begin(), cfg.multiples.end());
  std::vector<EvalRow> rows;
  const std::string name = label.empty() ? model->config().encoding : label;
  for (int64_t m : cfg.multiples) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t len = train_len * m;
    if (auto L = model->max_length(); L && len > *L) {  // skip the cell, say why
      EvalRow r;
      r.encoding = name;
      r.train_len = train_len;
      r.eval_len = len;
      r.multiple = m;
      r.loss = r.ppl = std::numeric_limits<double>::quiet_NaN();
      r.note = "learned absolute positions: sequence length " + std::to_string(len) +
               " exceeds the table's max_length " + std::to_string(*L);
      rows.push_back(r);
      if (log) *log << "[eval] " << name << " @ " << len << " (" << m << "x): skipped: " << r.note << "\n" << std::flush;
      continue;
    }
    const int64_t segments = std::max<int64_t>(1, cfg.tokens / max_len);
    torch::Tensor windows = eval_windows(split, len, max_len, segments);  // (N, len + 1)
    const int64_t N = windows.size(0);
    const int64_t per_batch = std::max<int64_t>(1, cfg.batch_tokens / len);
    int64_t count = 0;
    const int64_t lo = shard ? N * shard->rank / shard->world : 0, hi = shard ? N * (shard->rank + 1) / shard->world : N;
    // The sum stays on the model's device (float64) and is read once per length: on a GPU the
    // batches are queued without waiting.
    const at::Device device = model->placement().device;
    if (!device.is_cpu()) windows = windows.to(device);
    // Loss sums per window (float64, on the model's device); windows are segment-major
    // (eval_windows), so the segments' sums are a reshape away.
    torch::Tensor per_window = torch::zeros({N}, torch::TensorOptions().dtype(torch::kDouble).device(device));
    for (int64_t i = lo; i < hi; i += per_batch) {
      const int64_t b = std::min(per_batch, hi - i);
      torch::Tensor w = windows.narrow(0, i, b);
      torch::Tensor targets = w.narrow(1, 1, len);
      per_window.narrow(0, i, b) += model->token_losses(w.narrow(1, 0, len), targets).to(torch::kDouble).sum(1);
      count += targets.numel();
    }
    const int64_t per_seg = max_len / len, n_seg = N / per_seg;
    torch::Tensor seg = per_window.view({n_seg, per_seg}).sum(1).cpu().contiguous();
    std::vector<double> sums(seg.data_ptr<double>(), seg.data_ptr<double>() + n_seg);
    sums.push_back(double(count));
    if (shard) shard->sum(sums);  // a rank's segments outside its windows are 0
    count = static_cast<int64_t>(sums.back());
    sums.pop_back();
    double sum = 0;
    for (double x : sums) sum += x;
    EvalRow r;
    r.encoding = name;
    r.train_len = train_len;
    r.eval_len = len;
    r.multiple = m;
    r.tokens = count;
    r.loss = sum / double(count);
    r.ppl = std::exp(r.loss);
    for (double x : sums) r.segment_losses.push_back(x / double(per_seg * len));
    rows.push_back(r);
    if (log) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      char buf[256];
      std::snprintf(buf, sizeof buf, "[eval] %s @ %lld (%lldx): loss %.4f, ppl %.2f over %lld tokens in %.1f s\n",
                    r.encoding.c_str(), (long long)len, (long long)m, r.loss, r.ppl, (long long)count, s);
      *log << buf << std::flush;
    }
  }
  return rows;
}

void print_table(std::ostream &out, const std::vector<EvalRow> &rows, const std::string &title) {
  // Rows keyed by (encoding, train_len) in first-seen order; columns by multiple.
  std::vector<std::pair<std::string, int64_t>> keys;
  std::set<int64_t> mults;
  std::map<std::pair<std::string, int64_t>, std::map<int64_t, const EvalRow *>> cell;
  for (const auto &r : rows) {
    auto k = std::make_pair(r.encoding, r.train_len);
    if (!cell.count(k)) keys.push_back(k);
    cell[k][r.multiple] = &r;
    mults.insert(r.multiple);
  }
  auto fmt = [](const EvalRow *r) {
    if (!r) return std::string("-");
    if (r->skipped()) return std::string("skipped");
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3f / %.2f", r->loss, r->ppl);
    return std::string(buf);
  };
  std::set<int64_t> lens;
  for (const auto &k : keys) lens.insert(k.second);
  std::vector<std::string> header{"encoding", "L"};
  for (int64_t m : mults) {
    std::string h = std::to_string(m) + "x";
    if (lens.size() == 1) h += " (" + std::to_string(*lens.begin() * m) + ")";
    header.push_back(h);
  }
  std::vector<std::vector<std::string>> table{header};
  for (const auto &k : keys) {
    std::vector<std::string> line{k.first, std::to_string(k.second)};
    for (int64_t m : mults) line.push_back(fmt(cell[k].count(m) ? cell[k][m] : nullptr));
    table.push_back(line);
  }
  std::vector<size_t> width(header.size(), 0);
  for (const auto &line : table)
    for (size_t c = 0; c < line.size(); ++c) width[c] = std::max(width[c], line[c].size());
  if (!title.empty()) out << title << "\n";
  auto print_line = [&](const std::vector<std::string> &line) {
    for (size_t c = 0; c < line.size(); ++c) {
      if (c) out << " | ";
      if (c == 0) out << std::left << std::setw(int(width[c])) << line[c];
      else out << std::right << std::setw(int(width[c])) << line[c];
    }
    out << std::left << "\n";
  };
  print_line(table[0]);
  for (size_t c = 0; c < width.size(); ++c) out << (c ? "-+-" : "") << std::string(width[c], '-');
  out << "\n";
  for (size_t i = 1; i < table.size(); ++i) print_line(table[i]);
  bool first = true;
  for (const auto &r : rows)
    if (r.skipped()) {
      if (first) out << "skipped:\n";
      first = false;
      out << "  " << r.encoding << " @ " << r.eval_len << " (" << r.multiple << "x): " << r.note << "\n";
    }
}

namespace {
// The records of a CSV text (a quoted field may hold commas, quotes and newlines), each with its
// first field unquoted: (first field, the record's text with its newline). `whole` false when
// the text ends inside a quoted field (a quote never closed: the rest is no record).
std::vector<std::pair<std::string, std::string>> csv_records(const std::string &text, bool &whole) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t start = 0;
  bool quoted = false;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '"') quoted = !quoted;
    if (text[i] != '\n' || quoted) continue;
    const std::string record = text.substr(start, i + 1 - start);
    std::string first;
    if (!record.empty() && record[0] == '"') {
      for (size_t k = 1; k < record.size(); ++k) {
        if (record[k] == '"' && k + 1 < record.size() && record[k + 1] == '"') first += '"', ++k;
        else if (record[k] == '"') break;
        else first += record[k];
      }
    } else {
      first = record.substr(0, record.find_first_of(",\n"));
    }
    out.emplace_back(first, record);
    start = i + 1;
  }
  whole = start == text.size();
  return out;
}
}  // namespace

void write_csv(const std::string &path, const std::vector<EvalRow> &rows, bool keep_other_encodings) {
  auto field = [](const std::string &text) {  // CSV quoting where needed
    if (text.find_first_of(",\"\n") == std::string::npos) return text;
    std::string q = "\"";
    for (char c : text) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  const std::string header = "encoding,train_len,eval_len,multiple,loss,ppl,tokens,note,segment_losses\n";
  std::ostringstream o;
  o << header;
  if (keep_other_encodings) {  // the rows of the encodings `rows` does not have, as they were
    // (of a regular file only, through links: a FIFO's open waits for a writer; write_file_atomically
    // then says what it is)
    std::error_code reg_ec;
    std::stringstream old;
    if (std::filesystem::is_regular_file(path, reg_ec)) {
      std::ifstream in(path, std::ios::binary);
      if (in) old << in.rdbuf();
    }
    std::string text = old.str();
    // As a spreadsheet or an editor may save it: CRLF line ends read as LF, a UTF-8 byte-order mark
    // dropped, a last line without its newline given one.
    for (size_t at = text.find("\r\n"); at != std::string::npos; at = text.find("\r\n", at)) text.erase(at, 1);
    if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
    if (!text.empty() && text.back() != '\n') text += '\n';
    bool whole = true;
    const auto records = text.rfind(header, 0) == 0 ? csv_records(text.substr(header.size()), whole)
                                                    : std::vector<std::pair<std::string, std::string>>{};
    if (text.rfind(header, 0) == 0 && whole) {
      std::set<std::string> mine;
      for (const auto &r : rows) mine.insert(r.encoding);
      for (const auto &[enc, record] : records)
        if (!mine.count(enc)) o << record;
    } else if (!text.empty()) {
      // Another header (an older APE's columns, a file edited by hand), or a quote never closed
      // (the rows from there on are no records: they had been dropped): its rows cannot be
      // merged, and are never dropped: the file is kept beside the new one, said so.
      std::error_code ec;
      const std::filesystem::path given(path), stem = given.parent_path() / given.stem();
      std::filesystem::path aside;
      for (int n = 0; aside.empty() || std::filesystem::exists(aside, ec); ++n)
        aside = stem.string() + ".unmerged" + (n ? "-" + std::to_string(n) : std::string()) + ".csv";
      std::filesystem::rename(given, aside, ec);
      if (ec)
        throw std::runtime_error("cannot merge " + path + " (its header is not " + header.substr(0, header.size() - 1) +
                                 ") nor set it aside as " + aside.string() + ": " + ec.message());
      std::cerr << "[results] " << path
                << (whole ? " has another header than this APE's (an older version, or edited): "
                          : " has a quote that is never closed (edited by hand?): ")
                << "kept as " << aside.string() << "; " << path << " now holds the rows of this run\n";
    }
  }
  o << std::setprecision(6) << std::fixed;
  for (const auto &r : rows) {
    o << field(r.encoding) << "," << r.train_len << "," << r.eval_len << "," << r.multiple << ",";
    if (r.skipped()) o << ",";
    else o << r.loss << "," << r.ppl;
    o << "," << r.tokens << "," << field(r.note) << ",";
    // (a skipped or non-finite cell has no segments: a non-finite loss has a NaN or inf among them)
    if (!r.skipped())
      for (size_t i = 0; i < r.segment_losses.size(); ++i) o << (i ? ";" : "") << r.segment_losses[i];
    o << "\n";
  }
  write_file_atomically(path, o.str());
}

}  // namespace ape
