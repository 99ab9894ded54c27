// What a program and a kernel library compiled at run time (runtime/SpecLibrary.h) must agree on:
// the layout of the structs they pass each other (kernel_entry.h, attention.h, decode.h). A
// library compiled against other headers than the program's (headers edited or pulled since the
// program was built) would read fields the program never wrote. A spec library exports this
// fingerprint of the headers it was compiled with (`ape_kernel_abi()`, from a unit the runtime
// adds to its compile); the program compares it with its own and refuses a library that differs.
// Raise kKernelAbiVersion on a change that keeps every size (a field's meaning or order).
#pragma once

#include <cstdint>

#include "ape/cpu/kernel_entry.h"

namespace ape {

inline constexpr uint64_t kKernelAbiVersion = 1;

constexpr uint64_t kernel_abi_fingerprint() {
  const uint64_t parts[] = {kKernelAbiVersion,         sizeof(KernelEntry),        sizeof(DecodeEntry),
                            sizeof(AttnArgs<float>),   sizeof(AttnArgs<double>),   alignof(AttnArgs<double>),
                            sizeof(DecodeArgs<float>), sizeof(DecodeArgs<double>), sizeof(DecodeCache<float>),
                            sizeof(DecodeCache<double>)};
  uint64_t h = 1469598103934665603ull;  // FNV-1a's steps over the parts
  for (uint64_t v : parts) h = (h ^ v) * 1099511628211ull;
  return h;
}

}  // namespace ape
