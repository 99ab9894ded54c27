// Lookup by name over the generated registry (kernel_registry is defined by the ape_kernels library).
#include "runtime/Registry.h"

#include <stdexcept>

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

}  // namespace ape
