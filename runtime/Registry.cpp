// Lookup by name over the generated registry (kernel_registry is defined by the ape_kernels library).
#include "runtime/Registry.h"

#include <stdexcept>

#include "ape/cpu_dispatch.h"
#include "ape/kernel_entry.h"

namespace ape {

std::vector<std::string> kernel_names() {
  size_t n = 0;
  const KernelEntry *const *all = kernel_registry(&n);
  std::vector<std::string> names;
  for (size_t i = 0; i < n; ++i)
    if (all[i] && all[i]->name) names.emplace_back(all[i]->name);
  return names;
}

const KernelEntry &find_kernel(const std::string &name) {
  size_t n = 0;
  const KernelEntry *const *all = kernel_registry(&n);
  for (size_t i = 0; i < n; ++i)
    if (all[i] && all[i]->name && name == all[i]->name) return *all[i];
  std::string list;
  for (const auto &s : kernel_names()) list += (list.empty() ? "" : ", ") + s;
  throw std::runtime_error("unknown encoding '" + name + "'; available: " +
                           (list.empty() ? std::string("(none: the kernel registry is empty)") : list) +
                           " (ape-train --list)");
}

std::string checked_kernel_cpu_level() {
  const CpuLevelChoice &c = kernel_cpu_level();
  if (c.level < 0) throw std::runtime_error(c.error);
  return c.describe();
}

std::string kernel_cpu_level_help() {
  const CpuLevelChoice &c = kernel_cpu_level();
  return "Environment: APE_CPU_LEVEL=baseline|avx2|avx512 runs the kernels compiled for that "
         "instruction set\n(default: the best one this CPU runs). Built: " +
         cpu_level_list(c.built) + "; this CPU runs: " + cpu_level_list(c.runnable) + ".";
}

}  // namespace ape
