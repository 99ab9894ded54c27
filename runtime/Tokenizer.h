// Tokenizer: SentencePiece, reached through the libape_spm.so plugin (see SentencePiecePlugin.cpp
// for why it cannot be linked directly next to LibTorch). Plain C++, no LibTorch.
#pragma once

#include <string>
#include <vector>

namespace ape {

class Tokenizer {
 public:
  // Trains a model (SentencePiece command-line style arguments, e.g. "--input=a.txt,b.txt
  // --model_prefix=m --vocab_size=4096 --model_type=bpe"). Throws std::runtime_error.
  static void train(const std::string &args);

  explicit Tokenizer(const std::string &model_path);  // throws std::runtime_error naming the path
  ~Tokenizer();
  Tokenizer(const Tokenizer &) = delete;
  Tokenizer &operator=(const Tokenizer &) = delete;

  std::vector<int> encode(const std::string &text) const;  // thread-safe
  int piece_size() const { return piece_size_; }
  int eos_id() const { return eos_id_; }
  int unk_id() const { return unk_id_; }

  // Where the plugin is looked for: $APE_SPM_PLUGIN, the build's libape_spm.so, then next to
  // the running executable.
  static std::string plugin_path();

 private:
  void *handle_ = nullptr;
  std::string path_;
  int piece_size_ = 0, eos_id_ = -1, unk_id_ = 0;
};

}  // namespace ape
