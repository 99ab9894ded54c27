// AtomicFile: writing a file so that a crash at any moment leaves the old file or the new one.
//
//   PATH.tmp.<pid>  ──write(2), fsync──▶  fsync(folder)  ──rename──▶  PATH  ──fsync(folder)
//
// The data is on disk before the name points at it (fsync of the file before the rename), the
// temporary's directory entry exists before the rename (fsync of the folder), and the rename
// itself is durable when the call returns (fsync of the folder after). A process killed before
// the rename leaves PATH untouched and a stale PATH.tmp.<pid>; the next write to PATH removes the
// temporaries whose writer is gone.
#pragma once

#include <string>
#include <string_view>

namespace ape {

// Replaces `path` with `bytes` as above. Throws std::runtime_error naming the path and the
// system's reason (e.g. "cannot replace runs/rope.ckpt: Is a directory"); `path` is then untouched.
//
// Test hook: when the environment variable named `kill_hook` (if non-null) holds N, the N-th such
// write of this process writes half of its temporary file and then kills the process with
// SIGKILL — a crash mid-write, on demand (test/resume/kill_loop.sh).
//
// A user's output (a checkpoint, a results table) that is write-protected (no write bit, or none
// for this user) is not replaced: "cannot replace PATH: it is write-protected" (a rename needs
// only the folder's permission). A cache entry (`cache` true: token ids, a tokenizer, a compiled
// spec, which the next run rebuilds) is replaced whatever its mode, as a stale one must be in a
// shared cache folder. A replaced file keeps its permissions.
void write_file_atomically(const std::string &path, std::string_view bytes,
                           const char *kill_hook = nullptr, bool cache = false);

// Removes PATH.tmp.<pid> files left by writers that died: a writer holds an exclusive flock on its
// temporary while it writes (the kernel releases it when the writer dies), so a temporary whose
// lock can be taken, or this process's own, is stale even where its pid was reused. Returns how
// many were removed.
int remove_stale_temporaries(const std::string &path);

// An exclusive lock on a folder for the lifetime of the object (flock on the folder itself: the
// kernel drops it when the process dies, however it dies). Two runs that would write the same
// files (ape-train's checkpoints and results.csv in one --out) refuse each other instead of
// replacing each other's files: the constructor throws std::runtime_error "DIR is in use by another
// process: WHAT" when the lock is held.
class FolderLock {
 public:
  FolderLock(const std::string &dir, const std::string &what);
  ~FolderLock();
  FolderLock(const FolderLock &) = delete;
  FolderLock &operator=(const FolderLock &) = delete;

 private:
  int fd_ = -1;
};

// Throws std::runtime_error unless a file can be written in `dir` (created if missing) under the
// name `file`: catches an output folder that is not writable, or a checkpoint path that is a
// folder, before hours of training.
void check_writable(const std::string &dir, const std::string &file);

}  // namespace ape
