// The decoder LM. Everything encoding-specific comes from the kernel's manifest.
#include "runtime/Model.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>

#include <nlohmann/json.hpp>
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>

#include "ape/torch/derived_params.h"
#include "ape/cpu/kernel_entry.h"
#include "runtime/Attention.h"
#include "runtime/LmLoss.h"
#include "runtime/Options.h"
#include "runtime/Registry.h"
#include "runtime/Threads.h"

namespace ape {
namespace F = torch::nn::functional;

// ---- ModelConfig ---------------------------------------------------------------------------------

void ModelConfig::validate() const {
  // The ranges of the command line (ape-train --help) and of a checkpoint's config alike.
  require_in("--vocab", vocab, 2, int64_t(1) << 20);
  require_in("--d-model", d_model, 1, ape_rules::kMaxDim);
  require_in("--layers", layers, 1, 1024);
  require_in("--heads", heads, 1, d_model);
  if (d_model % heads != 0)
    throw std::invalid_argument("--d-model (" + std::to_string(d_model) + ") must be divisible by --heads (" +
                                std::to_string(heads) + ")");
  require_in("--kv-heads", kv_heads, 0, heads);  // (0: every head)
  if (kv_heads != 0) {
    if (heads % kv_heads != 0)
      throw std::invalid_argument("--heads (" + std::to_string(heads) + ") must be a multiple of --kv-heads (" +
                                  std::to_string(kv_heads) + ")");
  }
  require_in("mlp_mult", mlp_mult, 1, 64);
  require_in("init_std", init_std, 0.0, 1.0, /*open_low=*/true);
}

int64_t ModelConfig::min_elements() const {
  // Embedding (vocab x d), per block W_q, W_o (2 d²), W_k, W_v (2 d·H_kv·D) and the MLP
  // (2·mlp_mult·d²).
  const int64_t kv_width = key_heads() * head_dim();
  return vocab * d_model + layers * ((2 + 2 * mlp_mult) * d_model * d_model + 2 * d_model * kv_width);
}

nlohmann::json ModelConfig::to_json() const {
  nlohmann::json j = {{"encoding", encoding}, {"vocab", vocab},       {"d_model", d_model}, {"layers", layers},
                      {"heads", heads},       {"mlp_mult", mlp_mult}, {"init_std", init_std}};
  if (key_heads() != heads) j["kv_heads"] = kv_heads;  // absent: every head its own keys
  return j;
}

ModelConfig ModelConfig::from_json(const nlohmann::json &j) {
  ModelConfig c;
  try {
    c.encoding = j.at("encoding").get<std::string>();
    c.vocab = j.at("vocab").get<int64_t>();
    c.d_model = j.at("d_model").get<int64_t>();
    c.layers = j.at("layers").get<int64_t>();
    c.heads = j.at("heads").get<int64_t>();
    c.kv_heads = j.value("kv_heads", int64_t{0});
    c.mlp_mult = j.value("mlp_mult", int64_t{4});
    c.init_std = j.value("init_std", 0.02);
  } catch (const nlohmann::json::exception &e) {
    throw std::runtime_error(std::string("model config JSON: ") + e.what());
  }
  c.validate();
  return c;
}

// ---- attention -------------------------------------------------------------------------------------

namespace {
std::string param_key(const std::string &name) {
  std::string s = name;
  for (char &ch : s)
    if (ch == '.') ch = '_';
  return s;
}
}  // namespace

void check_model_width(const Manifest &m, int64_t d) {
  if (m.override_ && (m.override_->l >= d))
    throw std::invalid_argument("encoding '" + m.encoding + "': override l = " +
                                std::to_string(m.override_->l) + " must be < d_model = " +
                                std::to_string(d));
  for (const ParamSpec &p : m.params) {
    if (!p.init.derived()) continue;
    if (p.init.columns > d)
      throw std::invalid_argument("encoding '" + m.encoding + "': param '" + p.name + "' uses " +
                                  std::to_string(p.init.columns) + " columns of W_" + p.init.projection +
                                  " but d_model = " + std::to_string(d));
    if (m.override_ && p.init.columns > m.override_->l)
      throw std::invalid_argument("encoding '" + m.encoding + "': param '" + p.name + "' uses " +
                                  std::to_string(p.init.columns) + " columns of W_" + p.init.projection +
                                  " but the override replaces only l = " + std::to_string(m.override_->l));
  }
}

EncodedAttentionImpl::EncodedAttentionImpl(const KernelEntry &entry, const ModelConfig &cfg,
                                           std::vector<torch::Tensor> shared, int64_t layer)
    : entry_(&entry), manifest_(&manifest_of(entry)), cfg_(cfg), layer_(layer) {
  const Manifest &m = *manifest_;
  const int64_t d = cfg.d_model, H = cfg.heads, D = cfg.head_dim(), KV = cfg.key_heads();
  auto linear = [&](const char *name, int64_t in, int64_t out, bool bias, double std) {
    auto l = register_module(name, torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias)));
    torch::NoGradGuard g;
    torch::nn::init::normal_(l->weight, 0.0, std);
    if (bias) l->bias.zero_();
    return l;
  };
  wq = linear("wq", d, d, false, cfg.init_std);
  wk = linear("wk", d, KV * D, false, cfg.init_std);
  wv = linear("wv", d, KV * D, false, cfg.init_std);
  wo = linear("wo", d, d, true, cfg.init_std / std::sqrt(2.0 * cfg.layers));

  check_model_width(m, d);
  const int64_t nf = m.num_features();
  if (nf > 0) {
    wf = linear("wf", d, H * nf, true, 0.02);
    torch::NoGradGuard g;
    for (int64_t n = 0; n < nf; ++n) {
      wf->weight.narrow(0, n * H, H).normal_(0.0, m.features[n].weight_std);
      wf->bias.narrow(0, n * H, H).fill_(m.features[n].bias);
    }
  }

  params_.resize(m.params.size());
  for (size_t i = 0; i < m.params.size(); ++i) {
    const ParamSpec &p = m.params[i];
    if (p.init.derived()) continue;  // computed in kernel_params() (check_model_width)
    if (!p.per_layer) {
      if (i >= shared.size() || !shared[i].defined())
        throw std::logic_error("shared param '" + p.name + "' was not created by the model");
      params_[i] = shared[i];
      continue;
    }
    torch::Tensor t = init_param(p, H, D);
    params_[i] = p.trainable ? register_parameter(param_key(p.name), t)
                             : register_buffer(param_key(p.name), t);
  }
}

std::vector<torch::Tensor> EncodedAttentionImpl::kernel_params() {
  const Manifest &m = *manifest_;
  std::vector<torch::Tensor> out(m.params.size());
  for (size_t i = 0; i < m.params.size(); ++i) {
    const ParamSpec &p = m.params[i];
    if (!p.init.derived()) {
      out[i] = params_[i];
      continue;
    }
    const auto &pr = p.init.projection;
    torch::Tensor W = (pr == "q" ? wq : pr == "k" ? wk : wv)->weight;
    if (!p.trainable) W = W.detach();
    // ape/torch/derived_params.h, shared with the emitted operator libraries; autograd reaches W.
    out[i] = p.init.kind == InitSpec::Kind::ProjectionTerm
                 ? ape::derived::projection_term(W, p.init.columns, p.init.start, p.init.step,
                                                 cfg_.heads, cfg_.head_dim())
                 : ape::derived::projection_prefix(W, p.init.columns, p.init.scale, cfg_.heads,
                                                   cfg_.head_dim());
  }
  return out;
}

torch::Tensor EncodedAttentionImpl::override_positions(int64_t T, at::ScalarType dtype) const {
  const Manifest &m = *manifest_;
  if (!m.override_) throw std::logic_error("encoding '" + m.encoding + "' has no override");
  const OverrideSpec &ov = *m.override_;
  const at::Device device = wq->weight.device();
  if (!positions_.defined() || positions_.size(0) < T || positions_.scalar_type() != dtype ||
      positions_.device() != device) {
    // p_n depends on n alone: the rows of a longer table are the same values.
    const bool grow = positions_.defined() && positions_.scalar_type() == dtype && positions_.device() == device;
    const int64_t rows = grow ? std::max(T, 2 * positions_.size(0)) : T;
    positions_ = torch::tensor(ov.positions(rows), torch::TensorOptions().dtype(torch::kDouble))
                     .view({rows, ov.l})
                     .to(device, dtype);
  }
  torch::Tensor p = positions_.narrow(0, 0, T);
  if (!ov.position_scale.empty()) {
    const torch::Tensor &sigma = params_.at(m.param_index(ov.position_scale));
    p = p * sigma.detach().to(dtype).reshape({1, 1});
  }
  return p;
}

torch::Tensor EncodedAttentionImpl::project(const torch::Tensor &xn, torch::nn::Linear &w,
                                            bool overridden) const {
  if (!overridden) return w(xn);
  // x̃[..., l:] W[:, l:]ᵀ: both narrows are views, so x̃ is not copied.
  const int64_t l = manifest_->override_->l, d = cfg_.d_model;
  return torch::matmul(xn.narrow(-1, l, d - l), w->weight.narrow(1, l, d - l).t());
}

EncodedAttentionImpl::Inputs EncodedAttentionImpl::inputs(const torch::Tensor &xn, int64_t pos0) {
  const Manifest &m = *manifest_;
  const int64_t B = xn.size(0), T = xn.size(1), H = cfg_.heads, D = cfg_.head_dim();
  const auto &ov = m.override_;
  auto heads = [&](const torch::Tensor &t) {  // (B, T, n·D) -> (B, n, T, D)
    return t.view({B, T, t.size(2) / D, D}).transpose(1, 2).contiguous();
  };
  Inputs in;
  in.q = heads(project(xn, wq, ov && ov->q));
  in.k = heads(project(xn, wk, ov && ov->k));  // (B, H_kv, T, D)
  torch::Tensor v_lin = project(xn, wv, ov && ov->v);
  if (ov && ov->v) {
    // The value projection of the overridden input (σ·p_n, x̃[..., l:]): the tail part above plus
    // (σ·p_n) W_v[:, :l]ᵀ, the same for every batch row.
    torch::Tensor pos = override_positions(pos0 + T, xn.scalar_type()).narrow(0, pos0, T);  // (T, l)
    v_lin = v_lin + torch::matmul(pos, wv->weight.narrow(1, 0, ov->l).t()).unsqueeze(0);  // + (1, T, H_kv·D)
  }
  in.v = heads(v_lin);
  if (wf) {  // (B, T, nf·H) -> nf x (B, H, T)
    const int64_t nf = m.num_features();
    torch::Tensor f = wf(xn).view({B, T, nf, H}).permute({2, 0, 3, 1}).contiguous();
    in.feats = f.unbind(0);
  }
  return in;
}

torch::Tensor EncodedAttentionImpl::forward(const torch::Tensor &xn) {
  const int64_t B = xn.size(0), T = xn.size(1), H = cfg_.heads, D = cfg_.head_dim();
  Inputs in = inputs(xn, 0);
  torch::Tensor o = fused_attention(*entry_, in.q, in.k, in.v, in.feats, kernel_params(),
                                    manifest_->scale_for(D), AttnLayer{layer_, cfg_.layers});
  return wo(o.transpose(1, 2).reshape({B, T, H * D}));
}

torch::Tensor EncodedAttentionImpl::forward_cached(const torch::Tensor &xn, LayerCache &cache,
                                                   int64_t pos0, int64_t capacity) {
  torch::NoGradGuard no_grad;
  const int64_t B = xn.size(0), T = xn.size(1), H = cfg_.heads, D = cfg_.head_dim();
  Inputs in = inputs(xn, pos0);  // k, v of key_heads() heads: the cache keeps them so (runtime/Decode.h)
  torch::Tensor o = decode_attention(*entry_, cache, capacity, in.q, in.k, in.v, in.feats,
                                     kernel_params(), manifest_->scale_for(D),
                                     AttnLayer{layer_, cfg_.layers});
  return wo(o.transpose(1, 2).reshape({B, T, H * D}));
}

// ---- layer norm whose gradients do not depend on the thread count --------------------------------------

namespace {
// LibTorch's fused layer norm backward sums dγ and dβ over the rows in per-thread partials, so
// their last bits depend on the number of threads. Here dx comes from the fused kernel and
//   dγ = Σ_rows dy ⊙ x̂,   dβ = Σ_rows dy,   x̂ = (x - μ)·rstd          (rows = B·T)
// are column sums of a (rows, d) matrix, which LibTorch splits across threads by column, each
// column summed in the same order whatever the thread count. Training is then bitwise the same
// on 1, 2 or more threads (test: Determinism.TrainingIsTheSameOnAnyThreadCount). On a GPU the
// fused kernel's own dγ and dβ (no thread count there).
struct LayerNormFn : public torch::autograd::Function<LayerNormFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &x,
                               const torch::Tensor &weight, const torch::Tensor &bias, double eps) {
    const int64_t d = x.size(-1);
    auto [y, mean, rstd] = at::native_layer_norm(x, {d}, weight, bias, eps);
    ctx->save_for_backward({x, weight, bias, mean, rstd});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    auto s = ctx->get_saved_variables();
    const torch::Tensor &x = s[0], &weight = s[1], &bias = s[2], &mean = s[3], &rstd = s[4];
    const torch::Tensor dy = grads[0].contiguous();
    const int64_t d = x.size(-1);
    if (!x.device().is_cpu()) {
      // On a GPU LibTorch's own dγ and dβ: a reduction of a fixed shape, the same bits run to run,
      // without the three extra passes over (rows, d) below.
      auto [dx, dw, db] =
          at::native_layer_norm_backward(dy, x, {d}, mean, rstd, weight, bias, {true, true, true});
      return {dx, dw, db, torch::Tensor()};
    }
    auto [dx, unused_w, unused_b] =
        at::native_layer_norm_backward(dy, x, {d}, mean, rstd, weight, bias, {true, false, false});
    torch::Tensor xhat = (x - mean) * rstd;
    torch::Tensor dw = (dy * xhat).reshape({-1, d}).sum(0);
    torch::Tensor db = dy.reshape({-1, d}).sum(0);
    return {dx, dw, db, torch::Tensor()};
  }
};

// ln(x) with ln's weight, bias and eps, through LayerNormFn.
torch::Tensor layer_norm(const torch::nn::LayerNorm &ln, const torch::Tensor &x) {
  return LayerNormFn::apply(x, ln->weight, ln->bias, ln->options.eps());
}
}  // namespace

// ---- block -------------------------------------------------------------------------------------------

BlockImpl::BlockImpl(const KernelEntry &entry, const ModelConfig &cfg, std::vector<torch::Tensor> shared,
                     int64_t layer) {
  const int64_t d = cfg.d_model;
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  attn = register_module("attn", EncodedAttention(entry, cfg, std::move(shared), layer));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  fc = register_module("fc", torch::nn::Linear(d, cfg.mlp_mult * d));
  proj = register_module("proj", torch::nn::Linear(cfg.mlp_mult * d, d));
  torch::NoGradGuard g;
  torch::nn::init::normal_(fc->weight, 0.0, cfg.init_std);
  fc->bias.zero_();
  torch::nn::init::normal_(proj->weight, 0.0, cfg.init_std / std::sqrt(2.0 * cfg.layers));
  proj->bias.zero_();
}

torch::Tensor BlockImpl::forward(torch::Tensor x) { return forward(std::move(x), nullptr, 0); }

torch::Tensor BlockImpl::forward_cached(torch::Tensor x, LayerCache &cache, int64_t pos0,
                                        int64_t capacity) {
  x = x + attn->forward_cached(layer_norm(ln1, x), cache, pos0, capacity);
  return x + proj(F::gelu(fc(layer_norm(ln2, x))));
}

torch::Tensor BlockImpl::forward(torch::Tensor x, const ForwardProbe &probe, int64_t index) {
  torch::Tensor a = attn(layer_norm(ln1, x));
  if (probe) probe("block " + std::to_string(index) + " attention", a);
  x = x + a;
  torch::Tensor m = proj(F::gelu(fc(layer_norm(ln2, x))));
  if (probe) probe("block " + std::to_string(index) + " MLP", m);
  return x + m;
}

// ---- language model ------------------------------------------------------------------------------------

LanguageModelImpl::LanguageModelImpl(const KernelEntry &entry, ModelConfig cfg)
    : entry_(&entry), cfg_(std::move(cfg)) {
  if (cfg_.encoding.empty()) cfg_.encoding = entry.name;
  if (cfg_.encoding != entry.name)
    throw std::invalid_argument("model config names encoding '" + cfg_.encoding +
                                "' but the kernel is '" + entry.name + "'");
  build();
}

LanguageModelImpl::LanguageModelImpl(ModelConfig cfg)
    : entry_(&find_kernel(cfg.encoding)), cfg_(std::move(cfg)) {
  build();
}

const Manifest &LanguageModelImpl::manifest() const { return manifest_of(*entry_); }

void LanguageModelImpl::build() {
  cfg_.validate();
  const Manifest &m = manifest_of(*entry_);
  if (!m.causal)
    throw std::invalid_argument("encoding '" + m.encoding +
                                "' is not causal; a decoder language model needs causal attention");
  if (m.head_dim_hint && *m.head_dim_hint != cfg_.head_dim())
    throw std::invalid_argument("encoding '" + m.encoding + "' was compiled for head_dim " +
                                std::to_string(*m.head_dim_hint) + " (a shape hint of its spec); the model has " +
                                std::to_string(cfg_.head_dim()) + " (d_model / heads)");
  if (m.rotation)  // the verifier's rule for a head_dim hint, applied to the model's head_dim
    if (std::string why = ape_rules::checkRotation(m.rotation->fraction, cfg_.head_dim()); !why.empty())
      throw std::invalid_argument("encoding '" + m.encoding + "' rotates q/k pairs: " + why +
                                  "; choose --d-model / --heads so that head_dim = d_model / heads fits");
  if (m.model_dim_hint && *m.model_dim_hint != cfg_.d_model)
    throw std::invalid_argument("encoding '" + m.encoding + "' was compiled for model_dim " +
                                std::to_string(*m.model_dim_hint) + " (a shape hint of its spec); the model has d_model " +
                                std::to_string(cfg_.d_model));
  wte = register_module("wte", torch::nn::Embedding(cfg_.vocab, cfg_.d_model));
  {
    torch::NoGradGuard g;
    torch::nn::init::normal_(wte->weight, 0.0, cfg_.init_std);
  }
  if (m.embedding) {
    const EmbeddingSpec &e = *m.embedding;
    if (e.kind == EmbeddingSpec::Kind::Learned) {
      wpe = register_parameter("wpe", torch::randn({e.max_length, cfg_.d_model}) * e.std);
    } else if (!entry_->embed_table) {
      throw std::invalid_argument("encoding '" + m.encoding +
                                  "': the manifest asks for a fixed embedding table but the kernel "
                                  "entry has no embed_table (rebuild the kernel with this apec)");
    }
  }
  // Params shared by all layers (per_layer = false) live here, once.
  std::vector<torch::Tensor> shared(m.params.size());
  for (size_t i = 0; i < m.params.size(); ++i) {
    const ParamSpec &p = m.params[i];
    if (p.per_layer || p.init.derived()) continue;
    torch::Tensor t = init_param(p, cfg_.heads, cfg_.head_dim());
    shared[i] = p.trainable ? register_parameter("shared_" + param_key(p.name), t)
                            : register_buffer("shared_" + param_key(p.name), t);
  }
  for (int64_t l = 0; l < cfg_.layers; ++l)
    blocks.push_back(register_module("block" + std::to_string(l), Block(*entry_, cfg_, shared, l)));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg_.d_model})));
}

torch::Tensor LanguageModelImpl::forward(const torch::Tensor &tokens) { return forward(tokens, nullptr); }

void LanguageModelImpl::place(const ComputeDevice &dev, std::ostream *log) {
  check_encoding_on(dev, *entry_, cfg_.head_dim(), log);
  to(dev.device);
  table_cache_.clear();
  placement_ = dev;
}

torch::Tensor LanguageModelImpl::hidden(const torch::Tensor &tokens, const ForwardProbe &probe) {
  torch::Tensor x = embed(tokens);  // (B, T, d)
  if (probe) probe("the embedding", x);
  for (size_t l = 0; l < blocks.size(); ++l) x = blocks[l]->forward(x, probe, static_cast<int64_t>(l));
  return layer_norm(ln_f, x);
}

torch::Tensor LanguageModelImpl::forward(const torch::Tensor &tokens, const ForwardProbe &probe) {
  AutocastScope autocast(placement_);
  torch::Tensor logits = F::linear(hidden(tokens, probe), wte->weight);  // (B, T, V), tied output
  if (probe) probe("the logits", logits);
  return logits;
}

torch::Tensor LanguageModelImpl::forward_cached(const torch::Tensor &tokens, KvCache &cache) {
  torch::NoGradGuard no_grad;
  if (cache.capacity < 1)
    throw std::invalid_argument("LanguageModel::forward_cached: the cache has no capacity");
  if (tokens.dim() == 2 && cache.len + tokens.size(1) > cache.capacity)
    throw std::length_error("LanguageModel::forward_cached: " + std::to_string(cache.len) + " cached + " +
                            std::to_string(tokens.size(1)) + " new tokens exceed the cache's capacity " +
                            std::to_string(cache.capacity));
  if (cache.layers.empty()) cache.layers.resize(blocks.size());
  if (cache.layers.size() != blocks.size())
    throw std::invalid_argument("LanguageModel::forward_cached: the cache has " + std::to_string(cache.layers.size()) +
                                " layers, the model " + std::to_string(blocks.size()));
  const int64_t pos0 = cache.len;
  AutocastScope autocast(placement_);
  // The step's multiply-adds, for the CPU's threads (Threads.h): every weight once per new token
  // (the tied embedding as the output layer), and each layer's q K^T and P V over the cache.
  const double new_tokens = tokens.dim() == 2 ? double(tokens.size(0) * tokens.size(1)) : 0.0;
  const double per_token = double(cfg_.min_elements()) +
                           2.0 * double(cfg_.layers) * double(pos0 + (tokens.dim() == 2 ? tokens.size(1) : 0)) *
                               double(cfg_.d_model);
  std::optional<SmallWorkThreads> threads;
  if (placement_.device.is_cpu()) threads.emplace(new_tokens * per_token);
  torch::Tensor x = embed(tokens.to(placement_.device), pos0, cache.capacity);
  for (size_t l = 0; l < blocks.size(); ++l) x = blocks[l]->forward_cached(x, cache.layers[l], pos0, cache.capacity);
  cache.len += tokens.size(1);
  x = layer_norm(ln_f, x);
  return F::linear(x, wte->weight);
}

std::optional<int64_t> LanguageModelImpl::max_length() const {
  const Manifest &m = manifest();
  if (m.embedding && m.embedding->kind == EmbeddingSpec::Kind::Learned) return m.embedding->max_length;
  return std::nullopt;
}

void LanguageModelImpl::check_length(int64_t T) const {
  if (auto L = max_length(); L && T > *L)
    throw std::invalid_argument("encoding '" + cfg_.encoding + "': learned absolute positions: sequence length " +
                                std::to_string(T) + " exceeds the table's max_length " + std::to_string(*L));
}

torch::Tensor LanguageModelImpl::position_table(int64_t T, at::ScalarType dtype) {
  const auto key = std::make_pair(T, static_cast<int>(dtype));
  auto it = table_cache_.find(key);
  if (it != table_cache_.end()) return it->second;
  torch::Tensor t = torch::empty({T, cfg_.d_model}, torch::TensorOptions().dtype(torch::kDouble));
  entry_->embed_table(T, cfg_.d_model, t.data_ptr<double>());
  t = t.to(wte->weight.device(), dtype);
  if (table_cache_.size() >= 16) table_cache_.clear();  // a handful of lengths in practice
  table_cache_.emplace(key, t);
  return t;
}

torch::Tensor LanguageModelImpl::embed(const torch::Tensor &tokens, int64_t pos0, int64_t table_rows) {
  if (tokens.dim() != 2 || tokens.scalar_type() != torch::kLong)
    throw std::invalid_argument("LanguageModel::forward: tokens must be (B, T) int64, got " +
                                std::string(c10::toString(tokens.scalar_type())) + " with " +
                                std::to_string(tokens.dim()) + " dims");
  const int64_t T = tokens.size(1);
  check_length(pos0 + T);  // before any computation
  torch::Tensor x = wte(tokens);  // (B, T, d)
  const Manifest &m = manifest();
  if (!m.embedding) return x;
  if (m.embedding->scale_embedding) x = x * std::sqrt(static_cast<double>(cfg_.d_model));
  if (m.embedding->kind == EmbeddingSpec::Kind::Learned) return x + wpe.narrow(0, pos0, T).unsqueeze(0);
  const int64_t rows = std::max(table_rows, pos0 + T);
  return x + position_table(rows, x.scalar_type()).narrow(0, pos0, T).unsqueeze(0);
}

std::vector<std::string> settable_params(const Manifest &m) {
  std::vector<std::string> out;
  for (const auto &p : m.params)
    if (p.fixed()) out.push_back(p.name);
  return out;
}

std::vector<std::string> LanguageModelImpl::settable_params() const { return ape::settable_params(manifest()); }

int64_t check_fixed_param(const Manifest &m, const std::string &name, double value) {
  auto settable = [&] {
    std::string list;
    for (const auto &n : settable_params(m)) list += (list.empty() ? "" : ", ") + n;
    return list.empty() ? std::string("(none)") : list;
  };
  const int64_t idx = m.param_index(name);
  if (idx < 0)
    throw std::invalid_argument("encoding '" + m.encoding + "' has no param '" + name +
                                "'; its settable (fixed) params: " + settable());
  const ParamSpec &p = m.params[idx];
  if (!p.fixed())
    throw std::invalid_argument("param '" + name + "' of encoding '" + m.encoding + "' is " +
                                (p.init.derived() ? "derived from a projection weight"
                                                  : "trainable (its value comes from training)") +
                                ", not a fixed param; settable: " + settable());
  // The rule apec's verifier applied to the spec's value (ape/contract/value_rules.h), carried by
  // the manifest; a param without one takes any value a f32 kernel can hold.
  const ape_rules::Range range = p.range ? *p.range : ape_rules::kFiniteF32;
  if (std::string why = range.check(value); !why.empty())
    throw std::invalid_argument("param '" + name + "' of encoding '" + m.encoding + "' " + why);
  return idx;
}

void LanguageModelImpl::set_fixed_param(const std::string &name, double value) {
  const int64_t idx = check_fixed_param(manifest(), name, value);
  torch::NoGradGuard g;
  for (auto &b : blocks) b->attn->stored_param(static_cast<size_t>(idx)).fill_(value);
}

torch::Tensor LanguageModelImpl::loss(const torch::Tensor &windows) {
  const int64_t T1 = windows.size(1);
  if (windows.dim() != 2 || T1 < 2)
    throw std::invalid_argument("LanguageModel::loss: windows must be (B, T+1) with T >= 1");
  const torch::Tensor inputs = windows.narrow(1, 0, T1 - 1), targets = windows.narrow(1, 1, T1 - 1);
  if (chunked_loss()) {
    const torch::Tensor x = hidden(inputs, nullptr);
    return lm_loss(x.reshape({-1, cfg_.d_model}), wte->weight, targets.reshape({-1}));
  }
  // float32 logits for the loss (bf16 under autocast).
  torch::Tensor logits = forward(inputs).to(torch::kFloat);
  return F::cross_entropy(logits.reshape({-1, cfg_.vocab}), targets.reshape({-1}));
}

torch::Tensor LanguageModelImpl::token_losses(const torch::Tensor &tokens, const torch::Tensor &targets) {
  if (tokens.dim() != 2 || !targets.sizes().equals(tokens.sizes()))
    throw std::invalid_argument("LanguageModel::token_losses: tokens and targets must be (B, T) alike");
  torch::NoGradGuard no_grad;
  const int64_t B = tokens.size(0), T = tokens.size(1);
  if (chunked_loss())
    return lm_token_losses(hidden(tokens, nullptr).reshape({-1, cfg_.d_model}), wte->weight, targets.reshape({-1}))
        .view({B, T});
  torch::Tensor logits = forward(tokens).to(torch::kFloat);
  return F::cross_entropy(logits.reshape({-1, cfg_.vocab}), targets.reshape({-1}),
                          F::CrossEntropyFuncOptions().reduction(torch::kNone))
      .view({B, T});
}

bool LanguageModelImpl::chunked_loss() const {
  return placement_.device.is_cpu() && placement_.precision == Precision::F32 &&
         wte->weight.scalar_type() == torch::kFloat && !at::autocast::is_autocast_enabled(at::kCPU);
}

int64_t LanguageModelImpl::num_parameters() const {
  int64_t n = 0;
  for (const auto &p : parameters()) n += p.numel();
  return n;
}

}  // namespace ape
