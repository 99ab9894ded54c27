// Manifest: the JSON description of a compiled encoding (docs/internals.md, section 3).
//
// The runtime learns everything encoding-specific from here: which per-token features it must
// compute, which parameters it must create (shape, initialiser, trainable, per layer or shared),
// whether q/k(/v) are projected from only the tail of x̃ (ExPE-style override), the logit scale
// and causality. Plain C++ (no LibTorch), so it is cheap to include and to test.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace ape {

// One entry of "features": f_t,h = w_h·x̃_t + c_h, a Linear(d, H) of the normalised block input.
struct FeatureSpec {
  std::string name;
  double weight_std = 0.02;
  double bias = 0.0;
};

// A dimension of a parameter's shape: a symbol resolved at model build time, or a number.
struct DimSpec {
  enum class Kind { Heads, HeadDim, Fixed };
  Kind kind = Kind::Fixed;
  int64_t value = 0;  // for Fixed
  int64_t resolve(int64_t heads, int64_t head_dim) const;
  std::string str() const;  // "heads", "head_dim" or the number
};

struct InitSpec {
  enum class Kind { Zeros, Ones, Normal, Constant, AlibiSlopes, ProjectionTerm };
  Kind kind = Kind::Zeros;
  double std = 0.02;    // normal
  double value = 0.0;   // constant
  // projection_term: (W[:, :columns] @ u).view(H, D), u_j = start + step·j, W from `projection`.
  std::string projection;  // "q", "k" or "v"
  int64_t columns = 0;
  double start = 0.0;
  double step = 0.0;
  std::string str() const;  // e.g. "normal(std=0.02)"
};

struct ParamSpec {
  std::string name;
  std::vector<DimSpec> shape;
  InitSpec init;
  bool trainable = false;
  bool per_layer = true;
  std::vector<int64_t> resolve_shape(int64_t heads, int64_t head_dim) const;
  int64_t numel(int64_t heads, int64_t head_dim) const;
};

// "override": project the listed targets from x̃[..., l:] through W[:, l:] only.
struct OverrideSpec {
  int64_t l = 0;
  bool q = false, k = false, v = false;  // from targets "qk" | "qkv"
  std::string targets;
};

struct Manifest {
  std::string encoding;
  std::string source;
  std::optional<double> scale;  // null -> 1/sqrt(head_dim)
  bool causal = true;
  std::vector<FeatureSpec> features;
  std::vector<ParamSpec> params;
  std::optional<OverrideSpec> override_;

  // Parses and validates; throws std::runtime_error("manifest of '<what>': ...") on any problem.
  // `what` names the manifest in messages (an encoding or a file name).
  static Manifest parse(const std::string &json_text, const std::string &what = "<manifest>");

  double scale_for(int64_t head_dim) const;
  int64_t num_features() const { return static_cast<int64_t>(features.size()); }
  int64_t num_params() const { return static_cast<int64_t>(params.size()); }
};

// ALiBi slopes for H heads: power-of-two H: m_h = 2^(-8(h+1)/H); otherwise c = 2^floor(log2 H),
// slopes(c) followed by slopes(2c)[0::2][:H-c].
std::vector<double> alibi_slopes(int64_t heads);

}  // namespace ape
