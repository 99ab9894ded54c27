// Lookup by name over the generated registry (kernel_registry is defined by the ape_kernels library).
#include "runtime/Registry.h"

#include <mutex>
#include <stdexcept>

#include "ape/cpu/dispatch.h"
#include "ape/cpu/kernel_entry.h"

namespace ape {
namespace {
std::mutex g_added_mu;
std::vector<const KernelEntry *> &added() {  // register_kernel's, in order
  static std::vector<const KernelEntry *> v;
  return v;
}

// The built-in entries, then the added ones.
std::vector<const KernelEntry *> all_entries() {
  size_t n = 0;
  const KernelEntry *const *all = kernel_registry(&n);
  std::vector<const KernelEntry *> v;
  for (size_t i = 0; i < n; ++i)
    if (all[i] && all[i]->name) v.push_back(all[i]);
  std::lock_guard<std::mutex> lock(g_added_mu);
  v.insert(v.end(), added().begin(), added().end());
  return v;
}
}  // namespace

void register_kernel(const KernelEntry *entry) {
  if (!entry || !entry->name) throw std::runtime_error("register_kernel: an entry without a name");
  for (const KernelEntry *e : all_entries())
    if (std::string(e->name) == entry->name)
      throw std::runtime_error("encoding '" + std::string(entry->name) +
                               "' exists already (a built-in encoding or a spec loaded before); give "
                               "the spec another name (ape.encoding @other_name)");
  std::lock_guard<std::mutex> lock(g_added_mu);
  added().push_back(entry);
}

std::vector<std::string> kernel_names() {
  std::vector<std::string> names;
  for (const KernelEntry *e : all_entries()) names.emplace_back(e->name);
  return names;
}

const KernelEntry &find_kernel(const std::string &name) {
  for (const KernelEntry *e : all_entries())
    if (name == e->name) return *e;
  std::string list;
  for (const auto &s : kernel_names()) list += (list.empty() ? "" : ", ") + s;
  throw std::runtime_error("unknown encoding '" + name + "'; available: " +
                           (list.empty() ? std::string("(none: the kernel registry is empty)") : list) +
                           " (ape-train --list; a spec file of your own: --spec FILE)");
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
