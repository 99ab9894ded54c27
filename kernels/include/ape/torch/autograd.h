// The autograd binding of a fused attention kernel: one torch::autograd::Function, shared by the
// runtime (runtime/Attention.cpp: fused_attention over a KernelEntry) and the operator library
// (torch/ops_impl.h: the differentiable ape_NAME::attention). What differs between the two is
// how the raw forward and backward run, which `Ops` supplies:
//
//   struct Ops {
//     // "who: ", the start of an error message about the kernel at `handle`.
//     static std::string prefix(int64_t handle);
//     // o (B, H, T, D) and lse (B, H, T) from the inputs.
//     static std::tuple<at::Tensor, at::Tensor> forward(int64_t handle, q, k, v,
//         at::TensorList features, at::TensorList params, double scale);
//     // dq, dk, dv, dfeatures, dparams from dout and the forward's o and lse.
//     static AttentionGrads backward(int64_t handle, dout, q, k, v, o, lse,
//         at::TensorList features, at::TensorList params, double scale);
//   };
//
// `handle` identifies the kernel (the address of its entry or input table, as an int64 that
// autograd can carry). Usage: AttentionAutograd<Ops>::apply(q, k, v, features, params, handle,
// scale) -> o; gradients reach q, k, v, the features and the params that require grad.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace ape {

// dq, dk, dv, dfeatures, dparams.
using AttentionGrads = std::tuple<at::Tensor, at::Tensor, at::Tensor, std::vector<at::Tensor>,
                                  std::vector<at::Tensor>>;

// Saved for backward: q, k, v, o, lse, features..., params...
template <class Ops>
struct AttentionAutograd : public torch::autograd::Function<AttentionAutograd<Ops>> {
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &q,
                            const at::Tensor &k, const at::Tensor &v, at::TensorList features,
                            at::TensorList params, int64_t handle, double scale) {
    auto [o, lse] = Ops::forward(handle, q, k, v, features, params, scale);
    torch::autograd::variable_list saved{q, k, v, o, lse};
    saved.insert(saved.end(), features.begin(), features.end());
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["handle"] = handle;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["nf"] = static_cast<int64_t>(features.size());
    ctx->saved_data["np"] = static_cast<int64_t>(params.size());
    return o;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const int64_t handle = ctx->saved_data["handle"].toInt();
    TORCH_CHECK(!at::GradMode::is_enabled(), Ops::prefix(handle),
                "the kernel's backward is not differentiable (no double backward: "
                "create_graph=True is not supported)");
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t nf = ctx->saved_data["nf"].toInt(), np = ctx->saved_data["np"].toInt();
    auto s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &o = s[3], &lse = s[4];
    std::vector<at::Tensor> features(s.begin() + 5, s.begin() + 5 + nf);
    std::vector<at::Tensor> params(s.begin() + 5 + nf, s.begin() + 5 + nf + np);
    at::Tensor dout = grad_outputs[0].defined() ? grad_outputs[0] : at::zeros_like(o);
    auto [dq, dk, dv, df, dp] =
        Ops::backward(handle, dout, q, k, v, o, lse, features, params, scale);
    // One gradient per forward argument: q, k, v, features..., params..., handle, scale.
    torch::autograd::variable_list grads{dq, dk, dv};
    for (int64_t i = 0; i < nf; ++i)
      grads.push_back(ctx->needs_input_grad(3 + i) ? df[i] : at::Tensor());
    for (int64_t i = 0; i < np; ++i)
      grads.push_back(ctx->needs_input_grad(3 + nf + i) ? dp[i] : at::Tensor());
    grads.emplace_back();
    grads.emplace_back();
    return grads;
  }
};

}  // namespace ape
