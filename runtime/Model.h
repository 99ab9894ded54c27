// Model: a small decoder-only language model whose attention is one compiled encoding.
//
//   tokens (B, T) -> Embedding (B, T, d) [·sqrt(d)] [+ PE[:T]]   manifest "embedding": a fixed table
//                                                             (entry.embed_table) or a learned wpe
//   N x [ x += Attn(LN(x));  x += MLP(LN(x)) ]      pre-norm blocks, MLP d -> 4d -> d with GELU
//   LN -> logits (B, T, V) = x · Eᵀ                 output tied to the embedding
//   loss: mean cross-entropy; on the CPU by chunks of rows, never the (B·T, V) logits (LmLoss.h)
//
// Attention in each block (x̃ = LN(x), H heads of width D = d/H, H_kv key heads):
//   q, k, v = x̃ W_q ᵀ, x̃ W_k ᵀ, x̃ W_v ᵀ             (B, T, d) -> (B, H, T, D); no bias; k and v
//                                                  (B, H_kv, T, D), W_k and W_v (H_kv·D, d): with
//                                                  H_kv < H grouped-query attention (AttnArgs::kv_heads)
//   with a manifest override {l, targets}: target = x̃[..., l:] W[:, l:]ᵀ (the first l inputs are
//   replaced by positions; their contribution arrives through projection_term/_prefix params);
//   with targets "qkv" the value projection reads the overridden input (σ·p_n, x̃[..., l:]) itself
//   features = Linear(d, H·n_features)(x̃)          -> n_features x (B, H, T)
//   params   = manifest params (per layer, or shared by all layers when per_layer = false);
//              projection_term params are (W[:, :columns] @ u).view(H, D), u_j = start + step·j;
//              projection_prefix params are (cumsum(W[:, :columns], 1)·scale)ᵀ.view(columns, H, D)
//   o = fused_attention(kernel, q, k, v, features, params, κ) -> (B, T, d) -> W_o
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "runtime/Decode.h"
#include "runtime/Device.h"
#include "runtime/Manifest.h"

namespace ape {
struct KernelEntry;

// Called with each stage's output during a forward pass ("the embedding", "block 0 attention",
// "block 0 MLP", ..., "the logits"): how a non-finite value is traced to where it appeared.
using ForwardProbe = std::function<void(const std::string &stage, const torch::Tensor &value)>;

struct ModelConfig {
  std::string encoding;  // registry name of the kernel
  int64_t vocab = 4096;
  int64_t d_model = 128;
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t kv_heads = 0;  // heads of k and v (--kv-heads): 0 = heads; else a divisor of heads
  int64_t mlp_mult = 4;
  double init_std = 0.02;

  int64_t head_dim() const { return d_model / heads; }
  int64_t key_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  void validate() const;  // throws std::invalid_argument naming the option, its range and the value
  // The elements of the embedding, the attention projections and the MLPs: a lower bound of the
  // model's size, known before anything is allocated (a checkpoint must hold at least this many).
  int64_t min_elements() const;
  nlohmann::json to_json() const;
  static ModelConfig from_json(const nlohmann::json &j);  // throws std::runtime_error
};

// One block's attention with the encoding's features and params.
class EncodedAttentionImpl : public torch::nn::Module {
 public:
  // `shared` holds the model-level (per_layer = false) params, indexed like manifest.params
  // (undefined where the param is per layer). `layer`: this block's index (0-based) of cfg.layers,
  // handed to the kernel (an attention transition transforms some layers only).
  EncodedAttentionImpl(const KernelEntry &entry, const ModelConfig &cfg,
                       std::vector<torch::Tensor> shared, int64_t layer = 0);
  torch::Tensor forward(const torch::Tensor &xn);  // (B, T, d) normalised -> (B, T, d)
  // Cached decoding (docs/decoding.md): xn (B, n, d) holds the tokens at positions pos0 ..
  // pos0 + n - 1, which the layer cache takes; no autograd graph.
  torch::Tensor forward_cached(const torch::Tensor &xn, LayerCache &cache, int64_t pos0,
                               int64_t capacity);

  // The param tensors handed to the kernel, in manifest order (derived params computed now).
  std::vector<torch::Tensor> kernel_params();
  // The stored tensor of manifest param i (per layer or shared); undefined for derived params.
  torch::Tensor stored_param(size_t i) const { return params_.at(i); }
  // σ·p_n for n < T, shape (T, l) (the override's position values; σ from position_scale).
  torch::Tensor override_positions(int64_t T, at::ScalarType dtype) const;

  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr}, wf{nullptr};

 private:
  torch::Tensor project(const torch::Tensor &xn, torch::nn::Linear &w, bool overridden) const;
  // q, k, v (B, H, T, D) and the features of xn (B, T, d) at positions pos0 .. pos0 + T - 1.
  struct Inputs {
    torch::Tensor q, k, v;
    std::vector<torch::Tensor> feats;
  };
  Inputs inputs(const torch::Tensor &xn, int64_t pos0);
  const KernelEntry *entry_;
  const Manifest *manifest_;
  ModelConfig cfg_;
  int64_t layer_ = 0;
  std::vector<torch::Tensor> params_;  // manifest order; undefined for projection_term
  // The override's p_n for n < rows on the weights' device (override_positions): built once and
  // grown by doubling, so a step on a GPU makes no host copy (a pageable one waits for the GPU).
  mutable torch::Tensor positions_;
};
TORCH_MODULE(EncodedAttention);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const KernelEntry &entry, const ModelConfig &cfg, std::vector<torch::Tensor> shared,
            int64_t layer = 0);
  torch::Tensor forward(torch::Tensor x);
  // The same, reporting "block <index> attention" and "block <index> MLP" to `probe`.
  torch::Tensor forward(torch::Tensor x, const ForwardProbe &probe, int64_t index);
  torch::Tensor forward_cached(torch::Tensor x, LayerCache &cache, int64_t pos0, int64_t capacity);
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  EncodedAttention attn{nullptr};
  torch::nn::Linear fc{nullptr}, proj{nullptr};
};
TORCH_MODULE(Block);

// Whether a model of width d_model = d can hold `m`'s encoding: its override's l below d and the
// columns its derived params read within d (and within l): std::invalid_argument naming the
// encoding otherwise. The model's constructor checks it; ape-train before any encoding trains.
void check_model_width(const Manifest &m, int64_t d);

// The fixed params of an encoding (not trainable, not derived: e.g. "rope_factor"), by name.
std::vector<std::string> settable_params(const Manifest &m);
// Whether `name` = `value` can be set in a model of `m`'s encoding: returns the param's index;
// unknown, trainable or derived names, or a value outside the param's range (the spec's rule):
// std::invalid_argument naming the reason and the settable names. (ape-train checks every
// encoding's --set before training the first.)
int64_t check_fixed_param(const Manifest &m, const std::string &name, double value);

class LanguageModelImpl : public torch::nn::Module {
 public:
  // Builds the model for `entry` (which must match cfg.encoding when that is set).
  LanguageModelImpl(const KernelEntry &entry, ModelConfig cfg);
  // Looks the kernel up in the registry by cfg.encoding (unknown name: error listing the names).
  explicit LanguageModelImpl(ModelConfig cfg);

  torch::Tensor forward(const torch::Tensor &tokens);  // (B, T) int64 -> logits (B, T, V)
  // The same, reporting every stage's output to `probe` (ForwardProbe).
  torch::Tensor forward(const torch::Tensor &tokens, const ForwardProbe &probe);
  // Cached decoding (docs/decoding.md): logits (B, n, V) of tokens (B, n) at positions
  // cache.len .., which every layer's cache takes. Equals the rows of forward() over all tokens
  // so far (for encodings that read the sequence length, of a forward over exactly those).
  // Inference only (no autograd graph); cache.capacity bounds the length (std::length_error).
  torch::Tensor forward_cached(const torch::Tensor &tokens, KvCache &cache);
  // The blocks' input: wte(tokens)·(scale_embedding ? sqrt(d) : 1) + the absolute table, if any;
  // the tokens sit at positions pos0 .., and a fixed table is computed for table_rows rows (at
  // least pos0 + T; cached).
  torch::Tensor embed(const torch::Tensor &tokens, int64_t pos0 = 0, int64_t table_rows = 0);
  // The longest sequence the model can take (learned absolute positions), or none.
  std::optional<int64_t> max_length() const;
  // Throws std::invalid_argument naming T and max_length when T does not fit.
  void check_length(int64_t T) const;

  // Fixed params (not trainable, not derived: e.g. "rope_factor", "position_scale"), by name.
  std::vector<std::string> settable_params() const;
  // Sets every copy (all layers and shared) of the fixed param `name` to `value`, as checked by
  // check_fixed_param below.
  void set_fixed_param(const std::string &name, double value);
  // Mean next-token cross-entropy of windows (B, T+1): inputs [:, :-1], targets [:, 1:]. On the
  // CPU in float32 without the logits tensor (runtime/LmLoss.h: by chunks of rows).
  torch::Tensor loss(const torch::Tensor &windows);
  // Each target's cross-entropy (B, T) float32 after tokens (B, T), targets (B, T); no gradient.
  // On the CPU in float32 by chunks of rows, as loss().
  torch::Tensor token_losses(const torch::Tensor &tokens, const torch::Tensor &targets);

  // Moves the model to dev.device and runs its forward passes in dev.precision from now on (bf16:
  // autocast on the GPU; the parameters stay float32). Throws std::invalid_argument, before
  // moving anything, when the encoding has no kernel there (runtime/Device.h).
  // `log`: where a run-time spec's CUDA compile says so (check_encoding_on).
  void place(const ComputeDevice &dev, std::ostream *log = nullptr);
  const ComputeDevice &placement() const { return placement_; }

  const ModelConfig &config() const { return cfg_; }
  const KernelEntry &entry() const { return *entry_; }
  const Manifest &manifest() const;
  int64_t num_parameters() const;

  torch::nn::Embedding wte{nullptr};
  torch::Tensor wpe;  // learned absolute positions [max_length, d]; undefined otherwise
  torch::nn::LayerNorm ln_f{nullptr};
  std::vector<Block> blocks;

 private:
  void build();
  // The output layer's input: ln_f of the last block's output (B, T, d); forward() is
  // hidden() · wteᵀ. Under the placement's autocast when the caller set it.
  torch::Tensor hidden(const torch::Tensor &tokens, const ForwardProbe &probe);
  // Whether loss() and token_losses() take runtime/LmLoss.h's chunked path (the CPU, float32).
  bool chunked_loss() const;
  torch::Tensor position_table(int64_t T, at::ScalarType dtype);  // "table": PE[:T], no grad
  const KernelEntry *entry_;
  ModelConfig cfg_;
  std::map<std::pair<int64_t, int>, torch::Tensor> table_cache_;  // by (T, dtype), on the model's device
  ComputeDevice placement_;
};
TORCH_MODULE(LanguageModel);

}  // namespace ape
