// Tokenizer: SentencePiece through the ape-spm helper process (runtime/SentencePieceTool.cpp says
// why it cannot be linked next to LibTorch). Plain C++, no LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ape {

// The helper: $APE_SPM_TOOL if set, else the one this build made, else ape-spm next to the
// running executable.
std::string spm_tool_path();

// Trains a model with SentencePiece flags (e.g. "--input=a.txt,b.txt", "--model_prefix=m",
// "--vocab_size=4096"); the helper's output goes to log_path. Throws std::runtime_error (with the
// end of the log) on failure.
void spm_train(const std::vector<std::string> &flags, const std::string &log_path);

struct EncodedBooks {
  int32_t pieces = 0;  // vocabulary size of the model
  int32_t eos = -1;    // the paragraph-break id
  std::vector<std::vector<int32_t>> books;
};

// Encodes each book (paragraphs joined per line, </s> after each paragraph). `scratch` is a
// temporary file for the helper's output (removed afterwards). Throws std::runtime_error.
EncodedBooks spm_encode_books(const std::string &model, const std::vector<std::string> &books,
                              const std::string &scratch, const std::string &log_path);

// The text of `ids` (a </s> id is a paragraph break: a blank line). `scratch` is a prefix for
// temporary files (removed afterwards). Throws std::runtime_error (e.g. an id outside the
// vocabulary, with the helper's message).
std::string spm_decode(const std::string &model, const std::vector<int32_t> &ids, const std::string &scratch,
                       const std::string &log_path);

}  // namespace ape
