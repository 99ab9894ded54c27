// Controls and reports of the SIMT emulator (docs/cuda.md, "The emulator"). Plain C++17, usable
// from code that does not include the emulated CUDA surface (tests, the runtime).
//
// Checks (every launch, always on):
//   memcheck   an access outside every live allocation of emulated device memory (each has a
//              red zone on both sides; freed memory is never reused), outside the block's shared
//              memory, or a host-code dereference of device memory;
//   racecheck  two threads of a block touching the same byte of shared memory between two
//              barriers, at least one of them writing (atomic pairs excepted; lanes of one warp
//              are ordered by __syncwarp), or touching a TMA or bulk copy's bytes (or copying
//              over them) before it is ordered after the phase of the copy's mbarrier;
//   initcheck  a read of shared or device memory that nothing has written (memset and
//              host-to-device copies count as writes);
//   synccheck  a block barrier or a warp collective that not every participating thread
//              reaches (deadlock), different barriers reached together, warp collectives of one
//              mask called with different operations or masks, a mask naming exited lanes;
//   async      a read or write of a cp.async destination before the wait that completes it, a
//              cp.async never waited for;
//   launch     a configuration the chosen architecture refuses (threads per block, grid size,
//              dynamic shared memory above 48 KiB without cudaFuncSetAttribute, or above the
//              architecture's per-block limit).
// Each finding is recorded (and printed once per launch and kind, up to a limit); a launch with a
// finding that leaves the block unable to continue (deadlock) returns cudaErrorLaunchFailure.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ape::simt {

enum class Check { Memcheck, Racecheck, Initcheck, Synccheck, Async, Launch };
const char *check_name(Check c);

struct Finding {
  Check check;
  std::string kernel;   // demangled name of the launched kernel
  std::string message;  // what, where (block, thread, address), and who else
};

// Findings since the last call (and clears them).
std::vector<Finding> take_findings();
// Total findings recorded since the process started.
size_t finding_count();
// Print findings to stderr as they are recorded (default on; APE_SIMT_QUIET=1 turns it off).
void set_print(bool on);

// The emulated architecture: 80, 86, 89 or 90 (APE_SIMT_ARCH, default 80). It sets the limits the
// launch checks use: dynamic shared memory per block (opt-in) 163 KiB (80), 99 KiB (86, 89),
// 227 KiB (90); 1024 threads per block; grid y and z at most 65535.
void set_arch(int sm);
int arch();
// The multiprocessors the emulated device reports (cudaDevAttrMultiProcessorCount): the
// architecture's (132 on sm_90, 108 otherwise; n <= 0 restores that) or n, so that a test sees
// the grids of a smaller device, e.g. a persistent kernel's blocks each taking several tiles.
void set_sm_count(int n);
int sm_count();
size_t max_dynamic_smem(int sm);

// Statistics of this process: launches, blocks, thread switches, instrumented accesses checked.
struct Stats {
  size_t launches = 0, blocks = 0, switches = 0, accesses = 0;
};
Stats stats();

// Global-memory traffic of the emulated kernels since the last call (which clears it): one entry
// per kernel (its demangled name), in order of first launch. The bytes its threads read, wrote
// and updated atomically in device memory, and the same bytes by the width of the access that
// moved them. These are the threads' requests, what the SMs ask of L1 and L2: no cache is
// modelled, so they are not DRAM bytes (bench/cuda_traffic.cpp and docs/cuda.md read them).
struct Traffic {
  std::string kernel;
  size_t launches = 0, blocks = 0, threads = 0;
  size_t read = 0, written = 0, atomic = 0;  // bytes
  // bytes by access width: 1, 2, 4, 8, 16 bytes (and wider), then cp.async / TMA / bulk copies
  size_t by_width[6] = {};
  size_t accesses = 0;
  // The tensor cores' work its warps issued, 2 m n k per mma.sync, wmma or wgmma (each warp's
  // share of a warpgroup's): the multiply-adds the kernel asks for, useful or not.
  size_t mma_flops = 0;
  size_t named_rounds[16] = {};  // completed rounds of named barrier id (bar.sync / bar.arrive)
};
std::vector<Traffic> take_traffic();

}  // namespace ape::simt
