// Materialised fp64 LibTorch reference of causal attention with every positional encoding that
// examples/encodings/ compiles, written from the math of the project's encodings specification
// (exact formulas and checks) and never from the generated kernels:
//
//   l_ij = scale * q'_i . k'_j + B_ij  (j <= i; -inf above the diagonal),
//   o_i  = sum_j softmax_j(l_ij) v_j,  lse_i = log sum_j exp(l_ij),
//
// with q', k' and B per encoding. Positions n, i, j, t are 0-based token indices, T is the
// sequence length of the call, D the head dim. Fixed params (shape [1], not trainable) are read
// by value: s = "rope_factor", L = "rope_original_length", sigma = "position_scale".
//
// RoPE: d_r = 2 floor(fraction D / 2) rotated coordinates (the rest pass through), frequencies
// theta_k = base^(-2k/d_r) for k < d_r/2, pair k rotated by the angle n theta'_k; pairs are
// (k, k + d_r/2) ("half") or (2k, 2k+1) ("interleaved"):
//   nope              q' = q, k' = k, B = 0
//   sinusoidal        as nope (its table is added to the embedding, outside the kernel)
//   learned_absolute  as nope
//   rope              half, base 1e4, theta' = theta
//   rope_interleaved  interleaved, base 1e4
//   rope_partial      half, fraction 0.5 (d_r = 2 floor(D/4)), base 1e4
//   rope_pi           half, theta' = theta / s
//   rope_ntk          half, base' = base s^(d_r/(d_r-2))
//   rope_dynamic_ntk  half, l = max(T, L), base' = base ((s l / L) - (s - 1))^(d_r/(d_r-2))
//   rope_yarn         half, beta_fast 32, beta_slow 1: dimIdx(R) = d_r ln(L/(2 pi R)) / (2 ln base),
//                     low = max(floor(dimIdx(32)), 0), high = min(ceil(dimIdx(1)), d_r - 1)
//                     (+0.001 if equal), ramp_k = clamp((k - low)/(high - low), 0, 1),
//                     theta'_k = (theta_k / s) ramp_k + theta_k (1 - ramp_k); q' and k' (the whole
//                     head vectors, after the rotation) times mscale = 0.1 ln s + 1 (1 if s <= 1)
//   rope_llama3       half, base 5e5, low_freq_factor 1, high_freq_factor 4: lambda_k = 2 pi/theta_k;
//                     lambda < L/4: theta; lambda > L/1: theta/s; else with
//                     g = (L/lambda - 1)/(4 - 1): theta' = (1 - g) theta/s + g theta
//   xpos              interleaved, base 1e4, times zeta_k^(+t_c/512) on both coordinates of pair k of
//                     q and zeta_k^(-t_c/512) of k, zeta_k = (k/(D/2) + 0.4)/1.4, t_c = t - floor(T/2)
//   alibi             B_ij = -m_h (i - j), m_h = param "alibi_slopes" [H]
//   rope_alibi        rope's q', k' and alibi's B
//   cable             S = cumsum_t(-softplus(f)), B_ij = S_i - S_j           (feature 0)
//   forget_gate       C = cumsum_t(log sigmoid(g)), B_ij = C_i - C_j          (feature 0)
//   expe, expe_qkv    q' = q + sigma (a_q + n b_q), k' likewise, params "override_{q,k}_{a,b}" [H, D]
//                     (expe_qkv's value override happens outside the kernel)
//   expe_cable        expe's q', k' and cable's B
//   expe_rope_cable   q' = rope(q + sigma (a_q + n b_q)), k' likewise, B = cable's
//   exqpe             q' = q + sigma (a_q[h] + floor(n/l) b_q[h] + P_q[n mod l, h]), k' likewise;
//                     "override_{q,k}_{a,b}" [H, D], "override_{q,k}_p" [l, H, D] (l = its dim 0)
// Additive-bias and relative-position encodings (Delta = max(i - j, 0); the masked entries j > i
// are computed at Delta = 0, so that no NaN reaches the gradients through the mask):
//   t5                B_ij = T[bucket(Delta), h], T = "t5_table" [32, H]; bucket(n) = n for n < 16,
//                     else min(16 + floor(ln(n/16) / ln(8) 16), 31)
//   rope_t5           rope's q', k' and t5's B
//   kerple_log        B_ij = -max(p_h, 0.01) ln(1 + max(a_h, 0.01) Delta), "kerple_p", "kerple_a" [H]
//   kerple_power      B_ij = -max(a_h, 0.01) Delta^clamp(p_h, 0.01, 2), Delta^p := 0 at Delta = 0
//                     (no gradient there)
//   fire              B_ij = b2[h] + sum_k w2[k, h] relu(w1[k] x_ij + b1[k]),
//                     x_ij = psi(Delta) / (psi(max(i, 512 L)) + 1e-6), psi(z) = ln(1 + |c z|);
//                     c = "fire_c" [1], L = "fire_l_mult" [1], "fire_w1", "fire_b1" [32],
//                     "fire_w2" [32, H], "fire_b2" [H] (all trainable)
//   kcable            S as cable's, B_ij = -ln(1 + (S_i - S_j)^2)
//   alibi_learned     alibi with trainable slopes
//   shaw              r = clip(i - j, 0, 32); B_ij = q'_i . a^K_r / sqrt(D), and the value term
//                     o_i = sum_j P_ij (v_j + a^V_r); a^K = "shaw_key", a^V = "shaw_value" [33, H, D]
//   deberta           delta = t5's bucket(Delta); B_ij = (q'_i . K_delta + k'_j . Q_delta) / sqrt(D),
//                     K = "deberta_c2p", Q = "deberta_p2c" [32, H, D]
//   transformer_xl    r = min(Delta, 256); B_ij = ((q'_i + v_h) . P_r + u_h . k'_j) / sqrt(D),
//                     P = "xl_rel" [257, H, D], v = "xl_v" [H, D], u = "xl_u" [1, H, D]
// (The sqrt(D) of the relative terms is their own: kappa multiplies only q' . k'.)
// Gradients come from torch autograd on the materialised graph (fixed params get none).
//
// Shapes: q, k, v, o, dout [B, H, T, D]; lse, features [B, H, T]; bias [B, H, T, T].
#pragma once

#include <torch/torch.h>

#include <map>
#include <optional>
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

// Where a flash-attention kernel with 16-bit inputs rounds to its input dtype; the reference can
// round at the same points (the "same-precision" baseline of the CUDA tests' FlashAttention rule:
// a kernel's error against the exact reference may be twice the baseline's):
//   q', k' after the q/k modifications (the operands of Q'K'^T), the gradient of q'.k' (dS, the
//   operand of dQ' = dS K' and dK' = dS^T Q'), P (the operand of P V and of dV = P^T dO), and o
//   (which the backward reads in Delta_i = dO_i . o_i). Everything else stays fp64.
struct RefRounding {
  torch::ScalarType dtype = torch::kFloat64;  // kBFloat16 or kHalf: round; kFloat64: exact
  // When defined ([B, H, T, D]), Delta_i = dO_i . delta_o_i reads this o (e.g. a kernel's own
  // rounded output) instead of the reference's rounded o: a second same-precision backward that
  // differs from the first only in which rounding of o it reads; with dtype kFloat64, the exact
  // attention whose Delta reads this o (a kernel that reads its o back in bf16).
  torch::Tensor delta_o;
};

// Forward (and, when dout is defined, backward by autograd) of encoding `encoding`.
// Throws std::invalid_argument for an unknown encoding or a missing input.
RefOutputs reference_attention(const std::string &encoding, const RefInputs &in,
                               const torch::Tensor &dout, const RefRounding &rounding = {});

// The rotated q' and k' (before kappa, after every q/k modification: ExPE/ExQPE terms, rotation,
// YaRN's mscale, xPos's factors) of an encoding, fp64 [B, H, T, D] each. Differentiable with
// respect to in's tensors (used by reference_attention; exposed for long-T row checks).
std::pair<torch::Tensor, torch::Tensor> reference_qk(const std::string &encoding,
                                                     const RefInputs &in);

// ---- the pieces, exposed for the hand-checkable cases -------------------------------------------

enum class Pairing { Half, Interleaved };

// Rotated coordinates: 2 floor(fraction D / 2).
int64_t rotary_dims(int64_t D, double fraction);

// theta_k = base^(-2k/d_r), k < d_r/2, fp64 [d_r/2].
torch::Tensor rope_theta(int64_t d_r, double base);
// Position interpolation: theta_k / s.
torch::Tensor rope_theta_pi(int64_t d_r, double base, double s);
// NTK-aware base: base s^(d_r/(d_r-2)).
double ntk_base(double base, double s, int64_t d_r);
// Dynamic NTK base at run-time length T: l = max(T, L), base ((s l/L) - (s-1))^(d_r/(d_r-2)).
double dynamic_ntk_base(double base, double s, double L, int64_t T, int64_t d_r);
// YaRN frequencies (beta_fast, beta_slow rotations) and its q/k factor.
torch::Tensor rope_theta_yarn(int64_t d_r, double base, double s, double L,
                              double beta_fast = 32.0, double beta_slow = 1.0);
double yarn_mscale(double s);
// Llama-3 frequencies.
torch::Tensor rope_theta_llama3(int64_t d_r, double base, double s, double L,
                                double low_freq_factor = 1.0, double high_freq_factor = 4.0);

// Rotates the first 2 theta.size(0) coordinates of x [..., T, D] by the angles n theta_k
// (n = index along dim -2), pairs per `pairing`; the other coordinates pass through.
torch::Tensor rope_rotate(const torch::Tensor &x, const torch::Tensor &theta, Pairing pairing);
// Rotate-half RoPE of all D coordinates with theta_k = base^(-2k/D).
torch::Tensor rope_rotate_half(const torch::Tensor &x, double base = 10000.0);

// xPos: zeta_k = (k/(D/2) + gamma)/(1 + gamma), fp64 [D/2].
torch::Tensor xpos_zeta(int64_t D, double gamma = 0.4);
// The per-coordinate factors [T, D] (interleaved pairs: coordinate c belongs to pair c/2):
// zeta_{c/2}^(sign (t - floor(T/2)) / scale_base); sign +1 for q, -1 for k.
torch::Tensor xpos_factors(int64_t T, int64_t D, double sign, double gamma = 0.4,
                           double scale_base = 512.0);

// Sinusoidal table PE [T, d]: PE[n, 2k] = sin(n / base^(2k/d)), PE[n, 2k+1] = cos(n / base^(2k/d)).
torch::Tensor sinusoidal_table(int64_t T, int64_t d, double base = 10000.0);

// ExPE: x + sigma (a[h] + n b[h]); a, b [H, D], sigma a scalar tensor (or [1]).
torch::Tensor expe_shift(const torch::Tensor &x, const torch::Tensor &a, const torch::Tensor &b,
                         const torch::Tensor &sigma);
// ExQPE: x + sigma (a[h] + floor(n/l) b[h] + P[n mod l, h]); P [l, H, D].
torch::Tensor exqpe_shift(const torch::Tensor &x, const torch::Tensor &a, const torch::Tensor &b,
                          const torch::Tensor &P, const torch::Tensor &sigma);

// The standard ALiBi slopes for H heads (powers of two: 2^(-8(h+1)/H); otherwise the slopes of
// the largest power of two c <= H followed by slopes(2c)[0::2][:H-c]), fp64 [H].
torch::Tensor alibi_slopes(int64_t H);

// ---- the kernel tests' param values (every suite: the CPU harness, the emulated and GPU suites) ---

// The std of the random values of the bias and relative-position encodings' params: large enough
// that their terms matter (at the manifests' inits, e.g. N(0, 0.02) tables or FIRE's zero b1,
// the biases would be negligible or sit on ReLU kinks): T5's table O(1), the relative tables and
// global biases 0.5 (q . a / sqrt(D) = O(0.5)), FIRE's MLP O(1) with nonzero b1 and b2.
std::optional<double> bias_param_std(const std::string &name);

// A param's values for a kernel test, fp64 of `shape`, from its manifest entry (name, init kind,
// init value, trainable) and the sequence length T: ALiBi slopes the standard values (also the
// learned ones); fixed params (not trainable: "rope_factor", "rope_original_length",
// "position_scale") their manifest init value (constant -> value, zeros, ones); trainable
// constant-init params (KERPLE's p and a, FIRE's c) their init value times |1 + 0.1 N(0, 1)|
// (away from the clamps at 0.01 and 2, and p != a), FIRE's L 0.1 |1 + 0.1 N(0, 1)| (so that
// 512 L ~ 51 lies inside the tests' sequences: both sides of max(i, 512 L) run, with no integer
// tie); the bias encodings' other params per bias_param_std; the other params (ExPE's a and b,
// ExQPE's a, b and P) ~ N(0, 0.02), the per-position ones (suffix _b) scaled by min(1, 32/T) so
// that n*b stays O(0.5) at T = 1000 instead of swamping q and k. Draws from torch's generator.
torch::Tensor test_param_values(const std::string &name, const std::string &init,
                                std::optional<double> init_value, bool trainable,
                                c10::IntArrayRef shape, int64_t H, int64_t T);

// T5's bucket of a distance n >= 0 (32 buckets, 16 exact, max distance 128), computed in fp64.
int64_t t5_bucket(int64_t n);

// FIRE's normalised input x_ij [T, T] (Delta = max(i - j, 0)) for c and L (0-d or [1] tensors,
// differentiable).
torch::Tensor fire_inputs(int64_t T, const torch::Tensor &c, const torch::Tensor &L);

// The additive bias B [B, H, T, T] (all (i, j), not masked) of a score-bias encoding, or an
// undefined tensor for encodings without one. For the q/k-dependent ones (shaw, deberta,
// transformer_xl) it is computed from reference_qk's q', k'.
torch::Tensor reference_bias(const std::string &encoding, const RefInputs &in);

}  // namespace ape_test
