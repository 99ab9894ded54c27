// Loads libape_spm.so once with dlopen(RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND) and calls its C ABI.
#include "runtime/Tokenizer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <stdexcept>

#ifndef APE_SPM_PLUGIN
#define APE_SPM_PLUGIN ""
#endif

namespace ape {
namespace {

struct Plugin {
  int (*train)(const char *, char *, size_t) = nullptr;
  void *(*load)(const char *, char *, size_t) = nullptr;
  void (*free)(void *) = nullptr;
  void (*info)(void *, int *, int *, int *) = nullptr;
  int (*encode)(void *, const char *, size_t, const int **, size_t *, char *, size_t) = nullptr;
};

std::string exe_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.parent_path().string();
}

const Plugin &plugin() {
  static std::once_flag once;
  static Plugin p;
  static std::string error;
  std::call_once(once, [] {
    const std::string path = Tokenizer::plugin_path();
    void *h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!h) {
      const char *e = ::dlerror();
      error = "cannot load the SentencePiece plugin '" + path + "': " + (e ? e : "unknown error") +
              " (build the ape_spm target, or point APE_SPM_PLUGIN at libape_spm.so)";
      return;
    }
    auto sym = [&](const char *name) {
      void *s = ::dlsym(h, name);
      if (!s && error.empty()) error = "SentencePiece plugin '" + path + "' lacks symbol " + name;
      return s;
    };
    auto abi = reinterpret_cast<int (*)()>(sym("ape_spm_abi_version"));
    p.train = reinterpret_cast<decltype(p.train)>(sym("ape_spm_train"));
    p.load = reinterpret_cast<decltype(p.load)>(sym("ape_spm_load"));
    p.free = reinterpret_cast<decltype(p.free)>(sym("ape_spm_free"));
    p.info = reinterpret_cast<decltype(p.info)>(sym("ape_spm_info"));
    p.encode = reinterpret_cast<decltype(p.encode)>(sym("ape_spm_encode"));
    if (error.empty() && abi() != 1)
      error = "SentencePiece plugin '" + path + "' has ABI version " + std::to_string(abi()) + ", expected 1";
  });
  if (!error.empty()) throw std::runtime_error(error);
  return p;
}

}  // namespace

std::string Tokenizer::plugin_path() {
  if (const char *env = std::getenv("APE_SPM_PLUGIN"); env && *env) return env;
  std::error_code ec;
  if (std::string(APE_SPM_PLUGIN).size() && std::filesystem::exists(APE_SPM_PLUGIN, ec)) return APE_SPM_PLUGIN;
  const std::string local = exe_dir() + "/libape_spm.so";
  if (std::filesystem::exists(local, ec)) return local;
  return std::string(APE_SPM_PLUGIN).empty() ? local : std::string(APE_SPM_PLUGIN);
}

void Tokenizer::train(const std::string &args) {
  char err[1024] = {0};
  if (plugin().train(args.c_str(), err, sizeof err) != 0)
    throw std::runtime_error(std::string("SentencePiece training failed: ") + err);
}

Tokenizer::Tokenizer(const std::string &model_path) : path_(model_path) {
  char err[1024] = {0};
  handle_ = plugin().load(model_path.c_str(), err, sizeof err);
  if (!handle_) throw std::runtime_error("cannot load tokenizer " + model_path + ": " + err);
  plugin().info(handle_, &piece_size_, &eos_id_, &unk_id_);
}

Tokenizer::~Tokenizer() {
  if (handle_) plugin().free(handle_);
}

std::vector<int> Tokenizer::encode(const std::string &text) const {
  const int *ids = nullptr;
  size_t n = 0;
  char err[1024] = {0};
  if (plugin().encode(handle_, text.data(), text.size(), &ids, &n, err, sizeof err) != 0)
    throw std::runtime_error("tokenizer " + path_ + ": encoding failed: " + err);
  return std::vector<int>(ids, ids + n);
}

}  // namespace ape
