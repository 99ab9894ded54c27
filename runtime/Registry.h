// Registry: how the runtime finds compiled encodings (the build's, and specs loaded at run time). The runtime never names an encoding itself.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ape {
struct KernelEntry;
struct CpuLevelChoice;

// Defined in the build-generated registry.cpp: every encoding compiled from examples/encodings,
// at the instruction-set level chosen for this process (ape/cpu/dispatch.h).
const KernelEntry *const *kernel_registry(size_t *count);
// The same encodings compiled for `level` (0 baseline, 1 avx2, 2 avx512), null where the level
// was not built (APE_CPU_LEVELS); null for a level out of range. For tests and benchmarks.
const KernelEntry *const *kernel_registry_level(int level, size_t *count);
// How the level of kernel_registry() was chosen.
const CpuLevelChoice &kernel_cpu_level();

// The log line of the chosen level ("avx512 (AVX-512 F/CD/BW/DQ/VL; the best ...)"); throws
// std::runtime_error with the reason when APE_CPU_LEVEL names a level that cannot run here.
std::string checked_kernel_cpu_level();

// The paragraph of the tools' --help about APE_CPU_LEVEL: the built levels and this CPU's.
std::string kernel_cpu_level_help();

// Adds an encoding compiled at run time (runtime/SpecLibrary.h) after the built-in ones; throws
// std::runtime_error when its name is taken. `entry` must outlive the process's use of it.
void register_kernel(const KernelEntry *entry);

// Every registered encoding name, in registry order (built-in first, then register_kernel's).
std::vector<std::string> kernel_names();

// The entry named `name`; throws std::runtime_error listing the available names when absent.
const KernelEntry &find_kernel(const std::string &name);

}  // namespace ape
