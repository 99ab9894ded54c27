// The SIMT emulator's scheduler, device memory and runtime API (docs/cuda.md, "The emulator").
//
// A launch runs its blocks one after another (or spread over APE_SIMT_WORKERS OS threads); the
// threads of a block are fibers (Boost.Context) switched only at synchronisation points: a
// thread runs until it reaches __syncthreads, a warp collective or its end. The scheduler sweeps
// the threads in index order; when no thread can run, either every live thread waits at a block
// barrier (the barrier completes: a new epoch for racecheck) or the block is stuck (synccheck:
// reported with where each thread waits, and the block is abandoned).
#include "Internal.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace ape::simt {

thread_local ThreadCtx *tl_thread = nullptr;

namespace detail {

thread_local Worker tl_worker{nullptr, nullptr};
char *g_arena_lo = nullptr, *g_arena_hi = nullptr;
uint8_t *g_arena_shadow = nullptr;

namespace {

// ---- settings and statistics -------------------------------------------------------------------
int env_int(const char *name, int fallback) {
  const char *v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

std::atomic<int> g_arch{0};
std::atomic<int> g_sms{0};  // 0: the architecture's (set_sm_count)
std::atomic<int> g_print{-1};
std::atomic<size_t> g_launches{0}, g_blocks{0}, g_switches{0}, g_accesses{0}, g_findings{0};
std::mutex g_findings_mu;
std::vector<Finding> g_pending_findings;

thread_local Launch *tl_launch = nullptr;
thread_local cudaError_t tl_last_error = cudaSuccess;

}  // namespace

std::atomic<size_t> &access_counter() { return g_accesses; }

namespace {
std::mutex g_traffic_mu;
std::vector<Traffic> g_traffic;  // per kernel name, in order of first launch
}  // namespace

void record_traffic(const Launch &l, size_t blocks, size_t threads) {
  std::lock_guard<std::mutex> lock(g_traffic_mu);
  auto it = std::find_if(g_traffic.begin(), g_traffic.end(),
                         [&](const Traffic &t) { return t.kernel == l.name; });
  if (it == g_traffic.end()) {
    g_traffic.emplace_back();
    g_traffic.back().kernel = l.name;
    it = g_traffic.end() - 1;
  }
  Traffic &t = *it;
  auto get = [&](int slot) { return l.traffic[slot].load(); };
  t.launches += 1, t.blocks += blocks, t.threads += threads;
  t.read += get(kTrRead), t.written += get(kTrWritten), t.atomic += get(kTrAtomic);
  for (int w = 0; w < 6; ++w) t.by_width[w] += get(kTrW1 + w);
  t.accesses += get(kTrAccesses);
  t.mma_flops += get(kTrMmaFlops);
  for (int id = 0; id < 16; ++id) t.named_rounds[id] += get(kTrNamedRounds + id);
}

// ---- findings ------------------------------------------------------------------------------------
std::string demangle(const char *name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void *)> d(abi::__cxa_demangle(name, nullptr, nullptr, &status),
                                            std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(name);
}

std::string symbol_name(const void *p) {
  Dl_info info{};
  if (p && dladdr(p, &info) && info.dli_sname) return demangle(info.dli_sname);
  std::ostringstream os;
  os << "kernel@" << p;
  return os.str();
}

std::string where(const void *pc) {
  if (!pc) return "";
  Dl_info info{};
  std::ostringstream os;
  if (dladdr(pc, &info) && info.dli_sname)
    os << " (in " << demangle(info.dli_sname) << "+0x" << std::hex
       << (static_cast<const char *>(pc) - static_cast<const char *>(info.dli_saddr)) << ")";
  else
    os << " (at pc " << pc << ")";
  return os.str();
}

std::string where(const Site &s) {
  if (!s.file) return where(s.pc);
  std::ostringstream os;
  os << " (at " << s.file << ":" << s.line << ")";
  return os.str();
}

std::string thread_name(const Block &b, unsigned tid) {
  const dim3 bd = b.launch ? b.launch->block : dim3{};
  std::ostringstream os;
  os << "(" << tid % bd.x << "," << tid / bd.x % bd.y << "," << tid / (bd.x * bd.y) << ")";
  return os.str();
}

void report(Check check, const std::string &message, const void *pc) {
  Launch *l = tl_launch;
  Block *b = tl_worker.block;
  std::ostringstream os;
  if (b) {
    os << "block (" << b->idx.x << "," << b->idx.y << "," << b->idx.z << ")";
    if (Thread *t = tl_worker.thread) os << " thread " << thread_name(*b, t->tid);
    os << ": ";
  }
  os << message << where(pc);
  Finding f{check, l ? l->name : std::string("host"), os.str()};
  g_findings.fetch_add(1);
  if (g_print.load() < 0) g_print = env_int("APE_SIMT_QUIET", 0) ? 0 : 1;
  constexpr size_t kMaxPrinted = 8;  // per launch
  if (g_print.load() && (!l || l->printed.fetch_add(1) < kMaxPrinted))
    std::fprintf(stderr, "ape-simt: %s: %s: %s\n", check_name(check), f.kernel.c_str(),
                 f.message.c_str());
  std::lock_guard<std::mutex> lock(g_findings_mu);
  if (g_pending_findings.size() < 10000) g_pending_findings.push_back(std::move(f));
}

// ---- device memory ------------------------------------------------------------------------------
namespace {

constexpr size_t kArenaBytes = size_t(64) << 30;  // reserved, not committed
constexpr size_t kRedzone = 256;                  // also cudaMalloc's alignment

struct Arena {
  std::mutex mu;
  size_t top = 0;
  std::unordered_map<const void *, size_t> live;  // start -> bytes
  bool ready = false;
};
Arena &arena() {
  static Arena a;
  return a;
}

bool arena_init(Arena &a) {
  if (a.ready) return true;
  void *data = mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void *shadow = mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (data == MAP_FAILED || shadow == MAP_FAILED) return false;
  g_arena_shadow = static_cast<uint8_t *>(shadow);
  g_arena_lo = static_cast<char *>(data);
  g_arena_hi = g_arena_lo + kArenaBytes;
  a.ready = true;
  return true;
}

void release_pages(char *lo, char *hi) {  // give whole pages inside [lo, hi) back to the OS
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = (reinterpret_cast<uintptr_t>(lo) + page - 1) / page * page;
  const uintptr_t b = reinterpret_cast<uintptr_t>(hi) / page * page;
  if (b > a) madvise(reinterpret_cast<void *>(a), b - a, MADV_DONTNEED);
}

cudaError_t set_error(cudaError_t e) {
  if (e != cudaSuccess) tl_last_error = e;
  return e;
}

}  // namespace

bool device_range_ok(const void *p, size_t n) {
  const char *c = static_cast<const char *>(p);
  if (!g_arena_lo || c < g_arena_lo || c + n > g_arena_hi || c + n < c) return false;
  const uint8_t *s = g_arena_shadow + (c - g_arena_lo);
  for (size_t i = 0; i < n; ++i)
    if (!(s[i] & kAddressable)) return false;
  return true;
}

void mark_initialised(const void *p, size_t n) {
  uint8_t *s = g_arena_shadow + (static_cast<const char *>(p) - g_arena_lo);
  for (size_t i = 0; i < n; ++i) s[i] |= kInit;
}

// ---- fibers ------------------------------------------------------------------------------------------
namespace {

// Stacks of the thread fibers, reused across blocks, with a guard page below each.
constexpr size_t kStackBytes = 256 * 1024;

struct StackPool {
  std::vector<void *> free;  // base addresses (guard page first)
  ~StackPool() {
    for (void *p : free) munmap(p, kStackBytes);
  }
};
thread_local StackPool tl_stacks;
thread_local boost::context::stack_context tl_last_stack;  // the stack allocate() gave last

struct PooledStack {
  boost::context::stack_context allocate() {
    void *base;
    if (!tl_stacks.free.empty()) {
      base = tl_stacks.free.back();
      tl_stacks.free.pop_back();
    } else {
      base = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (base == MAP_FAILED) throw std::bad_alloc();
      mprotect(base, static_cast<size_t>(sysconf(_SC_PAGESIZE)), PROT_NONE);
    }
    boost::context::stack_context sc;
    sc.size = kStackBytes;
    sc.sp = static_cast<char *>(base) + kStackBytes;
    tl_last_stack = sc;
    return sc;
  }
  void deallocate(boost::context::stack_context &sc) noexcept {
    tl_stacks.free.push_back(static_cast<char *>(sc.sp) - sc.size);
  }
};

void resume(Block &b, Thread &t) {
  if (WorkerState *w = tl_worker.state; w && w->mode.load(std::memory_order_relaxed) == WorkerMode::Spinning)
    w->mode.store(WorkerMode::Running, std::memory_order_relaxed);  // another thread of the block runs
  tl_worker.thread = &t;
  tl_thread = &t.ctx;
  t.fiber = std::move(t.fiber).resume();
  tl_worker.thread = nullptr;
  tl_thread = nullptr;
  g_switches.fetch_add(1, std::memory_order_relaxed);
  (void)b;
}

}  // namespace

void yield_to_scheduler() {
  Thread *t = self();
  t->back = std::move(t->back).resume();
}

// ---- the scheduler -----------------------------------------------------------------------------
namespace {

const char *state_name(const Thread &t) {
  switch (t.state) {
  case State::Ready: return "runnable";
  case State::Barrier: return "at __syncthreads";
  case State::Named: return "at a named barrier";
  case State::Collective: return "in a warp collective";
  case State::Mbarrier: return "waiting on an mbarrier";
  case State::Done: return "returned";
  }
  return "?";
}

// "threads 0-31 at __syncthreads (in f+0x10); threads 32-63 ..." for a stuck block.
std::string describe_waits(const Block &b) {
  std::ostringstream os;
  size_t n = b.threads.size(), i = 0;
  bool first = true;
  while (i < n) {
    const Thread &t = b.threads[i];
    size_t j = i + 1;
    while (j < n && b.threads[j].state == t.state && b.threads[j].site == t.site &&
           b.threads[j].op_kind == t.op_kind && b.threads[j].op_mask == t.op_mask)
      ++j;
    os << (first ? "" : "; ") << "threads " << i;
    if (j - 1 > i) os << "-" << j - 1;
    os << " " << state_name(t);
    if (t.state == State::Named) os << " " << t.op_kind;
    if (t.state == State::Collective) os << " (kind " << t.op_kind << ", mask 0x" << std::hex
                                         << t.op_mask << std::dec << ")";
    if (t.state != State::Done) os << where(t.site);
    first = false;
    i = j;
  }
  return os.str();
}

// A block barrier: every thread is ordered after what any thread was (Thread::seen).
void join_all_seen(Block &b) {
  if (b.mbars.empty()) return;
  std::vector<uint32_t> seen;
  for (const Thread &t : b.threads) join_seen(seen, t.seen);
  for (Thread &t : b.threads) t.seen = seen;
}

// Runs one block to its end. False when it was abandoned (deadlock).
bool run_block(Block &b, Body body) {
  Launch &l = *b.launch;
  const unsigned nthreads = l.block.x * l.block.y * l.block.z;
  const unsigned nwarps = (nthreads + 31) / 32;
  b.threads.clear();
  b.threads.resize(nthreads);
  b.warps.assign(nwarps, Warp{});
  b.epoch = 1;
  b.mbars.clear();
  for (NamedBar &nb : b.named) nb = NamedBar{};
  reset_shared_shadow(b);  // before the statics are forgotten: it clears what they used
  b.statics.clear();
  b.static_bytes = 0;
  for (unsigned w = 0; w < nwarps; ++w) b.warps[w].index = w;
  for (unsigned tid = 0; tid < nthreads; ++tid) {
    Thread &t = b.threads[tid];
    t.tid = tid;
    t.ctx.thread_idx = uint3{tid % l.block.x, tid / l.block.x % l.block.y,
                             tid / (l.block.x * l.block.y)};
    t.ctx.block_idx = b.idx;
    t.ctx.block_dim = l.block;
    t.ctx.grid_dim = l.grid;
    t.ctx.lane = tid % 32;
    t.ctx.warp = tid / 32;
    Warp &w = b.warps[tid / 32];
    w.lanes[tid % 32] = &t;
    w.valid |= 1u << (tid % 32);
    Thread *tp = &t;
    t.fiber = boost::context::fiber(
        std::allocator_arg, PooledStack(),
        [tp, body, &b](boost::context::fiber &&sched) -> boost::context::fiber {
          tp->back = std::move(sched);
          body.call(body.self);
          if (!tp->uncommitted.empty() || !tp->groups.empty())
            report(Check::Async, "returns with cp.async copies never waited for");
          bulk_drain(*tp);  // TMA reductions' adds may land after a return, their reads may not
          tp->state = State::Done;
          Warp &w = b.warps[tp->tid / 32];
          w.exited |= 1u << (tp->tid % 32);
          if (w.exited == w.valid && (!w.wgmma_open.empty() || !w.wgmma_groups.empty()))
            report(Check::Async, "warp returns with wgmma operations never waited for");
          return std::move(tp->back);
        });
    t.stack_hi = static_cast<const char *>(tl_last_stack.sp);  // local memory: unchecked
    t.stack_lo = t.stack_hi - tl_last_stack.size;
  }

  for (;;) {
    bool ran = false, all_done = true;
    for (Thread &t : b.threads) {
      if (t.state == State::Ready) {
        resume(b, t);
        ran = true;
      }
      all_done = all_done && t.state == State::Done;
    }
    if (all_done) {
      // A round of a named barrier left incomplete: arrivals the protocol never matched.
      for (int id = 1; id < 16; ++id)
        if (b.named[id].arrived != 0) {
          std::ostringstream os;
          os << "the block ends with " << b.named[id].arrived << " of " << b.named[id].count
             << " threads arrived at named barrier " << id << " (a round never completed)";
          report(Check::Synccheck, os.str());
        }
      return true;
    }
    if (ran) continue;
    // Nobody can run: a barrier every live thread reached completes; anything else is stuck.
    const Site *site = nullptr;
    bool barrier = true, same_site = true;
    for (Thread &t : b.threads) {
      if (t.state == State::Done) continue;
      if (t.state != State::Barrier) barrier = false;
      if (!site) site = &t.site;
      else if (t.site != *site) same_site = false;
    }
    if (barrier) {
      if (!same_site)
        report(Check::Synccheck, "threads wait at different __syncthreads calls: " +
                                     describe_waits(b));
      ++b.epoch;
      join_all_seen(b);
      for (Thread &t : b.threads)
        if (t.state == State::Barrier) t.state = State::Ready;
      continue;
    }
    report(Check::Synccheck, "deadlock: not every thread reaches the same barrier or warp "
                             "collective: " + describe_waits(b));
    l.failed = true;
    for (Thread &t : b.threads) t.fiber = boost::context::fiber();  // unwinds the stuck fibers
    return false;
  }
}

struct FuncAttrs {
  std::mutex mu;
  std::unordered_map<const void *, int> max_dynamic_smem;
};
FuncAttrs &func_attrs() {
  static FuncAttrs f;
  return f;
}

}  // namespace

// ---- warp collectives ------------------------------------------------------------------------------
void collective(int kind, unsigned mask, void *arg, Complete complete, const Site &site) {
  Thread *t = self();
  if (!t) {
    report(Check::Synccheck, "a warp intrinsic is called from host code" + where(site));
    std::abort();
  }
  Block &b = *tl_worker.block;
  Warp &w = b.warps[t->tid / 32];
  const unsigned bit = 1u << (t->tid % 32);
  if (!(mask & bit)) {
    std::ostringstream os;
    os << "calls a warp collective with mask 0x" << std::hex << mask
       << " that does not include its own lane " << std::dec << t->tid % 32;
    report(Check::Synccheck, os.str() + where(site));
    mask |= bit;
  }
  if (mask & ~w.valid) {
    std::ostringstream os;
    os << "warp collective mask 0x" << std::hex << mask << " names lanes that do not exist (0x"
       << (mask & ~w.valid) << ")";
    report(Check::Synccheck, os.str() + where(site));
    mask &= w.valid;
  }
  if (mask & w.exited) {
    std::ostringstream os;
    os << "warp collective mask 0x" << std::hex << mask << " names lanes that have returned (0x"
       << (mask & w.exited) << ")";
    report(Check::Synccheck, os.str() + where(site));
    mask &= ~w.exited;
  }
  t->op_kind = kind;
  t->op_mask = mask;
  t->op_arg = arg;
  t->site = site;
  t->state = State::Collective;
  w.in_collective |= bit;
  // The last lane of the mask to arrive checks that they all meet in this collective, and
  // completes it (the others wait: a test of the mask against the waiting lanes, not of each lane).
  if (mask & ~w.in_collective) {
    while (t->state != State::Ready) yield_to_scheduler();
    return;
  }
  bool all = true;
  for (unsigned lane = 0; lane < 32; ++lane) {
    if (!(mask >> lane & 1u)) continue;
    Thread *u = w.lanes[lane];
    if (u->op_kind != kind || u->op_mask != mask) {
      std::ostringstream os;
      os << "lanes of one warp meet in different collectives: lane " << t->tid % 32 << " (kind "
         << kind << ", mask 0x" << std::hex << mask << ") and lane " << std::dec << lane
         << " (kind " << u->op_kind << ", mask 0x" << std::hex << u->op_mask << ")";
      report(Check::Synccheck, os.str() + where(site));
      all = false;
    }
  }
  if (!all) {
    while (t->state != State::Ready) yield_to_scheduler();
    return;
  }
  void *args[32] = {};
  for (unsigned lane = 0; lane < 32; ++lane)
    if (mask >> lane & 1u) args[lane] = w.lanes[lane]->op_arg;
  if (!b.mbars.empty()) {  // the lanes are ordered after what any of them was (Thread::seen)
    std::vector<uint32_t> seen;
    for (unsigned lane = 0; lane < 32; ++lane)
      if (mask >> lane & 1u) join_seen(seen, w.lanes[lane]->seen);
    for (unsigned lane = 0; lane < 32; ++lane)
      if (mask >> lane & 1u) w.lanes[lane]->seen = seen;
  }
  complete(w, mask, args);
  ++w.sync_count;
  w.in_collective &= ~mask;
  for (unsigned lane = 0; lane < 32; ++lane)
    if (mask >> lane & 1u) w.lanes[lane]->state = State::Ready;
}

}  // namespace detail

using namespace detail;

// ---- the semaphores' hooks (cuda.h: sem_polled, sem_released) -------------------------------------
namespace {
std::atomic<unsigned long long> g_releases{0};  // sem_released calls so far (all launches)
}  // namespace

void sem_polled(const int *p, int value) {
  WorkerState *w = tl_worker.state;
  if (!w) return;
  // The word read once more after the count of releases: a value still the same was read after
  // every release counted (the poll's own read may predate one).
  const unsigned long long releases = g_releases.load(std::memory_order_seq_cst);
  const bool same = __atomic_load_n(p, __ATOMIC_SEQ_CST) == value;
  const bool again = same && w->poll == p && w->value == value;
  w->poll = p, w->value = value;
  w->seen_releases.store(releases, std::memory_order_seq_cst);
  w->mode.store(again ? WorkerMode::Spinning : WorkerMode::Running, std::memory_order_seq_cst);
}

void sem_released() {
  WorkerState *me = tl_worker.state;
  const Launch *l = tl_launch;
  if (!me || !l || !l->stall_releases) return;
  me->poll = nullptr;
  me->mode.store(WorkerMode::Held, std::memory_order_seq_cst);
  const unsigned long long mine = g_releases.fetch_add(1, std::memory_order_seq_cst) + 1;
  // Until nobody else can move without this block: every other worker spins on a value it read
  // after this release, is held or has no block left (a safety bound: a block stuck for a minute
  // is its own finding, which it reports).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    bool quiet = true;
    for (const WorkerState &w : *l->workers) {
      if (&w == me) continue;
      const WorkerMode mode = w.mode.load(std::memory_order_seq_cst);
      quiet = quiet && (mode == WorkerMode::Held || mode == WorkerMode::Done ||
                        (mode == WorkerMode::Spinning && w.seen_releases.load(std::memory_order_seq_cst) >= mine));
    }
    if (quiet || std::chrono::steady_clock::now() > until) break;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  me->mode.store(WorkerMode::Running, std::memory_order_seq_cst);
}

// ---- public controls ------------------------------------------------------------------------------
const char *check_name(Check c) {
  switch (c) {
  case Check::Memcheck: return "memcheck";
  case Check::Racecheck: return "racecheck";
  case Check::Initcheck: return "initcheck";
  case Check::Synccheck: return "synccheck";
  case Check::Async: return "async";
  case Check::Launch: return "launch";
  }
  return "?";
}

std::vector<Finding> take_findings() {
  std::lock_guard<std::mutex> lock(g_findings_mu);
  std::vector<Finding> out;
  out.swap(g_pending_findings);
  return out;
}
size_t finding_count() { return g_findings.load(); }
void set_print(bool on) { g_print = on ? 1 : 0; }

size_t max_dynamic_smem(int sm) {
  switch (sm) {
  case 80: return 166912;           // 163 KiB
  case 86: case 89: return 101376;  // 99 KiB
  case 90: return 232448;           // 227 KiB
  default: return 0;
  }
}
void set_arch(int sm) {
  if (max_dynamic_smem(sm) == 0) {
    std::fprintf(stderr, "ape-simt: unknown architecture sm_%d (80, 86, 89 or 90)\n", sm);
    std::abort();
  }
  g_arch = sm;
}
int arch() {
  if (g_arch.load() == 0) set_arch(env_int("APE_SIMT_ARCH", 80));
  return g_arch.load();
}
void set_sm_count(int n) { g_sms = n > 0 ? n : 0; }
int sm_count() {
  const int n = g_sms.load();
  return n > 0 ? n : arch() == 90 ? 132 : 108;
}

std::vector<Traffic> take_traffic() {
  std::lock_guard<std::mutex> lock(detail::g_traffic_mu);
  std::vector<Traffic> out;
  out.swap(detail::g_traffic);
  return out;
}

Stats stats() {
  Stats s;
  s.launches = g_launches.load(), s.blocks = g_blocks.load(), s.switches = g_switches.load();
  s.accesses = g_accesses.load();
  return s;
}

// ---- launches -------------------------------------------------------------------------------------
cudaError_t occupancy(int *blocks, const void *kernel, int threads, size_t dynamic_smem) {
  if (!blocks || threads <= 0 || threads > 1024) return set_error(cudaErrorInvalidValue);
  int allowed = 48 * 1024;
  {
    std::lock_guard<std::mutex> lock(func_attrs().mu);
    auto it = func_attrs().max_dynamic_smem.find(kernel);
    if (it != func_attrs().max_dynamic_smem.end()) allowed = std::max(allowed, it->second);
  }
  *blocks = 0;
  if (dynamic_smem > static_cast<size_t>(allowed) || dynamic_smem > max_dynamic_smem(arch())) return cudaSuccess;
  // Per SM (the CUDA C++ Programming Guide's table of compute capabilities): threads, blocks and
  // shared memory, of which each block also takes 1 KiB reserved for the system.
  const int sm = arch();
  const int max_threads = sm == 86 || sm == 89 ? 1536 : 2048, max_blocks = sm == 86 ? 16 : sm == 89 ? 24 : 32;
  const size_t smem = sm == 80 ? 167936 : sm == 90 ? 233472 : 102400, per_block = dynamic_smem + 1024;
  const int warps = (threads + 31) / 32;
  *blocks = std::min({max_threads / (32 * warps), max_blocks, static_cast<int>(smem / per_block)});
  return cudaSuccess;
}

cudaError_t func_set_attribute(const void *kernel, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return set_error(cudaErrorInvalidValue);
  if (value < 0 || static_cast<size_t>(value) > max_dynamic_smem(arch())) {
    std::ostringstream os;
    os << "cudaFuncSetAttribute(" << symbol_name(kernel) << ", MaxDynamicSharedMemorySize, "
       << value << "): sm_" << arch() << " allows at most " << max_dynamic_smem(arch())
       << " bytes per block";
    report(Check::Launch, os.str());
    return set_error(cudaErrorInvalidValue);
  }
  std::lock_guard<std::mutex> lock(func_attrs().mu);
  func_attrs().max_dynamic_smem[kernel] = value;
  return cudaSuccess;
}

cudaError_t launch_grid(const void *kernel, dim3 grid, dim3 block, size_t dynamic_smem,
                        cudaStream_t stream, Body body) {
  (void)stream;
  Launch l;
  l.kernel = kernel;
  l.name = symbol_name(kernel);
  l.grid = grid, l.block = block, l.dynamic_smem = dynamic_smem;
  Launch *outer = tl_launch;
  tl_launch = &l;
  struct Restore {
    Launch *outer;
    ~Restore() { tl_launch = outer; }
  } restore{outer};
  g_launches.fetch_add(1);

  // The launch checks of the emulated architecture.
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  std::ostringstream bad;
  if (threads == 0 || threads > 1024 || block.z > 64)
    bad << "block (" << block.x << "," << block.y << "," << block.z
        << ") has more than 1024 threads (or none, or z > 64)";
  else if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 ||
           grid.x > 2147483647u)
    bad << "grid (" << grid.x << "," << grid.y << "," << grid.z
        << ") is empty or exceeds (2^31-1, 65535, 65535)";
  if (!bad.str().empty()) {
    report(Check::Launch, bad.str());
    return set_error(cudaErrorInvalidConfiguration);
  }
  int allowed = 48 * 1024;
  {
    std::lock_guard<std::mutex> lock(func_attrs().mu);
    auto it = func_attrs().max_dynamic_smem.find(kernel);
    if (it != func_attrs().max_dynamic_smem.end()) allowed = std::max(allowed, it->second);
  }
  if (dynamic_smem > static_cast<size_t>(allowed) || dynamic_smem > max_dynamic_smem(arch())) {
    std::ostringstream os;
    os << "asks for " << dynamic_smem << " bytes of dynamic shared memory; allowed: " << allowed
       << " (48 KiB without cudaFuncSetAttribute), sm_" << arch() << "'s limit "
       << max_dynamic_smem(arch());
    report(Check::Launch, os.str());
    return set_error(cudaErrorInvalidValue);
  }

  const size_t nblocks = size_t(grid.x) * grid.y * grid.z;
  const size_t window = kSmemRedzone + max_dynamic_smem(90) + kSmemRedzone;
  const int workers = std::clamp(env_int("APE_SIMT_WORKERS", 1), 1, 64);
  std::vector<WorkerState> states(static_cast<size_t>(workers));
  l.workers = &states;
  l.stall_releases = workers > 1 && nblocks > 1 && env_int("APE_SIMT_STALL_RELEASES", 0) != 0;
  l.eager_wake = env_int("APE_SIMT_EAGER_WAKE", 1) != 0;
  auto worker = [&](std::atomic<size_t> &next, WorkerState &state) {
    tl_launch = &l;
    tl_worker.state = &state;
    Block b;
    b.launch = &l;
    // Shared memory starts 1024-byte aligned, as APE_DYNAMIC_SMEM declares it on the GPU (the
    // swizzled tiles' address arithmetic relies on it).
    std::vector<char> mem(window + 1024);
    std::vector<uint8_t> flags(window);
    std::vector<Cell> cells(window);
    const uintptr_t start = reinterpret_cast<uintptr_t>(mem.data()) + kSmemRedzone;
    b.window = reinterpret_cast<char *>((start + 1023) / 1024 * 1024 - kSmemRedzone);
    b.window_bytes = window, b.flags = flags.data(), b.cells = cells.data();
    b.smem = b.window + kSmemRedzone;
    b.dynamic_bytes = dynamic_smem;
    tl_worker.block = &b;
    for (size_t n; (n = next.fetch_add(1)) < nblocks && !l.failed;) {
      b.idx = uint3{static_cast<unsigned>(n % grid.x), static_cast<unsigned>(n / grid.x % grid.y),
                    static_cast<unsigned>(n / (size_t(grid.x) * grid.y))};
      state.mode.store(WorkerMode::Running, std::memory_order_release);
      state.poll = nullptr;
      run_block(b, body);
      g_blocks.fetch_add(1, std::memory_order_relaxed);
    }
    flush_counts(state, l);
    state.mode.store(WorkerMode::Done, std::memory_order_release);
    tl_worker.block = nullptr;
    tl_worker.state = nullptr;
  };
  std::atomic<size_t> next{0};
  if (workers == 1 || nblocks == 1) {
    worker(next, states[0]);
  } else {
    std::vector<std::thread> pool;
    for (int w = 0; w < workers; ++w) pool.emplace_back(worker, std::ref(next), std::ref(states[static_cast<size_t>(w)]));
    for (auto &th : pool) th.join();
  }
  l.workers = nullptr;
  record_traffic(l, nblocks, nblocks * threads);
  return l.failed ? set_error(cudaErrorLaunchFailure) : cudaSuccess;
}

unsigned char *dynamic_smem() { return reinterpret_cast<unsigned char *>(tl_worker.block->smem); }

uint32_t smem_window_offset(const void *p) {
  const Block *b = tl_worker.block;
  const char *c = static_cast<const char *>(p);
  if (!b || c < b->smem || c > b->window + b->window_bytes) {
    report(Check::Memcheck, "a wgmma descriptor's address is not in the block's shared memory",
           __builtin_return_address(0));
    return 0;
  }
  return static_cast<uint32_t>(c - b->smem);
}

void *static_smem(const void *id, size_t bytes, size_t align) {
  Block &b = *tl_worker.block;
  for (auto &[key, off] : b.statics)
    if (key == id) return b.smem + off;
  size_t off = (b.dynamic_bytes + b.static_bytes + align - 1) / align * align;
  if (off + bytes > max_dynamic_smem(arch())) {
    std::ostringstream os;
    os << "static __shared__ storage (" << bytes << " bytes at offset " << off
       << ") exceeds sm_" << arch() << "'s " << max_dynamic_smem(arch()) << " bytes per block";
    report(Check::Launch, os.str());
    std::abort();
  }
  b.statics.emplace_back(id, off);
  b.static_bytes = off + bytes - b.dynamic_bytes;
  for (size_t i = 0; i < bytes; ++i) b.flags[kSmemRedzone + off + i] |= kAddressable;
  return b.smem + off;
}

// ---- synchronisation ---------------------------------------------------------------------------
void syncthreads(const char *file, int line) {
  Thread *t = self();
  if (!t) {
    report(Check::Synccheck, "__syncthreads is called from host code");
    std::abort();
  }
  t->site = Site{__builtin_return_address(0), file, line};
  t->state = State::Barrier;
  while (t->state != State::Ready) yield_to_scheduler();
}

// bar.sync / bar.arrive id, count: a round of barrier `id` completes when `count` threads (whole
// warps) of the block have arrived, by either; bar.sync waits for its round, bar.arrive does not.
// The race check credits block barriers, rounds of a named barrier that every thread of the block
// takes part in by bar.sync (count = the block's threads: a block barrier under another id, as
// warp-specialised kernels use one where their roles run different code; a thread that arrives by
// bar.arrive runs on unordered) and warp collectives with ordering, so
// accesses that only a named barrier of fewer threads orders across warps are reported
// (conservative: the kernels use those to order work, e.g. whose wgmma issue comes first, not to
// publish shared memory).
// An aligned bar.sync (PTX: bar.sync = barrier.sync.aligned) promises that every thread waiting in
// the round runs the same instruction: waiters at two source lines are reported (a GPU's behaviour
// is undefined there; compute-sanitizer's synccheck reports "Divergent thread(s) in block"), as
// the unaligned barrier.sync allows them.
void named_barrier(int id, int count, bool wait, bool aligned, const char *file, int line) {
  Thread *t = self();
  if (!t) {
    report(Check::Synccheck, "bar.sync / bar.arrive is called from host code");
    std::abort();
  }
  Block &b = *tl_worker.block;
  const int nthreads = static_cast<int>(b.threads.size());
  t->site = Site{__builtin_return_address(0), file, line};
  if (id < 1 || id > 15 || count <= 0 || count % 32 != 0 || count > nthreads) {
    std::ostringstream os;
    os << (wait ? "bar.sync " : "bar.arrive ") << id << ", " << count
       << ": needs an id of 1-15 (0 is __syncthreads') and "
       << "a count of whole warps, at most the block's " << nthreads << " threads";
    report(Check::Synccheck, os.str(), __builtin_return_address(0));
    return;
  }
  NamedBar &nb = b.named[id];
  if (nb.arrived == 0) {
    nb.count = static_cast<unsigned>(count);
  } else if (nb.count != static_cast<unsigned>(count)) {
    std::ostringstream os;
    os << "barrier " << id << ": threads arrive with counts " << nb.count << " and " << count;
    report(Check::Synccheck, os.str(), __builtin_return_address(0));
  }
  if (!wait) nb.arrive_only = true;
  if (wait && aligned) {
    if (!nb.aligned_waited) {
      nb.aligned_waited = true;
      nb.aligned_site = t->site;
    } else if (nb.aligned_site != t->site) {
      std::ostringstream os;
      os << "bar.sync " << id << ", " << count << " (aligned) is waited on in one round at two "
         << "instructions:" << where(nb.aligned_site) << " and" << where(t->site)
         << "; waiters in different code take barrier.sync (ptx::bar_sync_unaligned)";
      report(Check::Synccheck, os.str(), __builtin_return_address(0));
      nb.aligned_site = t->site;  // one report per change of site
    }
  }
  join_seen(nb.round_seen, t->seen);  // an arrival releases what its thread was ordered after
  if (++nb.arrived >= nb.count) {  // the round completes: its waiters run on
    nb.arrived = 0;
    if (nb.count == static_cast<unsigned>(nthreads) && !nb.arrive_only) ++b.epoch;  // a block barrier
    nb.arrive_only = false;
    nb.aligned_waited = false;
    b.launch->traffic[kTrNamedRounds + id].fetch_add(1, std::memory_order_relaxed);
    for (Thread &o : b.threads)
      if (o.state == State::Named && o.op_kind == id) {
        join_seen(o.seen, nb.round_seen);
        o.state = State::Ready;
      }
    if (wait) join_seen(t->seen, nb.round_seen);
    nb.round_seen.clear();
    return;
  }
  if (!wait) return;
  t->state = State::Named;
  t->op_kind = id;
  while (t->state != State::Ready) yield_to_scheduler();
}

namespace {
struct ShflArg {
  uint64_t value, out;
  int src, width, mode;
};
struct BallotArg {
  bool pred;
  unsigned out;
};
}  // namespace

void syncwarp(unsigned mask, const char *file, int line) {
  collective(kSyncwarp, mask, nullptr, [](Warp &, unsigned, void *const *) {},
             Site{__builtin_return_address(0), file, line});
}

uint64_t shfl(unsigned mask, uint64_t value, int src, int width, int mode, int bytes,
              const char *file, int line) {
  (void)bytes;
  ShflArg arg{value, 0, src, width, mode};
  collective(kShfl, mask, &arg, [](Warp &w, unsigned m, void *const *args) {
    for (unsigned lane = 0; lane < 32; ++lane) {
      if (!(m >> lane & 1u)) continue;
      auto *a = static_cast<ShflArg *>(args[lane]);
      const int width = a->width, seg = static_cast<int>(lane) & ~(width - 1);
      const int l = static_cast<int>(lane) - seg;  // lane within the segment
      int from = static_cast<int>(lane);
      switch (a->mode) {
      case 0: from = seg + (a->src & (width - 1)); break;
      case 1: from = l >= a->src ? static_cast<int>(lane) - a->src : static_cast<int>(lane); break;
      case 2: from = l + a->src < width ? static_cast<int>(lane) + a->src : static_cast<int>(lane); break;
      case 3: {
        const int j = static_cast<int>(lane) ^ a->src;
        from = (j & ~(width - 1)) == seg ? j : static_cast<int>(lane);
        break;
      }
      }
      if (!(m >> from & 1u)) {
        std::ostringstream os;
        os << "lane " << lane << " shuffles from lane " << from << ", outside the mask 0x"
           << std::hex << m << " (an undefined value)";
        report(Check::Synccheck, os.str());
        a->out = a->value;
        continue;
      }
      a->out = static_cast<ShflArg *>(args[from])->value;
    }
    (void)w;
  }, Site{__builtin_return_address(0), file, line});
  return arg.out;
}

unsigned ballot(unsigned mask, bool pred, const char *file, int line) {
  BallotArg arg{pred, 0};
  collective(kBallot, mask, &arg, [](Warp &, unsigned m, void *const *args) {
    unsigned bits = 0;
    for (unsigned lane = 0; lane < 32; ++lane)
      if ((m >> lane & 1u) && static_cast<BallotArg *>(args[lane])->pred) bits |= 1u << lane;
    for (unsigned lane = 0; lane < 32; ++lane)
      if (m >> lane & 1u) static_cast<BallotArg *>(args[lane])->out = bits;
  }, Site{__builtin_return_address(0), file, line});
  return arg.out;
}

unsigned match_any(unsigned mask, uint64_t value, const char *file, int line) {
  ShflArg arg{value, 0, 0, 0, 0};
  collective(kMatch, mask, &arg, [](Warp &, unsigned m, void *const *args) {
    for (unsigned lane = 0; lane < 32; ++lane) {
      if (!(m >> lane & 1u)) continue;
      auto *a = static_cast<ShflArg *>(args[lane]);
      unsigned peers = 0;
      for (unsigned other = 0; other < 32; ++other)
        if ((m >> other & 1u) && static_cast<ShflArg *>(args[other])->value == a->value) peers |= 1u << other;
      a->out = peers;
    }
  }, Site{__builtin_return_address(0), file, line});
  return static_cast<unsigned>(arg.out);
}

unsigned active_mask() {
  Thread *t = self();
  if (!t) return 0;
  const Warp &w = tl_worker.block->warps[t->tid / 32];
  return w.valid & ~w.exited;
}

// ---- atomics ------------------------------------------------------------------------------------
#define APE_ATOMIC_CHECK(p, n) check_access((p), (n), Access::Atomic, __builtin_return_address(0))

float atomic_add_f32(float *p, float v) {
  APE_ATOMIC_CHECK(p, 4);
  uint32_t old = __atomic_load_n(reinterpret_cast<uint32_t *>(p), __ATOMIC_RELAXED), next;
  do {
    next = f32_bits(bits_f32(old) + v);
  } while (!__atomic_compare_exchange_n(reinterpret_cast<uint32_t *>(p), &old, next, true,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return bits_f32(old);
}
void atomic_add_f32x2(float *p, float a, float b) {
  if (reinterpret_cast<uintptr_t>(p) % 8 != 0) {
    std::ostringstream os;
    os << "8-byte reduction at " << static_cast<const void *>(p) << ": the address is not 8-byte aligned";
    detail::report(Check::Memcheck, os.str(), __builtin_return_address(0));
  }
  APE_ATOMIC_CHECK(p, 8);
  for (int k = 0; k < 2; ++k) {
    uint32_t old = __atomic_load_n(reinterpret_cast<uint32_t *>(p + k), __ATOMIC_RELAXED), next;
    const float v = k == 0 ? a : b;
    do {
      next = f32_bits(bits_f32(old) + v);
    } while (!__atomic_compare_exchange_n(reinterpret_cast<uint32_t *>(p + k), &old, next, true,
                                          __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  }
}
double atomic_add_f64(double *p, double v) {
  APE_ATOMIC_CHECK(p, 8);
  uint64_t old = __atomic_load_n(reinterpret_cast<uint64_t *>(p), __ATOMIC_RELAXED), next;
  double o, n;
  do {
    std::memcpy(&o, &old, 8);
    n = o + v;
    std::memcpy(&next, &n, 8);
  } while (!__atomic_compare_exchange_n(reinterpret_cast<uint64_t *>(p), &old, next, true,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  std::memcpy(&o, &old, 8);
  return o;
}
unsigned long long atomic_add_u64(unsigned long long *p, unsigned long long v) {
  APE_ATOMIC_CHECK(p, 8);
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
unsigned atomic_add_u32(unsigned *p, unsigned v) {
  APE_ATOMIC_CHECK(p, 4);
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
int atomic_add_i32(int *p, int v) {
  APE_ATOMIC_CHECK(p, 4);
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
unsigned atomic_or_u32(unsigned *p, unsigned v) {
  APE_ATOMIC_CHECK(p, 4);
  return __atomic_fetch_or(p, v, __ATOMIC_RELAXED);
}
unsigned long long atomic_or_u64(unsigned long long *p, unsigned long long v) {
  APE_ATOMIC_CHECK(p, 8);
  return __atomic_fetch_or(p, v, __ATOMIC_RELAXED);
}
int atomic_max_i32(int *p, int v) {
  APE_ATOMIC_CHECK(p, 4);
  int old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v &&
         !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
int atomic_exch_i32(int *p, int v) {
  APE_ATOMIC_CHECK(p, 4);
  return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);
}
unsigned atomic_cas_u32(unsigned *p, unsigned compare, unsigned v) {
  APE_ATOMIC_CHECK(p, 4);
  __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return compare;
}
unsigned long long atomic_cas_u64(unsigned long long *p, unsigned long long compare,
                                  unsigned long long v) {
  APE_ATOMIC_CHECK(p, 8);
  __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return compare;
}

// ---- f16 ------------------------------------------------------------------------------------------
uint16_t f32_to_f16_rn(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7fffu);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {  // below 2^-14: subnormal (or zero) in f16, units of 2^-24
    // value / 2^-24, rounded to nearest even: done in float arithmetic, exact for these ranges.
    const float scaled = bits_f32(abs) * 16777216.0f;  // * 2^24
    const float r = std::nearbyint(scaled);            // the default mode: nearest even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 23-bit mantissa to 10 bits.
  const uint32_t rounding = 0xfffu + ((abs >> 13) & 1u);
  const uint32_t r = (abs + rounding - (112u << 23)) >> 13;
  return static_cast<uint16_t>(sign | r);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float v = static_cast<float>(man) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (man << 13));  // inf or NaN
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

}  // namespace ape::simt

// ---- the runtime API ----------------------------------------------------------------------------
using namespace ape::simt;
using namespace ape::simt::detail;

cudaError_t cudaMalloc(void **ptr, size_t bytes) {
  if (!ptr) return set_error(cudaErrorInvalidValue);
  *ptr = nullptr;
  Arena &a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  if (!arena_init(a)) return set_error(cudaErrorMemoryAllocation);
  const size_t start = a.top + kRedzone;
  const size_t rounded = (std::max<size_t>(bytes, 1) + kRedzone - 1) / kRedzone * kRedzone;
  if (start + rounded + kRedzone > kArenaBytes) return set_error(cudaErrorMemoryAllocation);
  char *p = g_arena_lo + start;
  std::memset(g_arena_shadow + start, kAddressable, bytes);
  std::memset(p, 0xff, bytes);  // what a fresh allocation holds is unspecified
  a.top = start + rounded;
  a.live[p] = bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
  if (!ptr) return cudaSuccess;
  Arena &a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  auto it = a.live.find(ptr);
  if (it == a.live.end()) {
    std::ostringstream os;
    os << "cudaFree(" << ptr << "): not a live allocation (freed twice, or never allocated)";
    report(Check::Memcheck, os.str());
    return set_error(cudaErrorInvalidDevicePointer);
  }
  char *p = static_cast<char *>(ptr);
  const size_t off = static_cast<size_t>(p - g_arena_lo);
  std::memset(g_arena_shadow + off, 0, it->second);
  release_pages(p, p + it->second);
  release_pages(reinterpret_cast<char *>(g_arena_shadow + off),
                reinterpret_cast<char *>(g_arena_shadow + off + it->second));
  a.live.erase(it);
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t) { return cudaMalloc(ptr, bytes); }
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t) { return cudaFree(ptr); }

cudaError_t cudaMemset(void *ptr, int value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (!device_range_ok(ptr, bytes)) {
    std::ostringstream os;
    os << "cudaMemset(" << ptr << ", " << bytes << " bytes): outside every live allocation";
    report(Check::Memcheck, os.str());
    return set_error(cudaErrorInvalidValue);
  }
  std::memset(ptr, value, bytes);
  mark_initialised(ptr, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t) {
  return cudaMemset(ptr, value, bytes);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  const bool dst_dev = device_range_ok(dst, bytes), src_dev = device_range_ok(src, bytes);
  bool ok = true;
  switch (kind) {
  case cudaMemcpyHostToDevice: ok = dst_dev; break;
  case cudaMemcpyDeviceToHost: ok = src_dev; break;
  case cudaMemcpyDeviceToDevice: ok = dst_dev && src_dev; break;
  case cudaMemcpyHostToHost: ok = true; break;
  case cudaMemcpyDefault: ok = true; break;
  default: return set_error(cudaErrorInvalidMemcpyDirection);
  }
  if (!ok) {
    std::ostringstream os;
    os << "cudaMemcpy(" << dst << ", " << src << ", " << bytes << " bytes, kind " << kind
       << "): a device side lies outside every live allocation";
    report(Check::Memcheck, os.str());
    return set_error(cudaErrorInvalidValue);
  }
  std::memmove(dst, src, bytes);
  if (dst_dev) mark_initialised(dst, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                              size_t height, cudaMemcpyKind kind, cudaStream_t) {
  if (width > dpitch || width > spitch) return set_error(cudaErrorInvalidPitchValue);
  for (size_t r = 0; r < height; ++r) {
    const cudaError_t err = cudaMemcpy(static_cast<char *>(dst) + r * dpitch,
                                       static_cast<const char *>(src) + r * spitch, width, kind);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned) {
  if (!event) return set_error(cudaErrorInvalidValue);
  *event = reinterpret_cast<cudaEvent_t>(new char(0));
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  return event ? cudaSuccess : set_error(cudaErrorInvalidValue);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t event, unsigned) {
  return event ? cudaSuccess : set_error(cudaErrorInvalidValue);
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned) {
  if (!stream) return set_error(cudaErrorInvalidValue);
  *stream = reinterpret_cast<cudaStream_t>(new char(0));
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (!stream) return set_error(cudaErrorInvalidValue);
  delete reinterpret_cast<char *>(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus *status) {
  if (!status) return set_error(cudaErrorInvalidValue);
  *status = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (!event) return set_error(cudaErrorInvalidValue);
  delete reinterpret_cast<char *>(event);
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int *count) {
  if (count) *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
  if (device) *device = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int) {
  if (!value) return set_error(cudaErrorInvalidValue);
  switch (attr) {
  case cudaDevAttrMaxSharedMemoryPerBlockOptin:
    *value = static_cast<int>(max_dynamic_smem(arch()));
    return cudaSuccess;
  case cudaDevAttrComputeCapabilityMajor: *value = arch() / 10; return cudaSuccess;
  case cudaDevAttrComputeCapabilityMinor: *value = arch() % 10; return cudaSuccess;
  case cudaDevAttrMultiProcessorCount: *value = sm_count(); return cudaSuccess;
  }
  return set_error(cudaErrorInvalidValue);
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = tl_last_error;
  tl_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return tl_last_error; }
const char *cudaGetErrorString(cudaError_t err) {
  switch (err) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  case cudaErrorInvalidDevicePointer: return "invalid device pointer";
  case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
  case cudaErrorInvalidPitchValue: return "invalid pitch argument";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected";
  case cudaErrorInvalidDeviceFunction: return "invalid device function";
  case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
  case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
  case cudaErrorLaunchFailure: return "unspecified launch failure";
  case cudaErrorNotSupported: return "operation not supported";
  }
  return "unrecognized error code";
}
