// Checkpoint: the file ape-train writes (periodically and at the end) and ape-eval reads.
//
// Format version 2 (host byte order; little-endian on every supported machine):
//   "APECKPT1"                 magic
//   u32 version                2
//   u32 n, encoding name       n in [1, 1024]
//   u64 n, config JSON         {"model": ModelConfig, "train": TrainConfig, "state": the training
//                              state (Train.h), "result", "data": {vocab, tokenizer_fnv}, and
//                              for an encoding trained with --spec "spec": {name, path, fnv,
//                              text} (SpecLibrary.h)}
//   u64 count                  tensors, then per tensor:
//     u32 n, name              n in [1, 4096]
//     u8 dtype, u8 ndim        dtype 0 f32, 1 f64, 2 i64, 3 u8; ndim <= 8
//     ndim x i64 dims          each >= 0
//     elements                 row-major, numel x the dtype's size
//   u64 FNV-1a                 of every byte before
// Tensors: every parameter and buffer of the model by its dotted name ("block0.attn.wq.weight"),
// and with a training state the optimizer and random state under "train/" (Train.h).
//
// Reading checks, before anything is allocated beyond the file itself: the envelope (magic,
// version, lengths, checksum), every tensor header against the bytes that remain, the config's
// ranges (Options.h; a forged `seq_len = 0` or `layers = 10^9` is refused), and that the model the
// config describes fits the tensors the file holds. Loading into a model then checks every tensor
// against the model of the encoding in the header: names, shapes and dtypes, nothing missing,
// nothing extra. Files are written with write_file_atomically (AtomicFile.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "runtime/Model.h"

namespace ape {
struct KernelEntry;

constexpr uint32_t kCheckpointVersion = 2;

// One tensor of a checkpoint file: where its elements are, not a copy of them.
struct SavedTensor {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  size_t offset = 0;  // of its first element in Checkpoint::bytes
  size_t nbytes = 0;
};

struct Checkpoint {
  std::string path;      // for messages
  std::string encoding;  // the header's
  nlohmann::json config;
  std::string bytes;                 // the whole file
  std::vector<SavedTensor> tensors;  // in file order

  const SavedTensor *find(const std::string &name) const;  // nullptr when absent
  at::Tensor tensor(const SavedTensor &t) const;          // a copy of its elements
  // The number of f32 elements outside "train/" (the model's).
  int64_t model_elements() const;
};

// The file's bytes for `encoding`, `config` and `tensors` (names unique; f32, f64, i64 or u8).
std::string encode_checkpoint(const std::string &encoding, const nlohmann::json &config,
                              const std::vector<std::pair<std::string, at::Tensor>> &tensors);

// Every parameter and buffer of `model` by dotted name.
std::vector<std::pair<std::string, at::Tensor>> model_tensors(LanguageModel &model);

// Writes the model alone (no training state) atomically. `config` gets "model" from the model.
void save_checkpoint(const std::string &path, LanguageModel &model, const nlohmann::json &config);

// Reads and checks the envelope and the tensor table. Throws std::runtime_error
// "checkpoint <path>: <what is wrong>" for a missing, foreign, truncated or corrupt file.
Checkpoint read_checkpoint(const std::string &path);

// Whether `path` is a file that starts as a checkpoint does (its magic number): an output that
// must not be written over by anything but a checkpoint (e.g. ape-eval --csv).
bool is_checkpoint_file(const std::string &path);

// The checkpoint's model config, validated (ranges of Options.h) and checked against the header
// and the tensors the file holds, before any model is built. Throws "checkpoint <path>: ...".
ModelConfig checked_model_config(const Checkpoint &ckpt);

// Copies the checkpoint's tensors into `model` (same encoding). Every tensor must be one of the
// model's, with its shape and dtype f32, and every parameter must be there; a buffer the checkpoint
// lacks (a fixed param added to the encoding since) keeps its init. Tensors under "train/" are the
// training state's (Train.h) and are not looked at here.
void load_state(LanguageModel &model, const Checkpoint &ckpt, const std::string &path = "<checkpoint>");

// Reads a checkpoint and rebuilds its model through the kernel registry.
LanguageModel load_model(const std::string &path, nlohmann::json *config = nullptr);

// Loads a checkpoint trained with one encoding into `model`, built from the same model config with
// another kernel (e.g. a rope checkpoint evaluated with rope_yarn). Every trainable parameter must
// match in name and shape (else an error naming the first mismatch); buffers the checkpoint holds
// with the same name and shape are copied, the others keep the model's (new encoding's) initial
// values; their names are returned. `source` is the checkpoint's kernel (default: the registry's).
std::vector<std::string> load_state_across(LanguageModel &model, const Checkpoint &ckpt,
                                           const std::string &path = "<checkpoint>",
                                           const KernelEntry *source = nullptr);

// Reads a checkpoint and builds its model with the kernel `encoding` (through the registry);
// the same as load_model when `encoding` is the checkpoint's. `kept` gets the buffers that keep
// the new encoding's initial values.
LanguageModel load_model_as(const std::string &path, const std::string &encoding,
                            nlohmann::json *config = nullptr, std::vector<std::string> *kept = nullptr);

}  // namespace ape
