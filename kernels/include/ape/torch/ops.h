// Operator library: PyTorch operators around one generated kernel (docs/frameworks.md).
//
// apec --emit=torch-library writes NAME_ops.cpp, which includes only this header (no LibTorch,
// so it compiles in a blink): it describes the kernel's inputs (kernel_inputs.h) and, when the
// library is loaded, registers the operator namespace ape_NAME through register_operators().
// The operator code itself (checks, dtypes, devices, autograd, fake tensors) is LibTorch-heavy
// and the same for every encoding: torch/ops_impl.h, compiled once per library from the emitted
// ape/torch_ops.cpp (and once per CMake project that builds several emitted folders).
#pragma once

#include "ape/contract/kernel_inputs.h"

namespace ape::cuda {
struct CudaKernelEntry;  // cuda/kernel_entry.h
}

namespace ape::torch_ops {

struct Library {
  const KernelInputs *inputs;         // the CPU kernel and the inputs beyond q, k, v
  const char *attention_schema;       // "attention(Tensor q, Tensor k, Tensor v, ...) -> Tensor"
  const cuda::CudaKernelEntry *cuda;  // the generated CUDA kernels, or nullptr
  const char *no_cuda_reason;         // when cuda is nullptr: why (shown when CUDA tensors come)
  // An attention transition (ape.attention_transition): inference only. attention and
  // attention_forward then also take the layer of the model the call computes and the model's
  // depth (torch/ops_impl.h); there is no backward.
  bool inference_only = false;
};

// Defines the operators of `lib` in the namespace ape_<encoding> and registers their CPU, CUDA,
// Meta and autograd kernels (torch/ops_impl.h). `lib` must outlive the process.
void register_operators(const Library &lib);

// A static object of NAME_ops.cpp: registers at load time, like TORCH_LIBRARY.
struct Registration {
  explicit Registration(const Library &lib) { register_operators(lib); }
};

}  // namespace ape::torch_ops
