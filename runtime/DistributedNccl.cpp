// The NCCL backend of Distributed.cpp: c10d::ProcessGroupNCCL for one GPU per rank. Compiled only
// where LibTorch has CUDA and NCCL's headers are found (APE_HAVE_C10D_NCCL; runtime/CMakeLists.txt):
// its header pulls in CUDA's. The runtime trains on the CPU, so Distributed.cpp stages each bucket
// on the rank's GPU, reduces it there and copies it back.
#include <chrono>

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

namespace ape {

bool nccl_device_present(int device) {
  return device >= 0 && device < static_cast<int>(c10::cuda::device_count());
}

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store> &store, int rank,
                                                   int world, std::chrono::milliseconds timeout, int device) {
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, opts);
}

}  // namespace ape
