// Checkpoint files: encoding, bounded parsing, validation against the model, loading.
#include "runtime/Checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include <ATen/ATen.h>

#include "ape/cpu/kernel_entry.h"
#include "ape/contract/value_rules.h"
#include "runtime/AtomicFile.h"
#include "runtime/Util.h"
#include "runtime/Options.h"

namespace fs = std::filesystem;

namespace ape {
namespace {

constexpr char kMagic[8] = {'A', 'P', 'E', 'C', 'K', 'P', 'T', '1'};
constexpr uint32_t kMaxNameLength = 4096;
constexpr uint8_t kMaxDims = 8;

// File dtype codes and their element sizes.
struct DTypeCode {
  uint8_t code;
  at::ScalarType type;
  size_t size;
  const char *name;
};
constexpr DTypeCode kDTypes[] = {{0, at::kFloat, 4, "f32"}, {1, at::kDouble, 8, "f64"},
                                 {2, at::kLong, 8, "i64"},  {3, at::kByte, 1, "u8"}};

const DTypeCode *by_code(uint8_t code) {
  for (const auto &d : kDTypes)
    if (d.code == code) return &d;
  return nullptr;
}
const DTypeCode *by_type(at::ScalarType t) {
  for (const auto &d : kDTypes)
    if (d.type == t) return &d;
  return nullptr;
}

template <typename T> void append(std::string &buf, const T &v) {
  buf.append(reinterpret_cast<const char *>(&v), sizeof(T));
}

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

bool is_training_state(const std::string &name) { return name.rfind("train/", 0) == 0; }

}  // namespace

// ---- the file -------------------------------------------------------------------------------------

const SavedTensor *Checkpoint::find(const std::string &name) const {
  for (const auto &t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

at::Tensor Checkpoint::tensor(const SavedTensor &t) const {
  at::Tensor out = at::empty(t.shape, at::TensorOptions().dtype(t.dtype));
  if (t.nbytes) std::memcpy(out.data_ptr(), bytes.data() + t.offset, t.nbytes);  // any alignment
  return out;
}

int64_t Checkpoint::model_elements() const {
  int64_t n = 0;
  for (const auto &t : tensors)
    if (!is_training_state(t.name) && t.dtype == at::kFloat) n += static_cast<int64_t>(t.nbytes / 4);
  return n;
}

std::string encode_checkpoint(const std::string &encoding, const nlohmann::json &config,
                              const std::vector<std::pair<std::string, at::Tensor>> &tensors) {
  const std::string cfg = config.dump();
  std::string buf(kMagic, 8);
  append(buf, kCheckpointVersion);
  append(buf, static_cast<uint32_t>(encoding.size()));
  buf += encoding;
  append(buf, static_cast<uint64_t>(cfg.size()));
  buf += cfg;
  append(buf, static_cast<uint64_t>(tensors.size()));
  std::set<std::string> names;
  for (const auto &[name, t0] : tensors) {
    if (name.empty() || name.size() > kMaxNameLength || !names.insert(name).second)
      throw std::logic_error("encode_checkpoint: bad or repeated tensor name '" + name + "'");
    const DTypeCode *d = by_type(t0.scalar_type());
    if (!d || t0.dim() > kMaxDims)
      throw std::logic_error("encode_checkpoint: tensor '" + name + "' has an unsupported dtype or rank");
    at::Tensor t = t0.detach().cpu().contiguous();
    append(buf, static_cast<uint32_t>(name.size()));
    buf += name;
    append(buf, d->code);
    append(buf, static_cast<uint8_t>(t.dim()));
    for (int64_t s : t.sizes()) append(buf, s);
    buf.append(static_cast<const char *>(t.data_ptr()), t.numel() * d->size);
  }
  append(buf, fnv1a(buf.data(), buf.size()));
  return buf;
}

std::vector<std::pair<std::string, at::Tensor>> model_tensors(LanguageModel &model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto &kv : model->named_parameters()) out.emplace_back(kv.key(), kv.value());
  for (const auto &kv : model->named_buffers()) out.emplace_back(kv.key(), kv.value());
  return out;
}

void save_checkpoint(const std::string &path, LanguageModel &model, const nlohmann::json &config_in) {
  nlohmann::json config = config_in;
  config["model"] = model->config().to_json();
  write_file_atomically(path, encode_checkpoint(model->config().encoding, config, model_tensors(model)),
                        "APE_TEST_KILL_DURING_CHECKPOINT");
}

bool is_checkpoint_file(const std::string &path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;  // (a FIFO's open would wait for a writer)
  std::ifstream in(path, std::ios::binary);
  char head[8] = {};
  return in && in.read(head, 8) && std::memcmp(head, kMagic, 8) == 0;
}

Checkpoint read_checkpoint(const std::string &path) {
  auto fail = [&](const std::string &why) { return std::runtime_error("checkpoint " + path + ": " + why); };
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw fail("is a folder, not a checkpoint file");
  // A pipe or device: its open can wait forever (a FIFO without a writer), and the tools read a
  // checkpoint more than once (a second read of a pipe found nothing: "bad magic number").
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec))
    throw fail("is not a regular file (a pipe or a device): save the checkpoint to a file first");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw fail(std::string("cannot open: ") + std::strerror(errno));
  Checkpoint c;
  c.path = path;
  {
    std::ostringstream ss;
    ss << f.rdbuf();
    c.bytes = ss.str();
  }
  const std::string &buf = c.bytes;
  size_t pos = 0;
  // Whether the last 8 bytes are the checksum of the rest: a structure that fails to parse then
  // says so too (a copy that converted line ends or changed a byte read as a nonsense rank or
  // dtype, which named the damage as if it were a writer's).
  // (Hashed only when a check fails: a good read hashes the file once, below.)
  auto sealed = [&] {
    uint64_t tail = 0;
    if (buf.size() >= 16) std::memcpy(&tail, buf.data() + buf.size() - 8, 8);
    return buf.size() >= 16 && tail == fnv1a(buf.data(), buf.size() - 8);
  };
  auto damaged = [&](const std::string &why) {
    return fail(why + (sealed() ? "" : "; its checksum does not match either: the file was damaged or cut short"));
  };
  // Every read is checked against what remains: a length field can never make us read (or
  // allocate) beyond the file.
  auto take = [&](size_t n, const std::string &what) {
    if (n > buf.size() - pos)
      throw damaged("truncated while reading " + what + " (file has " + std::to_string(buf.size()) +
                 " bytes); it was not written completely");
    const char *p = buf.data() + pos;
    pos += n;
    return p;
  };
  auto get = [&](auto &v, const std::string &what) { std::memcpy(&v, take(sizeof v, what), sizeof v); };

  if (buf.size() < 8 || std::memcmp(buf.data(), kMagic, 8) != 0)
    throw fail("not an APE checkpoint (bad magic number; expected \"APECKPT1\")");
  pos = 8;
  uint32_t version = 0, name_len = 0;
  get(version, "the version");
  if (version == 1)
    throw fail("format version 1 (written before resumable checkpoints); this build reads version " +
               std::to_string(kCheckpointVersion) + ": train again, or evaluate it with the build that wrote it");
  if (version != kCheckpointVersion)
    throw damaged("format version " + std::to_string(version) + ", this build reads version " +
               std::to_string(kCheckpointVersion));
  get(name_len, "the encoding name length");
  if (name_len == 0 || name_len > 1024) throw damaged("corrupt encoding name length " + std::to_string(name_len));
  c.encoding.assign(take(name_len, "the encoding name"), name_len);
  uint64_t cfg_len = 0, count = 0;
  get(cfg_len, "the config length");
  if (cfg_len > buf.size() - pos)
    throw damaged("truncated or damaged: the config needs " + std::to_string(cfg_len) + " bytes, " +
               std::to_string(buf.size() - pos) + " remain");
  const std::string cfg(take(cfg_len, "the config"), cfg_len);
  get(count, "the tensor count");
  if (count > (buf.size() - pos) / 6)  // a tensor takes at least 6 bytes
    throw damaged("truncated or damaged: " + std::to_string(count) + " tensors cannot fit in the " +
                  std::to_string(buf.size() - pos) + " bytes that remain");
  std::set<std::string> names;
  for (uint64_t i = 0; i < count; ++i) {
    const std::string where = "tensor " + std::to_string(i + 1) + " of " + std::to_string(count);
    SavedTensor t;
    uint32_t n = 0;
    get(n, "the name length of " + where);
    if (n == 0 || n > kMaxNameLength) throw damaged("corrupt name length " + std::to_string(n) + " of " + where);
    t.name.assign(take(n, "the name of " + where), n);
    if (!names.insert(t.name).second) throw damaged("tensor '" + printable(t.name) + "' appears twice (corrupt)");
    uint8_t code = 0, ndim = 0;
    get(code, "the dtype of '" + printable(t.name) + "'");
    get(ndim, "the rank of '" + printable(t.name) + "'");
    const DTypeCode *d = by_code(code);
    if (!d) throw damaged("tensor '" + printable(t.name) + "' has unknown dtype code " + std::to_string(code) + " (corrupt)");
    if (ndim > kMaxDims) throw damaged("tensor '" + printable(t.name) + "' has rank " + std::to_string(ndim) + " (corrupt)");
    t.dtype = d->type;
    uint64_t numel = 1;
    const uint64_t room = (buf.size() - pos) / d->size + 1;  // bounds numel; never overflows
    for (uint8_t k = 0; k < ndim; ++k) {
      int64_t s = 0;
      get(s, "the shape of '" + printable(t.name) + "'");
      if (s < 0) throw damaged("tensor '" + printable(t.name) + "' has a negative dimension (corrupt)");
      t.shape.push_back(s);
      if (s != 0 && numel > room / static_cast<uint64_t>(s)) numel = room;  // saturate: too big
      else numel *= static_cast<uint64_t>(s);
    }
    if (numel >= room || numel * d->size > buf.size() - pos)
      throw damaged("truncated or damaged: tensor '" + printable(t.name) + "' of shape " + shape_str(t.shape) +
                    " needs more bytes than remain");
    t.nbytes = numel * d->size;
    t.offset = pos;
    take(t.nbytes, "the elements of '" + printable(t.name) + "'");
    c.tensors.push_back(std::move(t));
  }
  const size_t body = pos;
  uint64_t checksum = 0;
  get(checksum, "the checksum");
  if (pos != buf.size()) throw damaged(std::to_string(buf.size() - pos) + " unexpected trailing bytes (corrupt)");
  if (checksum != fnv1a(buf.data(), body)) throw fail("checksum mismatch: the file is corrupt");
  try {
    c.config = nlohmann::json::parse(cfg);
  } catch (const std::exception &e) {
    throw fail(std::string("config is not valid JSON: ") + e.what());
  }
  if (!c.config.is_object() || !c.config.contains("model")) throw fail("config has no \"model\" section");
  return c;
}

ModelConfig checked_model_config(const Checkpoint &c) {
  auto fail = [&](const std::string &why) { return std::runtime_error("checkpoint " + c.path + ": " + why); };
  ModelConfig mc;
  try {
    mc = ModelConfig::from_json(c.config.at("model"));
  } catch (const std::exception &e) {
    throw fail(std::string("bad model config: ") + e.what());
  }
  if (mc.encoding != c.encoding)
    throw fail("header says encoding '" + c.encoding + "' but the config says '" + mc.encoding + "'");
  if (auto t = c.config.find("train"); t != c.config.end() && t->is_object() && t->contains("seq_len")) {
    const auto &L = t->at("seq_len");
    if (!L.is_number_integer()) throw fail("train.seq_len is not an integer: " + L.dump());
    try {
      require_in("--seq-len", L.get<int64_t>(), 1, ape_rules::kMaxLength);
    } catch (const std::exception &e) {
      throw fail(std::string("bad training config: ") + e.what());
    }
  }
  // The model the config describes must fit the values the file holds: a forged config cannot make
  // us allocate more than the file's size.
  if (mc.min_elements() > c.model_elements())
    throw fail("the config describes a model of at least " + std::to_string(mc.min_elements()) +
               " values (vocab " + std::to_string(mc.vocab) + ", d_model " + std::to_string(mc.d_model) +
               ", " + std::to_string(mc.layers) + " layers) but the file holds " +
               std::to_string(c.model_elements()) + ": the config is damaged or forged");
  return mc;
}

// ---- loading into a model ------------------------------------------------------------------------

void load_state(LanguageModel &model, const Checkpoint &ckpt, const std::string &path) {
  auto fail = [&](const std::string &why) { return std::runtime_error("checkpoint " + path + ": " + why); };
  const std::string enc = model->config().encoding;
  if (ckpt.encoding != enc)
    throw fail("it holds encoding '" + ckpt.encoding + "', but the model is '" + enc + "'");
  std::map<std::string, at::Tensor> mine;
  std::set<std::string> buffers;
  for (auto &[name, t] : model_tensors(model)) mine.emplace(name, t);
  for (const auto &kv : model->named_buffers()) buffers.insert(kv.key());
  // Nothing extra: a tensor the model does not have means another encoding's or layout's file.
  for (const auto &t : ckpt.tensors)
    if (!is_training_state(t.name) && !mine.count(t.name))
      throw fail("tensor '" + t.name + "' is not part of a '" + enc +
                 "' model: the file holds another encoding's or another layout's tensors");
  // Nothing missing, every shape and dtype right: all checked before anything is copied.
  std::vector<std::pair<at::Tensor, const SavedTensor *>> copies;
  for (auto &[name, t] : mine) {
    const SavedTensor *s = ckpt.find(name);
    if (!s) {
      // A fixed param the encoding gained after the checkpoint was written keeps its initial value.
      if (buffers.count(name)) continue;
      throw fail("missing tensor '" + name + "' (saved by a different model layout?)");
    }
    if (s->dtype != at::kFloat || at::IntArrayRef(s->shape) != t.sizes())
      throw fail("tensor '" + name + "' has shape " + shape_str(s->shape) + " " +
                 std::string(c10::toString(s->dtype)) + ", the model expects " + shape_str(t.sizes()) +
                 " Float (different --d-model/--heads/--kv-heads/--layers/vocab?)");
    copies.emplace_back(t, s);
  }
  // Values no model computes with, checked in the file before anything is copied (a refused file
  // leaves the model as it was): a NaN or an infinity (training stops before it saves one), or a
  // fixed param outside the range its spec's value was checked against (ape-eval --set's rule;
  // a param is saved as "shared_KEY" or "blockN.attn.KEY").
  const Manifest &m = model->manifest();
  for (auto &[t, s] : copies) {
    const at::Tensor v = ckpt.tensor(*s);
    if (!at::isfinite(v).all().item<bool>())
      throw fail("tensor '" + s->name + "' holds a NaN or an infinity: the file is damaged or was not written by a "
                 "finished step");
    for (const ParamSpec &p : m.params) {
      std::string key = p.name;  // as the model registers it (runtime/Model.cpp: '.' -> '_')
      for (char &ch : key)
        if (ch == '.') ch = '_';
      const std::string tail = ".attn." + key;
      const bool match = s->name == "shared_" + key ||
                         (s->name.size() > tail.size() &&
                          s->name.compare(s->name.size() - tail.size(), tail.size(), tail) == 0);
      if (!match || !p.fixed() || !p.range) continue;
      const at::Tensor d = v.to(at::kDouble).contiguous();
      for (int64_t x = 0; x < d.numel(); ++x)
        if (std::string why = p.range->check(d.data_ptr<double>()[x]); !why.empty())
          throw fail("fixed param '" + p.name + "' " + why + " (damaged or forged)");
    }
  }
  at::NoGradGuard no_grad;
  for (auto &[t, s] : copies) {
    TORCH_CHECK(t.is_contiguous() && t.scalar_type() == at::kFloat);
    if (t.device().is_cpu())
      std::memcpy(t.data_ptr(), ckpt.bytes.data() + s->offset, s->nbytes);
    else  // a model on a GPU: files are device-independent (written from CPU copies)
      t.copy_(ckpt.tensor(*s));
  }
}

std::vector<std::string> load_state_across(LanguageModel &model, const Checkpoint &ckpt, const std::string &path,
                                           const KernelEntry *source) {
  const std::string to = model->config().encoding, from = ckpt.encoding;
  auto fail = [&](const std::string &why) {
    return std::runtime_error("checkpoint " + path + " (trained with '" + from + "') loaded as '" + to +
                              "': " + why);
  };
  ModelConfig mc;
  try {
    mc = ModelConfig::from_json(ckpt.config.at("model"));
  } catch (const std::exception &e) {
    throw fail(std::string("bad model config: ") + e.what());
  }
  mc.encoding = from;
  // The checkpoint's own model, for the names and shapes of its trainable parameters.
  LanguageModel trained{nullptr};
  try {
    trained = source ? LanguageModel(*source, mc) : LanguageModel(mc);
  } catch (const std::exception &e) {
    throw fail(e.what());
  }
  const auto was = trained->named_parameters(), now = model->named_parameters();
  for (const auto &kv : now) {
    const at::Tensor *t = was.find(kv.key());
    if (!t)
      throw fail("trainable parameter '" + kv.key() + "' of '" + to + "' is not in the checkpoint ('" + from +
                 "' has no such parameter)");
    if (t->sizes() != kv.value().sizes())
      throw fail("trainable parameter '" + kv.key() + "' has shape " + shape_str(t->sizes()) + " in the checkpoint, " +
                 shape_str(kv.value().sizes()) + " in '" + to + "'");
  }
  for (const auto &kv : was)
    if (!now.find(kv.key()))
      throw fail("the checkpoint's trainable parameter '" + kv.key() + "' has no place in '" + to + "'");
  // The file against its own encoding's model: the same checks as load_state.
  load_state(trained, ckpt, path);

  at::NoGradGuard no_grad;
  for (auto &kv : now) kv.value().copy_(was[kv.key()]);
  std::vector<std::string> kept;
  const auto old_buffers = trained->named_buffers();
  for (auto &kv : model->named_buffers()) {
    const at::Tensor *saved = old_buffers.find(kv.key());
    if (saved && ckpt.find(kv.key()) && saved->sizes() == kv.value().sizes())
      kv.value().copy_(*saved);
    else
      kept.push_back(kv.key());
  }
  return kept;
}

LanguageModel load_model(const std::string &path, nlohmann::json *config) {
  Checkpoint c = read_checkpoint(path);
  ModelConfig mc = checked_model_config(c);
  LanguageModel model{nullptr};
  try {
    model = LanguageModel(mc);  // registry lookup: unknown encoding -> error listing the names
  } catch (const std::exception &e) {
    throw std::runtime_error("checkpoint " + path + ": " + e.what());
  }
  load_state(model, c, path);
  if (config) *config = c.config;
  return model;
}

LanguageModel load_model_as(const std::string &path, const std::string &encoding, nlohmann::json *config,
                            std::vector<std::string> *kept) {
  Checkpoint c = read_checkpoint(path);
  ModelConfig mc = checked_model_config(c);
  if (encoding.empty() || encoding == c.encoding) {
    if (kept) kept->clear();
    LanguageModel model{nullptr};
    try {
      model = LanguageModel(mc);
    } catch (const std::exception &e) {
      throw std::runtime_error("checkpoint " + path + ": " + e.what());
    }
    load_state(model, c, path);
    if (config) *config = c.config;
    return model;
  }
  mc.encoding = encoding;
  LanguageModel model{nullptr};
  try {
    model = LanguageModel(mc);
  } catch (const std::exception &e) {
    throw std::runtime_error("checkpoint " + path + " loaded as '" + encoding + "': " + e.what());
  }
  auto k = load_state_across(model, c, path);
  if (kept) *kept = std::move(k);
  if (config) *config = c.config;
  return model;
}

}  // namespace ape
