// The language model's cross-entropy by chunks of rows (runtime/LmLoss.h).
#include "runtime/LmLoss.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/csrc/autograd/custom_function.h>

namespace ape {

bool lm_loss_chunked(const at::Tensor &x, const at::Tensor &weight) {
  return x.device().is_cpu() && weight.device().is_cpu() && x.scalar_type() == at::kFloat &&
         weight.scalar_type() == at::kFloat;
}

int64_t lm_loss_chunk_rows(int64_t vocab) {
  const int64_t rows = (int64_t(1) << 20) / std::max<int64_t>(vocab, 1);  // 2^20 floats: 4 MiB
  return std::clamp<int64_t>(rows / 16 * 16, 64, 4096);
}

namespace {

void check_shapes(const char *who, const at::Tensor &x, const at::Tensor &w, const at::Tensor &t) {
  const std::string p = std::string("ape::") + who + ": ";
  if (x.dim() != 2 || w.dim() != 2 || x.size(1) != w.size(1))
    throw std::invalid_argument(p + "x must be (N, d) and weight (V, d)");
  if (t.dim() != 1 || t.size(0) != x.size(0) || t.scalar_type() != at::kLong)
    throw std::invalid_argument(p + "targets must be int64 (N) with x's N rows");
  if (t.numel() > 0 && t.device().is_cpu()) {  // on a GPU the loss checks (reading would wait)
    const int64_t lo = t.min().item<int64_t>(), hi = t.max().item<int64_t>();
    if (lo < 0 || hi >= w.size(0))
      throw std::invalid_argument(p + "target token " + std::to_string(lo < 0 ? lo : hi) +
                                  " is outside the vocabulary [0, " + std::to_string(w.size(0)) + ")");
  }
}

// The chunks: each row's loss into row_loss (N, float32); with gx / gw given, the gradients of
// `scale` x the sum of the rows' losses: gx (N, d) written, gw (V, d) added to.
void run_chunks(const at::Tensor &x, const at::Tensor &w, const at::Tensor &t, int64_t chunk,
                at::Tensor &row_loss, at::Tensor *gx, at::Tensor *gw, double scale) {
  const int64_t N = x.size(0), V = w.size(0);
  if (chunk <= 0) chunk = lm_loss_chunk_rows(V);
  const at::Tensor wt = w.t();
  at::Tensor buf = at::empty({std::min(chunk, N), V}, x.options());
  at::Tensor minus_one = at::full({std::min(chunk, N), 1}, -1.0f, x.options());
  for (int64_t s = 0; s < N; s += chunk) {
    const int64_t n = std::min(chunk, N - s);
    const at::Tensor xc = x.narrow(0, s, n), tc = t.narrow(0, s, n).unsqueeze(1);
    at::Tensor z = buf.narrow(0, 0, n);
    at::mm_out(z, xc, wt);                                 // logits
    z.sub_(at::amax(z, {1}, /*keepdim=*/true));             // z - max (a max is exact in any order)
    const at::Tensor zt = z.gather(1, tc);                  // z_target - max
    z.exp_();
    const at::Tensor sum = z.sum(1, /*keepdim=*/true);      // one thread a row
    row_loss.narrow(0, s, n).copy_((sum.log() - zt).squeeze(1));
    if (!gx && !gw) continue;
    z.div_(sum);                                            // softmax
    z.scatter_add_(1, tc, minus_one.narrow(0, 0, n));       // - onehot
    if (gx) {
      at::Tensor gxc = gx->narrow(0, s, n);
      at::addmm_out(gxc, gxc, z, w, /*beta=*/0, /*alpha=*/scale);
    }
    if (gw) gw->addmm_(z.t(), xc, /*beta=*/1, /*alpha=*/scale);
  }
}

// Σ row_loss / N in float64, in row order.
double mean_of(const at::Tensor &row_loss) {
  const at::Tensor r = row_loss.contiguous();
  const float *p = r.data_ptr<float>();
  double sum = 0;
  for (int64_t i = 0; i < r.numel(); ++i) sum += p[i];
  return r.numel() > 0 ? sum / double(r.numel()) : 0.0;
}

struct LmLossFn : public torch::autograd::Function<LmLossFn> {
  // want_gx, want_gw: whether x and weight take a gradient (decided before apply: the context's
  // needs_input_grad has no edges to read when the call records none).
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &x,
                            const at::Tensor &w, const at::Tensor &t, int64_t chunk, bool want_gx,
                            bool want_gw) {
    const at::Tensor xc = x.contiguous(), wc = w.contiguous();
    const int64_t N = xc.size(0);
    at::Tensor row_loss = at::empty({N}, xc.options());
    at::Tensor gx = want_gx ? at::empty_like(xc) : at::Tensor();
    at::Tensor gw = want_gw ? at::zeros_like(wc) : at::Tensor();
    run_chunks(xc, wc, t.contiguous(), chunk, row_loss, want_gx ? &gx : nullptr, want_gw ? &gw : nullptr,
               N > 0 ? 1.0 / double(N) : 0.0);
    ctx->save_for_backward({gx, gw});
    return at::scalar_tensor(mean_of(row_loss), xc.options());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor &g = grads[0];
    return {s[0].defined() ? s[0] * g : at::Tensor(), s[1].defined() ? s[1] * g : at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor lm_loss(const at::Tensor &x, const at::Tensor &weight, const at::Tensor &targets, int64_t chunk_rows) {
  check_shapes("lm_loss", x, weight, targets);
  if (!lm_loss_chunked(x, weight))
    return at::cross_entropy_loss(at::linear(x, weight).to(at::kFloat), targets);
  const bool grad = at::GradMode::is_enabled();
  return LmLossFn::apply(x, weight, targets, chunk_rows, grad && x.requires_grad(), grad && weight.requires_grad());
}

at::Tensor lm_token_losses(const at::Tensor &x, const at::Tensor &weight, const at::Tensor &targets,
                           int64_t chunk_rows) {
  check_shapes("lm_token_losses", x, weight, targets);
  const at::NoGradGuard no_grad;
  if (!lm_loss_chunked(x, weight))
    return at::cross_entropy_loss(at::linear(x, weight).to(at::kFloat), targets, {}, at::Reduction::None);
  at::Tensor row_loss = at::empty({x.size(0)}, x.options());
  run_chunks(x.contiguous(), weight.contiguous(), targets.contiguous(), chunk_rows, row_loss, nullptr, nullptr, 0.0);
  return row_loss;
}

}  // namespace ape
