// Data: the shipped pg30 corpus (30 public-domain books) -> token ids -> training and eval windows.
//
//   data/pg30/clean.tar.xz ──tar -xJf──▶ <cache>/pg30/clean/pg<ID>_<slug>.txt    (once)
//   train split ──SentencePiece BPE──▶ <cache>/spm_bpe_<V>_<H>.model              (once)
//   each split ──encode──▶ <cache>/tokens_<split>_<V>_<H>.bin                      (once; versioned)
//
// <H>: 8 hex digits of the FNV-1a of the tokenizer's inputs (train books' names and sizes, V,
// the sentence sample): corpora sharing a cache folder keep their own tokenizers and token ids
// (but not their unpacked text, one <cache>/pg30 per folder: two archives, or a book edited
// without changing its size, need their own --cache-dir). Each step runs under a lock of its own
// in the cache folder: one process at a time makes a file, the others wait and read it.
//
// SentencePiece runs in the ape-spm helper process (runtime/Tokenizer.h). Books are split into
// paragraphs at blank lines; the lines of a paragraph are joined with spaces, encoded, and followed
// by the tokenizer's </s> id (a paragraph break). With a data folder that already holds an unpacked
// clean/ folder, that folder is used as is.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace ape {

// The books of one split, tokenized and stored back to back.
struct TokenSplit {
  std::vector<std::string> names;    // book file names (e.g. pg84_frankenstein.txt)
  std::vector<int64_t> offsets{0};   // book i = ids[offsets[i], offsets[i+1])
  std::vector<int32_t> ids;

  int64_t num_docs() const { return static_cast<int64_t>(names.size()); }
  int64_t doc_size(int64_t i) const { return offsets[i + 1] - offsets[i]; }
  const int32_t *doc(int64_t i) const { return ids.data() + offsets[i]; }
  int64_t size() const { return static_cast<int64_t>(ids.size()); }
  void add_doc(const std::string &name, const std::vector<int32_t> &doc_ids);
};

// ---- token cache files --------------------------------------------------------------------------
// Layout (host byte order): "APETOKS\0" | u32 version | u32 vocab | u64 fingerprint | u64 docs |
// u64 count | per doc: u32 name length, name, u64 length | count x i32 ids | u64 FNV-1a of ids.
constexpr uint32_t kTokenCacheVersion = 1;

// A cache file that is missing, stale, truncated or corrupt; the message says which and why.
struct CacheError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Writes atomically (temporary file, then rename).
void write_token_cache(const std::string &path, const TokenSplit &split, uint32_t vocab,
                       uint64_t fingerprint);
// Throws CacheError unless the file is complete, intact and matches vocab and fingerprint.
TokenSplit read_token_cache(const std::string &path, uint32_t vocab, uint64_t fingerprint);

// A SentencePiece model's identity, recorded in checkpoints (data.tokenizer_fnv): FNV-1a, as 16 hex
// digits, of the model file without what says only where and how it was trained (TrainerSpec's
// input paths, model prefix and thread count), so that the same pieces trained again in another
// cache folder or on another machine match. A file that does not parse as a ModelProto: the
// FNV-1a of its bytes.
std::string tokenizer_fingerprint(const std::string &model_bytes);
// Whether `recorded` (a checkpoint's data.tokenizer_fnv) names the model file `model_bytes`: its
// fingerprint, or the FNV-1a of its bytes (what checkpoints recorded before the fingerprint).
bool tokenizer_matches(const std::string &model_bytes, const std::string &recorded);

// The tokenizer ape-train made in `cache_dir` for a `vocab`-piece model that `fnv_hex` names (a
// checkpoint's data.tokenizer_fnv, tokenizer_matches; empty: the only spm_bpe_<vocab>*.model there).
// Throws with what it found when none (or, without fnv_hex, more than one) matches.
std::string find_cached_tokenizer(const std::string &cache_dir, int64_t vocab, const std::string &fnv_hex);

// ---- the corpus ------------------------------------------------------------------------------------
struct DataOptions {
  std::string data_dir;                  // holds SPLITS.tsv and clean.tar.xz (or an unpacked clean/)
  std::string cache_dir;                 // unpacked text, tokenizer, token caches
  int64_t vocab = 4096;                  // SentencePiece BPE vocabulary size
  int64_t input_sentence_size = 300000;  // lines sampled for tokenizer training (~4 s on 2 cores)
  std::ostream *log = nullptr;           // progress messages (nullptr: std::cerr)
};

std::string default_data_dir();   // <source>/data/pg30
std::string default_cache_dir();  // <build>/cache

class Corpus {
 public:
  // Unpacks, trains or loads the tokenizer, tokenizes or loads every split. Throws
  // std::runtime_error naming the path when the data folder, SPLITS.tsv, the archive or a book is
  // missing or unreadable.
  static Corpus open(const DataOptions &opts);

  const TokenSplit &train() const { return train_; }
  const TokenSplit &valid() const { return valid_; }
  const TokenSplit &test() const { return test_; }
  int64_t vocab() const { return vocab_; }
  const std::string &tokenizer_path() const { return tokenizer_path_; }
  // The tokenizer's fingerprint (tokenizer_fingerprint: recorded in checkpoints).
  const std::string &tokenizer_hash() const { return tokenizer_hash_; }
  // Whether a checkpoint's recorded tokenizer is this one (tokenizer_matches).
  bool tokenizer_is(const std::string &recorded) const { return tokenizer_matches(model_bytes_, recorded); }
  double tokenizer_train_seconds() const { return spm_seconds_; }  // 0 when loaded from the cache
  double tokenize_seconds() const { return tok_seconds_; }         // 0 when every split was cached

 private:
  TokenSplit train_, valid_, test_;
  int64_t vocab_ = 0;
  std::string tokenizer_path_, tokenizer_hash_, model_bytes_;
  double spm_seconds_ = 0, tok_seconds_ = 0;
};

// ---- windows -------------------------------------------------------------------------------------------

// Random training windows: every row is `length` consecutive tokens of one book, its start drawn
// uniformly over all valid starts in the split (longer books are drawn more often). The sequence is a
// function of the seed only.
class TrainSampler {
 public:
  TrainSampler(const TokenSplit &split, uint64_t seed);
  at::Tensor next(int64_t batch, int64_t length);  // (batch, length) int64
  // Draws `batch` windows like next(batch, length) but returns rows [first, first + count) of them,
  // (count, length): one data-parallel rank's shard of the step's batch (runtime/Distributed.h).
  at::Tensor next(int64_t batch, int64_t length, int64_t first, int64_t count);

  // Its position, for resuming: the engine's state as text (the standard's mt19937_64 format)
  // and the windows drawn so far.
  std::string engine_state() const;
  int64_t windows() const { return windows_; }
  // Continues from a position engine_state()/windows() gave. Throws std::invalid_argument when
  // `engine` is not an mt19937_64 state.
  void restore(const std::string &engine, int64_t windows);

 private:
  const TokenSplit *split_;
  std::mt19937_64 rng_;
  int64_t windows_ = 0;
};

// Evaluation windows of `len` + 1 tokens (inputs and shifted targets). `segments` non-overlapping
// segments of max_len + 1 tokens are placed evenly through the split's books (in proportion to their
// length; fewer if the books are too short, never across a book boundary); each segment is cut into
// max_len / len windows whose targets tile it, so every len that divides max_len is scored on the same
// target tokens. Returns (N, len + 1) int64. Throws when not even one segment fits.
at::Tensor eval_windows(const TokenSplit &split, int64_t len, int64_t max_len, int64_t segments);

}  // namespace ape
