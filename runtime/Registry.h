// Registry: how the runtime finds compiled encodings. The runtime never names an encoding itself.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ape {
struct KernelEntry;

// Defined in the build-generated registry.cpp: every encoding compiled from examples/encodings.
const KernelEntry *const *kernel_registry(size_t *count);

// Every registered encoding name, in registry order.
std::vector<std::string> kernel_names();

// The entry named `name`; throws std::runtime_error listing the available names when absent.
const KernelEntry &find_kernel(const std::string &name);

}  // namespace ape
