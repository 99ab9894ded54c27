// fused_attention through the CUDA kernels, run on the CPU by the SIMT emulator (docs/cuda.md):
// the whole path from a spec to its CUDA kernels to training, exercised without a GPU. Slow (the
// emulator runs every GPU thread as a fiber and checks every access); for the tests and
// `ape-check --cuda` (a spec's own kernels, compiled at run time: add_simt_kernels).
//
// The tensors (float32 or float64, CPU) are copied into emulated device memory in the variant's
// input dtype (q, k, v, dout; features and params in float32), and the results back in the
// caller's dtype. Each call also fails, with the findings, if the emulator's checks found
// anything or the backward's status word reports an error.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace ape {
struct KernelEntry;

// The emulated CUDA kernels' input dtype: "bf16", "f16" or "f32".
// Installs them as fused_attention's implementation (set_attention_impl); throws
// std::invalid_argument for another dtype name.
void use_simt_kernels(const std::string &dtype);

// Back to the CPU kernels.
void use_cpu_kernels();

// The device the emulator poses as for the calls that follow: its architecture (80, 86, 89 or 90:
// the launch picks each architecture's kernels, e.g. sm_90's Hopper forward and wgmma backward)
// and multiprocessors (0: the architecture's, 108 or 132; fewer make a persistent grid's blocks
// claim several tiles). Throws std::invalid_argument for another architecture.
void pose_simt_device(int sm, int multiprocessors = 0);
// The pose now: the architecture and the multiprocessors the device reports (pose_simt_device
// takes them back).
std::pair<int, int> simt_device_pose();

// Tokens through the emulated CUDA decode steps of `entry`'s kernels in `dtype` (cuda/decode.h, what
// ape-generate --device cuda runs): q, k, v (B, H, T, D) and features (B, H, T) on the CPU, any
// floating dtype, `steps` tokens at a time into one cache (num_splits as CudaDecodeArgs: 0, the
// device decides). Returns o (B, H, T, D) and lse (B, H, T), float32, every step's new rows in
// order. Throws with the reason where a step fails or the emulator's checks find anything.
std::pair<at::Tensor, at::Tensor> simt_decode(const KernelEntry &entry, const std::string &dtype,
                                              const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                              const std::vector<at::Tensor> &features,
                                              const std::vector<at::Tensor> &params, double scale,
                                              const std::vector<int64_t> &steps, int num_splits = 0);

// Adds emulated kernels compiled at run time (load_spec_simt's entry, an
// ape::cuda::CudaKernelEntry of the emulated build): the encoding of that name then runs them,
// before any of the build's own.
void add_simt_kernels(const void *entry);

// The emulated kernels' headers' fingerprint (ape/cuda/kernel_abi.h compiled with -DAPE_SIMT):
// load_spec_simt's SpecCudaOptions::expected_abi.
uint64_t simt_kernel_abi();

// The (dtype, head dim) variants of the emulated kernels encoding `name` runs ("bf16", 64), none
// when there are none.
std::vector<std::pair<std::string, int64_t>> simt_variants(const std::string &name);

}  // namespace ape
