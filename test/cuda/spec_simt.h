// The harness of the test specs' emulated CUDA tests (masked_rows_, value_rows_ and
// fast_math_simt_test.cpp; cuda_tests.cmake): one differentiable call of a spec's kernels, CPU or
// emulated CUDA, and the inputs as a 16-bit kernel sees them.
#pragma once

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "ape/cpu/kernel_entry.h"
#include "runtime/Attention.h"
#include "runtime/SimtAttention.h"

namespace ape::test {

// o and the gradients of <o, dout> w.r.t. q, k, v, every feature and every param, in that order,
// from fused_attention on `kernels`: "cpu" (the CPU kernel) or a CUDA dtype ("f32", "bf16", "f16":
// the build's emulated CUDA kernels of that dtype, under the emulator's checks). The inputs are
// cloned; the CPU kernels are selected again afterwards.
inline std::vector<at::Tensor> run_spec(const KernelEntry &e, const std::string &kernels, const at::Tensor &q0,
                                        const at::Tensor &k0, const at::Tensor &v0,
                                        const std::vector<at::Tensor> &features0,
                                        const std::vector<at::Tensor> &params0, const at::Tensor &dout,
                                        double scale) {
  if (kernels == "cpu") use_cpu_kernels();
  else use_simt_kernels(kernels);
  auto leaf = [](const at::Tensor &t) { return t.clone().requires_grad_(); };
  std::vector<at::Tensor> inputs{leaf(q0), leaf(k0), leaf(v0)}, features, params;
  for (const auto &f : features0) features.push_back(leaf(f)), inputs.push_back(features.back());
  for (const auto &p : params0) params.push_back(leaf(p)), inputs.push_back(params.back());
  const at::Tensor o = fused_attention(e, inputs[0], inputs[1], inputs[2], features, params, scale);
  std::vector<at::Tensor> out{o.detach()};
  for (auto &g : torch::autograd::grad({o}, inputs, {dout})) out.push_back(g);
  use_cpu_kernels();
  return out;
}

// t rounded to bfloat16 and back: the value a bf16 kernel reads, so that a reference fed it
// differs from the kernel by the kernel's own rounding only.
inline at::Tensor bf16_rounded(const at::Tensor &t) { return t.to(at::kBFloat16).to(t.scalar_type()); }

}  // namespace ape::test
