// Runs ape-spm and reads back what it wrote.
#include "runtime/Tokenizer.h"

#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "runtime/Util.h"

#ifndef APE_SPM_TOOL
#define APE_SPM_TOOL ""
#endif

namespace fs = std::filesystem;

namespace ape {
namespace {

std::string log_tail(const std::string &path) {
  std::ifstream f(path);
  std::ostringstream s;
  s << f.rdbuf();
  std::string t = s.str();
  if (t.size() > 600) t = "..." + t.substr(t.size() - 600);
  return t;
}

// Runs argv with its output in log_path (run_process: a Ctrl-C or SIGTERM is a stop, ape::Stopped,
// not the helper's failure; the helper dies with its caller).
void run(const std::vector<std::string> &argv, const std::string &log_path, const std::string &what) {
  std::error_code ec;
  int status = 0;
  try {
    status = run_process(argv, what, nullptr, log_path);
  } catch (const Stopped &) {
    fs::remove(log_path, ec);  // a stop is no failure: nothing in the log to read
    throw;
  }
  if (status == 0 && fs::file_size(log_path, ec) == 0 && !ec) fs::remove(log_path, ec);  // nothing to keep
  if (status != 0) {
    // A full disk (the cache's): the helper's own message may be lost with its log (written to
    // the same disk), so its state is said here.
    const fs::path folder = fs::path(log_path).parent_path();
    const fs::space_info room = fs::space(folder.empty() ? fs::path(".") : folder, ec);
    if (!ec && room.available < (std::uintmax_t(1) << 20))
      throw std::runtime_error(what + " failed: the disk of " + folder.string() + " is full (" +
                               std::to_string(room.available >> 10) + " KiB free; free some space, or give --cache-dir "
                               "another folder) (" + argv[0] + " " + system_status_text(status) + "; log " + log_path +
                               "):\n" + log_tail(log_path));
    throw std::runtime_error(what + " failed (" + argv[0] + " " +
                             (WIFEXITED(status) && WEXITSTATUS(status) == 127 ? std::string("could not be run")
                                                                              : system_status_text(status)) +
                             "; log " + log_path + "):\n" + log_tail(log_path));
  }
}

}  // namespace

std::string spm_tool_path() {
  if (const char *env = std::getenv("APE_SPM_TOOL"); env && *env) return env;
  std::error_code ec;
  const std::string built = APE_SPM_TOOL;
  if (!built.empty() && fs::exists(built, ec)) return built;
  auto exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && fs::exists(exe.parent_path() / "ape-spm", ec)) return (exe.parent_path() / "ape-spm").string();
  throw std::runtime_error("cannot find the SentencePiece helper ape-spm (looked at '" + built +
                           "' and next to this program); build the ape-spm target or set APE_SPM_TOOL");
}

void spm_train(const std::vector<std::string> &flags, const std::string &log_path) {
  std::vector<std::string> argv{spm_tool_path(), "train"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  run(argv, log_path, "SentencePiece training");
}

EncodedBooks spm_encode_books(const std::string &model, const std::vector<std::string> &books,
                              const std::string &scratch, const std::string &log_path) {
  std::vector<std::string> argv{spm_tool_path(), "encode", model, scratch};
  argv.insert(argv.end(), books.begin(), books.end());
  std::error_code ec;
  try {
    run(argv, log_path, "tokenizing with " + model);
  } catch (...) {
    fs::remove(scratch, ec);  // what the helper wrote before it failed or was stopped
    throw;
  }

  std::ifstream f(scratch, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  const std::string buf = ss.str();
  fs::remove(scratch, ec);
  size_t pos = 0;
  auto take = [&](void *dst, size_t n) {
    if (pos + n > buf.size()) throw std::runtime_error("ape-spm wrote a truncated " + scratch);
    std::memcpy(dst, buf.data() + pos, n);
    pos += n;
  };
  char magic[8];
  take(magic, 8);
  if (std::memcmp(magic, "APESPMI1", 8) != 0) throw std::runtime_error("ape-spm wrote an unexpected " + scratch);
  EncodedBooks out;
  uint64_t n = 0;
  take(&out.pieces, 4);
  take(&out.eos, 4);
  take(&n, 8);
  if (n != books.size()) throw std::runtime_error("ape-spm encoded " + std::to_string(n) + " books, expected " +
                                                  std::to_string(books.size()));
  for (uint64_t b = 0; b < n; ++b) {
    uint64_t len = 0;
    take(&len, 8);
    if (len > (buf.size() - pos) / 4) throw std::runtime_error("ape-spm wrote a truncated " + scratch);
    std::vector<int32_t> ids(len);
    take(ids.data(), len * 4);
    out.books.push_back(std::move(ids));
  }
  return out;
}

std::string spm_decode(const std::string &model, const std::vector<int32_t> &ids, const std::string &scratch,
                       const std::string &log_path) {
  const std::string in = scratch + ".ids", out = scratch + ".txt";
  {
    std::ofstream f(in, std::ios::trunc);
    for (int32_t id : ids) f << id << '\n';
    f.close();
    if (!f) throw std::runtime_error("cannot write " + in + " (a full disk?)");
  }
  std::error_code ec;
  try {
    run({spm_tool_path(), "decode", model, in, out}, log_path, "detokenizing with " + model);
  } catch (...) {
    fs::remove(in, ec);
    fs::remove(out, ec);
    throw;
  }
  std::ifstream f(out, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  fs::remove(in, ec);
  fs::remove(out, ec);
  return ss.str();
}

}  // namespace ape
