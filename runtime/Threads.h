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
// threads. Returns the number set.
int64_t set_threads(int64_t n);

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
