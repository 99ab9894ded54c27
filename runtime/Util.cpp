#include "runtime/Util.h"

#include <fcntl.h>
#include <signal.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <poll.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

namespace ape {

uint64_t fnv1a(const void *data, size_t n, uint64_t h) {
  const auto *p = static_cast<const unsigned char *>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  return h;
}

namespace {
void on_broken_pipe(int) {}  // the write that raised it fails with EPIPE
}  // namespace

// A handler that does nothing rather than SIG_IGN: an ignored signal stays ignored across exec,
// and the children (apec, the compilers, cmake, xz) would run with it; a handler is reset there.
void ignore_broken_pipes() {
  struct sigaction sa {};
  sa.sa_handler = on_broken_pipe;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGPIPE, &sa, nullptr);
}

int output_status(int rc, const char *tool) {
  std::cout.flush();
  const bool lost = !std::cout.good() || std::fflush(stdout) != 0 || std::ferror(stdout);
  if (!lost) return rc;
  std::cerr << tool << ": error: the standard output could not be written (a reader that closed it, or a full "
            << "disk): what it should hold is lost" << std::endl;
  return rc != 0 ? rc : 1;
}

void tune_allocator() {
#if defined(__GLIBC__)
  const char *tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables && std::strstr(tunables, "glibc.malloc.")) return;
  // The trim threshold only where the mmap threshold took: setting either one fixes both, and a
  // glibc that refuses 256 MB would be left at its 128 KB starting threshold.
  if (mallopt(M_MMAP_THRESHOLD, 256 << 20) == 1) mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
}

std::string hex16(uint64_t h) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

std::string fnv1a_hex(const std::string &bytes) { return hex16(fnv1a(bytes.data(), bytes.size())); }

std::string error_text(const std::exception &e) {
  std::string s = e.what();
  // c10's errors carry a C++ backtrace: after "Exception raised from " (TORCH_CHECK), or as lines
  // "frame #N: ..." (an enforce failure, such as an allocation the machine refused).
  size_t at = s.find("Exception raised from ");
  if (at != std::string::npos) s.erase(at);
  at = s.find("frame #");
  if (at != std::string::npos && (at == 0 || s[at - 1] == '\n')) s.erase(at);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string read_file(const std::filesystem::path &p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + p.string() + ": " + std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string shell_quote(const std::string &s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string system_status_text(int rc) {
  if (rc == -1) return "could not be started";
  if (WIFEXITED(rc)) return "exited with status " + std::to_string(WEXITSTATUS(rc));
  if (WIFSIGNALED(rc)) return "was killed by signal " + std::to_string(WTERMSIG(rc));
  return "failed (wait status " + std::to_string(rc) + ")";
}

uint64_t available_memory_bytes() {
  uint64_t avail = 0, swap = 0;
  {
    std::ifstream in("/proc/meminfo");
    std::string key, unit;
    uint64_t kb = 0;
    while (in >> key >> kb) {
      std::getline(in, unit);
      if (key == "MemAvailable:") avail = kb * 1024;
      else if (key == "SwapFree:") swap = kb * 1024;
    }
  }
  if (avail == 0) return 0;
  uint64_t total = avail + swap;
  // cgroup v2: this process's group (/proc/self/cgroup's "0::PATH"), its memory.max less what it
  // uses beyond the file cache the kernel reclaims (memory.current counts it: a group that had
  // read a corpus or built a tree looked full).
  std::string group;
  {
    std::ifstream in("/proc/self/cgroup");
    for (std::string line; std::getline(in, line);)
      if (line.rfind("0::", 0) == 0) group = line.substr(3);
  }
  const std::string dir = "/sys/fs/cgroup" + (group == "/" ? std::string() : group);
  std::ifstream max_in(dir + "/memory.max"), cur_in(dir + "/memory.current");
  std::string max_text;
  uint64_t current = 0;
  if (max_in >> max_text && max_text != "max" && cur_in >> current) {
    uint64_t reclaimable = 0;
    std::ifstream stat(dir + "/memory.stat");
    std::string key;
    uint64_t value = 0;
    while (stat >> key >> value)
      if (key == "inactive_file") reclaimable = value;
    try {
      const uint64_t limit = std::stoull(max_text);
      const uint64_t used = current > reclaimable ? current - reclaimable : 0;
      total = std::min(total, limit > used ? limit - used : 1);
    } catch (const std::exception &) {
    }
  }
  return total;
}

bool is_decimal_real(std::string_view s) {
  size_t i = !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
  std::string rest(s.substr(i));
  for (char &c : rest) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (rest == "nan" || rest == "inf" || rest == "infinity") return true;
  size_t digits = 0;
  bool point = false;
  for (; i < s.size() && ((s[i] >= '0' && s[i] <= '9') || (s[i] == '.' && !point)); ++i) {
    if (s[i] == '.') point = true;
    else ++digits;
  }
  if (digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    const size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    if (i == start) return false;
  }
  return i == s.size();
}

size_t first_non_utf8(std::string_view text) {
  const auto *b = reinterpret_cast<const unsigned char *>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = b[i];
    size_t len = 0;
    unsigned min = 0, cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((b[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (b[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;  // overlong, surrogate
    i += len;
  }
  return std::string::npos;
}

void require_utf8(std::string_view text, const std::string &what) {
  const size_t at = first_non_utf8(text);
  if (at == std::string::npos) return;
  char h[3];
  std::snprintf(h, sizeof h, "%02x", static_cast<unsigned char>(text[at]));
  throw std::invalid_argument(what + " is not UTF-8 text: byte " + std::to_string(at) + " (0x" + h +
                              ") starts no UTF-8 character (convert the file, e.g. iconv -t UTF-8)");
}

std::string printable(const std::string &bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size() && i < 80; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return bytes.size() > 80 ? out + "..." : out;
}

volatile std::sig_atomic_t g_stop_requested = 0;

namespace {

// coreutils' `timeout`, found once: run_process starts its commands under `timeout -k 10 0`, which
// makes its own process group of the command and everything the command starts (a compiler
// driver's cc1plus, nvcc's cicc and ptxas, tar's xz), passes a SIGTERM or SIGINT it gets on to that
// whole group (SIGKILL 10 s later if any member is still there), and ends as the command ended (its
// exit status, or the signal that killed it, raised again). Without it, a stop or the caller's
// death (PR_SET_PDEATHSIG) ended the command alone and left its children running to their end.
// Empty where there is no `timeout` (the command is then run directly, as before).
const std::string &process_tree_guard() {
  static const std::string path = [] {
    std::vector<std::string> dirs = {"/usr/bin", "/bin"};
    if (const char *env = std::getenv("PATH"); env && *env) {
      std::stringstream in(env);
      for (std::string d; std::getline(in, d, ':');)
        if (!d.empty()) dirs.push_back(d);
    }
    for (const auto &d : dirs) {
      const std::string p = d + "/timeout";
      if (::access(p.c_str(), X_OK) == 0) return p;
    }
    return std::string();
  }();
  return path;
}

}  // namespace

int run_process(const std::vector<std::string> &argv, const std::string &what, std::string *output,
                const std::string &log_path, const std::string &cwd) {
  if (argv.empty()) throw std::invalid_argument("run_process: no command");
  if (g_stop_requested) throw Stopped(what + " was not started: a stop was asked for (Ctrl-C or SIGTERM)");
  auto fail = [&](const std::string &why) { return std::runtime_error(what + ": " + why + ": " + std::strerror(errno)); };
  // Everything the child uses is made here: between vfork and exec it only makes system calls.
  const int null_in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_in < 0) throw fail("cannot open /dev/null");
  int out = -1, pipe_fds[2] = {-1, -1};
  if (!log_path.empty()) {
    out = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
      ::close(null_in);
      throw fail("cannot write its log " + log_path);
    }
  } else if (output) {
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
      ::close(null_in);
      throw fail("cannot make a pipe");
    }
    out = pipe_fds[1];
  } else {
    out = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  }
  const std::string &guard = process_tree_guard();
  const std::vector<std::string> guard_args = {guard, "-k", "10", "0"};
  std::vector<char *> args;
  if (!guard.empty())
    for (const auto &a : guard_args) args.push_back(const_cast<char *>(a.c_str()));
  for (const auto &a : argv) args.push_back(const_cast<char *>(a.c_str()));
  args.push_back(nullptr);
  const char *dir = cwd.empty() ? nullptr : cwd.c_str();
  const pid_t parent = ::getpid();
  // The child's end when this process dies: the guard's SIGTERM, which it passes on to the
  // command's whole process group; a command run directly is killed.
  const int death_signal = guard.empty() ? SIGKILL : SIGTERM;
  // vfork: no copy of a large caller's page tables (a model already loaded), as std::system.
  const pid_t pid = ::vfork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, death_signal);
    if (::getppid() != parent) ::_exit(127);  // the caller died before the line above
    if ((dir && ::chdir(dir) != 0) || ::dup2(null_in, 0) < 0 || (out >= 0 && (::dup2(out, 1) < 0 || ::dup2(out, 2) < 0)))
      ::_exit(127);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  const int start_errno = errno;
  ::close(null_in);
  if (out >= 0) ::close(out);
  if (pid < 0) {
    if (pipe_fds[0] >= 0) ::close(pipe_fds[0]);
    errno = start_errno;
    throw fail("cannot start " + argv[0]);
  }
  // Wait, reading its output, and end it on a stop request (polled: a handler installed with
  // SA_RESTART, as std::signal's, would restart a blocking wait).
  int status = 0;
  bool stopped = false, exited = false;
  if (pipe_fds[0] >= 0) output->clear();
  while (!exited) {
    if (g_stop_requested && !stopped) {
      ::kill(pid, SIGTERM);
      stopped = true;
    }
    if (pipe_fds[0] >= 0) {
      struct pollfd pfd {pipe_fds[0], POLLIN, 0};
      if (::poll(&pfd, 1, 50) > 0) {
        char buf[4096];
        const ssize_t n = ::read(pipe_fds[0], buf, sizeof buf);
        if (n > 0) {
          output->append(buf, static_cast<size_t>(n));
          continue;
        }
        if (n == 0) {  // its end of the pipe closed: it exited (or closed it); wait for it
          ::close(pipe_fds[0]);
          pipe_fds[0] = -1;
        }
      }
    } else {
      ::usleep(20000);
    }
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) exited = true;
    else if (r < 0 && errno != EINTR) {
      if (pipe_fds[0] >= 0) ::close(pipe_fds[0]);
      throw fail("cannot wait for " + argv[0]);
    }
  }
  if (pipe_fds[0] >= 0) {  // what it wrote last
    char buf[4096];
    ssize_t n;
    while ((n = ::read(pipe_fds[0], buf, sizeof buf)) > 0) output->append(buf, static_cast<size_t>(n));
    ::close(pipe_fds[0]);
  }
  if (stopped || (WIFSIGNALED(status) && (WTERMSIG(status) == SIGINT || WTERMSIG(status) == SIGTERM)))
    throw Stopped(what + " was stopped (Ctrl-C or SIGTERM; " + argv[0] + " " + system_status_text(status) +
                  "): the next run starts it again");
  return status;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

FileLock::FileLock(const std::string &path, bool unless_read_only)
    : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
  if (fd_ < 0 && unless_read_only && (errno == EROFS || errno == EACCES || errno == EPERM)) return;
  if (fd_ < 0) throw std::runtime_error("cannot open the cache lock " + path + ": " + std::strerror(errno));
  while (::flock(fd_, LOCK_EX) != 0)
    if (errno != EINTR) {
      const int err = errno;
      ::close(fd_);
      throw std::runtime_error("cannot lock " + path + ": " + std::strerror(err));
    }
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace ape
