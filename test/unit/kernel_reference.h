// Materialised fp64 LibTorch reference of causal attention with every positional encoding that
// examples/encodings/ compiles (nope, rope, alibi, cable, expe, forget_gate, expe_rope_cable),
// written from the
// math of the project's encodings specification (exact formulas and checks) and never from the generated kernels:
//
//   l_ij = scale * q'_i . k'_j + B_ij  (j <= i; -inf above the diagonal),
//   o_i  = sum_j softmax_j(l_ij) v_j,  lse_i = log sum_j exp(l_ij),
//
// with q', k' and B per encoding (positions n, i, j are 0-based token indices):
//   nope         q' = q, k' = k, B = 0
//   rope         rotate-half, theta_k = 10000^(-2k/D), k < D/2, angle n*theta_k
//   alibi        B_ij = -m_h (i - j), m_h = param "alibi_slopes" [H]
//   cable        S = cumsum_t(-softplus(f)), B_ij = S_i - S_j           (feature 0)
//   forget_gate  C = cumsum_t(log sigmoid(g)), B_ij = C_i - C_j          (feature 0)
//   expe         q' = q + a_q + n b_q, k' = k + a_k + n b_k, params "override_{q,k}_{a,b}" [H, D]
//   expe_rope_cable  q' = rope(q + a_q + n b_q), k' likewise, B = cable's (feature 0)
// Gradients come from torch autograd on the materialised graph.
//
// Shapes: q, k, v, o, dout [B, H, T, D]; lse, features [B, H, T]; bias [B, H, T, T].
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

namespace ape_test {

// Inputs of the reference; every tensor is converted to fp64.
struct RefInputs {
  torch::Tensor q, k, v;                       // [B, H, T, D]
  std::vector<torch::Tensor> features;         // each [B, H, T], in manifest order
  std::map<std::string, torch::Tensor> params; // by manifest name
  std::vector<std::string> trainable;          // names of params whose gradient is wanted
  double scale = 0;                            // kappa
};

struct RefOutputs {
  torch::Tensor o, lse;                               // [B,H,T,D], [B,H,T]
  torch::Tensor dq, dk, dv;                           // only with a dout
  std::vector<torch::Tensor> dfeatures;               // one per feature
  std::map<std::string, torch::Tensor> dparams;       // one per trainable param
};

// The encodings the reference knows.
const std::vector<std::string> &reference_encodings();

// Forward (and, when dout is defined, backward by autograd) of encoding `encoding`.
// Throws std::invalid_argument for an unknown encoding or a missing input.
RefOutputs reference_attention(const std::string &encoding, const RefInputs &in,
                               const torch::Tensor &dout);

// ---- the pieces, exposed for the hand-checkable cases -------------------------------------------

// Rotate-half RoPE of x [..., T, D] (D even), position n = index along dim -2, base `base`.
torch::Tensor rope_rotate_half(const torch::Tensor &x, double base = 10000.0);

// The standard ALiBi slopes for H heads (powers of two: 2^(-8(h+1)/H); otherwise the slopes of
// the largest power of two c <= H followed by slopes(2c)[0::2][:H-c]), fp64 [H].
torch::Tensor alibi_slopes(int64_t H);

// The additive bias B [B, H, T, T] (all (i, j), not masked) of a score-bias encoding, or an
// undefined tensor for encodings without one.
torch::Tensor reference_bias(const std::string &encoding, const RefInputs &in);

}  // namespace ape_test
