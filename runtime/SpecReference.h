// SpecReference: a materialised attention reference evaluated from a spec's own regions
// (docs/ape-check.md).
//
// `apec --emit=reference` writes an encoding after -ape-expand and -ape-push-override, before
// -ape-fuse, as JSON data (every region an expression graph; codegen/ReferenceEmitter.cpp). This
// evaluates that data with LibTorch ops, elementwise on whole tensors, never through the fused
// kernel, its tiles or -ape-differentiate:
//
//   tok      the token program in order: a feature, a map (its region on [B, H, T]), a scan
//            (cumsum along T)
//   q', k'   every q_mod (k_mod) in spec order on the whole [B, H, T, D] tensor, its partner
//            coordinate taken by the mod's own pairing and fraction
//   R_n      rel_rows: (x' + bias[h]) . table[r, h, :], [B, H, T, rows]
//   s_ij     scale q'_i . k'_j, then every score_mod in spec order, on the causal pairs j <= i
//            only ([B, H, T(T+1)/2]; the others are -inf)
//   P        softmax over j (a row with no finite logit gets P = 0, o = 0)
//   o        P v (+ sum_j P_ij table[r(i, j), h, :] with value_rows)
//   lse      log sum_j exp(l_ij)
//   A        with an attention transition, at layer l of a model of N layers: the spec's steps
//            1-5 applied to the rows of P it names (docs/encodings-math.md, "Attention
//            transition"), o = A v; lse stays the softmax's
// Gradients come from torch autograd on this graph. Shapes: B batch, H heads, T tokens, D head
// dim. Computed indices are clamped into their dimension, as the kernels do.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

namespace ape {

struct SpecReferenceData;  // the parsed JSON

// Where in a model a reference call sits: read only by an attention transition (layer `layer`,
// 0-based, of `num_layers`; num_layers = 0 transforms nothing, as in the kernels).
struct ReferenceSite {
  int64_t layer = 0, num_layers = 0;
  // Rounded to bf16 where the 16-bit kernels round: q' and k' after the mods, P before P V (and
  // P^T dO), o as written, the gradient of the product q' k'^T (dS) before dQ' = dS K' and
  // dK' = dS^T Q', and the gradients of q, k and v as written; and Delta_i = dO_i . o_i taken of
  // the rounded o, as the kernels take it (autograd's softmax backward forms it of the exact one:
  // a hook adds the difference). The forward's roundings pass their gradients straight through.
  // ape-check's bf16 yardstick (SpecCheck.h): the reference's own change under the kernels'
  // roundings. Not rounded: the transition's and the value rows' terms.
  bool round_bf16 = false;
  // With round_bf16: k's and v's gradients rounded too; false where the caller sums them over
  // groups of query heads first and rounds the sums, as the kernels do (grouped-query attention).
  bool round_kv_grads = true;
  // With round_bf16: 0 rounds to nearest (as the kernels); otherwise the seed of a stochastic
  // rounding (a value rounded to its upper or lower bf16 neighbour with probability by its
  // distance), one of the draws that average ape-check's yardstick of a param gradient, a sum
  // whose one nearest-rounded draw is a poor estimate of its spread (SpecCheck.cpp).
  uint64_t stochastic_seed = 0;
};

// x rounded to bf16 stochastically: each value to its lower or upper bf16 neighbour (in
// magnitude) with probability by its distance from the other, so that the rounding is unbiased
// (through float32: a double is first rounded to float32's 24 bits); a value bf16 holds, and NaN,
// stays. The type of x is kept. (ape-check's param yardsticks: ReferenceSite::stochastic_seed.)
at::Tensor round_bf16_stochastic(const at::Tensor &x, at::Generator &gen);

class SpecReference {
public:
  // Parses `json_text` (apec's NAME.reference.json); throws std::runtime_error naming `what` and
  // the problem for anything malformed.
  static SpecReference parse(const std::string &json_text, const std::string &what);

  struct ParamInfo {
    std::string name;
    std::vector<std::string> shape;  // "heads", "head_dim" or a positive integer
    bool trainable = false;
  };
  const std::string &encoding() const;
  const std::vector<ParamInfo> &params() const;
  const std::vector<std::string> &features() const;
  bool has_embedding_table() const;

  // The spec has an attention transition: an inference-only kernel (no gradients to check).
  bool has_transition() const;

  struct Result {
    at::Tensor o, lse;  // [B, H, T, D], [B, H, T]
    at::Tensor s;       // the causal pairs' logits after every score_mod, [B, H, T (T + 1) / 2]
    at::Tensor p;       // their softmax weights P_ij, the same layout
    at::Tensor row;     // the query i of each pair, [T (T + 1) / 2] (int64)
  };
  using Site = ReferenceSite;
  // The reference attention in the dtype of q (float64 or float32; everything else is converted
  // to it). features and params by name (every one the spec declares); differentiable with
  // respect to every input that requires grad.
  Result attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                   const std::map<std::string, at::Tensor> &features,
                   const std::map<std::string, at::Tensor> &params, double scale,
                   const Site &site = {}) const;

  // The fixed absolute position table [T, d] in float64, from the position_embedding's region;
  // throws when the spec has none.
  at::Tensor embedding_table(int64_t T, int64_t d) const;

private:
  std::shared_ptr<const SpecReferenceData> data_;
};

// Evaluates one region of reference data ({"args", "ops", "yield"} as JSON text) on `args` in
// float64, with no params or token sequences to load: the op semantics on their own (tests).
std::vector<at::Tensor> evaluate_reference_region(const std::string &region_json,
                                                  const std::vector<at::Tensor> &args);

}  // namespace ape
