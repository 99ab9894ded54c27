// Threads: CPU threading for the tools (LibTorch defaults to one intra-op thread here).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace ape {

// Call first thing in main(): the environment that the threads of LibTorch, MKL and the generated
// kernels read (thread_env_settings). libgomp reads its settings when it loads, so when one of
// them is set here the program re-executes itself once (same arguments); MKL_CBWR alone is read at
// MKL's first call, after this, and needs no re-execution. Returns normally when nothing needs
// doing or the re-exec fails.
void prepare_threads(char **argv);

// What prepare_threads sets, given the environment (`env`: getenv) and the arguments; nothing once
// the program was re-executed (APE_NO_REEXEC), and nothing the user set:
//   OMP_WAIT_POLICY=PASSIVE, unless set (e.g. scripts/test.sh's passive ctest). libgomp's default
//     busy-waits for a long while, and on a small machine spinning OpenMP workers starved the
//     threads of other work (training ran ~4x slower on 2 cores beside OpenBLAS's own threads);
//   with it, GOMP_SPINCOUNT=kOpenMpSpin, unless set or several processes share the machine's cores
//     (data parallel: LOCAL_WORLD_SIZE > 1, or --world-size > 1 among the arguments): a worker spins
//     that many pause loops (about a tenth of a millisecond) before it sleeps. A training step is
//     hundreds of LibTorch calls, each a parallel region whose workers a purely passive policy
//     wakes by futex: ape-train's default model on the 2-core Xeon trained 1.17x faster with this
//     spin (21.5k -> 25.2k tokens/s), while two such trainings at once on the two cores each ran
//     0.93x; 3,000 gave 1.18x and 0.89x, 5,000 1.21x and 0.86x, 100,000 0.32x paired
//     (bench/results/cpu_training.md);
//   MKL_CBWR=AUTO,STRICT, unless set: MKL's strict reproducibility mode, in which its matrix
//     products give the same bits on any thread count (MKL otherwise plans a product's split of its
//     sum by the thread count: the output layer's dx = G W, a sum over the 4,096-word vocabulary,
//     differed between 1 and 2 threads at ape-train's default shape). Training is bitwise the same
//     on any thread count (docs/reliability.md; test train_threads). A LibTorch whose BLAS is not
//     MKL ignores it.
constexpr int kOpenMpSpin = 2000;
std::vector<std::pair<std::string, std::string>> thread_env_settings(
    const std::function<const char *(const char *)> &env, int argc, const char *const *argv);

// Intra-op threads for LibTorch and the generated kernels (OpenMP); n <= 0 means all hardware
// threads, and then a small piece of work may take fewer (SmallWorkThreads). Returns the number set.
int64_t set_threads(int64_t n);

// While it lives, the intra-op threads for a piece of work of `macs` multiply-adds, when
// set_threads chose them (n <= 0; a number the user gave is kept): one per kMacsPerThread, at
// least one, at most set_threads' count. A cached decoding step of a small model (one token:
// every weight once, the cache's rows once) is a few million multiply-adds in a hundred or so
// LibTorch calls and kernel launches, each of which wakes and waits for the other threads: on the
// 2-core Xeon with purely passive OpenMP waits one thread decoded d_model 256 x 4 layers 2.7x
// faster than two at 256 cached tokens and 1.3x at 4,096. With the short spin (prepare_threads)
// two threads cost less: one thread still won at 256 cached tokens (4.7M multiply-adds: 620-650
// against 540 tok/s), the two were level at 1,024 (6.3M) and two won at 4,096 (12.6M: 1.15x) and
// at d_model 512 (15M: 1.3-1.4x); hence 8M (bench/results/decode.md, "Threads"). Nothing on the
// GPU uses it.
class SmallWorkThreads {
 public:
  static constexpr double kMacsPerThread = 8e6;
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
