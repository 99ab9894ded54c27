// Instruction-set levels (ape/cpu/dispatch.h): the choice, the CPU detection against
// /proc/cpuinfo, the level the registry runs (ctest also runs these with APE_CPU_LEVEL forced to
// each level and to a bad name: cpu_levels_test.cmake), and every trainable encoding at every
// level this CPU runs against the reference (CpuLevelsVsReference). Everything else in
// ape_kernels_test runs the level chosen for this process (the best one the CPU runs).
#include "decode_check.h"

#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace {

using namespace ape_test;

// ---- instruction-set levels (ape/cpu/dispatch.h) ------------------------------------------------

const ape::KernelEntry *level_entry(int level, const std::string &name) {
  size_t n = 0;
  const ape::KernelEntry *const *all = ape::kernel_registry_level(level, &n);
  for (size_t i = 0; all && i < n; ++i)
    if (all[i] && name == all[i]->name) return all[i];
  return nullptr;
}

// The choice on given masks: the best usable level by default, a named level when it is built
// and runnable, otherwise a refusal that says why.
// The kernels' scratch blocks (ape::memory, cpu/attention.h): a freed large block serves the
// next allocation of its size on the same thread (its pages still mapped), other sizes get other
// blocks, the cache never holds more than kCacheBytes, and small blocks are not kept.
TEST(CpuScratch, FreedBlocksServeTheNextAllocationOfTheirSize) {
  namespace m = ape::memory;
  std::thread([] {  // a fresh thread: an empty cache
    const std::size_t mib = std::size_t(1) << 20;
    void *a = m::allocate(mib);
    m::release(a, mib);
    EXPECT_EQ(m::block_cache()->total, mib);
    void *b = m::allocate(mib);
    EXPECT_EQ(a, b);
    EXPECT_EQ(m::block_cache()->total, 0u);
    m::release(b, mib);
    void *c = m::allocate(2 * mib);
    EXPECT_NE(c, b);
    m::release(c, 2 * mib);
    std::vector<void *> many;
    for (int i = 0; i < 2 * m::kCacheSlots; ++i) many.push_back(m::allocate(3 * mib));
    for (void *p : many) m::release(p, 3 * mib);
    EXPECT_LE(m::block_cache()->total, m::kCacheBytes);
    EXPECT_GE(m::block_cache()->total, m::kCacheBytes - 3 * mib);
    const std::size_t held = m::block_cache()->total;
    m::release(m::allocate(1024), 1024);
    m::release(m::allocate(2 * m::kCacheBytes), 2 * m::kCacheBytes);
    EXPECT_EQ(m::block_cache()->total, held);
  }).join();
}

TEST(CpuLevelChoice, DefaultAndForced) {
  EXPECT_EQ(ape::choose_cpu_level(7, 7, nullptr).level, 2);
  EXPECT_EQ(ape::choose_cpu_level(7, 3, nullptr).level, 1);  // a CPU without AVX-512
  EXPECT_EQ(ape::choose_cpu_level(7, 1, "").level, 0);        // empty = unset
  EXPECT_EQ(ape::choose_cpu_level(1, 7, nullptr).level, 0);  // a baseline-only build
  EXPECT_EQ(ape::choose_cpu_level(5, 7, nullptr).level, 2);  // avx2 not built
  EXPECT_FALSE(ape::choose_cpu_level(7, 7, nullptr).forced);
  for (const char *name : {"baseline", "avx2", "avx512"}) {
    const ape::CpuLevelChoice c = ape::choose_cpu_level(7, 7, name);
    EXPECT_EQ(c.level, ape::cpu_level_from_name(name)) << name;
    EXPECT_TRUE(c.forced && c.error.empty()) << name;
  }
}

TEST(CpuLevelChoice, RefusalsSayWhy) {
  auto error = [](unsigned built, unsigned runnable, const char *name) {
    const ape::CpuLevelChoice c = ape::choose_cpu_level(built, runnable, name);
    EXPECT_EQ(c.level, -1) << name;
    return c.error;
  };
  EXPECT_EQ(error(7, 7, "AVX2"), "APE_CPU_LEVEL=AVX2: not a level; use baseline, avx2 or avx512 "
                                 "(or unset it for the best level this CPU runs)");
  EXPECT_EQ(error(7, 3, "avx512"),
            "APE_CPU_LEVEL=avx512: this CPU cannot run AVX-512 F/CD/BW/DQ/VL code (it runs "
            "baseline, avx2); unset APE_CPU_LEVEL or name one of those");
  EXPECT_EQ(error(1, 7, "avx2"),
            "APE_CPU_LEVEL=avx2: these kernels were built without that level (built: baseline)");
}

// The runnable levels against the flags the kernel reports in /proc/cpuinfo (an independent
// reading of cpuid, with the OS's support of the register state applied).
TEST(CpuLevels, RunnableMatchesCpuinfo) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  std::set<std::string> flags;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      for (std::string w; words >> w;) flags.insert(w);
      break;
    }
  ASSERT_FALSE(flags.empty()) << "no flags line in /proc/cpuinfo";
#if defined(__x86_64__)
  auto has = [&](std::initializer_list<const char *> names) {
    return std::all_of(names.begin(), names.end(), [&](const char *f) { return flags.count(f) > 0; });
  };
  unsigned want = 1;
  if (has({"avx2", "fma"})) want |= 2;
  if ((want & 2) && has({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})) want |= 4;
  EXPECT_EQ(ape::cpu_runnable_levels(), want) << ape::cpu_level_list(want) << " expected";
#else
  EXPECT_EQ(ape::cpu_runnable_levels(), 1u);
#endif
}

// kernel_registry() runs the level APE_CPU_LEVEL names (or the best), and a level that cannot
// run is refused: its kernels throw the reason. ctest runs this with APE_CPU_LEVEL unset, each
// level and a bad name (kernels_test.cmake); a forced lower level also runs two encodings
// against the reference through the registry.
TEST(CpuLevels, ChoiceFollowsEnvironment) {
  const char *env = std::getenv("APE_CPU_LEVEL");
  const std::string request = env ? env : "";
  const ape::CpuLevelChoice &c = ape::kernel_cpu_level();
  EXPECT_EQ(c.runnable, ape::cpu_runnable_levels());
  const unsigned usable = c.built & c.runnable;
  int want = -1;
  if (request.empty()) {
    for (int l = 0; l < ape::kNumCpuLevels; ++l)
      if (usable & (1u << l)) want = l;
  } else if (const int l = ape::cpu_level_from_name(request); l >= 0 && (usable & (1u << l))) {
    want = l;
  }
  ASSERT_EQ(c.level, want) << "APE_CPU_LEVEL=" << request << ": " << c.describe();
  SCOPED_TRACE("APE_CPU_LEVEL=" + request + ": " + c.describe());
  for (const ape::KernelEntry *e : registry()) {
    SCOPED_TRACE(e->name);
    if (want >= 0) {
      EXPECT_STREQ(e->cpu_level, ape::cpu_level_name(want));
      const ape::KernelEntry *at = level_entry(want, e->name);
      ASSERT_NE(at, nullptr);
      EXPECT_EQ(e->forward_f32, at->forward_f32);
      EXPECT_EQ(e->backward_f32, at->backward_f32);
      ASSERT_TRUE(e->decode && at->decode);
      EXPECT_EQ(e->decode->step_f32, at->decode->step_f32);
    } else {
      EXPECT_STREQ(e->cpu_level, "none");
      ape::AttnArgs<float> a{};
      try {
        e->forward_f32(a);
        ADD_FAILURE() << "a refused level ran";
      } catch (const ape::CpuLevelError &err) {
        EXPECT_EQ(err.what(), c.error);
        EXPECT_NE(c.error.find("APE_CPU_LEVEL=" + request), std::string::npos) << c.error;
      }
      ape::DecodeCache<float> cache;
      ape::DecodeArgs<float> da{};
      EXPECT_THROW(e->decode->step_f32(cache, da), ape::CpuLevelError);
    }
  }
  if (want >= 0 && !request.empty())
    for (const char *enc : {"rope", "cable"}) {
      SCOPED_TRACE(enc);
      check_against_reference(make_problem(enc, 2, 3, 130, 64, case_seed(enc, 2, 3, 130, 64)));
    }
}

// Every encoding at every built level this CPU runs: fp32 against the reference at the grid's
// tolerances (the same at every level) and against the baseline; fp64 is the baseline's at every
// level. Shapes: 130 keys = two full tiles and a partial one, D 64; and T 1, D 16. The
// normalised differences between levels are recorded (APE_KERNELS_TEST_STATS=1, "levels/"): no
// level is bitwise equal to the baseline (FMA contraction and the vector width change rounding
// and the order of the SIMD reductions), all stay far inside the tolerances.
class CpuLevelsVsReference : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuLevelsVsReference, MatchReference) {
  const std::string &enc = GetParam();
  const ape::CpuLevelChoice &c = ape::kernel_cpu_level();
  const ape::KernelEntry *base = level_entry(0, enc);
  ASSERT_NE(base, nullptr);
  EXPECT_STREQ(base->cpu_level, "baseline");
  for (const auto &[B, H, T, D] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{2, 3, 130, 64},
                                   {1, 2, 1, 16}}) {
    SCOPED_TRACE(case_name(enc, B, H, T, D));
    Problem p = make_problem(enc, B, H, T, D, case_seed(enc, B, H, T, D));
    const RefOutputs ref = ape_test::reference_attention(p.enc, ref_inputs(p), p.dout);
    p.entry = base;
    KernelCall<float> kb(p);
    kb.forward(), kb.backward();
    for (int level = 0; level < ape::kNumCpuLevels; ++level) {
      const ape::KernelEntry *e = level_entry(level, enc);
      EXPECT_EQ(e != nullptr, (c.built >> level & 1u) != 0) << "level " << level;
      if (!e || !(c.runnable >> level & 1u)) continue;
      const std::string name = ape::cpu_level_name(level);
      SCOPED_TRACE("level " + name);
      EXPECT_EQ(name, e->cpu_level);
      EXPECT_EQ(e->forward_f64, base->forward_f64);  // fp64: compiled at the baseline only
      EXPECT_EQ(e->backward_f64, base->backward_f64);
      ASSERT_TRUE(e->decode && base->decode);
      EXPECT_EQ(e->decode->step_f64, base->decode->step_f64);
      if (T > 1) check_decode<float>(enc, kDecodeSchedules[2], e);  // this level's decode steps
      p.entry = e;
      KernelCall<float> kc(p);
      kc.forward(), kc.backward();
      compare_with_reference(p, kc, ref);
      // Per level: the largest error / tolerance over every encoding and quantity (stats only).
      const auto got = kc.outputs(p), want = kb.outputs(p);
      for (const auto &[quantity, t] : got) {
        const Tensor *r = quantity == "o" ? &ref.o : quantity == "lse" ? &ref.lse
                        : quantity == "dq" ? &ref.dq : quantity == "dk" ? &ref.dk
                        : quantity == "dv" ? &ref.dv : nullptr;
        if (quantity.rfind("dparam:", 0) == 0 && ref.dparams.count(quantity.substr(7)))
          r = &ref.dparams.at(quantity.substr(7));
        for (size_t n = 0; n < p.man.features.size(); ++n)
          if (quantity == "dfeature:" + p.man.features[n]) r = &ref.dfeatures[n];
        if (!r) continue;
        const double share = normalised_error(t, *r) / fp32_tol(enc, quantity);
        auto &stat = error_stats()["levels-ref/" + name + " (error / tolerance)"];
        if (!(share <= stat.first)) stat = {share, enc + " " + quantity};
      }
      for (size_t n = 0; n < got.size() && level > 0; ++n)
        expect_close("levels/" + name + "/" + enc + "/" + got[n].first, got[n].first + " vs baseline",
                     got[n].second, want[n].second.to(torch::kFloat64),
                     2 * fp32_tol(enc, got[n].first));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, CpuLevelsVsReference, ::testing::ValuesIn(trainable_encodings()),
                         [](const ::testing::TestParamInfo<std::string> &info) { return info.param; });

// ---- bf16 tensors (AttnArgs::bf16_io) -------------------------------------------------------------

// A KernelCall<float> whose q, k, v, o, dout, dq, dk, dv are bf16 tensors read and written by the
// kernel (AttnArgs::bf16_io; the float pointers of those eight null, as the operator library
// passes them). After each call the float tensors of `kc` hold the bf16 results widened.
struct Bf16IoCall {
  KernelCall<float> kc;
  Tensor q, k, v, dout, o, dq, dk, dv;  // bf16
  ape::Bf16Io io;

  explicit Bf16IoCall(const Problem &p) : kc(p) {
    auto b = [](const Tensor &t) { return t.to(torch::kBFloat16).contiguous(); };
    q = b(kc.q), k = b(kc.k), v = b(kc.v), dout = b(kc.dout);
    o = torch::empty_like(q), dq = torch::empty_like(q), dk = torch::empty_like(q),
    dv = torch::empty_like(q);
    auto bits = [](const Tensor &t) { return reinterpret_cast<uint16_t *>(t.data_ptr<at::BFloat16>()); };
    io.q = bits(q), io.k = bits(k), io.v = bits(v), io.o = bits(o), io.dout = bits(dout);
    io.dq = bits(dq), io.dk = bits(dk), io.dv = bits(dv);
    ape::AttnArgs<float> &a = kc.args;
    a.q = a.k = a.v = nullptr, a.o = nullptr, a.dout = nullptr, a.dq = a.dk = a.dv = nullptr;
    a.bf16_io = &io;
  }
  Bf16IoCall(const Bf16IoCall &) = delete;  // kc.args points at io
  Bf16IoCall &operator=(const Bf16IoCall &) = delete;
  void forward() {
    o.fill_(std::numeric_limits<float>::quiet_NaN());
    kc.forward();
    kc.o = o.to(torch::kFloat);
  }
  void backward() {
    for (Tensor *t : {&dq, &dk, &dv}) t->fill_(std::numeric_limits<float>::quiet_NaN());
    kc.backward();
    kc.dq = dq.to(torch::kFloat), kc.dk = dk.to(torch::kFloat), kc.dv = dv.to(torch::kFloat);
  }
};

// Every trainable encoding through bf16 tensors (AttnArgs::bf16_io, the operator library's path for
// bfloat16 inputs) at the level this process runs, with fp32 products (bf16_products off): on
// bf16 inputs, o, dq, dk, dv are the fp64 reference's rounded to bf16 (elementwise within 2^-8 of
// each value, which bounds the rounding's half ulp, plus the fp32 tolerance of the grid), lse and the
// feature and parameter gradients within the fp32 tolerance. The backward reads the bf16 o, so dq,
// dk and the feature and parameter gradients are compared with the reference whose Delta reads
// that o (RefRounding::delta_o). Shapes: B 2, H 3, 130 keys (two full tiles and a partial one)
// at d_h 64; 70 keys at d_h 40.
class CpuBf16IoVsReference : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuBf16IoVsReference, MatchReference) {
  const std::string &enc = GetParam();
  for (const auto &[B, H, T, D] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t>{2, 3, 130, 64}, {1, 2, 70, 40}}) {
    SCOPED_TRACE(case_name(enc, B, H, T, D));
    Problem r = make_problem(enc, B, H, T, D, case_seed(enc, B, H, T, D));
    auto bf16 = [](const Tensor &t) { return t.to(torch::kBFloat16).to(torch::kFloat64); };
    r.q = bf16(r.q), r.k = bf16(r.k), r.v = bf16(r.v), r.dout = bf16(r.dout);
    Bf16IoCall c(r);
    c.forward(), c.backward();
    const RefOutputs ref = ape_test::reference_attention(enc, ref_inputs(r), r.dout);
    const RefOutputs own = ape_test::reference_attention(
        enc, ref_inputs(r), r.dout, {torch::kFloat64, c.kc.o.to(torch::kFloat64)});
    auto rounded = [&](const std::string &what, const Tensor &got, const Tensor &want) {
      const Tensor g = got.to(torch::kFloat64);
      const double tol = fp32_tol(enc, what) * std::max(1.0, max_abs(want));
      const Tensor excess = (g - want).abs() - (std::ldexp(1.0, -8) * want.abs() + tol);
      EXPECT_LE(excess.max().item<double>(), 0.0)
          << what << ": some entry is further from the reference than its bf16 rounding allows "
          << "(max |error| " << max_abs_diff(g, want) << ")";
    };
    rounded("o", c.kc.o, ref.o);
    rounded("dq", c.kc.dq, own.dq);
    rounded("dk", c.kc.dk, own.dk);
    rounded("dv", c.kc.dv, ref.dv);
    expect_close("bf16io/" + enc + "/lse", "lse", c.kc.lse, ref.lse, fp32_tol(enc, "lse"));
    for (size_t n = 0; n < c.kc.dfeat.size(); ++n) {
      const std::string what = "dfeature:" + r.man.features[n];
      expect_close("bf16io/" + enc + "/" + what, what, c.kc.dfeat[n], own.dfeatures[n],
                   fp32_tol(enc, what));
    }
    for (size_t n = 0; n < c.kc.dprm.size(); ++n) {
      const ParamInfo &info = r.man.params[n];
      const std::string what = "dparam:" + info.name;
      if (info.trainable)
        expect_close("bf16io/" + enc + "/" + what, what, c.kc.dprm[n], own.dparams.at(info.name),
                     fp32_tol(enc, what));
      else
        EXPECT_TRUE(all_zero(c.kc.dprm[n])) << "the gradient of the non-trainable " << info.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, CpuBf16IoVsReference, ::testing::ValuesIn(trainable_encodings()),
                         [](const ::testing::TestParamInfo<std::string> &info) { return info.param; });

// ---- bf16 products on AMX or by AVX512-BF16 (cpu/attention.h, amx; AttnArgs::bf16_products) -----
// Every trainable encoding at the avx512 level with bf16_products on bf16 q, k, v and dO (bf16
// tensors, Bf16IoCall, as the operator library calls it), against the materialised attention in fp64 on the same inputs, held to the rule the GPU suite
// holds the bf16 CUDA kernels to: twice the error of the same-precision materialised attention
// (q', k', P, dS and o rounded to bf16 where a 16-bit flash kernel rounds them: kernel_reference.h
// RefRounding; for parameter gradients the larger of that and the one reading the kernel's own o)
// plus 1e-3 of the magnitude. Shapes: 130 keys (two full tiles and a partial one) at d_h 64, 77
// at d_h 128, T 1 at d_h 32, and d_h 40 (not a multiple of 32: the fp32 products). The products
// run on the AMX tiles, or by VDPBF16PS where the CPU has AVX512-BF16 and no AMX (ctest
// kernels_cpu_avx512bf16 runs this with APE_CPU_AMX=0 to take that path on an AMX CPU); that they
// ran is checked too: o differs from the same call's without bf16_products. Skipped where the CPU
// has neither (the products are then never taken: AttnArgs::bf16_products is a permission).
class CpuAmxVsReference : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuAmxVsReference, MatchReference) {
  const std::string &enc = GetParam();
  const ape::CpuLevelChoice &c = ape::kernel_cpu_level();
  if (!(c.built >> 2 & 1u) || !(c.runnable >> 2 & 1u))
    GTEST_SKIP() << "the avx512 level is not built or not runnable here";
  if (!ape::cpu_bf16_products_usable())
    GTEST_SKIP() << "this CPU or process runs no bf16 products (no AMX nor AVX512-BF16, or "
                    "APE_CPU_AMX=0 and APE_CPU_AVX512BF16=0)";
  const std::string path = ape::cpu_amx_bf16_usable() ? "amx" : "avx512bf16";
  const ape::KernelEntry *e = level_entry(2, enc);
  ASSERT_NE(e, nullptr);
  for (const auto &[B, H, T, D] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{2, 3, 130, 64},
                                   {1, 2, 77, 128}, {1, 2, 1, 32}, {1, 1, 70, 40}}) {
    SCOPED_TRACE(case_name(enc, B, H, T, D));
    Problem r = make_problem(enc, B, H, T, D, case_seed(enc, B, H, T, D));
    auto bf16 = [](const Tensor &t) { return t.to(torch::kBFloat16).to(torch::kFloat64); };
    r.q = bf16(r.q), r.k = bf16(r.k), r.v = bf16(r.v), r.dout = bf16(r.dout);
    r.entry = e;
    Bf16IoCall call(r);  // bf16 tensors, as the operator library passes bfloat16 inputs
    KernelCall<float> &kc = call.kc;
    kc.args.bf16_products = true;
    call.forward(), call.backward();
    if (T > 1 && D % 32 == 0) {  // the products ran: the same call in fp32 products gives another o
      Bf16IoCall f32(r);
      f32.forward();
      EXPECT_GT(max_abs_diff(f32.kc.o.to(torch::kFloat64), kc.o.to(torch::kFloat64)), 0.0)
          << "bf16_products changed nothing: the " << path << " products did not run";
    }
    const RefOutputs ref = ape_test::reference_attention(enc, ref_inputs(r), r.dout);
    const RefOutputs low =
        ape_test::reference_attention(enc, ref_inputs(r), r.dout, {torch::kBFloat16});
    const RefOutputs low_own = ape_test::reference_attention(
        enc, ref_inputs(r), r.dout, {torch::kBFloat16, kc.o.to(torch::kFloat64)});
    auto check = [&](const std::string &what, const Tensor &got, const Tensor &want,
                     const Tensor &base1, const Tensor *base2) {
      const Tensor g = got.to(torch::kFloat64);
      ASSERT_TRUE(torch::isfinite(g).all().item<bool>()) << what << " has non-finite entries";
      double base = max_abs_diff(base1, want);
      if (base2) base = std::max(base, max_abs_diff(*base2, want));
      const double err = max_abs_diff(g, want), mag = std::max(1e-3, max_abs(want));
      EXPECT_LE(err, 2 * base + 1e-3 * mag + 2e-6)
          << what << ": kernel error " << err << ", same-precision materialised error " << base
          << ", magnitude " << mag;
      auto &stat = error_stats()[path + "/" + what + " (error / magnitude)"];
      if (!(err / mag <= stat.first)) stat = {err / mag, enc};
    };
    // dq, dk, dv are bf16 tensors: the same-precision baseline's are rounded to bf16 too (as
    // FlashAttention's rule compares with a bf16 PyTorch run, whose gradients are bf16).
    auto r16 = [](const Tensor &t) { return t.to(torch::kBFloat16).to(torch::kFloat64); };
    check("o", kc.o, ref.o, low.o, nullptr);
    check("lse", kc.lse, ref.lse, low.lse, nullptr);
    check("dq", kc.dq, ref.dq, r16(low.dq), nullptr);
    check("dk", kc.dk, ref.dk, r16(low.dk), nullptr);
    check("dv", kc.dv, ref.dv, r16(low.dv), nullptr);
    for (size_t n = 0; n < kc.dfeat.size(); ++n)
      check("dfeature:" + r.man.features[n], kc.dfeat[n], ref.dfeatures[n], low.dfeatures[n],
            &low_own.dfeatures[n]);
    for (size_t n = 0; n < kc.dprm.size(); ++n) {
      const ParamInfo &info = r.man.params[n];
      if (!info.trainable) {
        EXPECT_TRUE(all_zero(kc.dprm[n])) << "the gradient of the non-trainable " << info.name;
        continue;
      }
      check("dparam:" + info.name, kc.dprm[n], ref.dparams.at(info.name),
            low.dparams.at(info.name), &low_own.dparams.at(info.name));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, CpuAmxVsReference, ::testing::ValuesIn(trainable_encodings()),
                         [](const ::testing::TestParamInfo<std::string> &info) { return info.param; });

}  // namespace
