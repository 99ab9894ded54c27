// A spec file compiled into a kernel at run time (SpecLibrary.h).
#include "runtime/SpecLibrary.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "ape/cpu/dispatch.h"
#include "ape/cpu/kernel_abi.h"
#include "ape/cpu/kernel_entry.h"
#include "runtime/AtomicFile.h"
#include "runtime/Util.h"
#include "runtime/Registry.h"

// Set by runtime/CMakeLists.txt: the build's apec, compiler, kernel headers and OpenMP flags.
#ifndef APE_APEC_PATH
#define APE_APEC_PATH "apec"
#endif
#ifndef APE_CXX_COMPILER
#define APE_CXX_COMPILER "c++"
#endif
#ifndef APE_KERNEL_INCLUDE_DIR
#define APE_KERNEL_INCLUDE_DIR "kernels/include"
#endif
#ifndef APE_OPENMP_FLAGS
#define APE_OPENMP_FLAGS "-fopenmp"
#endif
#ifndef APE_NVCC_PATH
#define APE_NVCC_PATH "nvcc"
#endif

namespace fs = std::filesystem;

namespace ape {

namespace {

// The linker flag of every library compiled here: its references to what it defines bind to its
// own definitions. The generated code's C++ symbols are named after the encoding (namespace
// ape_gen_NAME, template instantiations over its functor), so without it a process that exports
// a kernel of the same name (ape-check exports its symbols for the emulated kernels) would
// answer the library's calls with its own, older code: a spec edited under a built-in name would
// be checked, trained or run with the built-in kernel.
constexpr const char *kSelfBound = "-Wl,-Bsymbolic";

std::string join_command(const std::vector<std::string> &args) {
  std::string cmd;
  for (const auto &a : args) cmd += (cmd.empty() ? "" : " ") + shell_quote(a);
  return cmd;
}

// Runs `args` (in the folder `cwd` when given; stdin from /dev/null); returns the exit status (-1:
// not run or killed) and sets `output` to its stdout and stderr together. Through run_process: a
// compiler stopped by Ctrl-C or SIGTERM is a stop (ape::Stopped), not a compile failure.
int run_command(const std::vector<std::string> &args, std::string &output, const std::string &cwd = "") {
  output.clear();
  int st = 0;
  try {
    st = run_process(args, "running " + args[0], &output, "", cwd);
  } catch (const Stopped &) {
    throw;
  } catch (const std::exception &e) {
    output = e.what();
    return -1;
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == 127 && output.empty()) output = args[0] + ": not found or not executable\n";
  if (!WIFEXITED(st)) output += args[0] + " " + system_status_text(st) + "\n";  // (environment_note reads it)
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// The first `max_lines` lines of `text`, and a note of how many were left out.
std::string head_lines(const std::string &text, int max_lines) {
  std::istringstream in(text);
  std::string line, out;
  int n = 0, total = 0;
  while (std::getline(in, line)) {
    if (n < max_lines) out += line + "\n", ++n;
    ++total;
  }
  if (total > n) out += "... (" + std::to_string(total - n) + " more lines)\n";
  return out;
}

std::string env_or(const char *name, const std::string &fallback) {
  const char *v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// apec: $APE_APEC, else the one beside this program (build/tools/), else the build's.
std::string find_apec(const SpecLibraryOptions &o) {
  if (!o.apec.empty()) return o.apec;
  if (const char *v = std::getenv("APE_APEC"); v && *v) return v;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path beside = self.parent_path() / "apec";
    if (fs::is_regular_file(beside, ec)) return beside.string();
  }
  return APE_APEC_PATH;
}

// The compiler's `--version` first line (part of the cache key), once per compiler.
std::string compiler_version(const std::string &cxx) {
  static std::mutex mu;
  static std::map<std::string, std::string> known;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = known.find(cxx); it != known.end()) return it->second;
  std::string out;
  const int rc = run_command({cxx, "--version"}, out);
  if (rc != 0)
    throw std::runtime_error("the C++ compiler '" + cxx + "' does not run (" + head_lines(out, 3) +
                             "); set APE_CXX to a C++17 compiler");
  const std::string first = out.substr(0, out.find('\n'));
  known[cxx] = first;
  return first;
}

// FNV-1a over every file under the kernel headers, in path order: a header edit is a new key.
uint64_t headers_hash(const fs::path &dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file()) files.push_back(it->path());
  if (files.empty()) throw std::runtime_error("no kernel headers in " + dir.string());
  std::sort(files.begin(), files.end());
  uint64_t h = fnv1a("headers", 7);
  for (const auto &f : files) {
    const std::string rel = fs::relative(f, dir).string(), bytes = read_file(f);
    h = fnv1a(rel.data(), rel.size(), h);
    h = fnv1a(bytes.data(), bytes.size(), h);
  }
  return h;
}

// A folder a process compiles in, named PREFIX<pid>-<n>, with an owner file the process holds
// an flock on while the folder is its own: another process removes the folder only once that lock
// is free (remove_stale_folders). The pid alone does not say whether the owner lives: a process
// in another PID namespace (a container sharing the cache) or on another host (a shared home)
// looks dead. Removed when it goes out of scope unless released (renamed into the cache).
constexpr const char *kOwnerFile = ".owner";
struct WorkFolder {
  fs::path path;
  int owner = -1;
  WorkFolder(const fs::path &parent, const std::string &prefix) {
    static std::atomic<int> counter{0};
    fs::create_directories(parent);
    for (;;) {
      fs::path p = parent / (prefix + std::to_string(::getpid()) + "-" + std::to_string(counter++));
      if (!fs::create_directory(p)) continue;
      owner = ::open((p / kOwnerFile).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (owner < 0 || ::flock(owner, LOCK_EX | LOCK_NB) != 0) {  // (the destructor does not run)
        const std::string why = std::strerror(errno);
        if (owner >= 0) ::close(owner);
        std::error_code ec;
        fs::remove_all(p, ec);
        throw std::runtime_error("cannot lock the work folder " + p.string() + ": " + why);
      }
      path = p;
      return;
    }
  }
  // The folder is about to become a cache entry: without the owner file (its lock goes with the fd).
  void release() {
    std::error_code ec;
    fs::remove(path / kOwnerFile, ec);
  }
  void keep() { path.clear(); }
  ~WorkFolder() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
    if (owner >= 0) ::close(owner);
  }
  WorkFolder(const WorkFolder &) = delete;
  WorkFolder &operator=(const WorkFolder &) = delete;
};

// Removes PREFIX<pid>-* folders under `parent` whose owner is gone (killed mid-compile): its
// owner file's lock is free and the folder is a minute old (its owner takes the lock right after
// making the folder: a younger one may be between the two), or it has none (its owner died before
// making one, or an older APE's) and is an hour old.
void remove_stale_folders(const fs::path &parent, const std::string &prefix) {
  std::error_code ec;
  for (auto it = fs::directory_iterator(parent, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.compare(0, prefix.size(), prefix) != 0) continue;
    const long pid = std::strtol(n.c_str() + prefix.size(), nullptr, 10);
    if (pid <= 0 || pid == ::getpid() || (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH)) continue;
    std::error_code t;
    const auto when = fs::last_write_time(it->path(), t);
    const auto age = fs::file_time_type::clock::now() - when;
    if (t || age < std::chrono::minutes(1)) continue;
    bool stale = false;
    const int fd = ::open((it->path() / kOwnerFile).c_str(), O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
      stale = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
      ::close(fd);
    } else if (errno == ENOENT) {
      stale = age > std::chrono::hours(1);
    }
    if (stale) {
      std::error_code rm;
      fs::remove_all(it->path(), rm);
    }
  }
}

// Whether `cache` (made if missing) takes new entries: a complete entry in one that does not is
// used as it is (load, load_cuda_library), and a work folder is made in the system's temporary
// folder instead.
bool writable_cache(const fs::path &cache) {
  std::error_code ec;
  fs::create_directories(cache, ec);
  return fs::is_directory(cache, ec) && ::access(cache.c_str(), W_OK | X_OK) == 0;
}

// The compiler's output, or its end, says the machine failed it, not the kernel: a full disk (the
// cache's), or a compiler killed or out of memory (Linux's out-of-memory killer ends cc1plus with
// SIGKILL, and g++ says "Killed signal terminated program cc1plus"). "" when neither.
std::string environment_note(const std::string &out, const fs::path &where) {
  if (out.find("No space left on device") != std::string::npos || out.find("Disk quota exceeded") != std::string::npos)
    return "the disk of " + where.string() + " is full (free some space or set APE_CACHE_DIR to another folder):\n";
  for (const char *memory : {"Killed signal terminated program", "internal compiler error: Killed",
                             "virtual memory exhausted", "out of memory", "Cannot allocate memory", "std::bad_alloc",
                             "was killed by signal 9"})
    if (out.find(memory) != std::string::npos) {
      const uint64_t avail = available_memory_bytes();
      char now[64] = "";
      if (avail) std::snprintf(now, sizeof now, "; %.1f GiB available now", double(avail) / double(1ull << 30));
      return std::string("the compiler was killed or its memory ran out (most often Linux's out-of-memory killer") + now +
             "): the machine's state, not the spec's; run it again with more memory free:\n";
    }
  return "";
}

// A cache folder's name for an encoding: names beyond 64 characters are cut there (the key that
// follows tells entries apart; a file name has at most 255 bytes).
std::string entry_stem(const std::string &name) { return name.size() <= 64 ? name : name.substr(0, 64); }

// A compiled library's fingerprint, "<bytes> <fnv1a>": written beside it (library.fnv) before its
// folder is renamed into the cache, and compared before every load from the cache. A library
// damaged there (a truncated copy, a full disk) would otherwise crash dlopen (SIGBUS) rather than
// fail.
std::string library_fingerprint(const fs::path &so) {
  std::ifstream f(so, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return std::to_string(bytes.size()) + " " + hex16(fnv1a(bytes.data(), bytes.size()));
}
void write_fingerprint(const fs::path &folder, const fs::path &so) {
  std::ofstream f(folder / "library.fnv");
  f << library_fingerprint(so) << "\n";
  f.close();
  if (!f) throw std::runtime_error("cannot write " + (folder / "library.fnv").string() + " (a full disk?)");
}
// Whether `so` in the cache folder `dir` is there and whole (its fingerprint). A folder whose
// library is damaged or missing, or has no fingerprint (a cache of an older APE), is removed, with
// a note, to be compiled again.
bool intact_in_cache(const fs::path &dir, const fs::path &so, std::ostream *log) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return false;
  std::ifstream f(dir / "library.fnv");
  std::string want;
  if (fs::is_regular_file(so, ec) && std::getline(f, want) && want == library_fingerprint(so)) return true;
  if (log) *log << "[spec] " << so.string() << " is damaged or unverified in the cache: compiling it again\n";
  fs::remove_all(dir, ec);
  if (ec) throw std::runtime_error("cannot remove the damaged cache folder " + dir.string() + ": " + ec.message());
  return false;
}

// `entry` of the library at `lib` (kept loaded for the process).
const KernelEntry *open_library(const fs::path &lib, const std::string &name) {
  void *h = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) throw std::runtime_error("cannot load " + lib.string() + ": " + ::dlerror());
  const std::string sym = "ape_kernel_entry_" + name;
  using EntryFn = const KernelEntry *(*)();
  auto fn = reinterpret_cast<EntryFn>(::dlsym(h, sym.c_str()));
  if (!fn) throw std::runtime_error(lib.string() + " has no " + sym + "(): not a kernel of encoding '" + name + "'");
  // The headers the library was compiled against must be the ones this program was built with (the
  // cache key holds the headers as they are now: a program built before they changed would read
  // its structs by another layout).
  using AbiFn = uint64_t (*)();
  auto abi = reinterpret_cast<AbiFn>(::dlsym(h, "ape_kernel_abi"));
  if (!abi || abi() != kernel_abi_fingerprint())
    throw std::runtime_error(lib.string() + " was compiled against other kernel headers than this program was built "
                             "with (" + std::string(APE_KERNEL_INCLUDE_DIR) + " changed since): rebuild APE "
                             "(scripts/build.sh) so that the program and its spec libraries agree");
  const KernelEntry *e = fn();
  if (!e || !e->name) throw std::runtime_error(lib.string() + ": " + sym + "() returned no entry");
  return e;
}

// `admit(name, hash)`, when set, is called once apec has named the encoding, before compiling.
using Admit = std::function<void(const std::string &, const std::string &)>;

// `shown` names the spec in the log line (the file, or where a recorded text came from).
SpecLibrary load(const std::string &path, const std::string &text, const std::string &source_name,
                 const SpecLibraryOptions &o, const Admit &admit = {}, const std::string &shown = "") {
  SpecLibrary lib;
  lib.spec_path = path;
  lib.spec_text = text;
  lib.spec_hash = spec_fingerprint(text);
  lib.cache_dir = o.cache_dir.empty() ? default_spec_cache_dir() : o.cache_dir;
  const fs::path cache = fs::path(lib.cache_dir) / "kernels";
  const auto t0 = std::chrono::steady_clock::now();

  // 1. apec: the spec's errors surface here, at their file:line:col.
  const std::string apec = find_apec(o);
  const bool writable = writable_cache(cache);
  WorkFolder work(writable ? cache : fs::temp_directory_path(), ".apec-");
  const fs::path gen = work.path;
  if (writable) remove_stale_folders(cache, ".apec-");
  std::string out;
  const int rc = run_command({apec, path, "-o", gen.string(), "--emit=cpu,manifest", "--source-name", source_name}, out);
  if (rc != 0) {
    const std::string full = environment_note(out, gen);
    if (full.empty() && (rc == -1 || rc == 126 || rc == 127))
      throw std::runtime_error("cannot run apec (" + apec + "): " + head_lines(out, 5) +
                               "build it (scripts/build.sh apec) or set APE_APEC to its path");
    throw std::runtime_error(full.empty() ? "apec rejected " + path + ":\n" + head_lines(out, 40) : full + head_lines(out, 10));
  }
  if (o.show_warnings && out.find("warning:") != std::string::npos)  // compiled, with something to say (an unused param)
    (o.log ? *o.log : std::cerr) << head_lines(out, 40);
  std::vector<std::string> names;
  for (const auto &f : fs::directory_iterator(gen)) {
    const std::string fn = f.path().filename().string();
    const std::string tail = "_cpu.cpp";
    if (fn.size() > tail.size() && fn.compare(fn.size() - tail.size(), tail.size(), tail) == 0)
      names.push_back(fn.substr(0, fn.size() - tail.size()));
  }
  if (names.size() != 1)
    throw std::runtime_error(path + " holds " + std::to_string(names.size()) +
                             " encodings; a spec given to APE at run time holds exactly one ape.encoding");
  lib.name = names[0];
  if (admit) admit(lib.name, lib.spec_hash);
  const std::string source = read_file(gen / (lib.name + "_cpu.cpp"));

  // 2. The level: the best this CPU runs, or APE_CPU_LEVEL's (refused as the registry refuses it).
  const unsigned buildable = APE_CPU_HAS_X86_LEVELS ? 7u : 1u;
  CpuLevelChoice choice = choose_cpu_level(buildable, cpu_runnable_levels(), std::getenv("APE_CPU_LEVEL"));
  if (choice.level < 0) throw std::runtime_error(choice.error);
  lib.level = cpu_level_name(choice.level);
  const unsigned mask = 1u | (1u << choice.level);
  choice.built = mask;  // what the library holds (for the log line)

  // 3. The key: everything that decides the library's bytes.
  const std::string cxx = o.cxx.empty() ? env_or("APE_CXX", APE_CXX_COMPILER) : o.cxx;
  const std::string include_dir = APE_KERNEL_INCLUDE_DIR;
  // -Bsymbolic (kSelfBound): the library's calls reach its own code even where the process
  // already has a kernel of the same encoding name.
  std::vector<std::string> flags = {"-std=c++17", "-O3", "-fPIC", "-shared", kSelfBound, "-fno-math-errno",
                                    "-Wno-unused-parameter", "-DAPE_KERNEL_LEVELS=" + std::to_string(mask),
                                    "-I" + include_dir};
  {
    std::istringstream omp(APE_OPENMP_FLAGS);
    for (std::string f; omp >> f;) flags.push_back(f);
  }
  // The unit that exports the headers' fingerprint (kernel_abi.h), compiled into every library.
  const std::string abi_unit =
      "// The kernel headers' fingerprint, compared by the program that loads this library.\n"
      "#include \"ape/cpu/kernel_abi.h\"\n"
      "extern \"C\" uint64_t ape_kernel_abi() { return ::ape::kernel_abi_fingerprint(); }\n";
  std::string keytext = source + '\0' + abi_unit + '\0' + cxx + '\0' + compiler_version(cxx) + '\0' + lib.level;
  for (const auto &f : flags) keytext += '\0' + f;
  const uint64_t key = fnv1a(keytext.data(), keytext.size(), headers_hash(fs::path(include_dir) / "ape"));
  const fs::path dir = cache / (entry_stem(lib.name) + "-" + hex16(key));
  const fs::path so = dir / ("libape_" + lib.name + ".so");

  // One compiler per key at a time: a second process waits here, then finds the library (the
  // rename below keeps the cache whole where the lock is not honoured). A cache this process
  // cannot write to: its complete entry as it is, or a clear error.
  std::optional<FileLock> lock;
  if (writable) lock.emplace((cache / (dir.filename().string() + ".lock")).string(), /*unless_read_only=*/true);
  std::error_code ec;
  if (!writable) {
    std::string want;
    if (std::ifstream f(dir / "library.fnv"); fs::is_regular_file(so, ec) && std::getline(f, want) &&
                                               want == library_fingerprint(so))
      lib.cached = true;
    else
      throw std::runtime_error("the cache " + cache.string() + " holds no compiled kernel for " + path +
                               " and cannot be written: set APE_CACHE_DIR to a writable folder");
  } else if (intact_in_cache(dir, so, o.log)) {
    lib.cached = true;
  } else {
    // 4. Compile in gen/ (the baseline unit, and the level's through a two-line wrapper, as the
    // build does), then rename gen/ to dir/: whole or not at all. The command names the files
    // relative to the folder, so command.txt rebuilds the library there.
    std::vector<std::string> cmd = {cxx};
    cmd.insert(cmd.end(), flags.begin(), flags.end());
    cmd.push_back("-o");
    cmd.push_back(so.filename().string());
    cmd.push_back(lib.name + "_cpu.cpp");
    // The units this function writes have short fixed names (an encoding's name may take 241 of a
    // file name's 255 bytes: NAME_cpu_avx512.cpp had not fitted).
    auto write_unit = [&](const std::string &file, const std::string &text) {
      std::ofstream f(gen / file);
      f << text;
      f.close();
      if (!f) throw std::runtime_error("cannot write " + (gen / file).string() + " (the kernel cache " + cache.string() +
                                       "): " + std::strerror(errno));
      cmd.push_back(file);
    };
    if (choice.level > 0)
      write_unit("level_" + lib.level + ".cpp", "// The " + lib.name + " kernel for the " + lib.level +
                                                    " level.\n#define APE_KERNEL_LEVEL " + std::to_string(choice.level) +
                                                    "\n#include \"" + lib.name + "_cpu.cpp\"\n");
    write_unit("kernel_abi.cpp", abi_unit);
    if (run_command(cmd, out, gen.string()) != 0) {
      const std::string full = environment_note(out, cache);
      throw std::runtime_error(full.empty() ? "the kernel apec generated from " + path + " does not compile (a bug "
                                              "in APE: please report it with the spec):\n" + join_command(cmd) +
                                              "\n" + head_lines(out, 40)
                                            : full + head_lines(out, 10));
    }
    if (std::error_code made; !fs::is_regular_file(gen / so.filename(), made))
      throw std::runtime_error("the C++ compiler " + cxx + " exited 0 but made no library (" + join_command(cmd) +
                               "): set APE_CXX to a C++ compiler");
    std::ofstream(gen / "command.txt") << join_command(cmd) << "\n";
    write_fingerprint(gen, gen / so.filename());
    work.release();
    fs::rename(gen, dir, ec);
    if (ec && !fs::is_regular_file(so)) {  // not another process's finished copy: a real failure
      throw std::runtime_error("cannot move the compiled kernel into the cache " + dir.string() + ": " + ec.message());
    }
    if (!ec) work.keep();  // it is dir/ now
  }
  lib.library = so.string();
  try {
    lib.entry = open_library(so, lib.name);
  } catch (const std::runtime_error &e) {
    if (!lib.cached || std::string(e.what()).rfind("cannot load ", 0) != 0) throw;
    // A cached entry the loader refuses (another machine's architecture on a shared cache, a file
    // damaged after its check): say which folder to remove.
    throw std::runtime_error(std::string(e.what()) + " (the cached entry " + dir.string() +
                             ": remove that folder to compile the spec again)");
  }
  if (!lib.entry->cpu_level || std::string(lib.entry->cpu_level) != lib.level)
    throw std::runtime_error(so.string() + ": its kernels run the " +
                             std::string(lib.entry->cpu_level ? lib.entry->cpu_level : "?") + " level, not " + lib.level);
  if (o.log) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    char took[32];
    std::snprintf(took, sizeof took, "%.1f s", s);
    *o.log << "[spec] " << (shown.empty() ? path : shown) << ": encoding '" << lib.name << "', kernel for " << choice.describe() << "; "
           << (lib.cached ? "from the cache" : std::string("compiled in ") + took) << ": " << so.string() << "\n";
  }
  return lib;
}

std::mutex g_mu;
std::map<std::string, std::unique_ptr<SpecLibrary>> &registered() {
  static std::map<std::string, std::unique_ptr<SpecLibrary>> m;
  return m;
}

// Refuses, before compiling, a name that a built-in encoding or another spec holds.
void admit_name(const std::string &name, const std::string &hash, const std::string &path) {
  auto &m = registered();
  if (auto it = m.find(name); it != m.end()) {
    if (it->second->spec_hash == hash) return;
    throw std::runtime_error("two different specs define encoding '" + name + "': " + it->second->spec_path +
                             " and " + path + " (rename one: ape.encoding @other_name)");
  }
  for (const auto &n : kernel_names())
    if (n == name)
      throw std::runtime_error(path + " defines encoding '" + name + "', which exists already (a built-in encoding); " +
                               "give the spec another name (ape.encoding @other_name)");
}

const SpecLibrary &add(SpecLibrary lib) {
  auto &m = registered();
  if (auto it = m.find(lib.name); it != m.end()) return *it->second;  // the same spec (admit_name)
  register_kernel(lib.entry);
  auto p = std::make_unique<SpecLibrary>(std::move(lib));
  const SpecLibrary &ref = *p;
  m.emplace(ref.name, std::move(p));
  return ref;
}

}  // namespace

nlohmann::json SpecLibrary::record() const {
  return {{"name", name}, {"path", spec_path}, {"fnv", spec_hash}, {"text", spec_text}};
}

std::string spec_fingerprint(const std::string &text) { return hex16(fnv1a(text.data(), text.size())); }

std::string default_spec_cache_dir() {
  if (const char *v = std::getenv("APE_CACHE_DIR"); v && *v) return v;
  if (const char *v = std::getenv("XDG_CACHE_HOME"); v && *v) return std::string(v) + "/ape";
  if (const char *v = std::getenv("HOME"); v && *v) return std::string(v) + "/.cache/ape";
  // No HOME (a service): the user's home from the password database, as Python's expanduser
  // does; else a folder of this user's own in the temporary folder, never one another user made
  // (whose libraries would run in this process).
  {
    passwd pw{}, *found = nullptr;
    std::vector<char> buf(16384);
    if (::getpwuid_r(::getuid(), &pw, buf.data(), buf.size(), &found) == 0 && found && pw.pw_dir &&
        *pw.pw_dir && std::string(pw.pw_dir) != "/" && ::access(pw.pw_dir, W_OK | X_OK) == 0)
      return std::string(pw.pw_dir) + "/.cache/ape";  // (a home that is there and writable)
  }
  const fs::path dir = fs::temp_directory_path() / ("ape-cache-" + std::to_string(::getuid()));
  ::mkdir(dir.c_str(), 0700);
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid() || (st.st_mode & 022) != 0)
    throw std::runtime_error("no HOME, and " + dir.string() + " is not a folder of this user's own that only it "
                             "can write: set APE_CACHE_DIR to the kernel cache's folder");
  return dir.string();
}

namespace {
SpecLibrary load_file(const std::string &path, const SpecLibraryOptions &opts, const Admit &admit) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw std::runtime_error("spec " + path + (fs::is_directory(path, ec) ? ": is a folder, not a spec file"
                                               : fs::exists(path, ec)     ? ": not a regular file"
                                                                          : ": no such file"));
  return load(path, read_file(path), fs::path(path).filename().string(), opts, admit);
}

SpecLibrary load_record(const nlohmann::json &record, const SpecLibraryOptions &opts, const Admit &admit) {
  std::string name, text, path, fnv;
  try {
    name = record.at("name").get<std::string>();
    text = record.at("text").get<std::string>();
    path = record.value("path", name + ".mlir");
    fnv = record.at("fnv").get<std::string>();
  } catch (const std::exception &e) {
    throw std::runtime_error(std::string("bad spec record: ") + e.what());
  }
  // The name becomes part of a path: an identifier, as apec's encoding names are.
  const bool ident = !name.empty() && name.size() <= 1024 && !std::isdigit(static_cast<unsigned char>(name[0])) &&
                     std::all_of(name.begin(), name.end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
                     });
  if (!ident) {
    std::string shown;
    for (unsigned char c : name.substr(0, 80)) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      shown += c >= 0x20 && c < 0x7f ? std::string(1, static_cast<char>(c)) : std::string(hex);
    }
    throw std::runtime_error("bad spec record: the encoding name '" + shown + "' is not an identifier");
  }
  if (spec_fingerprint(text) != fnv) throw std::runtime_error("spec record of '" + name + "': its text does not match its fnv");
  const fs::path cache = fs::path(opts.cache_dir.empty() ? default_spec_cache_dir() : opts.cache_dir) / "specs";
  const fs::path file = cache / (entry_stem(name) + "-" + fnv + ".mlir");
  // The file apec reads must hold the record's text: written when it is missing or differs (a
  // damaged or replaced copy), in the system's temporary folder where the cache is read-only.
  fs::path use = file;
  std::error_code ec;
  if (!fs::is_regular_file(file, ec) || read_file(file) != text) {
    if (writable_cache(cache)) {
      write_file_atomically(file.string(), text, nullptr, /*cache=*/true);
    } else {
      use = fs::temp_directory_path() / ("ape-spec-" + std::to_string(::getpid()) + "-" + fnv + ".mlir");
      write_file_atomically(use.string(), text, nullptr, /*cache=*/true);
    }
  }
  struct RemoveTemp {
    fs::path p, keep;
    ~RemoveTemp() {
      std::error_code e;
      if (p != keep) fs::remove(p, e);
    }
  } remove_temp{use, file};
  const fs::path &file_read = use;
  SpecLibrary lib = load(file_read.string(), text, fs::path(path).filename().string(), opts, admit,
                         path + " (the text the checkpoint holds)");
  if (lib.name != name)
    throw std::runtime_error("spec record of '" + name + "' compiles to encoding '" + lib.name + "'");
  lib.spec_path = path;
  return lib;
}
}  // namespace

namespace {
// The CUDA kernels of `lib` for `c`'s variants in a cached shared library, and its entry: compiled by
// nvcc for sm_ARCH (simt false), or by the host C++ compiler for the SIMT emulator (simt true: the
// objects instrumented for its checks, their references to the emulator left for the program that
// loads them to resolve, which links it and exports its symbols).
const void *load_cuda_library(const SpecLibrary &lib, const SpecCudaOptions &c, const SpecLibraryOptions &o,
                              bool simt) {
  auto join = [](const auto &xs) {
    std::string s;
    for (const auto &x : xs) {
      std::ostringstream one;
      one << x;
      s += (s.empty() ? "" : ",") + one.str();
    }
    return s;
  };
  const char *who = simt ? "load_spec_simt" : "load_spec_cuda";
  if (!simt && (c.arch.empty() || c.arch.find_first_not_of("0123456789a") != std::string::npos))
    throw std::runtime_error(std::string(who) + ": bad GPU architecture '" + c.arch + "'");
  if (c.dtypes.empty() || c.head_dims.empty()) throw std::runtime_error(std::string(who) + ": no variants asked for");
  const fs::path cache = fs::path(!o.cache_dir.empty()   ? o.cache_dir
                                  : !lib.cache_dir.empty() ? lib.cache_dir
                                                           : default_spec_cache_dir()) /
                         "kernels";
  const auto t0 = std::chrono::steady_clock::now();
  const bool writable = writable_cache(cache);
  WorkFolder work(writable ? cache : fs::temp_directory_path(), ".apec-cuda-");
  const fs::path gen = work.path;
  if (writable) remove_stale_folders(cache, ".apec-cuda-");
  const std::string spec_file = (gen / (lib.name + ".mlir")).string();
  std::ofstream(spec_file) << lib.spec_text;
  const std::string apec = find_apec(o);
  std::string out;
  if (run_command({apec, spec_file, "-o", gen.string(), "--emit=cuda", "--cuda-dtypes=" + join(c.dtypes),
                   "--cuda-head-dims=" + join(c.head_dims), "--expect-name", lib.name, "--source-name",
                   fs::path(lib.spec_path).filename().string()},
                  out) != 0)
    throw std::runtime_error("apec --emit=cuda rejected the spec of '" + lib.name + "':\n" + head_lines(out, 40));
  std::vector<std::string> sources = {lib.name + "_cuda.cu"};
  std::string source_text = read_file(gen / sources[0]);
  for (const auto &d : c.dtypes)
    for (int64_t D : c.head_dims) {
      sources.push_back(lib.name + "_cuda_" + d + "_hd" + std::to_string(D) + ".cu");
      source_text += '\0' + read_file(gen / sources.back());
    }
  source_text += '\0' + read_file(gen / (lib.name + "_cuda.cuh"));
  // The unit that exports the headers' fingerprint (cuda/kernel_abi.h), compiled into every library.
  const std::string abi_unit =
      "// The kernel headers' fingerprint, compared by the program that loads this library.\n"
      "#include \"ape/cuda/kernel_abi.h\"\n"
      "extern \"C\" __attribute__((visibility(\"default\"))) uint64_t ape_cuda_kernel_abi() {\n"
      "  return ::ape::cuda::cuda_kernel_abi_fingerprint();\n}\n";
  {
    std::ofstream f(gen / "kernel_abi.cu");
    f << abi_unit;
    if (!f.flush()) throw std::runtime_error("cannot write " + (gen / "kernel_abi.cu").string() + ": " + std::strerror(errno));
  }
  sources.push_back("kernel_abi.cu");
  source_text += '\0' + abi_unit;
  const std::string include_dir = APE_KERNEL_INCLUDE_DIR;
  std::string compiler, version;
  std::vector<std::string> flags;
  if (simt) {
    compiler = o.cxx.empty() ? env_or("APE_CXX", APE_CXX_COMPILER) : o.cxx;
    version = compiler_version(compiler);
    // As the build's emulated kernels (kernels/CMakeLists.txt, ape_simt_kernel_flags).
    flags = {"-std=c++17", "-x", "c++", "-DAPE_SIMT", "-O2", "-g0", "-fPIC", "-fno-sanitize=all",
             "-fsanitize=thread", "--param=tsan-instrument-func-entry-exit=0", "-Wno-psabi",
             "-I" + include_dir, "-I."};
  } else {
    compiler = env_or("APE_NVCC", APE_NVCC_PATH);
    if (run_command({compiler, "--version"}, version) != 0)
      throw std::runtime_error("cannot run nvcc (" + compiler + ") to compile the CUDA kernels of spec '" + lib.name +
                               "': " + head_lines(version, 3) + "install the CUDA toolkit or set APE_NVCC");
    flags = {"-std=c++17", "-O3", "-shared", "-Xcompiler", "-fPIC",
             "--expt-relaxed-constexpr", "-cudart", "shared", "-Xlinker", "-Bsymbolic",
             "-gencode", "arch=compute_" + c.arch + ",code=sm_" + c.arch,
             "-I" + include_dir, "-I."};
    if (c.arch == "90a") flags.push_back("-DAPE_CUDA_SM90A");
  }
  std::string keytext = source_text + '\0' + compiler + '\0' + version;
  for (const auto &f : flags) keytext += '\0' + f;
  const uint64_t key = fnv1a(keytext.data(), keytext.size(), headers_hash(fs::path(include_dir) / "ape"));
  const std::string kind = simt ? "simt" : "cuda";
  const fs::path dir = cache / (entry_stem(lib.name) + "-" + kind + "-" + hex16(key));
  const fs::path so = dir / ("libape_" + lib.name + "_" + kind + ".so");
  std::optional<FileLock> lock;  // as load()
  if (writable) lock.emplace((cache / (dir.filename().string() + ".lock")).string(), /*unless_read_only=*/true);
  std::error_code ec;
  bool cached = false;
  if (!writable) {
    std::string want;
    if (std::ifstream f(dir / "library.fnv"); fs::is_regular_file(so, ec) && std::getline(f, want) &&
                                               want == library_fingerprint(so))
      cached = true;
    else
      throw std::runtime_error("the cache " + cache.string() + " holds no compiled " + kind + " kernels for spec '" +
                               lib.name + "' and cannot be written: set APE_CACHE_DIR to a writable folder");
  } else {
    cached = intact_in_cache(dir, so, o.log);
  }
  if (!cached) {
    auto run = [&](const std::vector<std::string> &cmd) {
      if (run_command(cmd, out, gen.string()) != 0) {
        const std::string full = environment_note(out, cache);
        throw std::runtime_error(full.empty() ? "the CUDA kernels apec generated for spec '" + lib.name +
                                                    "' do not compile" + (simt ? " for the emulator" : "") + ":\n" +
                                                    join_command(cmd) + "\n" + head_lines(out, 40)
                                              : full + head_lines(out, 10));
      }
      std::ofstream(gen / "command.txt", std::ios::app) << join_command(cmd) << "\n";
    };
    if (simt) {  // each source to an object, then the library, linked without the sanitizer's runtime
      std::vector<std::string> link = {compiler, "-shared", kSelfBound, "-o", so.filename().string()};
      for (const auto &src : sources) {
        std::vector<std::string> cmd = {compiler};
        cmd.insert(cmd.end(), flags.begin(), flags.end());
        const std::string obj = fs::path(src).stem().string() + ".o";
        cmd.insert(cmd.end(), {"-c", src, "-o", obj});
        run(cmd);
        link.push_back(obj);
      }
      run(link);
    } else {
      std::vector<std::string> cmd = {compiler};
      cmd.insert(cmd.end(), flags.begin(), flags.end());
      cmd.push_back("-o");
      cmd.push_back(so.filename().string());
      cmd.insert(cmd.end(), sources.begin(), sources.end());
      run(cmd);
    }
    write_fingerprint(gen, gen / so.filename());
    work.release();
    fs::rename(gen, dir, ec);
    if (ec && !fs::is_regular_file(so))
      throw std::runtime_error("cannot move the compiled CUDA kernels into the cache " + dir.string() + ": " +
                               ec.message());
    if (!ec) work.keep();
  }
  void *h = ::dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h)
    throw std::runtime_error("cannot load " + so.string() + ": " + ::dlerror() +
                             (simt ? " (emulated kernels load into a program that links the emulator)" : ""));
  const std::string sym = std::string(simt ? "ape_simt_kernel_entry_" : "ape_cuda_kernel_entry_") + lib.name;
  using EntryFn = const void *(*)();
  auto fn = reinterpret_cast<EntryFn>(::dlsym(h, sym.c_str()));
  if (!fn) throw std::runtime_error(so.string() + " has no " + sym + "()");
  if (c.expected_abi != 0) {  // as open_library's check of a CPU library
    using AbiFn = uint64_t (*)();
    auto abi = reinterpret_cast<AbiFn>(::dlsym(h, "ape_cuda_kernel_abi"));
    if (!abi || abi() != c.expected_abi)
      throw std::runtime_error(so.string() + " was compiled against other kernel headers than this program was built "
                               "with (" + std::string(APE_KERNEL_INCLUDE_DIR) + " changed since): rebuild APE "
                               "(scripts/build.sh) so that the program and its spec libraries agree");
  }
  const void *entry = fn();
  if (!entry) throw std::runtime_error(so.string() + ": " + sym + "() returned no entry");
  if (o.log) {
    char took[32];
    std::snprintf(took, sizeof took, "%.1f s",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    *o.log << "[spec] " << lib.name << ": CUDA kernels " << (simt ? "for the SIMT emulator" : "for sm_" + c.arch)
           << " (" << join(c.dtypes) << " at head dim " << join(c.head_dims) << "); "
           << (cached ? "from the cache" : std::string("compiled in ") + took) << ": " << so.string() << "\n";
  }
  return entry;
}
}  // namespace

const void *load_spec_cuda(const SpecLibrary &lib, const SpecCudaOptions &c, const SpecLibraryOptions &o) {
  return load_cuda_library(lib, c, o, /*simt=*/false);
}

const void *load_spec_simt(const SpecLibrary &lib, const SpecCudaOptions &c, const SpecLibraryOptions &o) {
  return load_cuda_library(lib, c, o, /*simt=*/true);
}

SpecLibrary load_spec_library(const std::string &path, const SpecLibraryOptions &opts) {
  return load_file(path, opts, {});
}

SpecLibrary load_spec_record(const nlohmann::json &record, const SpecLibraryOptions &opts) {
  return load_record(record, opts, {});
}

const SpecLibrary &register_spec(const std::string &path, const SpecLibraryOptions &opts,
                                 const std::function<void(const std::string &name)> &refuse) {
  std::lock_guard<std::mutex> lock(g_mu);
  return add(load_file(path, opts, [&](const std::string &name, const std::string &hash) {
    if (refuse) refuse(name);
    admit_name(name, hash, path);
  }));
}

const SpecLibrary &register_spec_record(const nlohmann::json &record, const SpecLibraryOptions &opts) {
  std::lock_guard<std::mutex> lock(g_mu);
  return add(load_record(record, opts, [&](const std::string &name, const std::string &hash) {
    admit_name(name, hash, record.value("path", name));
  }));
}

const SpecLibrary *registered_spec(const std::string &name) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = registered().find(name);
  return it == registered().end() ? nullptr : it->second.get();
}

void register_checkpoint_spec(const nlohmann::json &config, const std::string &path, const SpecLibraryOptions &opts) {
  const auto rec = config.find("spec");
  if (rec == config.end() || rec->is_null()) return;
  if (!rec->is_object() || !rec->contains("name") || !rec->contains("fnv"))
    throw std::runtime_error("checkpoint " + path + ": bad \"spec\" record");
  const std::string name = rec->at("name").get<std::string>(), fnv = rec->at("fnv").get<std::string>();
  if (const SpecLibrary *s = registered_spec(name)) {
    if (s->spec_hash == fnv) return;
    throw std::runtime_error("checkpoint " + path + " was trained from another spec of encoding '" + name + "' (" +
                             rec->value("path", std::string("?")) + ", fnv " + fnv + ") than " + s->spec_path +
                             " (fnv " + s->spec_hash + "). Drop --spec to use the spec the checkpoint holds, or "
                             "give the new spec another name (ape.encoding @new_name) and pass --encoding new_name");
  }
  register_spec_record(*rec, opts);
}

}  // namespace ape
