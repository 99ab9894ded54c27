// The SentencePiece plugin (module libape_spm.so): a C ABI over SentencePiece, loaded by
// runtime/Tokenizer.cpp with dlopen(RTLD_LOCAL | RTLD_DEEPBIND).
//
// Why a plugin: Debian's libsentencepiece.so.0 carries its own copy of protobuf-lite and exports
// it, while LibTorch loads the system libprotobuf.so.32. Linked into one program the two copies
// interpose each other and the process crashes before main() (in protobuf's static initialisers).
// Loaded locally and deep-bound, SentencePiece keeps its protobuf and LibTorch keeps the system one.
// This file must not include LibTorch or protobuf headers other than SentencePiece's.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {
void set_error(char *err, size_t n, const std::string &msg) {
  if (!err || n == 0) return;
  std::strncpy(err, msg.c_str(), n - 1);
  err[n - 1] = '\0';
}
}  // namespace

extern "C" {

int ape_spm_abi_version() { return 1; }

// Trains a model from SentencePiece command-line style arguments; 0 on success.
int ape_spm_train(const char *args, char *err, size_t err_len) {
  try {
    auto st = sentencepiece::SentencePieceTrainer::Train(args);
    if (!st.ok()) {
      set_error(err, err_len, st.ToString());
      return 1;
    }
    return 0;
  } catch (const std::exception &e) {
    set_error(err, err_len, e.what());
    return 1;
  }
}

// Loads a model; returns a handle (nullptr on failure, with the reason in err).
void *ape_spm_load(const char *model_path, char *err, size_t err_len) {
  auto *sp = new sentencepiece::SentencePieceProcessor();
  auto st = sp->Load(model_path);
  if (!st.ok()) {
    set_error(err, err_len, st.ToString());
    delete sp;
    return nullptr;
  }
  return sp;
}

void ape_spm_free(void *handle) { delete static_cast<sentencepiece::SentencePieceProcessor *>(handle); }

void ape_spm_info(void *handle, int *piece_size, int *eos_id, int *unk_id) {
  auto *sp = static_cast<sentencepiece::SentencePieceProcessor *>(handle);
  *piece_size = sp->GetPieceSize();
  *eos_id = sp->eos_id();
  *unk_id = sp->unk_id();
}

// Encodes text; *ids points into a per-thread buffer valid until this thread's next call.
// Returns 0 on success. Thread-safe for one handle (Encode is const).
int ape_spm_encode(void *handle, const char *text, size_t len, const int **ids, size_t *count, char *err,
                   size_t err_len) {
  thread_local std::vector<int> buffer;
  auto *sp = static_cast<sentencepiece::SentencePieceProcessor *>(handle);
  buffer.clear();
  auto st = sp->Encode(absl::string_view(text, len), &buffer);
  if (!st.ok()) {
    set_error(err, err_len, st.ToString());
    return 1;
  }
  *ids = buffer.data();
  *count = buffer.size();
  return 0;
}

}  // extern "C"
