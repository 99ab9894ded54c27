// Model: a small decoder-only language model whose attention is one compiled encoding.
//
//   tokens (B, T) -> Embedding (B, T, d)
//   N x [ x += Attn(LN(x));  x += MLP(LN(x)) ]      pre-norm blocks, MLP d -> 4d -> d with GELU
//   LN -> logits (B, T, V) = x · Eᵀ                 output tied to the embedding
//
// Attention in each block (x̃ = LN(x), H heads of width D = d/H):
//   q, k, v = x̃ W_q ᵀ, x̃ W_k ᵀ, x̃ W_v ᵀ             (B, T, d) -> (B, H, T, D); no bias
//   with a manifest override {l, targets}: target = x̃[..., l:] W[:, l:]ᵀ (the first l inputs are
//   replaced by positions; their contribution arrives through projection_term params)
//   features = Linear(d, H·n_features)(x̃)          -> n_features x (B, H, T)
//   params   = manifest params (per layer, or shared by all layers when per_layer = false);
//              projection_term params are (W[:, :columns] @ u).view(H, D), u_j = start + step·j
//   o = fused_attention(kernel, q, k, v, features, params, κ) -> (B, T, d) -> W_o
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "runtime/Manifest.h"

namespace ape {
struct KernelEntry;

struct ModelConfig {
  std::string encoding;  // registry name of the kernel
  int64_t vocab = 4096;
  int64_t d_model = 128;
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t mlp_mult = 4;
  double init_std = 0.02;

  int64_t head_dim() const { return d_model / heads; }
  void validate() const;  // throws std::invalid_argument with the offending value
  nlohmann::json to_json() const;
  static ModelConfig from_json(const nlohmann::json &j);  // throws std::runtime_error
};

// One block's attention with the encoding's features and params.
class EncodedAttentionImpl : public torch::nn::Module {
 public:
  // `shared` holds the model-level (per_layer = false) params, indexed like manifest.params
  // (undefined where the param is per layer).
  EncodedAttentionImpl(const KernelEntry &entry, const ModelConfig &cfg,
                       std::vector<torch::Tensor> shared);
  torch::Tensor forward(const torch::Tensor &xn);  // (B, T, d) normalised -> (B, T, d)

  // The param tensors handed to the kernel, in manifest order (projection_terms computed now).
  std::vector<torch::Tensor> kernel_params();

  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr}, wf{nullptr};

 private:
  torch::Tensor project(const torch::Tensor &xn, torch::nn::Linear &w, bool overridden) const;
  const KernelEntry *entry_;
  const Manifest *manifest_;
  ModelConfig cfg_;
  std::vector<torch::Tensor> params_;  // manifest order; undefined for projection_term
};
TORCH_MODULE(EncodedAttention);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const KernelEntry &entry, const ModelConfig &cfg, std::vector<torch::Tensor> shared);
  torch::Tensor forward(torch::Tensor x);
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  EncodedAttention attn{nullptr};
  torch::nn::Linear fc{nullptr}, proj{nullptr};
};
TORCH_MODULE(Block);

class LanguageModelImpl : public torch::nn::Module {
 public:
  // Builds the model for `entry` (which must match cfg.encoding when that is set).
  LanguageModelImpl(const KernelEntry &entry, ModelConfig cfg);
  // Looks the kernel up in the registry by cfg.encoding (unknown name: error listing the names).
  explicit LanguageModelImpl(ModelConfig cfg);

  torch::Tensor forward(const torch::Tensor &tokens);  // (B, T) int64 -> logits (B, T, V)
  // Mean next-token cross-entropy of windows (B, T+1): inputs [:, :-1], targets [:, 1:].
  torch::Tensor loss(const torch::Tensor &windows);

  const ModelConfig &config() const { return cfg_; }
  const KernelEntry &entry() const { return *entry_; }
  const Manifest &manifest() const;
  int64_t num_parameters() const;

  torch::nn::Embedding wte{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  std::vector<Block> blocks;

 private:
  void build();
  const KernelEntry *entry_;
  ModelConfig cfg_;
};
TORCH_MODULE(LanguageModel);

}  // namespace ape
