#include "runtime/Threads.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include <ATen/Parallel.h>

namespace ape {

void prefer_passive_openmp(char **argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("APE_NO_REEXEC")) return;
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  ::setenv("APE_NO_REEXEC", "1", 1);  // never loop
  ::execv("/proc/self/exe", argv);
  // execv failed: carry on with the default policy.
}

int64_t set_threads(int64_t n) {
  if (n <= 0) n = std::max(1u, std::thread::hardware_concurrency());
  at::set_num_threads(static_cast<int>(n));
  return n;
}

}  // namespace ape
