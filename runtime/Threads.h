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

}  // namespace ape
