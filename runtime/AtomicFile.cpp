// Durable atomic replacement of a file (write, fsync, rename, fsync the folder).
#include "runtime/AtomicFile.h"

#include <fcntl.h>
#include <sys/file.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace fs = std::filesystem;

namespace ape {
namespace {

std::string why() { return std::strerror(errno); }

std::string folder_of(const std::string &path) {
  const fs::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

// fsync of a folder, so that a rename or a new entry in it survives a crash.
void sync_folder(const std::string &dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open folder " + dir + " to sync it: " + why());
  const int rc = ::fsync(fd), err = errno;
  ::close(fd);
  // Some file systems cannot sync a folder (EINVAL); the data itself was synced.
  if (rc != 0 && err != EINVAL)
    throw std::runtime_error("cannot sync folder " + dir + ": " + std::strerror(err));
}

// "" when `path` does not exist or may be replaced; else why not. A rename replaces any file in a
// folder one can write, whatever the file's own mode: a checkpoint a user had made read-only
// (chmod a-w), or another user's, was replaced silently. Refused as `rm` asks first: no write
// bit at all, or none for this process (access(2)).
std::string write_protection(const std::string &path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return "";
  if ((st.st_mode & 0222) == 0 || ::access(path.c_str(), W_OK) != 0)
    return "cannot replace " + path + ": it is write-protected (" +
           ((st.st_mode & 0222) == 0 ? std::string("no write permission") : std::string("not writable by this user")) +
           "); make it writable, or move it away, or write elsewhere";
  return "";
}

void write_all(int fd, const char *data, size_t n, const std::string &tmp) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("writing " + tmp + " failed: " + why());
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

int remove_stale_temporaries(const std::string &path) {
  const fs::path p(path);
  const std::string prefix = p.filename().string() + ".tmp.";
  std::error_code ec;
  int removed = 0;
  for (const auto &entry : fs::directory_iterator(folder_of(path), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    // A writer holds an exclusive lock on its temporary until it closes it; the kernel drops the
    // lock when the writer dies, however it dies. So the temporary is stale when it is ours (an
    // earlier write of ours that failed), or when its lock can be taken — whether or not a process
    // of that pid still exists (pids are reused).
    bool stale = pid == ::getpid();
    if (!stale) {
      const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        stale = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
        ::close(fd);
      }
    }
    if (stale) {
      std::error_code rm;
      if (fs::remove(entry.path(), rm)) ++removed;
    }
  }
  return removed;
}

namespace {
// Where output `path` is written: through a symbolic link to its target (renaming over the link
// had replaced it with a file and left its target as it was), and in place when that is neither a
// file nor a folder (a device, such as /dev/stdout's, or a FIFO: renaming over it had replaced a
// device node with a file).
struct OutputTarget {
  std::string path;
  bool in_place = false;
};
OutputTarget output_target(const std::string &given) {
  std::error_code ec;
  OutputTarget t{given, false};
  if (fs::is_symlink(given, ec)) {
    const fs::path target = fs::weakly_canonical(given, ec);
    if (!ec) t.path = target.string();
  }
  const fs::file_status st = fs::status(t.path, ec);
  t.in_place = fs::exists(st) && !fs::is_regular_file(st) && !fs::is_directory(st);
  return t;
}

// Writes `bytes` into what is at `path` and is not a regular file (a character device such as a
// terminal, /dev/null or /dev/full; a FIFO with a reader): nothing can be renamed over it.
void write_in_place(const std::string &path, std::string_view bytes) {
  // O_NONBLOCK: a FIFO without a reader fails at once (ENXIO) instead of waiting for one.
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    throw std::runtime_error("cannot write " + path + ": " + why() +
                             (errno == ENXIO ? " (a FIFO nothing reads)" : ""));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  try {
    write_all(fd, bytes.data(), bytes.size(), path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw std::runtime_error("cannot write " + path + ": " + why());
}
}  // namespace

void write_file_atomically(const std::string &path_given, std::string_view bytes, const char *kill_hook, bool cache) {
  std::error_code ec;
  const OutputTarget target = output_target(path_given);
  const std::string &path = target.path;
  if (target.in_place) {
    write_in_place(path, bytes);
    return;
  }
  const std::string dir = folder_of(path);
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create folder " + dir + ": " + ec.message());
  if (fs::is_directory(path, ec))
    throw std::runtime_error("cannot replace " + path + ": it is a folder, not a file");
  if (const std::string protectedWhy = cache ? "" : write_protection(path); !protectedWhy.empty())
    throw std::runtime_error(protectedWhy);
  remove_stale_temporaries(path);

  // The file it replaces keeps its permissions (a rename would give the new one 0644 less umask).
  struct stat old {};
  const bool replaces = ::stat(path.c_str(), &old) == 0;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot write " + tmp + ": " + why());
  ::flock(fd, LOCK_EX);  // ours until close or death: remove_stale_temporaries leaves it alone
  if (replaces) ::fchmod(fd, old.st_mode & 0777);
  try {
    size_t first = bytes.size();
    if (kill_hook) {  // the crash-mid-write test hook (AtomicFile.h)
      static std::atomic<long> writes{0};
      const char *n = std::getenv(kill_hook);
      if (n && std::atol(n) == ++writes) first = bytes.size() / 2;
    }
    write_all(fd, bytes.data(), first, tmp);
    if (first != bytes.size()) ::kill(::getpid(), SIGKILL);
    if (::fsync(fd) != 0) throw std::runtime_error("cannot sync " + tmp + ": " + why() + " (disk full?)");
    // The lock is held until the rename: another writer's remove_stale_temporaries, which may run
    // at any moment, must not take the temporary for a dead writer's between our close and rename.
    sync_folder(dir);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = why();  // before unlink can overwrite errno
    ::close(fd);
    ::unlink(tmp.c_str());
    throw std::runtime_error("cannot replace " + path + " with " + tmp + ": " + reason);
  }
  ::close(fd);  // the data is on disk (fsync above); the lock goes with it
  try {
    sync_folder(dir);
  } catch (const std::exception &e) {
    throw std::runtime_error(path + " was written, but its rename may not survive a power failure: " +
                             std::string(e.what()));
  }
}

FolderLock::FolderLock(const std::string &dir, const std::string &what) {
  fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) throw std::runtime_error("cannot open folder " + dir + ": " + why());
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const std::string reason = errno == EWOULDBLOCK ? "" : std::string(" (") + why() + ")";
    ::close(fd_);
    throw std::runtime_error(dir + " is in use by another process" + reason + ": " + what);
  }
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);
}

void check_writable(const std::string &dir, const std::string &file) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw std::runtime_error("output folder " + dir + " cannot be created: " +
                             (ec ? ec.message() : std::string("a file of that name exists")));
  const std::string given = (fs::path(dir) / file).string();
  if (fs::is_directory(given, ec))
    throw std::runtime_error("output " + given + " is a folder; it must be a file (remove or rename the folder)");
  // Where write_file_atomically will write (a device or FIFO in place: no temporary beside it).
  const OutputTarget target = output_target(given);
  if (target.in_place) return;
  const std::string &path = target.path;
  if (const std::string protectedWhy = write_protection(path); !protectedWhy.empty())
    throw std::runtime_error(protectedWhy);
  const std::string probe = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot write in the output folder " + folder_of(path) + ": " + why());
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace ape
