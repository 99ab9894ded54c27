// Manifest: the JSON description of a compiled encoding (docs/internals.md, section 3).
//
// The runtime learns everything encoding-specific from here: which per-token features it must
// compute, which parameters it must create (shape, initialiser, trainable, per layer or shared),
// whether q/k(/v) are projected from only the tail of x̃ (ExPE-style override), which absolute
// position table (fixed or learned) is added to the token embedding, the logit scale and causality. Plain C++ (no LibTorch), so it is cheap to include and to test.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ape/contract/transition.h"  // TransitionAttrs
#include "ape/contract/vocabulary.h"  // the contract: vocabularies, shape symbols, shared math
#include "ape/contract/value_rules.h"  // plain C++: the rules apec's verifier applies

namespace ape {

namespace abi = ::ape_abi;  // the contract (ape/contract/vocabulary.h)

// One entry of "features": f_t,h = w_h·x̃_t + c_h, a Linear(d, H) of the normalised block input.
struct FeatureSpec {
  std::string name;
  double weight_std = 0.02;
  double bias = 0.0;
};

// A dimension of a parameter's shape: a symbol resolved at model build time, or a number
// (abi::Dim: resolve(heads, head_dim), str()).
using DimSpec = abi::Dim;

struct InitSpec {
  // sinusoidal: shape [rows, heads, head_dim], value PE[r, h·head_dim + c] (docs/encodings-math.md, d = H·D).
  using Kind = abi::InitKind;  // zeros, ones, normal, ..., projection_prefix
  Kind kind = Kind::Zeros;
  double std = 0.02;    // normal
  double value = 0.0;   // constant
  // projection_term: (W[:, :columns] @ u).view(H, D), u_j = start + step·j, W from `projection`.
  // projection_prefix: P[r] = scale·Σ_{j<=r} W[:, j] for r < columns, shaped [columns, H, D].
  std::string projection;  // "q", "k" or "v"
  int64_t columns = 0;
  double start = 0.0;
  double step = 0.0;
  double scale = 1.0;       // projection_prefix
  // projection_term / projection_prefix: computed from a projection weight every step (not free).
  bool derived() const { return abi::is_derived(kind); }
  std::string str() const;  // e.g. "normal(std=0.02)"
};

struct ParamSpec {
  std::string name;
  std::vector<DimSpec> shape;
  InitSpec init;
  bool trainable = false;
  bool per_layer = true;
  // "range": the values a fixed param may take (ape-eval --set), checked with the rule the
  // verifier applied to the spec (ape/contract/value_rules.h). Absent: any finite value.
  std::optional<ape_rules::Range> range;
  // A fixed param: neither trainable nor derived (settable at evaluation, e.g. "rope_factor").
  bool fixed() const { return !trainable && !init.derived(); }
  std::vector<int64_t> resolve_shape(int64_t heads, int64_t head_dim) const;
  int64_t numel(int64_t heads, int64_t head_dim) const;
};

// "override": the first l inputs of the listed projections are overwritten by positions p_n.
// q and k are projected from x̃[..., l:] through W[:, l:] only (their position term arrives
// through the kernel's derived params); with targets "qkv" the value projection reads the
// overridden input itself, x_v = (σ·p_n, x̃[..., l:]), through the whole W_v.
//   expe:  p_{n,i} = start + θ·(n + i)
//   exqpe: p_{n,j} = start + j·θ1 + θ2·(floor(n/l) + [j <= n mod l])
// σ is the value of the fixed param named by position_scale (1 when there is none).
struct OverrideSpec {
  using Kind = abi::OverrideKind;
  Kind kind = Kind::Expe;
  int64_t l = 0;
  bool q = false, k = false, v = false;  // from targets "qk" | "qkv"
  std::string targets;
  double start = 0.0;
  double theta = 0.0;                 // expe
  double theta1 = 0.0, theta2 = 0.0;  // exqpe
  std::string position_scale;         // name of a fixed param of shape [1]; empty: σ = 1
  // p_{n, i} for n < T, i < l, row-major (T·l values), before σ.
  std::vector<double> positions(int64_t T) const;
};

// "embedding": an absolute position table added once to the token embedding,
//   x = wte(tokens)·(scale_embedding ? sqrt(d) : 1) + PE[:T]
// "table": PE is fixed, filled by the kernel entry's embed_table; "learned": PE = wpe[:T], a
// trainable [max_length, d] parameter, init N(0, std); longer sequences are an error.
struct EmbeddingSpec {
  using Kind = abi::EmbeddingKind;
  Kind kind = Kind::Table;
  int64_t max_length = 0;  // learned
  double std = 0.02;       // learned
  bool scale_embedding = false;
};

// "rotation": q/k pairs rotated by a rotary or xPos; fraction·head_dim coordinates rotate, which
// must be an even whole number >= 2 (ape_rules::checkRotation, the verifier's rule).
struct RotationSpec {
  std::string pairing;  // "half" | "interleaved"
  double fraction = 1.0;
};

struct Manifest {
  std::string encoding;
  std::string source;
  std::optional<double> scale;  // null -> 1/sqrt(head_dim)
  bool causal = true;
  std::vector<FeatureSpec> features;
  std::vector<ParamSpec> params;
  std::optional<OverrideSpec> override_;
  std::optional<EmbeddingSpec> embedding;
  std::optional<RotationSpec> rotation;
  // "inference_only": the kernel has no backward (an attention transition, docs/decoding.md);
  // training refuses it (inference_only_message), evaluation and decoding run it.
  bool inference_only = false;
  // "transition": the attention transition's attributes (null: none).
  std::optional<TransitionAttrs> transition;
  // Shape hints of the spec ("head_dim", "model_dim"): the kernel was compiled for these sizes.
  std::optional<int64_t> head_dim_hint, model_dim_hint;

  // Parses and validates; throws std::runtime_error("manifest of '<what>': ...") on any problem.
  // `what` names the manifest in messages (an encoding or a file name).
  static Manifest parse(const std::string &json_text, const std::string &what = "<manifest>");

  double scale_for(int64_t head_dim) const;
  int64_t num_features() const { return static_cast<int64_t>(features.size()); }
  int64_t num_params() const { return static_cast<int64_t>(params.size()); }
  // Index of the param named `name` in params, or -1.
  int64_t param_index(const std::string &name) const;
};

// Why an inference-only encoding cannot be trained, and what to do instead.
std::string inference_only_message(const std::string &encoding);

// A note when `m`'s attention transition transforms no layer of a model of `layers` layers (it
// transforms layers first_layer .. layers-1-skip_last: none below 4 layers at the defaults), so
// that results equal the encoding's without it; "" when it transforms some or there is none.
std::string transition_noop_note(const Manifest &m, int64_t layers);

// ALiBi slopes for H heads (abi::alibi_slopes); throws std::invalid_argument for heads <= 0.
std::vector<double> alibi_slopes(int64_t heads);

}  // namespace ape
