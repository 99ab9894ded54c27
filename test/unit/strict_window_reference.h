// test/unit/Inputs/strict_window.mlir, materialised (shared by spec_library_test.cpp, the CPU
// kernel compiled at run time, and test/cuda/masked_rows_simt_test.cpp, the emulated CUDA kernels):
// l_ij = κ q_i·k_j − m_h (i − j) for 1 <= i − j <= 3, else masked; a row without any key (i = 0)
// gives o_i = 0 (the template's contract), so its softmax is taken over the kept keys only and
// multiplied by "row has a key". Differentiable (gradients by autograd).
#pragma once

#include <cmath>

#include <ATen/ATen.h>

namespace ape_test {

inline at::Tensor reference_strict_window(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                          const at::Tensor &slopes, double scale) {
  const int64_t T = q.size(2);
  at::Tensor i = at::arange(T, q.options()).view({T, 1}), j = at::arange(T, q.options()).view({1, T});
  at::Tensor d = i - j;                                           // (T, T)
  at::Tensor keep = (d >= 1).logical_and(d <= 3);                 // (T, T)
  at::Tensor l = at::matmul(q, k.transpose(-1, -2)) * scale - slopes.view({1, -1, 1, 1}) * d;  // (B, H, T, T)
  l = l.masked_fill(keep.logical_not(), -INFINITY);
  at::Tensor has_key = keep.any(-1, /*keepdim=*/true);            // (T, 1)
  at::Tensor safe = l.masked_fill(has_key.logical_not(), 0.0);    // a fully masked row: any finite logits
  at::Tensor p = at::softmax(safe, -1) * has_key;
  return at::matmul(p, v);
}

}  // namespace ape_test
