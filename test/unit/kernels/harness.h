// The harness of ape_kernels_test (test/unit/kernels/*_test.cpp): the kernels of ape_kernels
// (examples/encodings/*.mlir compiled by apec) are reached only through ape::kernel_registry();
// a Problem holds fp64 master inputs of one call, KernelCall<Real> runs a kernel on them in fp32
// or fp64, and the comparisons measure it against the independent reference (kernel_reference.h)
// or against central differences of itself. The encoding lists come from the registry, so a new
// spec in examples/encodings/ is tested without editing a list.
//
// Fixed params get their manifest init value (constant -> value) unless a test sets another.
// Shapes: q, k, v, o, dout [B, H, T, D]; lse, features [B, H, T]; params per manifest.
// Set APE_KERNELS_TEST_STATS=1 to print the largest normalised error seen per quantity.
#pragma once

#include "kernel_reference.h"

#include <ape/cpu/dispatch.h>
#include <ape/cpu/kernel_entry.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ape {
const KernelEntry *const *kernel_registry(size_t *count);
const KernelEntry *const *kernel_registry_level(int level, size_t *count);
const CpuLevelChoice &kernel_cpu_level();
}  // namespace ape

namespace ape_test {

using torch::Tensor;

inline const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);

// ---- registry and manifests ---------------------------------------------------------------------

std::vector<const ape::KernelEntry *> registry();
// The entry named `name`, or nullptr.
const ape::KernelEntry *find_entry(const std::string &name);

// The encodings of the registry (every spec of examples/encodings/ the build compiled), by name:
//   trainable_encodings(): those with a backward, the ones the grids, the finite differences, the
//     edge cases, decoding and the instruction-set levels run;
//   inference_only_encodings(): "inference_only" in the manifest (an ape.attention_transition:
//     forward and prefill only, the backward refuses);
//   encodings_with_features(): the trainable ones with a feature (Cable's and the forget gate's
//     per-token scalars);
//   encodings_with_fixed_params(): the trainable ones with a fixed param read at run time
//     ("rope_factor", "rope_original_length", "position_scale": not trainable, init constant).
const std::vector<std::string> &trainable_encodings();
const std::vector<std::string> &inference_only_encodings();
std::vector<std::string> encodings_with_features();
std::vector<std::string> encodings_with_fixed_params();

struct ParamInfo {
  std::string name;
  std::vector<std::string> shape;  // "heads" / "head_dim" / an integer such as "16"
  bool trainable = false;
  std::string init;                 // init kind
  std::optional<double> init_value; // init "value" (kind "constant")
};

struct Manifest {
  nlohmann::json json;
  std::vector<std::string> features;
  std::vector<ParamInfo> params;
  std::optional<double> scale;
};

Manifest parse_manifest(const ape::KernelEntry &e);
// A param's shape for H heads of dimension D ("heads", "head_dim" or a positive integer).
std::vector<int64_t> param_shape(const ParamInfo &p, int64_t H, int64_t D);

// ---- a problem: fp64 master inputs of one kernel call -------------------------------------------

struct Problem {
  std::string enc;
  const ape::KernelEntry *entry = nullptr;
  Manifest man;
  int64_t B = 0, H = 0, T = 0, D = 0;
  Tensor q, k, v, dout;               // [B, H, T, D]; k, v [B, KV, T, D] (grouped_queries)
  std::vector<Tensor> features;       // [B, H, T] each, manifest order
  std::vector<Tensor> params;         // manifest order and shapes
  double scale = 0;
};

// make_problem's param values: test_param_values and bias_param_std (kernel_reference.h, the rule
// every kernel suite shares).

// Random inputs of encoding `enc` (make_problem in harness.cpp says which values every input gets).
Problem make_problem(const std::string &enc, int64_t B, int64_t H, int64_t T, int64_t D,
                     uint64_t seed);
// Index of the param `name` in p's manifest; a failure (and -1) when there is none.
int64_t param_index(const Problem &p, const std::string &name);
// Sets every element of the param `name` (a fixed param read at run time) to `value`.
void set_param(Problem &p, const std::string &name, double value);
// Every fixed param of p that `values` names gets that value (names p lacks are ignored).
void set_fixed_params(Problem &p, const std::map<std::string, double> &values);
// The first T tokens of p (same params): causal rows i < T of p depend only on these tokens.
Problem prefix(const Problem &p, int64_t T);
// p with another encoding's kernel (same inputs; the other manifest must take the same params).
Problem with_encoding(const Problem &p, const std::string &enc);
// p with k and v of `kv_heads` heads (the first of p's; AttnArgs::kv_heads), each shared by
// H / kv_heads query heads.
Problem grouped_queries(const Problem &p, int64_t kv_heads);
// Heads of p's k and v (H unless grouped_queries made it).
inline int64_t kv_heads_of(const Problem &p) { return p.k.size(1); }
// The reference's inputs for p (k and v repeated to H heads when grouped: the reference has no
// groups, so its dk and dv are summed per group by grouped_reference_grads).
RefInputs ref_inputs(const Problem &p);
// dk, dv of the reference over repeated k, v summed over each group of H / KV query heads.
void grouped_reference_grads(const Problem &p, RefOutputs &ref);

// ---- calling a kernel ---------------------------------------------------------------------------

template <class Real> constexpr torch::ScalarType scalar_type() {
  return std::is_same_v<Real, float> ? torch::kFloat32 : torch::kFloat64;
}

// One call of a kernel in precision Real; outputs are NaN-filled before every call so that an
// output the kernel fails to overwrite is caught.
template <class Real> struct KernelCall {
  const ape::KernelEntry *entry;
  Tensor q, k, v, o, lse, dout, dq, dk, dv;
  std::vector<Tensor> feat, prm, dfeat, dprm;
  std::vector<const Real *> feat_p, prm_p;
  std::vector<Real *> dfeat_p, dprm_p;
  ape::AttnArgs<Real> args{};

  explicit KernelCall(const Problem &p) : entry(p.entry) {
    const auto opt = torch::TensorOptions().dtype(scalar_type<Real>());
    auto cvt = [&](const Tensor &t) { return t.to(scalar_type<Real>()).contiguous().clone(); };
    q = cvt(p.q), k = cvt(p.k), v = cvt(p.v), dout = cvt(p.dout);
    for (const auto &f : p.features) feat.push_back(cvt(f));
    for (const auto &t : p.params) prm.push_back(cvt(t));
    o = torch::empty_like(q), lse = torch::empty({p.B, p.H, p.T}, opt);
    dq = torch::empty_like(q), dk = torch::empty_like(k), dv = torch::empty_like(v);
    for (const auto &f : feat) dfeat.push_back(torch::empty_like(f));
    for (const auto &t : prm) dprm.push_back(torch::empty_like(t));
    for (auto &t : feat) feat_p.push_back(t.data_ptr<Real>());
    for (auto &t : prm) prm_p.push_back(t.data_ptr<Real>());
    for (auto &t : dfeat) dfeat_p.push_back(t.data_ptr<Real>());
    for (auto &t : dprm) dprm_p.push_back(t.data_ptr<Real>());
    args.B = p.B, args.H = p.H, args.T = p.T, args.D = p.D;
    args.kv_heads = kv_heads_of(p) == p.H ? 0 : kv_heads_of(p);
    args.q = q.data_ptr<Real>(), args.k = k.data_ptr<Real>(), args.v = v.data_ptr<Real>();
    args.o = o.data_ptr<Real>(), args.lse = lse.data_ptr<Real>();
    args.features = feat_p.data(), args.params = prm_p.data();
    args.scale = static_cast<Real>(p.scale);
    args.dout = dout.data_ptr<Real>();
    args.dq = dq.data_ptr<Real>(), args.dk = dk.data_ptr<Real>(), args.dv = dv.data_ptr<Real>();
    args.dfeatures = dfeat_p.data(), args.dparams = dprm_p.data();
  }
  static void poison(Tensor &t) {
    Real *d = t.data_ptr<Real>();
    std::fill(d, d + t.numel(), std::numeric_limits<Real>::quiet_NaN());
  }
  void forward() {
    poison(o), poison(lse);
    if constexpr (std::is_same_v<Real, float>) entry->forward_f32(args);
    else entry->forward_f64(args);
  }
  void backward() {
    poison(dq), poison(dk), poison(dv);
    for (auto &t : dfeat) poison(t);
    for (auto &t : dprm) poison(t);
    if constexpr (std::is_same_v<Real, float>) entry->backward_f32(args);
    else entry->backward_f64(args);
  }
  // Every output of the last forward + backward, named.
  std::vector<std::pair<std::string, Tensor>> outputs(const Problem &p) const {
    std::vector<std::pair<std::string, Tensor>> out = {
        {"o", o}, {"lse", lse}, {"dq", dq}, {"dk", dk}, {"dv", dv}};
    for (size_t n = 0; n < dfeat.size(); ++n)
      out.push_back({"dfeature:" + p.man.features[n], dfeat[n]});
    for (size_t n = 0; n < dprm.size(); ++n)
      out.push_back({"dparam:" + p.man.params[n].name, dprm[n]});
    return out;
  }
};

// ---- comparisons --------------------------------------------------------------------------------

// Largest normalised error seen per (precision/encoding/quantity), printed with
// APE_KERNELS_TEST_STATS=1 (used to pick the tolerances in harness.cpp).
std::map<std::string, std::pair<double, std::string>> &error_stats();
// "Suite.Name" of the running test.
std::string current_test_name();

double max_abs(const Tensor &t);
double max_abs_diff(const Tensor &a, const Tensor &b);
bool all_zero(const Tensor &t);
// max |got - ref| / max(1, max |ref|); NaN when got holds a NaN.
double normalised_error(const Tensor &got, const Tensor &ref);
// normalised_error(got, ref) <= tol, recorded in error_stats()[key].
void expect_close(const std::string &key, const std::string &what, const Tensor &got,
                  const Tensor &ref, double tol);

// Tolerances of a kernel against the reference (the measurements behind them: harness.cpp).
double fp32_tol(const std::string &enc, const std::string &quantity);
double fp64_tol(const std::string &enc, int64_t T);

template <class Real>
void compare_with_reference(const Problem &p, const KernelCall<Real> &kc, const RefOutputs &ref) {
  const bool f32 = std::is_same_v<Real, float>;
  const std::string prec = f32 ? "fp32" : "fp64";
  auto check = [&](const std::string &quantity, const Tensor &got, const Tensor &want) {
    const double tol = f32 ? fp32_tol(p.enc, quantity) : fp64_tol(p.enc, p.T);
    expect_close(prec + "/" + p.enc + "/" + quantity, prec + " " + quantity, got, want, tol);
  };
  check("o", kc.o, ref.o);
  check("lse", kc.lse, ref.lse);
  check("dq", kc.dq, ref.dq);
  check("dk", kc.dk, ref.dk);
  check("dv", kc.dv, ref.dv);
  ASSERT_EQ(kc.dfeat.size(), ref.dfeatures.size());
  for (size_t n = 0; n < kc.dfeat.size(); ++n)
    check("dfeature:" + p.man.features[n], kc.dfeat[n], ref.dfeatures[n]);
  for (size_t n = 0; n < kc.dprm.size(); ++n) {
    const ParamInfo &info = p.man.params[n];
    if (info.trainable) {
      auto it = ref.dparams.find(info.name);
      ASSERT_NE(it, ref.dparams.end()) << info.name;
      check("dparam:" + info.name, kc.dprm[n], it->second);
    } else {  // docs/internals.md §2: dparams are overwritten, zero where not trainable
      EXPECT_TRUE(all_zero(kc.dprm[n]))
          << prec << " gradient of the non-trainable param " << info.name << " is not zero";
    }
  }
}

std::string case_name(const std::string &enc, int64_t B, int64_t H, int64_t T, int64_t D);
// A seed per case (FNV-1a of its name).
uint64_t case_seed(const std::string &enc, int64_t B, int64_t H, int64_t T, int64_t D);
// Runs fp32 and fp64 kernels on a problem and compares both with one reference.
void check_against_reference(const Problem &p);
// Central differences of the fp64 kernel against its backward, every input (harness.cpp).
void finite_difference_check(const Problem &p);
// Kernel a and kernel b (fp64) on the same inputs agree to `tol` on o, lse and the input
// gradients (and feature gradients when both have them).
void expect_same_kernel_outputs(const Problem &a, const Problem &b, double tol);

// Sets the OpenMP thread count for a scope.
class OmpThreads {
 public:
  explicit OmpThreads(int n) {
#ifdef _OPENMP
    saved_ = omp_get_max_threads();
    omp_set_num_threads(n);
#else
    (void)n;
#endif
  }
  ~OmpThreads() {
#ifdef _OPENMP
    omp_set_num_threads(saved_);
#endif
  }
  OmpThreads(const OmpThreads &) = delete;
  OmpThreads &operator=(const OmpThreads &) = delete;

 private:
  int saved_ = 1;
};

// Two runs of forward + backward with `threads` OpenMP threads (0: the current count) give
// bitwise-identical outputs and gradients (every output of KernelCall::outputs), and so does a
// run with one thread.
template <class Real> void expect_deterministic(const Problem &p, int threads) {
  auto run = [&](int n) {
    std::optional<OmpThreads> scope;
    if (n > 0) scope.emplace(n);
    KernelCall<Real> kc(p);
    kc.forward();
    kc.backward();
    std::vector<std::pair<std::string, Tensor>> out;
    for (auto &[name, t] : kc.outputs(p)) out.push_back({name, t.clone()});
    return out;
  };
  const auto first = run(threads), second = run(threads), serial = run(1);
  ASSERT_EQ(first.size(), second.size());
  ASSERT_EQ(first.size(), serial.size());
  for (size_t n = 0; n < first.size(); ++n) {
    EXPECT_TRUE(torch::equal(first[n].second, second[n].second))
        << first[n].first << " differs between two runs";
    EXPECT_TRUE(torch::equal(first[n].second, serial[n].second))
        << first[n].first << " differs between 1 and "
        << (threads > 0 ? threads : torch::get_num_threads()) << " threads";
  }
}

// ---- probes: values of the spec read through a kernel's outputs ---------------------------------

// got (flattened) equals want element by element to tol.
void expect_values(const Tensor &got, const std::vector<double> &want, double tol,
                   const std::string &what);

// The "q = 0, v = one-hot" probe: with q = 0 the logits are the bias alone, and with v_j = e_j
// (D >= T) o_i = softmax_j(B_ij) over j <= i; log(o_ij / o_ii) = B_ij - B_ii recovers the bias.
template <class Real>
KernelCall<Real> run_bias_probe(Problem &p) {
  p.q = torch::zeros_like(p.q);
  p.v = torch::zeros_like(p.v);
  for (int64_t t = 0; t < p.T; ++t)
    p.v.select(2, t).select(-1, t).fill_(1.0);
  KernelCall<Real> kc(p);
  kc.forward();
  return kc;
}

// Row 3 of a bias (j = 0..3) through the "q = 0, v = one-hot" probe: log(o_3j / o_33) =
// B_3j - B_33.
template <class Real> Tensor bias_row3(Problem &p) {
  KernelCall<Real> kc = run_bias_probe<Real>(p);
  const Tensor o = kc.o.to(torch::kFloat64)[0][0][3];
  return torch::log(o / o[3]);
}


// Logits of key 0 read through the forward kernel. With k_j = 0 for j >= 1, v_0 = e_0 and
// v_j = e_1 for j >= 1 (D >= 2), row i of an encoding without score bias whose q/k mods keep
// 0 at 0 has logits (l_i0, 0, ..., 0): o_i[0] / o_i[1] = exp(l_i0) / i for i >= 1 and
// lse_0 = l_00. The caller sets p.q and p.k[:, :, 0]; returns l_i0 [B, H, T] (kappa included).
template <class Real> Tensor key0_logits(Problem &p) {
  p.k.narrow(2, 1, p.T - 1).zero_();
  p.v.zero_();
  p.v.select(2, 0).select(-1, 0).fill_(1.0);
  p.v.narrow(2, 1, p.T - 1).select(-1, 1).fill_(1.0);
  KernelCall<Real> kc(p);
  kc.forward();
  const Tensor o = kc.o.to(torch::kFloat64), lse = kc.lse.to(torch::kFloat64);
  const Tensor i = torch::arange(p.T, kF64).view({1, 1, p.T});
  Tensor l = torch::log(i * o.select(-1, 0) / o.select(-1, 1));
  l.select(-1, 0).copy_(lse.select(-1, 0));
  return l;
}

// Rounding noise of a logit (divided by kappa) recovered through a kernel: fp32 reads it from o
// of rows with up to ~2000 keys (~1e-5 relative), fp64 to ~1e-12.
template <class Real> double probe_noise() { return std::is_same_v<Real, float> ? 1e-5 : 1e-10; }


// Logit differences l_{i, i-n} - l_{ii} of the last row i = T - 1 for the distances ns
// (ns[0] = 0), read through the forward kernel: v_{i-ns[s]} = e_s and every other v_j = 0
// (D >= ns.size()), so o_i[s] = P_{i, i-ns[s]} and log(o_i[s] / o_i[0]) = l_{i,i-ns[s]} - l_ii.
// The caller sets q, k and the params (with q_i . k_j = 0 the logits are the bias alone; Shaw's
// value table must be zero). Returns [B, H, ns.size()].
template <class Real> Tensor last_row_logits(Problem &p, const std::vector<int64_t> &ns) {
  const int64_t i = p.T - 1;
  EXPECT_GE(p.D, static_cast<int64_t>(ns.size()));
  EXPECT_EQ(ns.front(), 0);
  p.v.zero_();
  for (size_t s = 0; s < ns.size(); ++s) p.v.select(2, i - ns[s]).select(-1, s).fill_(1.0);
  KernelCall<Real> kc(p);
  kc.forward();
  const Tensor o = kc.o.to(torch::kFloat64).select(2, i).narrow(-1, 0, ns.size());
  return torch::log(o / o.narrow(-1, 0, 1));
}

// The distances the bucket hand checks (T5, DeBERTa) read through the kernels (row T - 1 = 1000).
extern const std::vector<int64_t> kBucketDistances;
// Buckets recovered from logits -step (h + 1) bucket: rounded, after checking that the value is
// that close to a multiple of the step.
std::vector<int64_t> recovered_buckets(const Tensor &l, double step, double tol);
// The reference's T5 buckets of the distances ns.
std::vector<int64_t> spec_buckets(const std::vector<int64_t> &ns);

}  // namespace ape_test
