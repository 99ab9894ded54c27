// KV-cache decoding checked against the full forward (decode_test.cpp, and every instruction-set
// level in levels_test.cpp).
#pragma once
#include "harness.h"

namespace ape_test {

// ---- KV-cache decoding (ape/cpu/decode.h, docs/decoding.md) -------------------------------------
//
// A prefill of P tokens, then steps of the given sizes up to N, through the entry's decode steps;
// every step's outputs (o, lse of its new queries) against the full forward over the tokens so
// far (rows L0 .. L - 1 of the forward of length L), and, for the encodings that do not read the
// sequence length, against the rows of one full forward over all N tokens. Schedules: a T = 1
// prompt decoded one token at a time across the first tile boundary (64); a prompt of 60 decoded
// three at a time across two boundaries; a prompt of 130 (three tiles) with steps of 1, 5 and 70
// (a step longer than a query tile). fp64 to 1e-12, fp32 to 2e-5 (normalised as the grid; the
// decode step runs the forward's tile loop, so most cells agree bit for bit).
// The encodings whose kernels read the run-time length T (a property of their math, not a list of
// encodings to test: every trainable encoding is decoded; an encoding that read T and were not
// here would fail the check against the forward over all N tokens).
inline const std::set<std::string> kReadsLength = {"rope_dynamic_ntk", "xpos"};

struct DecodeSchedule {
  int64_t prompt;
  std::vector<int64_t> steps;  // sizes of the steps after the prompt
};
inline const std::vector<DecodeSchedule> kDecodeSchedules = {
    {1, std::vector<int64_t>(69, 1)},
    {60, std::vector<int64_t>(24, 3)},
    {130, {1, 5, 70, 1}},
};

inline bool has_reference(const std::string &enc) {
  const auto &all = ape_test::reference_encodings();
  return std::find(all.begin(), all.end(), enc) != all.end();
}

// Encodings whose k mod is not linear (ExPE's and ExQPE's overrides: their terms are per head): a
// grouped cache keeps their k'^T per query head; every other one per key head (cpu/decode.h,
// traits::KModShared: no k mod, or a linear one).
inline const std::set<std::string> kKeysPerQueryHead = {"expe", "expe_cable", "expe_qkv", "expe_rope_cable", "exqpe"};

// `level`: the decode steps and forwards of that level's entry (default: the chosen level's).
// `kv_heads` > 0: grouped-query attention, 4 query heads reading k and v of kv_heads heads.
template <class Real>
void check_decode(const std::string &enc, const DecodeSchedule &sched,
                  const ape::KernelEntry *level = nullptr, int64_t kv_heads = 0) {
  int64_t N = sched.prompt;
  for (int64_t n : sched.steps) N += n;
  const int64_t B = 2, H = kv_heads > 0 ? 4 : 2, D = 16, KV = kv_heads > 0 ? kv_heads : H;
  Problem p = make_problem(enc, B, H, N, D, 1234);
  if (kv_heads > 0) p = grouped_queries(p, kv_heads);
  ASSERT_NE(p.entry, nullptr);
  // Dynamic NTK's base changes with the length past its original length: from length 33 here.
  if (enc == "rope_dynamic_ntk") set_param(p, "rope_original_length", 32);
  if (level) p.entry = level;
  ASSERT_NE(p.entry->decode, nullptr) << enc << ": no decode entry";
  const double tol = std::is_same_v<Real, double> ? 1e-12 : 2e-5;
  const std::string prec = std::is_same_v<Real, double> ? "f64" : "f32";
  KernelCall<Real> full(p);
  full.forward();
  KernelCall<Real> all(p);  // converted inputs of every token, sliced per step below

  ape::DecodeCache<Real> cache;
  cache.capacity = N;
  std::vector<int64_t> sizes = {sched.prompt};
  sizes.insert(sizes.end(), sched.steps.begin(), sched.steps.end());
  int64_t L0 = 0;
  for (int64_t n : sizes) {
    auto cut = [&](const Tensor &t) { return t.narrow(2, L0, n).contiguous(); };
    Tensor q = cut(all.q), k = cut(all.k), v = cut(all.v);
    std::vector<Tensor> feats;
    std::vector<const Real *> fp;
    for (const auto &f : all.feat) feats.push_back(cut(f)), fp.push_back(feats.back().data_ptr<Real>());
    Tensor o = torch::full({B, H, n, D}, std::numeric_limits<double>::quiet_NaN(),
                           torch::TensorOptions().dtype(scalar_type<Real>()));
    Tensor lse = torch::full({B, H, n}, std::numeric_limits<double>::quiet_NaN(),
                             torch::TensorOptions().dtype(scalar_type<Real>()));
    ape::DecodeArgs<Real> a{};
    a.B = B, a.H = H, a.n = n, a.D = D;
    a.q = q.data_ptr<Real>(), a.k = k.data_ptr<Real>(), a.v = v.data_ptr<Real>();
    a.features = fp.data(), a.params = all.prm_p.data();
    a.scale = static_cast<Real>(p.scale);
    a.o = o.data_ptr<Real>(), a.lse = lse.data_ptr<Real>();
    a.kv_heads = kv_heads;
    if constexpr (std::is_same_v<Real, float>) p.entry->decode->step_f32(cache, a);
    else p.entry->decode->step_f64(cache, a);
    const int64_t L = L0 + n;
    ASSERT_EQ(cache.len, L);
    const std::string where = enc + " " + prec + " prompt " + std::to_string(sched.prompt) +
                              ", step of " + std::to_string(n) + " to length " + std::to_string(L) +
                              (kv_heads > 0 ? ", " + std::to_string(kv_heads) + " key heads" : "");
    // What the cache keeps: values per key head; k'^T per key head where the group shares it.
    ASSERT_EQ(cache.v.size(), static_cast<size_t>(B * KV * N * D)) << where;
    ASSERT_EQ(cache.kt.size(), static_cast<size_t>(B * (kKeysPerQueryHead.count(enc) ? H : KV) * D * cache.Cp))
        << where << ": k'^T's heads";
    KernelCall<Real> ref(prefix(p, L));
    ref.forward();
    expect_close("decode/" + prec + "/" + enc + "/o", where + ": o vs the forward over " +
                 std::to_string(L) + " tokens", o, ref.o.narrow(2, L0, n).to(torch::kFloat64), tol);
    expect_close("decode/" + prec + "/" + enc + "/lse", where + ": lse", lse,
                 ref.lse.narrow(2, L0, n).to(torch::kFloat64), tol);
    if (!kReadsLength.count(enc))
      expect_close("decode/" + prec + "/" + enc + "/o_full", where + ": o vs the forward over all " +
                   std::to_string(N) + " tokens", o, full.o.narrow(2, L0, n).to(torch::kFloat64), tol);
    // The first and the last step in fp64 also against the materialised reference over the L
    // tokens (kernel_reference.h: independent of the kernels), as the forward's grid is.
    const bool edge = L0 == 0 || L == N;
    if (std::is_same_v<Real, double> && edge && has_reference(enc)) {
      const RefOutputs r = ape_test::reference_attention(enc, ref_inputs(prefix(p, L)), Tensor());
      expect_close("decode/ref/" + enc + "/o", where + ": o vs the materialised reference", o,
                   r.o.narrow(2, L0, n), fp64_tol(enc, L));
      expect_close("decode/ref/" + enc + "/lse", where + ": lse vs the materialised reference", lse,
                   r.lse.narrow(2, L0, n), fp64_tol(enc, L));
    }
    L0 = L;
  }
}

}  // namespace ape_test
