// What a program and a CUDA kernel library compiled at run time (runtime/SpecLibrary.h:
// load_spec_cuda, or load_spec_simt for the emulator) must agree on: the layout of the structs they
// pass each other (kernel_entry.h). As ape/cpu/kernel_abi.h for the CPU libraries: a library
// compiled against other headers than the program's (headers edited or pulled since the program
// was built) would read fields the program never wrote, so the library exports this fingerprint
// of the headers it was compiled with (`ape_cuda_kernel_abi()`, from a unit the runtime adds to its
// compile) and the program refuses one that differs from its own. Compiled with -DAPE_SIMT it is
// the emulated kernels' (their own namespace, kernel_entry.h). Raise kCudaKernelAbiVersion on a
// change that keeps every size (a field's meaning or order).
#pragma once

#include <cstdint>

#include "ape/cuda/kernel_entry.h"

namespace ape::cuda {
APE_CUDA_ABI_BEGIN

inline constexpr uint64_t kCudaKernelAbiVersion = 1;

constexpr uint64_t cuda_kernel_abi_fingerprint() {
  const uint64_t parts[] = {kCudaKernelAbiVersion,        sizeof(CudaKernelEntry), alignof(CudaKernelEntry),
                            sizeof(CudaVariant),          sizeof(CudaAttnArgs),    alignof(CudaAttnArgs),
                            sizeof(CudaScratchAllocator), sizeof(DType)};
  uint64_t h = 1469598103934665603ull;  // FNV-1a's steps over the parts
  for (uint64_t v : parts) h = (h ^ v) * 1099511628211ull;
  return h;
}

APE_CUDA_ABI_END
}  // namespace ape::cuda
