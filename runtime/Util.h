// Util: the small helpers every part of the runtime uses, written once: fingerprints and checksums
// (FNV-1a), reading a whole file, quoting for /bin/sh, elapsed time, a lock file.
#pragma once

#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ape {

// 64-bit FNV-1a, for fingerprints and checksums; `h` continues an earlier hash. The offset basis
// is 1469598103934665603, not the published 14695981039346656037 (a digit short): kept, since every
// checkpoint, cache key and fingerprint written so far was computed with it (docs/internals.md, 4).
uint64_t fnv1a(const void *data, size_t n, uint64_t h = 1469598103934665603ULL);
// fnv1a of `bytes` as 16 hex digits (a tokenizer file's identity in checkpoints and caches).
std::string fnv1a_hex(const std::string &bytes);
// `h` as 16 hex digits.
std::string hex16(uint64_t h);

// The bytes of the file `p`; throws std::runtime_error("cannot read P: <reason>") when it cannot
// be read.
std::string read_file(const std::filesystem::path &p);

// An exception's message for the user: e.what() without the C++ stack trace LibTorch appends to
// its errors ("Exception raised from ... frame #0: ..."), which buries the one line that says
// what went wrong.
std::string error_text(const std::exception &e);

// A stop asked for by Ctrl-C or SIGTERM while a child process ran (run_process): the tools exit
// with status 130, as for a stop of their own, not as for a failure.
struct Stopped : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Set by a tool's Ctrl-C and SIGTERM handler (ape-train's): a child that run_process waits for is
// then ended with SIGTERM, and run_process throws Stopped. Async-signal-safe to set.
extern volatile std::sig_atomic_t g_stop_requested;

// Runs argv (argv[0] looked up on PATH when it has no slash), stdin from /dev/null, in the folder
// `cwd` when not empty; its stdout and stderr go to the file `log_path` when not empty, else into
// *output (when not null; else nowhere). Returns the wait status (exit status 127: it could not be
// run). Not std::system or popen: those ignore SIGINT in the caller while the child runs (a
// Ctrl-C killed the child and was reported as its failure), and the child outlived a caller killed
// with SIGKILL. Here the child dies with its caller (PR_SET_PDEATHSIG); a child that dies of SIGINT
// or SIGTERM, or a stop request (g_stop_requested) while it runs, which ends it, throws Stopped
// ("<what> was stopped ..."). The command and every process it starts form one process group
// under coreutils' `timeout -k 10 0` where it is installed: a stop, or this process's death (even by
// SIGKILL), ends the whole tree (a compiler's cc1plus or ptxas too), not the command alone.
// Throws std::runtime_error when it cannot be started at all.
int run_process(const std::vector<std::string> &argv, const std::string &what, std::string *output = nullptr,
                const std::string &log_path = "", const std::string &cwd = "");

// The memory this process can still take on this machine, in bytes: MemAvailable plus SwapFree
// of /proc/meminfo, and no more than its cgroup's (v2) memory.max less its memory.current
// without the reclaimable file cache (inactive_file) where one is set; 0 when unknown.
uint64_t available_memory_bytes();

// Whether `text` is a real number as a user writes it in decimal: an optional sign, digits with
// at most one '.', an optional exponent (e or E, an optional sign, digits); or nan, inf or infinity
// (any case, with a sign), which range checks then name. Not C's other forms: hex floats
// (0x1p-8), leading or trailing spaces.
bool is_decimal_real(std::string_view text);

// The offset of the first byte of `text` that is not UTF-8 (std::string::npos: none): a byte that
// starts no character, a truncated or overlong sequence, a surrogate or a code point past U+10FFFF.
// The tokenizer turns such bytes into <unk> without a word: a prompt or a book in another encoding
// (Latin-1, UTF-16) was continued, scored or trained on as unknown tokens.
size_t first_non_utf8(std::string_view text);
// Throws std::invalid_argument("WHAT is not UTF-8 text: byte N (0xNN) starts no UTF-8 character
// (convert the file, e.g. iconv -t UTF-8)") when `text` is not UTF-8.
void require_utf8(std::string_view text, const std::string &what);

// Bytes of a file for a message (a line of a table, a name in a checkpoint): printable ASCII as it
// is, any other byte as \xNN, at most 80 bytes and "..." (a binary file's "line" printed raw
// garbled the terminal; a NUL ended a message there).
std::string printable(const std::string &bytes);

// `s` quoted for /bin/sh: one word, whatever it holds.
std::string shell_quote(const std::string &s);

// What std::system's wait status `rc` says of the command, for a message: "could not be started"
// (-1), "exited with status N", "was killed by signal N" (not the raw number: 256 is exit 1).
std::string system_status_text(int rc);

// Seconds on the steady clock since `t0`.
double seconds_since(std::chrono::steady_clock::time_point t0);

// Call first thing in main() (the tools do). LibTorch allocates a step's large tensors (the logits,
// their gradients: tens of MB) afresh every step; glibc serves blocks above its mmap threshold
// (at most 32 MB, adjusted as blocks are freed) with mmap and returns them with munmap, so every
// step faulted in and zeroed fresh pages: a third of a small CPU training run's time went to page
// faults (measured: 2.27M faults and 26.7 s of CPU for 60 RoPE steps of the study's model; 0.18M
// and 17.8 s with the blocks kept; bench/cpu_allocator.sh, bench/results/cpu_allocator.md). This keeps blocks up to 256 MB in the heap and trims it back
// above 512 MB free. A user's GLIBC_TUNABLES malloc settings win. No effect on the numbers.
void tune_allocator();

// Call first thing in main() (the tools do): a closed reader of the standard output (`| head`, a
// tee that died) makes writes to it fail instead of killing the process with SIGPIPE, which ended
// a training before its final checkpoint. The tool goes on and saves what it was asked to, and
// output_status says at the end that the output was lost.
void ignore_broken_pipes();

// The exit status of a tool that would return `rc`: rc, or 1 with a message on stderr when the
// standard output could not be written (a closed pipe, a full disk): the text was lost.
int output_status(int rc, const char *tool);

// An exclusive flock(2) on `path` (created if missing) for the object's lifetime: one process at a
// time makes a cache's files (the corpus cache, the spec kernels); the kernel drops the lock of a
// killed holder. Throws std::runtime_error when the file cannot be opened or locked, except, with
// `unless_read_only`, where the folder is read-only (EROFS, EACCES, EPERM: immutable): then no lock is held (held()
// false), for a caller that can use a complete cache without writing to it.
class FileLock {
 public:
  explicit FileLock(const std::string &path, bool unless_read_only = false);
  ~FileLock();
  FileLock(const FileLock &) = delete;
  FileLock &operator=(const FileLock &) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  int fd_;
};

}  // namespace ape
