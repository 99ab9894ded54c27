// A forward from first_row (a decode step's) of a row/column bias over relative rows, on the SIMT
// emulator (its checks on): the spec test/unit/Inputs/rowcol_rel.mlir (l_ij += (q'_i + v)·w + u·k'_j;
// cuda_tests.cmake compiles it for f32 and bf16 at head dim 32). Such a forward keeps q' and the
// query side's relative rows from its first computed row only (Params::qm_row0, rel_row0), and
// writes o and lse of rows [first_row, T) only where asked (CudaAttnArgs::o_from_first); the flash
// kernels' row/column table must then form R(i) of those rows only (rowcol_table_kernel read every
// row's, before the rows it had: an out-of-bounds read). The full forward must match the materialised
// attention in float64, and the forward from first_row its rows bit
// for bit, with no finding, on the FlashAttention-2-class kernel unsplit (q' from first_row's
// window of 384 rows) and as one share of its split kernel (from first_row's warp), and on the
// general kernel (f32).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "ape/cuda/kernel_entry.h"
#include "ape/simt/runtime.h"

extern "C" const ape::cuda::CudaKernelEntry *APE_CUDA_ENTRY(rowcol_rel)();

namespace {

struct Dev {
  void *ptr = nullptr;
  explicit Dev(size_t bytes) { EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess); }
  Dev(const at::Tensor &t) : Dev(t.nbytes()) {
    EXPECT_EQ(cudaMemcpy(ptr, t.data_ptr(), t.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(ptr); }
  at::Tensor get(const at::Tensor &like) const {
    at::Tensor t = at::empty_like(like);
    EXPECT_EQ(cudaMemcpy(t.data_ptr(), ptr, t.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return t;
  }
};

TEST(RowColRelSimt, AForwardFromFirstRowEqualsTheFullForwardsRows) {
  const ape::cuda::CudaKernelEntry *e = APE_CUDA_ENTRY(rowcol_rel)();
  ASSERT_NE(e, nullptr);
  const int64_t B = 1, H = 2, D = 32;
  struct Case {
    const char *what;
    ape::cuda::DType dtype;
    int64_t T, first_row;
  };
  const Case cases[] = {{"bf16, unsplit", ape::cuda::DType::BF16, 900, 400},
                        {"bf16, one share of the split kernel", ape::cuda::DType::BF16, 400, 390},
                        {"f32, the general kernel", ape::cuda::DType::F32, 420, 400}};
  for (const Case &c : cases) {
    SCOPED_TRACE(c.what);
    const ape::cuda::CudaVariant *var = ape::cuda::find_variant(*e, c.dtype, D);
    ASSERT_NE(var, nullptr);
    const at::ScalarType st = c.dtype == ape::cuda::DType::BF16 ? at::kBFloat16 : at::kFloat;
    at::manual_seed(c.T);
    const at::Tensor q = at::randn({B, H, c.T, D}).to(st), k = at::randn({B, H, c.T, D}).to(st),
                     v = at::randn({B, H, c.T, D}).to(st);
    const at::Tensor w = at::randn({1, H, D}) * 0.3, bias = at::randn({H, D}) * 0.3, u = at::randn({1, H, D}) * 0.3;
    Dev qd(q), kd(k), vd(v), wd(w), bd(bias), ud(u);
    const float *params[] = {static_cast<const float *>(wd.ptr), static_cast<const float *>(bd.ptr),
                             static_cast<const float *>(ud.ptr)};
    auto forward = [&](int64_t first_row, bool window, at::Tensor &o, at::Tensor &lse) {
      const int64_t rows = window ? c.T - first_row : c.T;
      o = at::zeros({B, H, rows, D}, st), lse = at::zeros({B, H, rows});
      Dev od(o), ld(lse);
      ape::cuda::CudaAttnArgs a;
      a.B = B, a.H = H, a.T = c.T, a.D = D, a.dtype = c.dtype, a.scale = 0.17f;
      a.q = qd.ptr, a.k = kd.ptr, a.v = vd.ptr, a.o = od.ptr, a.lse = static_cast<float *>(ld.ptr);
      a.params = params, a.first_row = first_row, a.o_from_first = window, a.num_splits = 1;
      ASSERT_EQ(var->forward(a), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      o = od.get(o), lse = ld.get(lse);
    };
    at::Tensor full_o, full_lse, o, lse;
    forward(0, false, full_o, full_lse);
    forward(c.first_row, true, o, lse);
    if (HasFatalFailure()) return;
    // The full forward against the materialised attention in float64 (the inputs as the kernel
    // reads them): logits scale q.k + (q_i + v_h).w_h + u_h.k_j, causal softmax, times v.
    {
      const at::Tensor qd = q.to(at::kDouble), kd = k.to(at::kDouble), vd = v.to(at::kDouble);
      const at::Tensor wd = w.to(at::kDouble).view({1, H, 1, D}), bd = bias.to(at::kDouble).view({1, H, 1, D}),
                       ud = u.to(at::kDouble).view({1, H, 1, D});
      const at::Tensor row = ((qd + bd) * wd).sum(-1, true), col = (kd * ud).sum(-1).unsqueeze(-2);
      at::Tensor logits = at::matmul(qd, kd.transpose(-1, -2)) * 0.17 + row + col;
      logits = logits.masked_fill(at::ones({c.T, c.T}, at::kBool).triu(1), -INFINITY);
      const at::Tensor ref_o = at::matmul(at::softmax(logits, -1), vd), ref_lse = at::logsumexp(logits, -1);
      const double tol = c.dtype == ape::cuda::DType::BF16 ? 2e-2 : 1e-4;
      const double mag = std::max(1.0, ref_o.abs().max().item<double>());
      EXPECT_LE((full_o.to(at::kDouble) - ref_o).abs().max().item<double>(), tol * mag) << "o against the reference";
      // lse: float32 sums in every dtype (bf16 rounds the inputs, which the reference reads as
      // rounded, and the products' operands); 1e-5 of |lse| is ~40 ulps of float32 at T = 900.
      const double lse_tol = c.dtype == ape::cuda::DType::BF16 ? 1e-3 : 1e-5;
      EXPECT_LE((full_lse.to(at::kDouble) - ref_lse).abs().max().item<double>(), lse_tol * ref_lse.abs().max().item<double>())
          << "lse against the reference";
    }
    const int64_t n = c.T - c.first_row;
    EXPECT_TRUE(at::equal(o, full_o.narrow(2, c.first_row, n))) << "o differs from the full forward's rows";
    EXPECT_TRUE(at::equal(lse, full_lse.narrow(2, c.first_row, n))) << "lse differs from the full forward's rows";
    for (const auto &f : ape::simt::take_findings())
      ADD_FAILURE() << "emulator " << ape::simt::check_name(f.check) << ": " << f.kernel << ": " << f.message;
  }
}

}  // namespace
