// Internals of the SIMT emulator shared by Runtime.cpp (launches, fibers, barriers, device
// memory, the runtime API), Checks.cpp (the access hooks and the shadow state behind memcheck,
// racecheck and initcheck) and Warp.cpp (warp collectives: shuffles, WMMA, mma.sync, ldmatrix,
// cp.async, wgmma). Not installed: the public surfaces are ape/simt/cuda.h and ape/simt/runtime.h.
#pragma once

#include "ape/simt/cuda.h"
#include "ape/simt/runtime.h"

#include <boost/context/fiber.hpp>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

namespace ape::simt::detail {

// ---- device memory -----------------------------------------------------------------------------
// One reserved range of virtual memory holds every allocation, each with a red zone on both
// sides; freed ranges are never handed out again. A shadow byte per byte says what it is.
constexpr uint8_t kAddressable = 1;  // inside a live allocation (or the block's shared memory)
constexpr uint8_t kInit = 2;         // written since it was allocated
constexpr uint8_t kPending = 4;      // (shared) destination of a cp.async not yet waited for
constexpr uint8_t kWAtomic = 8;      // (shared) the last write was atomic
constexpr uint8_t kRMulti = 16;      // (shared) read by threads of several warps since the last write

extern char *g_arena_lo, *g_arena_hi;  // [lo, hi): the reserved device range (null before use)
extern uint8_t *g_arena_shadow;        // one byte per byte of the range

// ---- threads, warps, blocks ------------------------------------------------------------------
enum class State : uint8_t { Ready, Barrier, Named, Collective, Mbarrier, Done };

// A cp.async in flight: lands when a wait lets it.
struct AsyncCopy {
  char *dst;
  const char *src;
  int bytes, src_bytes;
};

// A TMA reduction in flight (Warp.cpp): its shared-memory source is read at the issuing thread's
// bulk_wait_read or bulk_wait (as late as the program allows), its adds land at bulk_wait or when
// the thread returns.
struct BulkReduce {
  unsigned char map[128];
  int coords[3];
  const char *src;
  std::vector<float> issued;  // the in-bounds elements of the source when issued
  std::vector<float> values;  // the same, once read
  bool read = false;
};

struct Block;

// Where a thread waits: the source line of a barrier or intrinsic when the call site passed it
// (__builtin_FILE / __builtin_LINE: the same for every copy the optimiser makes), else the
// return address.
struct Site {
  const void *pc = nullptr;
  const char *file = nullptr;
  int line = 0;
  bool operator==(const Site &o) const {
    return file || o.file ? (file && o.file && line == o.line && std::strcmp(file, o.file) == 0)
                          : pc == o.pc;
  }
  bool operator!=(const Site &o) const { return !(*this == o); }
};
std::string where(const Site &s);

struct Thread {
  ThreadCtx ctx{};
  unsigned tid = 0;  // linear index in the block
  State state = State::Ready;
  boost::context::fiber fiber, back;  // its own context; the scheduler's, while it runs
  Site site;                          // where it blocked
  // The warp collective it waits in.
  int op_kind = 0;
  unsigned op_mask = 0;
  void *op_arg = nullptr;
  const char *stack_lo = nullptr, *stack_hi = nullptr;  // its stack: local memory, unchecked
  std::vector<AsyncCopy> uncommitted;
  std::deque<std::vector<AsyncCopy>> groups;  // committed cp.async groups, oldest first
  std::vector<BulkReduce> bulk_open;               // TMA reductions since the last bulk_commit
  std::deque<std::vector<BulkReduce>> bulk_groups;  // committed, oldest first
  // Per mbarrier of the block (its index in Block::mbars): how many of its phases this thread is
  // ordered after, by its own waits and by what block barriers, named barriers, warp collectives
  // and mbarrier arrivals passed on from other threads (the race rule of async copies, Checks.cpp).
  std::vector<uint32_t> seen;
};
// seen = max(seen, from), element-wise.
inline void join_seen(std::vector<uint32_t> &seen, const std::vector<uint32_t> &from) {
  if (seen.size() < from.size()) seen.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) seen[i] = seen[i] > from[i] ? seen[i] : from[i];
}
// Completes every TMA reduction of the thread (read, then added): what a return leaves in flight.
void bulk_drain(Thread &t);

// A wgmma of one warp, issued and not yet computed (Warp.cpp).
struct WgmmaOp {
  int elem = 0, n = 0;
  float *d[32] = {};
  uint32_t a[32][4] = {};
  bool a_regs = false, scale_d = false, trans_a = false, trans_b = false;
  uint64_t a_desc = 0, b_desc = 0;
};

struct Warp {
  unsigned index = 0;
  std::vector<WgmmaOp> wgmma_open;               // issued since the last commit
  std::deque<std::vector<WgmmaOp>> wgmma_groups;  // committed, oldest first
  unsigned valid = 0;   // lanes that exist (a last partial warp has fewer)
  unsigned exited = 0;  // lanes that returned
  uint32_t sync_count = 0;  // completed __syncwarp: orders the accesses of its lanes
  unsigned in_collective = 0;  // lanes waiting in a warp collective (State::Collective)
  Thread *lanes[32] = {};
};

// Shared-memory race state of one byte (Checks.cpp).
struct Cell {
  uint32_t w_epoch;  // block epoch of the last write, 0: none
  uint16_t w_tid, w_wsync;
  uint32_t r_epoch;  // a read since that write, 0: none
  uint16_t r_tid, r_wsync;
  // The last write was an async copy's (TMA, bulk copy) that completes in phase a_phase of
  // mbarrier a_bar - 1 (0: not an async copy's).
  uint32_t a_phase;
  uint16_t a_bar;
};

// Global-memory traffic of a launch (runtime.h, Traffic): bytes by kind, then by access width.
enum TrafficSlot : int {
  kTrRead, kTrWritten, kTrAtomic, kTrW1, kTrW2, kTrW4, kTrW8, kTrW16, kTrAsync, kTrAccesses,
  kTrMmaFlops,  // the tensor-core FLOPs the warps issued (Traffic::mma_flops)
  kTrNamedRounds, kTrSlots = kTrNamedRounds + 16  // then the named barriers' rounds, by id
};

// What a worker (an OS thread running blocks of a launch) is doing, for the stalled releases
// (simt::sem_released): running, spinning on a semaphore (it read the same value twice, and no
// thread of its block has run since), held after a release, or out of blocks.
enum class WorkerMode : int { Running, Spinning, Held, Done };
struct alignas(64) WorkerState {  // (a cache line of its own: workers update theirs on every access)
  std::atomic<WorkerMode> mode{WorkerMode::Running};
  // The releases (simt::sem_released) counted before its last poll read its word: a worker spins
  // past a release only if it read the value after it.
  std::atomic<unsigned long long> seen_releases{0};
  const int *poll = nullptr;  // the last poll's word and value (the worker's own thread only)
  int value = 0;
  // The worker's own counts (its thread only): the accesses it checked, and its launch's traffic
  // slots kTrRead .. kTrAccesses, added to the shared atomics when it finishes the launch
  // (flush_counts). An atomic add per access had cost about a quarter of the emulator's time.
  size_t checked = 0;
  size_t traffic[kTrNamedRounds] = {};
};

struct Launch {
  const void *kernel;
  std::string name;
  dim3 grid, block;
  size_t dynamic_smem;
  bool failed = false;  // a finding that stopped a block (deadlock)
  bool stall_releases = false;  // APE_SIMT_STALL_RELEASES with more than one worker
  bool eager_wake = true;       // unless APE_SIMT_EAGER_WAKE=0: an mbarrier's waiters run first (mbar_arrive)
  std::vector<WorkerState> *workers = nullptr;
  std::atomic<size_t> printed{0};
  std::atomic<size_t> traffic[kTrSlots] = {};
};

constexpr size_t kSmemRedzone = 256;

// An mbarrier object of a block (its 8 bytes in shared memory are the key): arrivals expected
// per phase, arrivals and transaction bytes still due in the current phase, phases completed.
struct Mbar {
  unsigned count = 0, pending = 0;
  long long tx = 0;
  unsigned completed = 0;
  // Phases completed before the last mbarrier.init of this object: Thread::seen and Cell::a_phase
  // count phases from the block's start (base + completed), so that a re-initialised barrier's
  // phases are not taken for ones a thread saw before.
  unsigned base = 0;
  // What the current phase's arrivals were ordered after (Thread::seen, joined), and what the
  // last completed phase of each parity passes on to the threads that wait for it.
  std::vector<uint32_t> arrived_seen, done_seen[2];
};

// A named barrier (bar.sync id, count; ids 1-15, 0 is __syncthreads'): the threads expected in
// the current round (0: none arrived yet) and those arrived.
struct NamedBar {
  unsigned count = 0, arrived = 0;
  bool arrive_only = false;  // a thread of the round arrived without waiting (bar.arrive)
  bool aligned_waited = false;  // a thread of the round waits by the aligned bar.sync, at:
  Site aligned_site;
  std::vector<uint32_t> round_seen;  // the round's arrivals' Thread::seen, joined
};

struct Block {
  Launch *launch = nullptr;
  std::vector<std::pair<const void *, Mbar>> mbars;
  NamedBar named[16];
  uint3 idx{};
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  // Shared memory: window = [red zone][dynamic][static][red zone]; `smem` is the dynamic start.
  char *window = nullptr, *smem = nullptr;
  size_t window_bytes = 0, dynamic_bytes = 0, static_bytes = 0;
  uint8_t *flags = nullptr;  // per byte of the window
  Cell *cells = nullptr;     // per byte of the window
  uint32_t epoch = 1;        // completed barriers + 1
  std::vector<std::pair<const void *, size_t>> statics;  // static __shared__: id -> offset
};

// The emulated thread running on this OS thread and its block (null: host code).
struct Worker {
  Thread *thread;
  Block *block;
  WorkerState *state = nullptr;  // this worker's in its launch's list (null: host code)
};
extern thread_local Worker tl_worker;

inline Thread *self() { return tl_worker.thread; }

// Gives control back to the scheduler until this thread is Ready again.
void yield_to_scheduler();

// ---- findings --------------------------------------------------------------------------------
void report(Check check, const std::string &message, const void *pc = nullptr);
std::string thread_name(const Block &b, unsigned tid);
std::string where(const void *pc);  // "in function+0xoff" when the symbol is known

// Adds a warp's tensor-core operation of `flops` (2 m n k) to its launch's count (Traffic::mma_flops).
inline void count_mma(size_t flops) {
  if (tl_worker.state) tl_worker.state->traffic[kTrMmaFlops] += flops;
}

// ---- checked accesses (Checks.cpp) ------------------------------------------------------------
enum class Access : uint8_t { Read, Write, Atomic };
// Checks one access of `bytes` at `addr` by the running emulated thread (or host code), as the
// instrumentation hooks do; the emulator's own loads and stores on behalf of a thread go here.
void check_access(const void *addr, size_t bytes, Access kind, const void *pc);
// Marks [p, p + n) of the block's shared memory as written by the async proxy (TMA, bulk
// copies) for the running thread, completing on mbarrier `bar` in its current phase: initialised,
// no thread's write for the block-barrier race rule (mbarriers order these writes, which block
// barriers do not describe), and readable by a thread only once it is ordered after that phase
// (Thread::seen). An earlier async copy's bytes that this thread is not yet ordered after are a
// write-after-write race (reported once per call: `reported`).
void mark_async_shared_write(Block &b, const char *p, size_t n, const void *bar, bool &reported,
                             const void *pc);
// The index of mbarrier `bar` in b.mbars, -1 when it is none.
int mbar_index(const Block &b, const void *bar);
// Marks [p, p + n) of device memory as written (memset, copies from the host).
void mark_initialised(const void *p, size_t n);
// True when [p, p + n) lies in one live device allocation.
bool device_range_ok(const void *p, size_t n);
// Shared-memory shadow of a block: called when a block starts.
void reset_shared_shadow(Block &b);

std::atomic<size_t> &access_counter();
// Adds worker `w`'s counts (WorkerState::checked, traffic) to the process's and launch `l`'s, and
// clears them: when the worker leaves the launch.
void flush_counts(WorkerState &w, Launch &l);
// Set while the emulator copies on behalf of cp.async, TMA or a bulk copy: their global reads
// count as async copies in the traffic (not by the width of the emulator's element loop).
extern thread_local bool tl_async_copy;
// Adds a finished launch's traffic to the process's per-kernel totals (take_traffic).
void record_traffic(const Launch &l, size_t blocks, size_t threads);

// ---- warp collectives (Runtime.cpp) ------------------------------------------------------------
// Waits until every lane of `mask` has called the same collective (`kind`, same mask), then runs
// `complete(warp, mask, args)` once, on the last lane to arrive, with each lane's `arg`.
using Complete = void (*)(Warp &w, unsigned mask, void *const *args);
void collective(int kind, unsigned mask, void *arg, Complete complete, const Site &site);

enum CollectiveKind : int {
  kSyncwarp = 1,
  kShfl,
  kBallot,
  kMatch,
  kWmmaLoad,
  kWmmaStore,
  kWmmaMma,
  kMma,
  kLdmatrix,
  kStmatrix,
  kWgmma,
  kWgmmaFence,
  kWgmmaCommit,
  kWgmmaWait,
};

}  // namespace ape::simt::detail
