// The corpus pipeline: unpack once, train the tokenizer once, tokenize each split once.
#include "runtime/Data.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include <ATen/ATen.h>

#include "runtime/AtomicFile.h"
#include "runtime/Tokenizer.h"
#include "runtime/Util.h"

#ifndef APE_SOURCE_DIR
#define APE_SOURCE_DIR "."
#endif
#ifndef APE_BINARY_DIR
#define APE_BINARY_DIR "."
#endif

namespace fs = std::filesystem;

namespace ape {

std::string default_data_dir() { return std::string(APE_SOURCE_DIR) + "/data/pg30"; }
std::string default_cache_dir() { return std::string(APE_BINARY_DIR) + "/cache"; }

void TokenSplit::add_doc(const std::string &name, const std::vector<int32_t> &doc_ids) {
  names.push_back(name);
  ids.insert(ids.end(), doc_ids.begin(), doc_ids.end());
  offsets.push_back(static_cast<int64_t>(ids.size()));
}

// ---- token cache files ----------------------------------------------------------------------------

namespace {
constexpr char kTokenMagic[8] = {'A', 'P', 'E', 'T', 'O', 'K', 'S', '\0'};

template <typename T> void put(std::ostream &o, const T &v) {
  o.write(reinterpret_cast<const char *>(&v), sizeof(T));
}

// Writes what `fill` writes to `path`, atomically and durably (AtomicFile.h).
template <typename Fill> void atomic_write(const std::string &path, Fill fill) {
  std::ostringstream o;
  fill(o);
  write_file_atomically(path, o.str(), nullptr, /*cache=*/true);
}
}  // namespace

void write_token_cache(const std::string &path, const TokenSplit &split, uint32_t vocab,
                       uint64_t fingerprint) {
  atomic_write(path, [&](std::ostream &o) {
    o.write(kTokenMagic, 8);
    put(o, kTokenCacheVersion);
    put(o, vocab);
    put(o, fingerprint);
    put(o, static_cast<uint64_t>(split.num_docs()));
    put(o, static_cast<uint64_t>(split.size()));
    for (int64_t i = 0; i < split.num_docs(); ++i) {
      put(o, static_cast<uint32_t>(split.names[i].size()));
      o.write(split.names[i].data(), split.names[i].size());
      put(o, static_cast<uint64_t>(split.doc_size(i)));
    }
    const size_t bytes = split.ids.size() * sizeof(int32_t);
    o.write(reinterpret_cast<const char *>(split.ids.data()), bytes);
    put(o, fnv1a(split.ids.data(), bytes));
  });
}

TokenSplit read_token_cache(const std::string &path, uint32_t vocab, uint64_t fingerprint) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw CacheError("token cache " + path + " does not exist yet");
  const uint64_t file_size = fs::file_size(path, ec);
  if (ec) throw CacheError("token cache " + path + ": cannot stat: " + ec.message());
  std::ifstream f(path, std::ios::binary);
  if (!f) throw CacheError("token cache " + path + ": cannot open: " + std::strerror(errno));
  auto fail = [&](const std::string &why) -> CacheError { return CacheError("token cache " + path + ": " + why); };
  uint64_t consumed = 0;
  auto get = [&](void *dst, uint64_t n, const char *what) {
    if (consumed + n > file_size)
      throw fail(std::string("truncated while reading ") + what + " (file has " +
                 std::to_string(file_size) + " bytes)");
    f.read(static_cast<char *>(dst), static_cast<std::streamsize>(n));
    if (!f) throw fail(std::string("read error in ") + what);
    consumed += n;
  };
  char magic[8];
  get(magic, 8, "the magic number");
  if (std::memcmp(magic, kTokenMagic, 8) != 0)
    throw fail("not an APE token cache (bad magic number)");
  uint32_t version = 0, file_vocab = 0;
  uint64_t file_fp = 0, docs = 0, count = 0;
  get(&version, 4, "the version");
  if (version != kTokenCacheVersion)
    throw fail("format version " + std::to_string(version) + ", this build reads version " +
               std::to_string(kTokenCacheVersion));
  get(&file_vocab, 4, "the vocabulary size");
  if (file_vocab != vocab)
    throw fail("built for vocabulary " + std::to_string(file_vocab) + ", need " + std::to_string(vocab));
  get(&file_fp, 8, "the fingerprint");
  if (file_fp != fingerprint) throw fail("stale (tokenizer or books changed since it was written)");
  get(&docs, 8, "the book count");
  get(&count, 8, "the token count");
  if (docs > (file_size - consumed) / 12 || count > (file_size - consumed) / 4)
    throw fail("header claims " + std::to_string(docs) + " books and " + std::to_string(count) +
               " tokens, more than the file holds (truncated or corrupt)");
  TokenSplit s;
  uint64_t total = 0;
  for (uint64_t i = 0; i < docs; ++i) {
    uint32_t len = 0;
    get(&len, 4, "a book name length");
    if (len > 4096) throw fail("corrupt book name length " + std::to_string(len));
    std::string name(len, '\0');
    get(name.data(), len, "a book name");
    uint64_t n = 0;
    get(&n, 8, "a book length");
    total += n;
    if (total > count) throw fail("book lengths exceed the token count (corrupt)");
    s.names.push_back(name);
    s.offsets.push_back(static_cast<int64_t>(total));
  }
  if (total != count) throw fail("book lengths do not add up to the token count (corrupt)");
  s.ids.resize(count);
  get(s.ids.data(), count * 4, "the token ids");
  uint64_t checksum = 0;
  get(&checksum, 8, "the checksum");
  if (consumed != file_size)
    throw fail(std::to_string(file_size - consumed) + " unexpected trailing bytes (corrupt)");
  if (checksum != fnv1a(s.ids.data(), count * 4)) throw fail("checksum mismatch (corrupt)");
  for (int32_t id : s.ids)
    if (id < 0 || uint32_t(id) >= vocab) throw fail("token id " + std::to_string(id) + " out of range");
  return s;
}

// ---- corpus ---------------------------------------------------------------------------------------------

namespace {

// Removes the temporaries `<name>.tmp.<pid>...` in `dir` of processes that no longer run (a run
// killed while unpacking the books or training the tokenizer left them: tens of MB each).
void remove_dead_temporaries(const fs::path &dir, const std::string &name) {
  const std::string head = name + ".tmp.";
  std::error_code ec;
  for (const auto &e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(head, 0) != 0) continue;
    const long pid = std::strtol(n.c_str() + head.size(), nullptr, 10);
    if (pid > 0 && pid != ::getpid() && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      fs::remove_all(e.path(), ec);
  }
}

// Returns the folder holding the pg<ID>_*.txt books: <data>/clean if present, else the archive
// unpacked (once) into <cache>/pg30/clean.
std::string text_dir(const DataOptions &o, std::ostream &log) {
  if (fs::is_directory(fs::path(o.data_dir) / "clean")) return (fs::path(o.data_dir) / "clean").string();
  const std::string archive = (fs::path(o.data_dir) / "clean.tar.xz").string();
  if (!fs::exists(archive))
    throw std::runtime_error("corpus archive " + archive + " is missing (expected in the data folder " +
                             o.data_dir + "; pass --data DIR)");
  const std::string bytes = read_file(archive);
  const std::string stamp = std::to_string(bytes.size()) + ":" + std::to_string(fnv1a(bytes.data(), bytes.size()));
  const fs::path dest = fs::path(o.cache_dir) / "pg30";
  const fs::path marker = dest / ".unpacked";
  auto unpacked = [&] {
    if (!fs::is_directory(dest / "clean") || !fs::exists(marker)) return false;
    std::ifstream m(marker);
    std::string got;
    std::getline(m, got);
    return got == stamp;
  };
  if (unpacked()) return (dest / "clean").string();
  // One process at a time unpacks (as it makes the tokenizer and the token caches): two runs on a
  // fresh cache each unpacked it, and the second's replacing the folder pulled the books from
  // under the first. The waiter then finds it unpacked.
  fs::create_directories(o.cache_dir);
  const FileLock lock((fs::path(o.cache_dir) / "pg30.lock").string(), /*unless_read_only=*/true);
  if (unpacked()) return (dest / "clean").string();
  if (!lock.held())
    throw std::runtime_error("the cache folder " + o.cache_dir + " is read-only and holds no unpacked corpus for " +
                             archive + ": pass a writable --cache-dir");
  log << "[data] unpacking " << archive << " into " << dest.string() << "\n";
  remove_dead_temporaries(o.cache_dir, "pg30");
  const fs::path tmp = fs::path(o.cache_dir) / ("pg30.tmp." + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp);
  const std::vector<std::string> argv{"tar", "-xJf", archive, "-C", tmp.string()};
  std::string said;
  int rc = 0;
  try {  // (run_process: a Ctrl-C is a stop, not a corrupt archive; tar dies with its caller)
    rc = run_process(argv, "unpacking " + archive, &said);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  if (rc != 0 || !fs::is_directory(tmp / "clean")) {
    fs::remove_all(tmp, ec);
    const std::string cmd = "tar -xJf " + shell_quote(archive) + " -C " + shell_quote(tmp.string());
    const std::string what = rc == 0 ? "exited with status 0" : system_status_text(rc);
    const bool full = said.find("No space left on device") != std::string::npos ||
                      said.find("Disk quota exceeded") != std::string::npos;
    throw std::runtime_error("cannot unpack corpus archive " + archive + " (`" + cmd + "` " + what +
                             (rc == 0 ? ", but the archive holds no clean/ folder" : "") + "); " +
                             (full ? "the disk of " + dest.parent_path().string() +
                                         " is full (free some space, or give --cache-dir another folder)"
                                   : std::string("the archive is missing, corrupt, or xz is not installed")) +
                             (said.empty() ? std::string() : ": " + said.substr(0, 600)));
  }
  std::ofstream(tmp / ".unpacked") << stamp << "\n";
  fs::remove_all(dest, ec);
  fs::rename(tmp, dest);
  return (dest / "clean").string();
}


// id -> split from SPLITS.tsv ("id<TAB>split", with a header line).
std::vector<std::pair<std::string, std::string>> read_splits(const std::string &path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read the split list " + path + " (pass --data DIR pointing at data/pg30)");
  std::vector<std::pair<std::string, std::string>> out;
  std::map<std::string, int> seen;  // id -> its line
  std::string line;
  int lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (lineno == 1 && line.rfind("id", 0) == 0)) continue;
    auto tab = line.find('\t');
    if (tab == std::string::npos)
      throw std::runtime_error(path + ":" + std::to_string(lineno) + ": expected `id<TAB>split`, got `" + printable(line) +
                               "`");
    std::string split = line.substr(tab + 1);
    if (split != "train" && split != "valid" && split != "test")
      throw std::runtime_error(path + ":" + std::to_string(lineno) + ": unknown split `" + printable(split) + "`");
    const std::string id = line.substr(0, tab);
    // A book listed twice would be trained on and scored as held out, or counted twice.
    if (auto it = seen.find(id); it != seen.end())
      throw std::runtime_error(path + ":" + std::to_string(lineno) + ": book " + printable(id) + " is listed again (line " +
                               std::to_string(it->second) + "): each book belongs to one split, once");
    seen.emplace(id, lineno);
    out.emplace_back(id, split);
  }
  return out;
}

// pg<ID>_*.txt in dir.
std::string find_book(const std::string &dir, const std::string &id) {
  const std::string prefix = "pg" + id + "_";
  for (const auto &e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(prefix, 0) == 0 && e.path().extension() == ".txt") return e.path().string();
  }
  throw std::runtime_error("book " + id + " (listed in SPLITS.tsv) has no file " + prefix + "*.txt in " + dir);
}

// Protocol-buffer wire format: the field at `pos` (its number, wire type and where its payload
// starts), pos moved past it; false where the bytes end inside it or it is a group (not in a
// ModelProto).
bool next_field(const std::string &b, size_t &pos, uint64_t &number, int &wire_type, size_t &payload) {
  auto varint = [&](uint64_t &v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= b.size()) return false;
      const auto c = static_cast<uint8_t>(b[pos++]);
      v |= uint64_t(c & 0x7f) << shift;
      if (!(c & 0x80)) return true;
    }
    return false;
  };
  uint64_t key = 0, v = 0;
  if (!varint(key)) return false;
  number = key >> 3, wire_type = static_cast<int>(key & 7);
  payload = pos;
  switch (wire_type) {
    case 0: return varint(v);
    case 1: return b.size() - pos >= 8 && (pos += 8, true);
    case 2: return varint(v) && v <= b.size() - pos && (payload = pos, pos += v, true);
    case 5: return b.size() - pos >= 4 && (pos += 4, true);
    default: return false;
  }
}

}  // namespace

std::string tokenizer_fingerprint(const std::string &m) {
  // ModelProto: 1 pieces, 2 trainer_spec, 3 normalizer_spec, 4 self_test_data, 5 denormalizer_spec;
  // TrainerSpec: 1 input, 2 model_prefix, 16 num_threads (sentencepiece_model.proto). Every other
  // field counts, with its key, in the file's order (the trainer spec's under its key).
  static const char kTag[] = "ape spm model v1";
  uint64_t h = fnv1a(kTag, sizeof kTag - 1);
  uint64_t number = 0;
  int wt = 0;
  size_t payload = 0;
  for (size_t pos = 0, start = 0; (start = pos) < m.size();) {
    if (!next_field(m, pos, number, wt, payload)) return fnv1a_hex(m);
    if (number != 2 || wt != 2) {
      h = fnv1a(m.data() + start, pos - start, h);
      continue;
    }
    h = fnv1a(m.data() + start, 1, h);  // the trainer spec's key (one byte), not its length
    const std::string spec = m.substr(payload, pos - payload);
    for (size_t sp = 0, s0 = 0; (s0 = sp) < spec.size();) {
      if (!next_field(spec, sp, number, wt, payload)) return fnv1a_hex(m);
      if (number != 1 && number != 2 && number != 16) h = fnv1a(spec.data() + s0, sp - s0, h);
    }
  }
  return hex16(h);
}

bool tokenizer_matches(const std::string &model_bytes, const std::string &recorded) {
  return recorded == tokenizer_fingerprint(model_bytes) || recorded == fnv1a_hex(model_bytes);
}

std::string find_cached_tokenizer(const std::string &cache_dir, int64_t vocab, const std::string &fnv_hex) {
  const std::string head = "spm_bpe_" + std::to_string(vocab);
  std::vector<std::string> candidates, matches;
  std::error_code ec;
  if (fs::is_directory(cache_dir, ec))
    for (const auto &e : fs::directory_iterator(cache_dir, ec)) {
      const std::string name = e.path().filename().string();
      // spm_bpe_<vocab>.model (older caches) or spm_bpe_<vocab>_<tag>.model
      if (name.rfind(head, 0) != 0 || e.path().extension() != ".model" || name.find(".tmp.") != std::string::npos)
        continue;
      const std::string rest = name.substr(head.size());
      if (rest != ".model" && rest[0] != '_') continue;
      candidates.push_back(e.path().string());
    }
  std::sort(candidates.begin(), candidates.end());
  for (const auto &path : candidates) {
    if (fnv_hex.empty()) {
      matches.push_back(path);
      continue;
    }
    if (tokenizer_matches(read_file(path), fnv_hex)) return path;
  }
  if (matches.size() == 1) return matches[0];
  std::string found;
  for (const auto &path : candidates) found += (found.empty() ? "" : ", ") + fs::path(path).filename().string();
  if (candidates.empty())
    throw std::runtime_error("no " + std::to_string(vocab) + "-piece tokenizer in " + cache_dir +
                             " (pass --tokenizer, or the --cache-dir ape-train used)");
  if (!fnv_hex.empty())
    throw std::runtime_error("none of the tokenizers in " + cache_dir + " (" + found +
                             ") is the checkpoint's (FNV " + fnv_hex +
                             "); pass --tokenizer, or the --cache-dir ape-train used");
  throw std::runtime_error("several tokenizers in " + cache_dir + " (" + found + "); pass --tokenizer");
}

Corpus Corpus::open(const DataOptions &opts) {
  std::ostream &log = opts.log ? *opts.log : std::cerr;
  if (opts.data_dir.empty() || !fs::is_directory(opts.data_dir)) {
    std::error_code ec;
    throw std::runtime_error("data folder '" + opts.data_dir + "' " +
                             (fs::exists(opts.data_dir, ec) ? "is a file, not a folder" : "does not exist") +
                             " (it should hold SPLITS.tsv and the books, clean/pg<ID>_*.txt or clean.tar.xz; pass --data DIR)");
  }
  if (opts.vocab < 300 || opts.vocab > 65535)
    throw std::invalid_argument("vocab must be in [300, 65535], got " + std::to_string(opts.vocab));
  const auto splits = read_splits((fs::path(opts.data_dir) / "SPLITS.tsv").string());
  fs::create_directories(opts.cache_dir);
  const std::string dir = text_dir(opts, log);

  std::map<std::string, std::vector<std::string>> books;  // split -> paths, in SPLITS.tsv order
  for (const auto &[id, split] : splits) books[split].push_back(find_book(dir, id));
  for (const char *s : {"train", "test"})
    if (books[s].empty()) throw std::runtime_error(std::string("SPLITS.tsv lists no ") + s + " books");
  // Each book read once: it must hold text (an empty one: the tokenizer trainer's message is
  // internal) in UTF-8 (other bytes became <unk> tokens, trained on and scored without a word),
  // and its content's hash keys the token caches (name and size alone kept a book edited at the
  // same size scored on its old text's tokens).
  std::map<std::string, uint64_t> content;  // path -> fnv1a of its bytes
  for (const auto &[split, paths] : books)
    for (const auto &p : paths) {
      if (content.count(p)) continue;
      const std::string bytes = read_file(p);
      if (bytes.empty()) throw std::runtime_error("the " + split + " book " + p + " is empty");
      try {
        require_utf8(bytes, "the " + split + " book " + p);
      } catch (const std::invalid_argument &e) {
        throw std::runtime_error(e.what());
      }
      content[p] = fnv1a(bytes.data(), bytes.size());
    }

  Corpus c;
  c.vocab_ = opts.vocab;
  const std::string pid = std::to_string(::getpid());

  // ---- tokenizer: trained once on the train books ----
  // The files of a cache are named by the hash of what they were made from (the train books,
  // the vocabulary, the sample size): corpora that share a cache folder never overwrite each
  // other's tokenizer (which would orphan the checkpoints trained with it).
  std::string key = "v1 bpe vocab=" + std::to_string(opts.vocab) +
                    " sentences=" + std::to_string(opts.input_sentence_size);
  for (const auto &p : books["train"])
    key += " " + fs::path(p).filename().string() + ":" + std::to_string(fs::file_size(p));
  char tag[9];
  std::snprintf(tag, sizeof tag, "%08llx",
                static_cast<unsigned long long>(fnv1a(key.data(), key.size()) & 0xffffffffULL));
  const std::string stem = std::to_string(opts.vocab) + "_" + tag;
  const std::string prefix = (fs::path(opts.cache_dir) / ("spm_bpe_" + stem)).string();
  c.tokenizer_path_ = prefix + ".model";
  const std::string key_path = prefix + ".key";
  // One process at a time makes a cache's files (ctest and users run several trainings at once);
  // the others wait and then read them. The kernel drops the lock of a killed holder. Without it,
  // two runs on a fresh cache each trained a tokenizer: the same pieces, but different bytes (the
  // model records its temporary path), so the checkpoints of the first no longer matched the cache.
  // A read-only cache (shared, or on a read-only mount) is used as it is when it is complete.
  const FileLock lock(prefix + ".lock", /*unless_read_only=*/true);
  // The train books' content when the tokenizer was trained: a book edited since at the same size
  // keeps the tokenizer (checkpoints trained with it name its bytes), with a note.
  std::string trained_on;
  for (const auto &p : books["train"]) trained_on += hex16(content.at(p)) + "\n";
  const std::string content_path = prefix + ".content";
  const bool have_model = fs::exists(c.tokenizer_path_) && fs::exists(key_path) && read_file(key_path) == key;
  if (!lock.held() && !have_model)
    throw std::runtime_error("the cache folder " + opts.cache_dir + " is read-only and holds no tokenizer for this "
                             "corpus: pass a writable --cache-dir");
  if (!have_model) {
    log << "[data] training a " << opts.vocab << "-piece BPE tokenizer on " << books["train"].size()
        << " train books (log: " << prefix << ".log)\n" << std::flush;
    std::string inputs;
    for (const auto &p : books["train"]) inputs += (inputs.empty() ? "" : ",") + p;
    remove_dead_temporaries(opts.cache_dir, "spm_bpe_" + stem);  // (under the lock: no one else's)
    const std::string tmp_prefix = prefix + ".tmp." + pid;
    const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    auto t0 = std::chrono::steady_clock::now();
    spm_train({"--input=" + inputs, "--model_prefix=" + tmp_prefix, "--vocab_size=" + std::to_string(opts.vocab),
               "--model_type=bpe", "--character_coverage=0.9999",
               "--input_sentence_size=" + std::to_string(opts.input_sentence_size),
               "--shuffle_input_sentence=true", "--num_threads=" + std::to_string(threads)},
              prefix + ".log");
    c.spm_seconds_ = seconds_since(t0);
    std::error_code ec;
    // On disk (written, synced, renamed) before the key that vouches for it: a crash between them
    // left a durable key naming an empty model, which every later run failed to load.
    write_file_atomically(c.tokenizer_path_, read_file(tmp_prefix + ".model"), nullptr, /*cache=*/true);
    fs::remove(tmp_prefix + ".model", ec);
    fs::remove(tmp_prefix + ".vocab", ec);
    atomic_write(content_path, [&](std::ostream &o) { o << trained_on; });
    atomic_write(key_path, [&](std::ostream &o) { o << key; });
    log << "[data] tokenizer trained in " << c.spm_seconds_ << " s -> " << c.tokenizer_path_ << "\n";
  } else if (std::error_code ec; fs::exists(content_path, ec) && read_file(content_path) != trained_on) {
    log << "[data] note: the train books changed since " << c.tokenizer_path_
        << " was trained on them (same names and sizes); it is kept, so that the checkpoints trained "
           "with it still match (delete "
        << prefix << ".* to train a new one)\n";
  }
  c.model_bytes_ = read_file(c.tokenizer_path_);
  const std::string &model_bytes = c.model_bytes_;
  c.tokenizer_hash_ = tokenizer_fingerprint(model_bytes);

  // ---- token caches, one per split ----
  auto load_split = [&](const std::string &split, TokenSplit &out) {
    const auto &paths = books[split];
    if (paths.empty()) return;
    uint64_t fp = fnv1a(model_bytes.data(), model_bytes.size());
    for (const auto &p : paths) {
      const std::string tag = fs::path(p).filename().string() + ":" + std::to_string(fs::file_size(p)) + ":" +
                              hex16(content.at(p));
      fp = fnv1a(tag.data(), tag.size(), fp);
    }
    const std::string cache = (fs::path(opts.cache_dir) /
                               ("tokens_" + split + "_" + stem + ".bin")).string();
    try {
      out = read_token_cache(cache, static_cast<uint32_t>(opts.vocab), fp);
      return;
    } catch (const CacheError &e) {
      if (fs::exists(cache)) log << "[data] " << e.what() << "; rebuilding\n";
    }
    auto t0 = std::chrono::steady_clock::now();
    EncodedBooks enc = spm_encode_books(c.tokenizer_path_, paths, cache + ".ids." + pid,
                                        (fs::path(opts.cache_dir) / ("tokens_" + split + ".log")).string());
    if (enc.pieces != opts.vocab)
      throw std::runtime_error("tokenizer " + c.tokenizer_path_ + " has " + std::to_string(enc.pieces) +
                               " pieces, expected " + std::to_string(opts.vocab) + " (delete it to retrain)");
    out = TokenSplit{};
    for (size_t i = 0; i < paths.size(); ++i) out.add_doc(fs::path(paths[i]).filename().string(), enc.books[i]);
    write_token_cache(cache, out, static_cast<uint32_t>(opts.vocab), fp);
    const double s = seconds_since(t0);
    c.tok_seconds_ += s;
    log << "[data] tokenized " << split << ": " << out.num_docs() << " books, " << out.size() << " tokens in "
        << s << " s -> " << cache << "\n";
  };
  load_split("train", c.train_);
  load_split("valid", c.valid_);
  load_split("test", c.test_);
  return c;
}

// ---- windows ---------------------------------------------------------------------------------------------

TrainSampler::TrainSampler(const TokenSplit &split, uint64_t seed) : split_(&split), rng_(seed) {}

at::Tensor TrainSampler::next(int64_t batch, int64_t length) { return next(batch, length, 0, batch); }

at::Tensor TrainSampler::next(int64_t batch, int64_t length, int64_t first, int64_t count) {
  if (first < 0 || count < 0 || first + count > batch)
    throw std::invalid_argument("TrainSampler::next: rows [" + std::to_string(first) + ", " +
                                std::to_string(first + count) + ") outside a batch of " + std::to_string(batch));
  const TokenSplit &s = *split_;
  // starts[i] = number of valid window starts in books 0..i-1
  std::vector<int64_t> cum{0};
  for (int64_t i = 0; i < s.num_docs(); ++i) cum.push_back(cum.back() + std::max<int64_t>(0, s.doc_size(i) - length + 1));
  if (cum.back() == 0)
    throw std::runtime_error("no training book holds a window of " + std::to_string(length) + " tokens");
  at::Tensor out = at::empty({count, length}, at::kLong);
  int64_t *o = out.data_ptr<int64_t>();
  std::uniform_int_distribution<int64_t> pick(0, cum.back() - 1);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t r = pick(rng_);  // every row is drawn: the stream is the same on every rank
    if (b < first || b >= first + count) continue;
    const int64_t d = std::upper_bound(cum.begin(), cum.end(), r) - cum.begin() - 1;
    const int32_t *src = s.doc(d) + (r - cum[d]);
    for (int64_t t = 0; t < length; ++t) o[(b - first) * length + t] = src[t];
  }
  windows_ += batch;
  return out;
}

std::string TrainSampler::engine_state() const {
  std::ostringstream s;
  s << rng_;
  return s.str();
}

void TrainSampler::restore(const std::string &engine, int64_t windows) {
  // 312 words and an index, each a decimal number: nothing else is accepted.
  if (engine.size() > 16384 || engine.find_first_not_of("0123456789 ") != std::string::npos)
    throw std::invalid_argument("sampler state: not an mt19937_64 state (unexpected characters)");
  std::istringstream in(engine);
  std::mt19937_64 rng;
  in >> rng;
  std::string rest;
  if (in.fail() || (in >> rest, !rest.empty()))
    throw std::invalid_argument("sampler state: not an mt19937_64 state");
  if (windows < 0) throw std::invalid_argument("sampler state: negative window count");
  rng_ = rng;
  windows_ = windows;
}

at::Tensor eval_windows(const TokenSplit &split, int64_t len, int64_t max_len, int64_t segments) {
  if (len <= 0 || max_len < len || segments <= 0)
    throw std::invalid_argument("eval_windows: need 0 < len <= max_len and segments > 0");
  const int64_t seg = max_len + 1;
  // Capacity per book, then segments in proportion to book length: each book's floor share
  // (capped by its capacity), then one more per book in turn from the first until all are placed.
  std::vector<int64_t> cap(split.num_docs()), n(split.num_docs(), 0);
  int64_t total_cap = 0, total = 0;
  for (int64_t i = 0; i < split.num_docs(); ++i) {
    cap[i] = split.doc_size(i) / seg;
    total_cap += cap[i];
    total += split.doc_size(i);
  }
  if (total_cap == 0)
    throw std::runtime_error("the evaluation books are too short for one window of " + std::to_string(seg) + " tokens");
  int64_t want = std::min(segments, total_cap), placed = 0;
  for (int64_t i = 0; i < split.num_docs(); ++i) {
    n[i] = std::min(cap[i], want * split.doc_size(i) / std::max<int64_t>(total, 1));
    placed += n[i];
  }
  for (int64_t i = 0; placed < want; i = (i + 1) % split.num_docs())
    if (n[i] < cap[i]) { ++n[i]; ++placed; }

  const int64_t per_seg = max_len / len;
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < split.num_docs(); ++i) {
    for (int64_t j = 0; j < n[i]; ++j) {
      const int64_t start = j * split.doc_size(i) / n[i];  // evenly spaced, non-overlapping
      for (int64_t w = 0; w < per_seg; ++w) {
        const int32_t *src = split.doc(i) + start + w * len;
        rows.insert(rows.end(), src, src + len + 1);
      }
    }
  }
  const int64_t N = static_cast<int64_t>(rows.size()) / (len + 1);
  return at::tensor(rows, at::kLong).view({N, len + 1});
}

}  // namespace ape
