#include "runtime/Util.h"

#include <fcntl.h>
#include <signal.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

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
