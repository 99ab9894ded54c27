// KernelInputs: what a caller passes to one generated kernel beyond q, k and v, as plain C++
// tables (the manifest's "features", "params" and "scale", docs/internals.md §3).
//
// apec --emit=torch-library and --emit=c-abi write, next to the generated kernel, a function
//   const ape::KernelInputs &kernel_inputs();
// that the operator library (torch/ops.h) and the C ABI (c/abi_impl.h) check their inputs against.
// No LibTorch, no JSON parser: the tables are generated from the same kernel as the manifest.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "ape/contract/value_rules.h"
#include "ape/contract/vocabulary.h"

namespace ape {

// The kernel's CPU entry (ape/cpu/kernel_entry.h, a floor above: callers that run the kernel
// include it); the tables here only point at it.
struct KernelEntry;

// The vocabularies are the contract's (vocabulary.h): a dimension is an ape_abi::Dim ("heads",
// "head_dim" or a size), an init kind an ape_abi::InitKind, a projection an ape_abi::Projection.
constexpr int kMaxParamRank = 8;

// How a derived param (init "projection_term" or "projection_prefix", docs/internals.md §3) is
// computed from a projection weight W (out_features H·D x in_features) every step; the math is
// ape/torch/derived_params.h.
struct DerivedInit {
  bool derived;                    // false: the param is not derived (the rest is unused)
  ape_abi::Projection projection;  // which weight: W_q, W_k or W_v
  int64_t columns;                 // the first `columns` input columns of W
  double start;     // projection_term: (W[:, :columns] @ u).view(H, D), u_j = start + step·j
  double step;
  double scale;     // projection_prefix: P[r] = scale·Σ_{j<=r} W[:, j], [columns, H, D]
};

struct ParamInput {
  const char *name;               // manifest name
  int rank;                       // number of dimensions, <= kMaxParamRank
  ape_abi::Dim dims[kMaxParamRank];  // "heads", "head_dim" or a size
  bool trainable;                 // false: the kernel computes no gradient (it writes zeros)
  ape_abi::InitKind init;         // the manifest's init kind
  DerivedInit derived;            // derived for projection_term / projection_prefix
  // The manifest's "range" of a fixed param (rope_factor, position_scale, a spec's `range`): the
  // values it may take, by the rule apec and the runtime check (contract/value_rules.h).
  bool has_range = false;
  ape_rules::Range range{0, 0, false};
  double init_arg = 0;            // the init's argument: constant's value, normal's std

  bool is_derived() const { return derived.derived; }
};

struct KernelInputs {
  const char *encoding;               // the encoding's name
  const KernelEntry *entry;           // fp32 / fp64 forward and backward
  int num_features;                   // token features, each (B, H, T), in manifest order
  const char *const *feature_names;
  int num_params;                     // params, flattened contiguous, in manifest order
  const ParamInput *params;
  bool has_scale;                     // manifest "scale" set; otherwise kappa = 1/sqrt(D)
  double scale;

  double scale_for(int64_t head_dim) const {
    return has_scale ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
  }
};

// The shape of param p for H heads of dimension D.
inline std::vector<int64_t> param_shape(const ParamInput &p, int64_t heads, int64_t head_dim) {
  std::vector<int64_t> shape;
  for (int i = 0; i < p.rank; ++i) shape.push_back(p.dims[i].resolve(heads, head_dim));
  return shape;
}

// Param p's element count for H heads of dimension D (both >= 0), or -1 where it overflows int64.
inline int64_t param_numel(const ParamInput &p, int64_t heads, int64_t head_dim) {
  int64_t n = 1;
  for (int i = 0; i < p.rank; ++i) {
    const int64_t d = p.dims[i].resolve(heads, head_dim);
    if (d < 0 || (d != 0 && n > std::numeric_limits<int64_t>::max() / d)) return -1;
    n *= d;
  }
  return n;
}

// Param p's initial value for H heads of dimension D (both >= 1), as the runtime makes it, in its
// manifest shape row-major: zeros, ones, constant (init_arg), alibi_slopes and sinusoidal (the
// values of vocabulary.h). None for normal (random: the caller draws N(0, init_arg^2)) and the
// derived kinds (computed from a projection weight: ape/torch/derived_params.h).
inline std::optional<std::vector<double>> initial_values(const ParamInput &p, int64_t heads, int64_t head_dim) {
  const int64_t n = param_numel(p, heads, head_dim);
  if (n < 0) return std::nullopt;
  const std::vector<int64_t> shape = param_shape(p, heads, head_dim);
  switch (p.init) {
    case ape_abi::InitKind::Zeros: return std::vector<double>(static_cast<size_t>(n), 0.0);
    case ape_abi::InitKind::Ones: return std::vector<double>(static_cast<size_t>(n), 1.0);
    case ape_abi::InitKind::Constant: return std::vector<double>(static_cast<size_t>(n), p.init_arg);
    case ape_abi::InitKind::AlibiSlopes:
      if (n != heads) return std::nullopt;
      return ape_abi::alibi_slopes(heads);
    case ape_abi::InitKind::Sinusoidal:
      if (shape.size() != 3) return std::nullopt;
      return ape_abi::sinusoid_table(shape[0], shape[1] * shape[2]);
    default: return std::nullopt;
  }
}

// "" when every value of param p (n of them, as the caller holds them) is in its range (or it has
// none); else why not, in the runtime's words: "param 'rope_factor' must be a positive number in
// [...]; got 0". Out-of-range values had run: a rope_factor of 0 made every output NaN, a
// rope_original_length of 2.5 a finite, wrong one.
template <typename Real> std::string param_range_problem(const ParamInput &p, const Real *values, int64_t n) {
  if (!p.has_range || !values) return "";
  for (int64_t i = 0; i < n; ++i) {
    const std::string why = p.range.check(static_cast<double>(values[i]));
    if (!why.empty())
      return "param '" + std::string(p.name) + "' " + why + (n > 1 ? " (element " + std::to_string(i) + ")" : "");
  }
  return "";
}

// The manifest's spelling of param p's shape, e.g. "[heads, head_dim]".
inline std::string param_shape_text(const ParamInput &p) {
  std::string s = "[";
  for (int i = 0; i < p.rank; ++i) {
    if (i) s += ", ";
    s += p.dims[i].str();
  }
  return s + "]";
}

}  // namespace ape
