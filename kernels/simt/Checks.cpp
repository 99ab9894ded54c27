// memcheck, racecheck and initcheck of the SIMT emulator (ape/simt/runtime.h).
//
// Emulated kernel translation units are compiled with gcc's -fsanitize=thread instrumentation,
// which calls __tsan_readN / __tsan_writeN before every load and store it cannot prove local,
// but they are linked WITHOUT ThreadSanitizer's runtime: the hooks below are the emulator's own.
// Each access is classified by address:
//   - the running thread's fiber stack (local memory): not checked;
//   - the block's shared-memory window: bounds (red zones around the block's dynamic and static
//     storage), initialisation, cp.async destinations in flight, and races between barriers;
//   - the emulated device memory (one reserved range, a shadow byte per byte): bounds (red zones,
//     freed memory) and initialisation; from host code any access is an error (a device pointer
//     dereferenced on the host);
//   - anything else (host memory, the functors' constants): not checked.
// Race rule (per byte of shared memory): two accesses by different threads conflict unless a
// block barrier completed between them, or both threads are lanes of one warp and a __syncwarp
// (or other warp collective) of that warp completed between them; a conflict needs a write, and
// two atomics never conflict. Bytes an async copy (TMA, bulk copy) wrote are ordered by their
// mbarrier instead: a thread touches them only once it is ordered after the phase the copy
// completes in (Thread::seen: its waits, and what block barriers, named barriers' rounds, warp
// collectives and mbarriers' arrivals pass on), and a second copy over them likewise.
#include "Internal.h"

#include <sstream>

namespace ape::simt::detail {

namespace {

// The reports of shared_access, out of its loop (cold: a report ends the access's check).
[[gnu::cold, gnu::noinline]] std::string offset_text(size_t at) {
  std::ostringstream os;
  os << "shared memory offset " << static_cast<long long>(at) - static_cast<long long>(kSmemRedzone);
  return os.str();
}
[[gnu::cold, gnu::noinline]] void report_outside(const Block &b, size_t off, size_t n, bool write, const void *pc) {
  std::ostringstream os;
  os << (write ? "writes " : "reads ") << n << " bytes at " << offset_text(off)
     << ", outside the block's shared memory (" << b.dynamic_bytes << " dynamic + "
     << b.static_bytes << " static bytes)";
  report(Check::Memcheck, os.str(), pc);
}
[[gnu::cold, gnu::noinline]] void report_pending(size_t at, bool write, const void *pc) {
  std::ostringstream os;
  os << (write ? "writes " : "reads ") << offset_text(at)
     << ", the destination of a cp.async not yet waited for (cp.async.wait_group)";
  report(Check::Async, os.str(), pc);
}
[[gnu::cold, gnu::noinline]] void report_async_race(const Block &b, const Cell &c, size_t off, size_t n, bool write,
                                                    const void *pc) {
  const size_t m = c.a_bar - 1u;
  std::ostringstream os;
  os << (write ? "writes " : "reads ") << n << " bytes at " << offset_text(off)
     << " that a TMA or bulk copy writes, before this thread waited for the copy's mbarrier"
     << " (at shared memory offset "
     << static_cast<const char *>(b.mbars[m].first) - b.smem << ") to complete phase (since the block began) "
     << c.a_phase << " (" << (write ? "write-after-write" : "read-after-write")
     << " race with the async proxy)";
  report(Check::Racecheck, os.str(), pc);
}
[[gnu::cold, gnu::noinline]] void report_after_write(const Block &b, const Cell &c, size_t off, size_t n, bool write,
                                                     const void *pc) {
  std::ostringstream os;
  os << (write ? "writes " : "reads ") << n << " bytes at " << offset_text(off)
     << " that thread " << thread_name(b, c.w_tid)
     << (write ? " also wrote" : " wrote") << " since the last barrier ("
     << (write ? "write-after-write" : "read-after-write") << " race)";
  report(Check::Racecheck, os.str(), pc);
}
[[gnu::cold, gnu::noinline]] void report_uninitialised(size_t off, size_t n, const void *pc) {
  std::ostringstream os;
  os << "reads " << n << " bytes at " << offset_text(off)
     << " that nothing has written";
  report(Check::Initcheck, os.str(), pc);
}
[[gnu::cold, gnu::noinline]] void report_after_read(const Block &b, const Cell &c, uint8_t f, size_t off, size_t n,
                                                    const void *pc) {
  std::ostringstream os;
  os << "writes " << n << " bytes at " << offset_text(off) << " that thread "
     << thread_name(b, c.r_tid) << ((f & kRMulti) ? " (and others)" : "")
     << " read since the last barrier (write-after-read race)";
  report(Check::Racecheck, os.str(), pc);
}

void shared_access(Thread &t, Block &b, const char *a, size_t n, Access kind, const void *pc) {
  const size_t off = static_cast<size_t>(a - b.window);
  const bool write = kind != Access::Read, atomic = kind == Access::Atomic;
  const Warp &warp = b.warps[t.tid / 32];
  const uint16_t tid = static_cast<uint16_t>(t.tid);
  const uint16_t wsync = static_cast<uint16_t>(warp.sync_count);
  const uint32_t epoch = b.epoch;
  // Is an access recorded as (other thread, its warp's sync count then) ordered before this one?
  auto ordered = [&](uint16_t other, uint16_t other_wsync) {
    return other == tid || (other / 32 == tid / 32 && other_wsync != wsync);
  };
  for (size_t i = 0; i < n; ++i) {
    const size_t at = off + i;
    uint8_t &f = b.flags[at];
    if (!(f & kAddressable)) return report_outside(b, off, n, write, pc);
    if (f & kPending) return report_pending(at, write, pc);
    Cell &c = b.cells[at];
    if (c.a_bar != 0) {  // an async copy's bytes: ordered only after its mbarrier's phase
      const size_t m = c.a_bar - 1u;
      if (m >= t.seen.size() || t.seen[m] <= c.a_phase) {
        report_async_race(b, c, off, n, write, pc);
        c.a_bar = 0;  // one report per conflict
        return;
      }
      if (write) c.a_bar = 0;
    }
    if (c.w_epoch == epoch && !ordered(c.w_tid, c.w_wsync) &&
        !(atomic && (f & kWAtomic))) {
      report_after_write(b, c, off, n, write, pc);
      c.w_tid = tid, c.w_wsync = wsync;  // one report per conflict
      return;
    }
    if (!write) {
      if (!(f & kInit)) return report_uninitialised(off, n, pc);
      if (c.r_epoch != epoch || ordered(c.r_tid, c.r_wsync)) {
        c.r_epoch = epoch, c.r_tid = tid, c.r_wsync = wsync;
        f &= static_cast<uint8_t>(~kRMulti);
      } else if (c.r_tid / 32 != tid / 32) {
        // (A lane of the kept reader's warp unordered with it read in the same __syncwarp interval:
        // whatever is ordered after the kept reader is ordered after it too.)
        f |= kRMulti;
      }
      continue;
    }
    if (c.r_epoch == epoch && ((f & kRMulti) || !ordered(c.r_tid, c.r_wsync))) {
      report_after_read(b, c, f, off, n, pc);
      c.r_epoch = 0;
      f &= static_cast<uint8_t>(~kRMulti);
      return;
    }
    c.w_epoch = epoch, c.w_tid = tid, c.w_wsync = wsync;
    c.r_epoch = 0;
    f = static_cast<uint8_t>((f | kInit) & ~kRMulti);
    f = static_cast<uint8_t>(atomic ? (f | kWAtomic) : (f & ~kWAtomic));
  }
}

}  // namespace

int mbar_index(const Block &b, const void *bar) {
  for (size_t i = 0; i < b.mbars.size(); ++i)
    if (b.mbars[i].first == bar) return static_cast<int>(i);
  return -1;
}

void mark_async_shared_write(Block &b, const char *p, size_t n, const void *bar, bool &reported,
                             const void *pc) {
  const size_t off = static_cast<size_t>(p - b.window);
  const int m = mbar_index(b, bar);
  const Thread *t = self();
  for (size_t i = 0; i < n; ++i) {
    Cell &c = b.cells[off + i];
    if (c.a_bar != 0 && t && !reported) {
      const size_t prev = c.a_bar - 1u;
      if (prev >= t->seen.size() || t->seen[prev] <= c.a_phase) {
        std::ostringstream os;
        os << "an async copy writes shared memory offset "
           << static_cast<long long>(off + i) - static_cast<long long>(kSmemRedzone)
           << " that an earlier one writes, before this thread waited for the earlier copy's"
           << " mbarrier (at shared memory offset "
           << static_cast<const char *>(b.mbars[prev].first) - b.smem << ") to complete phase (since the block began) "
           << c.a_phase << " (write-after-write race between async copies)";
        report(Check::Racecheck, os.str(), pc);
        reported = true;
      }
    }
    c.w_epoch = 0, c.r_epoch = 0;
    c.a_bar = static_cast<uint16_t>(m + 1);
    if (m >= 0) {
      const Mbar &mb = b.mbars[static_cast<size_t>(m)].second;
      c.a_phase = mb.base + mb.completed;
    }
    uint8_t &f = b.flags[off + i];
    f = static_cast<uint8_t>((f | kInit) & ~(kRMulti | kWAtomic));
  }
}

namespace {

void global_access(const char *a, size_t n, Access kind, const void *pc, bool host) {
  uint8_t *s = g_arena_shadow + (a - g_arena_lo);
  if (host) {
    std::ostringstream os;
    os << "host code " << (kind == Access::Read ? "reads " : "writes ") << n
       << " bytes of device memory at " << static_cast<const void *>(a);
    report(Check::Memcheck, os.str(), pc);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    if (!(s[i] & kAddressable)) {
      std::ostringstream os;
      os << (kind == Access::Read ? "reads " : "writes ") << n << " bytes of device memory at "
         << static_cast<const void *>(a) << ", outside every live allocation (out of bounds, or "
         << "freed)";
      report(Check::Memcheck, os.str(), pc);
      return;
    }
    if (kind == Access::Read && !(s[i] & kInit)) {
      std::ostringstream os;
      os << "reads " << n << " bytes of device memory at " << static_cast<const void *>(a)
         << " that nothing has written";
      report(Check::Initcheck, os.str(), pc);
      return;
    }
  }
  if (kind != Access::Read)
    for (size_t i = 0; i < n; ++i) s[i] |= kInit;
}

// One access of an emulated thread to device memory, into its worker's counts of the launch's
// traffic (flush_counts adds them to the launch's).
void count_traffic(WorkerState &w, size_t n, Access kind) {
  w.traffic[kind == Access::Read ? kTrRead : kind == Access::Write ? kTrWritten : kTrAtomic] += n;
  const int width = tl_async_copy ? kTrAsync
                    : n >= 16     ? kTrW16
                    : n >= 8      ? kTrW8
                    : n >= 4      ? kTrW4
                    : n >= 2      ? kTrW2
                                  : kTrW1;
  w.traffic[width] += n;
  w.traffic[kTrAccesses] += 1;
}

}  // namespace

thread_local bool tl_async_copy = false;

void check_access(const void *addr, size_t n, Access kind, const void *pc) {
  const char *a = static_cast<const char *>(addr);
  Thread *t = tl_worker.thread;
  if (t) {
    if (a >= t->stack_lo && a < t->stack_hi) return;
    Block *b = tl_worker.block;
    if (a >= b->window && a < b->window + b->window_bytes) {
      tl_worker.state->checked += 1;
      shared_access(*t, *b, a, n, kind, pc);
      return;
    }
  }
  if (a >= g_arena_lo && a < g_arena_hi) {
    if (t) {
      WorkerState &w = *tl_worker.state;
      w.checked += 1;
      count_traffic(w, n, kind);
    }
    global_access(a, n, kind, pc, t == nullptr);
  }
}

void flush_counts(WorkerState &w, Launch &l) {
  constexpr auto relaxed = std::memory_order_relaxed;
  access_counter().fetch_add(w.checked, relaxed);
  for (int slot = 0; slot < kTrNamedRounds; ++slot) l.traffic[slot].fetch_add(w.traffic[slot], relaxed);
  w.checked = 0;
  for (size_t &c : w.traffic) c = 0;
}

void reset_shared_shadow(Block &b) {
  const size_t used = kSmemRedzone + b.dynamic_bytes + b.static_bytes + kSmemRedzone;
  const size_t extent = used < b.window_bytes ? used : b.window_bytes;
  std::memset(b.flags, 0, extent);
  std::memset(static_cast<void *>(b.cells), 0, extent * sizeof(Cell));
  std::memset(b.smem, 0xff, b.dynamic_bytes);  // what shared memory holds at start: unspecified
  std::memset(b.flags + kSmemRedzone, kAddressable, b.dynamic_bytes);
}

}  // namespace ape::simt::detail

// ---- the instrumentation hooks ----------------------------------------------------------------------
// The entry points gcc's -fsanitize=thread emits (gcc/sanitizer.def). Atomics on host data in
// instrumented code (reference counts, guards) are performed as asked, without checks.
using ape::simt::detail::Access;
using ape::simt::detail::check_access;

#define APE_RA __builtin_return_address(0)
extern "C" {
void __tsan_init() {}
void __tsan_func_entry(void *) {}
void __tsan_func_exit() {}
void __tsan_read1(void *a) { check_access(a, 1, Access::Read, APE_RA); }
void __tsan_read2(void *a) { check_access(a, 2, Access::Read, APE_RA); }
void __tsan_read4(void *a) { check_access(a, 4, Access::Read, APE_RA); }
void __tsan_read8(void *a) { check_access(a, 8, Access::Read, APE_RA); }
void __tsan_read16(void *a) { check_access(a, 16, Access::Read, APE_RA); }
void __tsan_write1(void *a) { check_access(a, 1, Access::Write, APE_RA); }
void __tsan_write2(void *a) { check_access(a, 2, Access::Write, APE_RA); }
void __tsan_write4(void *a) { check_access(a, 4, Access::Write, APE_RA); }
void __tsan_write8(void *a) { check_access(a, 8, Access::Write, APE_RA); }
void __tsan_write16(void *a) { check_access(a, 16, Access::Write, APE_RA); }
void __tsan_unaligned_read2(void *a) { check_access(a, 2, Access::Read, APE_RA); }
void __tsan_unaligned_read4(void *a) { check_access(a, 4, Access::Read, APE_RA); }
void __tsan_unaligned_read8(void *a) { check_access(a, 8, Access::Read, APE_RA); }
void __tsan_unaligned_read16(void *a) { check_access(a, 16, Access::Read, APE_RA); }
void __tsan_unaligned_write2(void *a) { check_access(a, 2, Access::Write, APE_RA); }
void __tsan_unaligned_write4(void *a) { check_access(a, 4, Access::Write, APE_RA); }
void __tsan_unaligned_write8(void *a) { check_access(a, 8, Access::Write, APE_RA); }
void __tsan_unaligned_write16(void *a) { check_access(a, 16, Access::Write, APE_RA); }
void __tsan_volatile_read1(void *a) { check_access(a, 1, Access::Read, APE_RA); }
void __tsan_volatile_read2(void *a) { check_access(a, 2, Access::Read, APE_RA); }
void __tsan_volatile_read4(void *a) { check_access(a, 4, Access::Read, APE_RA); }
void __tsan_volatile_read8(void *a) { check_access(a, 8, Access::Read, APE_RA); }
void __tsan_volatile_read16(void *a) { check_access(a, 16, Access::Read, APE_RA); }
void __tsan_volatile_write1(void *a) { check_access(a, 1, Access::Write, APE_RA); }
void __tsan_volatile_write2(void *a) { check_access(a, 2, Access::Write, APE_RA); }
void __tsan_volatile_write4(void *a) { check_access(a, 4, Access::Write, APE_RA); }
void __tsan_volatile_write8(void *a) { check_access(a, 8, Access::Write, APE_RA); }
void __tsan_volatile_write16(void *a) { check_access(a, 16, Access::Write, APE_RA); }
void __tsan_read_range(void *a, unsigned long n) { check_access(a, n, Access::Read, APE_RA); }
void __tsan_write_range(void *a, unsigned long n) { check_access(a, n, Access::Write, APE_RA); }
void __tsan_vptr_read(void **) {}
void __tsan_vptr_update(void **, void *) {}

// Atomics: the memory order argument is ignored (relaxed is enough for one OS thread; blocks on
// several workers only share device memory through the kernels' own atomics, done seq_cst here).
#define APE_TSAN_ATOMICS(BITS, T)                                                                  \
  T __tsan_atomic##BITS##_load(const volatile T *a, int) {                                       \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                                 \
  }                                                                                              \
  void __tsan_atomic##BITS##_store(volatile T *a, T v, int) {                                    \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                    \
  }                                                                                              \
  T __tsan_atomic##BITS##_exchange(volatile T *a, T v, int) {                                    \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                          \
  }                                                                                              \
  T __tsan_atomic##BITS##_fetch_add(volatile T *a, T v, int) {                                   \
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                           \
  }                                                                                              \
  T __tsan_atomic##BITS##_fetch_sub(volatile T *a, T v, int) {                                   \
    return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                           \
  }                                                                                              \
  T __tsan_atomic##BITS##_fetch_and(volatile T *a, T v, int) {                                   \
    return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST);                                           \
  }                                                                                              \
  T __tsan_atomic##BITS##_fetch_or(volatile T *a, T v, int) {                                    \
    return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);                                            \
  }                                                                                              \
  T __tsan_atomic##BITS##_fetch_xor(volatile T *a, T v, int) {                                   \
    return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST);                                           \
  }                                                                                              \
  T __tsan_atomic##BITS##_fetch_nand(volatile T *a, T v, int) {                                  \
    return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST);                                          \
  }                                                                                              \
  int __tsan_atomic##BITS##_compare_exchange_strong(volatile T *a, T *c, T v, int, int) {        \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);      \
  }                                                                                              \
  int __tsan_atomic##BITS##_compare_exchange_weak(volatile T *a, T *c, T v, int, int) {          \
    return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);       \
  }                                                                                              \
  T __tsan_atomic##BITS##_compare_exchange_val(volatile T *a, T c, T v, int, int) {              \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);            \
    return c;                                                                                    \
  }
APE_TSAN_ATOMICS(8, char)
APE_TSAN_ATOMICS(16, short)
APE_TSAN_ATOMICS(32, int)
APE_TSAN_ATOMICS(64, long)
#undef APE_TSAN_ATOMICS
void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) {}
}
