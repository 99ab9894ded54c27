// Threads: CPU threading for the tools (LibTorch defaults to one intra-op thread here).
#pragma once

#include <cstdint>

namespace ape {

// Call first thing in main(). libgomp busy-waits between parallel regions unless OMP_WAIT_POLICY
// says otherwise; on a small machine the spinning OpenMP workers starve OpenBLAS's own threads
// (training ran ~4x slower on 2 cores). The policy is read when libgomp loads, so when it is unset
// this sets OMP_WAIT_POLICY=PASSIVE and re-executes the program once (same arguments). Returns
// normally when nothing needs doing or the re-exec fails.
void prefer_passive_openmp(char **argv);

// Intra-op threads for LibTorch and the generated kernels (OpenMP); n <= 0 means all hardware
// threads, and then a small piece of work may take fewer (SmallWorkThreads). Returns the number set.
int64_t set_threads(int64_t n);

// While it lives, the intra-op threads for a piece of work of `macs` multiply-adds, when
// set_threads chose them (n <= 0; a number the user gave is kept): one per kMacsPerThread, at
// least one, at most set_threads' count. A cached decoding step of a small model (one token:
// every weight once, the cache's rows once) is a few million multiply-adds in a hundred or so
// LibTorch calls and kernel launches, each of which wakes and waits for the other threads (futex
// wake-ups under OMP_WAIT_POLICY=PASSIVE): on the 2-core Xeon one thread decoded d_model 256 x 4
// layers 2.7x faster than two at 256 cached tokens and 1.3x at 4,096, and two threads won from
// d_model 1024 (bench/results/decode.md, "Threads"). Nothing on the GPU uses it.
class SmallWorkThreads {
 public:
  static constexpr double kMacsPerThread = 24e6;
  explicit SmallWorkThreads(double macs);
  ~SmallWorkThreads();
  SmallWorkThreads(const SmallWorkThreads &) = delete;
  SmallWorkThreads &operator=(const SmallWorkThreads &) = delete;
  // The count the latest guard ran its work with (0 before any, or when set_threads did not choose).
  static int last();

 private:
  int previous_ = 0;  // 0: nothing changed
};

// Calls, once per process and on this thread alone, each of the MKL vector-math (VML) functions
// through which LibTorch's CPU kernels compute sqrt, exp, log, tanh, erf and the like, so that
// MKL has set itself up before two threads first call them at once. Without it, a fresh process
// now and then computed, in one OpenMP thread's half of a tensor, sqrt(x) as x * rsqrtps(x) (11
// bits) where the other thread and every other process computed it correctly rounded: AdamW's
// first update of the embedding (131,072 elements, above LibTorch's 2,048-element grain for
// these functions) differed in 4 of 100 fresh `ape-train` processes, and a run was no longer
// bit-exact with its resumed self (test/resume/kill_loop.sh); after this call, 0 in 400.
// set_threads calls it, and so does the Trainer.
void warm_vector_math();

}  // namespace ape
