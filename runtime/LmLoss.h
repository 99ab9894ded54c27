// The language model's cross-entropy without its logits tensor (CPU, float32).
//
// The output layer's logits are (tokens x vocabulary): at ape-train's default shape 2,048 x 4,096
// floats, 32 MiB, which LibTorch's linear + cross_entropy write, read and write again in
// log_softmax, fill (the NLL's gradient) and read back in its backward, one exp pass each way.
// Here the rows go in chunks of about 4 MiB of logits (lm_loss_chunk_rows): per chunk z = x W^T,
// each row's loss log Σ exp(z - max) - (z_target - max) from one exp pass, and, when a gradient is
// wanted, softmax(z) - onehot straight into dx = G W / N and dW += G^T x / N. The gradients are
// computed in the forward (the chunk's logits are at hand there); the backward scales them by the
// loss's gradient. Training's bits stay independent of the thread count: rows are split among
// threads, never one row's sum; the loss's sum over rows is sequential, in float64; and the
// products are MKL's, which give the same bits on any thread count in the strict mode the tools
// start with (MKL_CBWR=AUTO,STRICT, runtime/Threads.h; LmLoss.SameBitsOnAnyThreadCount,
// train_threads). ape-train's default model on the 2-core Xeon: 1.15x the steps per second (1.22x
// on one thread; bench/results/cpu_training.md); no (tokens x vocabulary) tensor is kept.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace ape {

// Whether lm_loss and lm_token_losses take the chunked path: CPU tensors of float32. Elsewhere
// (a GPU, another dtype) they compute the logits and LibTorch's cross_entropy, as before.
bool lm_loss_chunked(const at::Tensor &x, const at::Tensor &weight);

// Rows per chunk for a vocabulary of `vocab`: about 4 MiB of float32 logits (256 rows at 4,096;
// 128-1,024 rows measured alike there, 64 slower by its calls' overhead), at least 64 rows, a
// multiple of 16.
int64_t lm_loss_chunk_rows(int64_t vocab);

// Mean over the rows of the cross-entropy of x W^T against targets: x (N, d), weight (V, d),
// targets (N) int64 in [0, V) (std::invalid_argument otherwise). Differentiable in x and weight.
// chunk_rows 0: lm_loss_chunk_rows(V) (tests set others).
at::Tensor lm_loss(const at::Tensor &x, const at::Tensor &weight, const at::Tensor &targets,
                   int64_t chunk_rows = 0);

// Each row's cross-entropy (N) float32, without gradient.
at::Tensor lm_token_losses(const at::Tensor &x, const at::Tensor &weight, const at::Tensor &targets,
                           int64_t chunk_rows = 0);

}  // namespace ape
