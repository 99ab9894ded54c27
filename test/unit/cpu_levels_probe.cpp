// ape_cpu_levels_probe: runs generated kernels of ape_kernels through the registry, at the
// instruction-set level chosen for this process (ape/cpu/dispatch.h), without LibTorch, so that
// it can run on an emulated CPU (cpu_levels_qemu.sh runs it under qemu-x86_64 as a CPU without
// AVX-512 and as one without AVX).
//
//   ape_cpu_levels_probe --write FILE              run, print the level, write every output
//   ape_cpu_levels_probe --compare FILE [--expect-level NAME]
//                                                  run, compare with FILE (written natively at
//                                                  the same level), check the chosen level
//   ape_cpu_levels_probe --levels                  print "runnable: baseline, avx2, ..."
//
// Encodings nope, rope, alibi and cable (no params, none, ALiBi's slopes, one token feature), fp32
// and fp64, forward and backward, B=1 H=2 T=130 D=64 (two full key tiles and a partial one).
// Deliberately a subset: one encoding per kind of kernel input, since the emulated runs are slow;
// every encoding at every level the CPU runs is ape_kernels_test's CpuLevelsVsReference.
// Inputs are a fixed pseudo-random sequence. Exit status: 0 ok, 1 mismatch or error.
#include <ape/cpu/dispatch.h>
#include <ape/cpu/kernel_entry.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace ape {
const KernelEntry *const *kernel_registry(size_t *count);
const CpuLevelChoice &kernel_cpu_level();
}  // namespace ape

namespace {

constexpr int64_t B = 1, H = 2, T = 130, D = 64;

struct Case {
  const char *encoding;
  int features;   // (B, H, T) each
  bool slopes;    // one param: ALiBi's slopes [H]
};
constexpr Case kCases[] = {{"nope", 0, false}, {"rope", 0, false}, {"alibi", 0, true},
                           {"cable", 1, false}};

// Uniform values in [-1, 1) from a 64-bit LCG (the same sequence on every machine).
struct Lcg {
  uint64_t s;
  double next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
  }
};

const ape::KernelEntry *find(const char *name) {
  size_t n = 0;
  const ape::KernelEntry *const *all = ape::kernel_registry(&n);
  for (size_t i = 0; i < n; ++i)
    if (all[i] && std::strcmp(all[i]->name, name) == 0) return all[i];
  return nullptr;
}

// Every output (o, lse, dq, dk, dv, dfeatures, dparams) of one forward + backward, as doubles.
template <class Real> std::vector<double> run(const ape::KernelEntry &e, const Case &c) {
  const size_t n = B * H * T * D, rows = B * H * T;
  Lcg rng{0x5eed + static_cast<uint64_t>(std::strlen(c.encoding))};
  auto fill = [&](std::vector<Real> &x) {
    for (Real &v : x) v = static_cast<Real>(rng.next());
  };
  std::vector<Real> q(n), k(n), v(n), dout(n), o(n), lse(rows), dq(n), dk(n), dv(n);
  fill(q), fill(k), fill(v), fill(dout);
  std::vector<std::vector<Real>> feat(c.features, std::vector<Real>(rows)), dfeat = feat;
  for (auto &f : feat) fill(f);
  std::vector<Real> slopes(H), dslopes(H);
  for (int64_t h = 0; h < H; ++h) slopes[h] = static_cast<Real>(std::exp2(-8.0 * (h + 1) / H));
  std::vector<const Real *> feat_p, param_p;
  std::vector<Real *> dfeat_p, dparam_p;
  for (int i = 0; i < c.features; ++i) feat_p.push_back(feat[i].data()), dfeat_p.push_back(dfeat[i].data());
  if (c.slopes) param_p.push_back(slopes.data()), dparam_p.push_back(dslopes.data());
  ape::AttnArgs<Real> a{B, H, T, D, q.data(), k.data(), v.data(), o.data(), lse.data(),
                        feat_p.data(), param_p.data(), static_cast<Real>(1.0 / std::sqrt(double(D))),
                        dout.data(), dq.data(), dk.data(), dv.data(), dfeat_p.data(), dparam_p.data()};
  if constexpr (std::is_same_v<Real, float>) {
    e.forward_f32(a);
    e.backward_f32(a);
  } else {
    e.forward_f64(a);
    e.backward_f64(a);
  }
  std::vector<double> out;
  for (const auto *x : {&o, &lse, &dq, &dk, &dv}) out.insert(out.end(), x->begin(), x->end());
  for (const auto &x : dfeat) out.insert(out.end(), x.begin(), x.end());
  if (c.slopes) out.insert(out.end(), dslopes.begin(), dslopes.end());
  return out;
}

int fail(const std::string &msg) {
  std::fprintf(stderr, "ape_cpu_levels_probe: %s\n", msg.c_str());
  return 1;
}

}  // namespace

int main(int argc, char **argv) {
  std::string mode = argc > 1 ? argv[1] : "", file = argc > 2 ? argv[2] : "", expect;
  if (argc > 4 && std::string(argv[3]) == "--expect-level") expect = argv[4];
  const ape::CpuLevelChoice &choice = ape::kernel_cpu_level();
  if (mode == "--levels") {
    std::printf("runnable: %s\nbuilt: %s\n", ape::cpu_level_list(choice.runnable).c_str(),
                ape::cpu_level_list(choice.built).c_str());
    return 0;
  }
  if ((mode != "--write" && mode != "--compare") || file.empty())
    return fail("usage: --write FILE | --compare FILE [--expect-level NAME] | --levels");
  if (choice.level < 0) return fail(choice.error);
  std::printf("level: %s\n", ape::cpu_level_name(choice.level));
  if (!expect.empty() && expect != ape::cpu_level_name(choice.level))
    return fail("expected the level " + expect + ", the dispatcher chose " +
                ape::cpu_level_name(choice.level));
  try {
    std::vector<double> all;
    std::vector<std::pair<std::string, size_t>> parts;  // (name, end offset) for messages
    for (const Case &c : kCases) {
      const ape::KernelEntry *e = find(c.encoding);
      if (!e) return fail(std::string("no kernel ") + c.encoding + " in the registry");
      for (bool f32 : {true, false}) {
        const std::vector<double> out = f32 ? run<float>(*e, c) : run<double>(*e, c);
        all.insert(all.end(), out.begin(), out.end());
        parts.push_back({std::string(c.encoding) + (f32 ? " fp32" : " fp64"), all.size()});
      }
    }
    if (mode == "--write") {
      FILE *f = std::fopen(file.c_str(), "wb");
      if (!f || std::fwrite(all.data(), sizeof(double), all.size(), f) != all.size())
        return fail("cannot write " + file);
      std::fclose(f);
      std::printf("wrote %zu values\n", all.size());
      return 0;
    }
    std::vector<double> want(all.size() + 1);
    FILE *f = std::fopen(file.c_str(), "rb");
    if (!f) return fail("cannot read " + file);
    const size_t got = std::fread(want.data(), sizeof(double), want.size(), f);
    std::fclose(f);
    if (got != all.size()) return fail(file + " holds " + std::to_string(got) + " values, expected " +
                                       std::to_string(all.size()));
    // Per part: max |x - x_native| / max(1, max |x_native|). Same code at the same level: only
    // libm's own CPU dispatch (glibc picks FMA variants of expf, sinf, ...) may differ.
    bool ok = true;
    size_t begin = 0;
    for (const auto &[name, end] : parts) {
      double err = 0, mag = 0;
      bool bitwise = true;
      for (size_t i = begin; i < end; ++i) {
        err = std::max(err, std::fabs(all[i] - want[i]));
        mag = std::max(mag, std::fabs(want[i]));
        bitwise = bitwise && std::memcmp(&all[i], &want[i], sizeof(double)) == 0;
        if (std::isnan(all[i]) != std::isnan(want[i])) err = INFINITY;
      }
      const double rel = err / std::max(1.0, mag);
      const double tol = name.find("fp32") != std::string::npos ? 1e-5 : 1e-12;
      std::printf("%-12s max normalised difference %.3g%s\n", name.c_str(), rel,
                  bitwise ? " (bitwise equal)" : "");
      if (!(rel <= tol)) ok = false, std::fprintf(stderr, "  %s: above %.0e\n", name.c_str(), tol);
      begin = end;
    }
    std::printf("%s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
  } catch (const std::exception &e) {
    return fail(e.what());
  }
}
