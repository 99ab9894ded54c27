// runtime/SpecLibrary.h: a spec file compiled at run time (apec + the C++ compiler), cached and
// loaded; and a -inf mask through that kernel, fully masked rows included, against a materialised
// LibTorch reference (forward and autograd gradients, fp64).
#include "runtime/SpecLibrary.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "runtime/CudaAttention.h"
#include "runtime/Util.h"
#include "runtime_fixtures.h"
#include "strict_window_reference.h"

namespace {

const std::string kSpecs = APE_TEST_SPEC_DIR;  // test/unit/Inputs

// One cache for the suite, in the build folder (fresh per configure of CI: the first test compiles).
ape::SpecLibraryOptions options() {
  ape::SpecLibraryOptions o;
  o.cache_dir = APE_TEST_SPEC_CACHE;
  return o;
}

using ape_test::reference_strict_window;  // strict_window_reference.h

}  // namespace

TEST(SpecLibrary, WindowedMinusInfMaskMatchesReferenceWithFullyMaskedRows) {
  const ape::SpecLibrary lib = ape::load_spec_library(kSpecs + "/strict_window.mlir", options());
  ASSERT_EQ(lib.name, "strict_window");
  ASSERT_NE(lib.entry, nullptr);
  const ape::Manifest &m = ape::manifest_of(*lib.entry);
  ASSERT_EQ(m.params.size(), 1u);
  // T = 1: the only row is fully masked; 7: a partial tile; 70: two key tiles (64). fp64 against
  // the reference at a tight tolerance; fp32 (the kernels of the level compiled) against the fp64
  // reference within 2e-5 of the largest value.
  for (auto dtype : {at::kDouble, at::kFloat})
    for (int64_t T : {1, 7, 70}) {
      at::manual_seed(T);
      const bool f64 = dtype == at::kDouble;
      auto opt = at::TensorOptions().dtype(at::kDouble);
      const int64_t B = 2, H = 3, D = 8;
      at::Tensor q = at::randn({B, H, T, D}, opt), k = at::randn({B, H, T, D}, opt), v = at::randn({B, H, T, D}, opt);
      at::Tensor slopes = ape::init_param(m.params[0], H, D, at::kDouble) * 1.3;
      at::Tensor dout = at::randn({B, H, T, D}, opt);
      auto leaf = [&](const at::Tensor &t) { return t.to(dtype).requires_grad_(); };
      at::Tensor qk = leaf(q), kk = leaf(k), vk = leaf(v), sk = leaf(slopes);
      const double scale = m.scale_for(D);
      at::Tensor o = ape::fused_attention(*lib.entry, qk, kk, vk, {}, {sk}, scale);
      auto g = torch::autograd::grad({o}, {qk, kk, vk, sk}, {dout.to(dtype)});
      at::Tensor qr = q.requires_grad_(), kr = k.requires_grad_(), vr = v.requires_grad_(),
                 sr = slopes.requires_grad_();
      at::Tensor ro = reference_strict_window(qr, kr, vr, sr, scale);
      auto rg = torch::autograd::grad({ro}, {qr, kr, vr, sr}, {dout});
      const std::string at_T = std::string(f64 ? " (fp64" : " (fp32") + ", T = " + std::to_string(T) + ")";
      for (const at::Tensor &t : {o, g[0], g[1], g[2], g[3]})
        ASSERT_TRUE(at::isfinite(t).all().item<bool>()) << "a NaN or inf" << at_T;
      // Row 0 has no key: o = 0 and dq = 0 there.
      EXPECT_EQ(o.select(2, 0).abs().max().item<double>(), 0.0) << at_T;
      EXPECT_EQ(g[0].select(2, 0).abs().max().item<double>(), 0.0) << at_T;
      const std::vector<std::pair<std::string, std::pair<at::Tensor, at::Tensor>>> pairs = {
          {"o", {o, ro}}, {"dq", {g[0], rg[0]}}, {"dk", {g[1], rg[1]}}, {"dv", {g[2], rg[2]}}, {"dslopes", {g[3], rg[3]}}};
      for (const auto &[what, p] : pairs) {
        const at::Tensor expect = p.second.detach();
        const double tol = f64 ? (what == "o" ? 1e-10 : 1e-9) * (what == "dslopes" ? 10 : 1)
                               : 2e-5 * std::max(1.0, expect.abs().max().item<double>());
        expect_close(p.first.detach().to(at::kDouble), expect, tol, what + at_T);
      }
    }
}

TEST(SpecLibrary, SecondLoadComesFromTheCacheAndRegistersOnce) {
  const ape::SpecLibrary a = ape::load_spec_library(kSpecs + "/strict_window.mlir", options());
  const ape::SpecLibrary b = ape::load_spec_library(kSpecs + "/strict_window.mlir", options());
  EXPECT_TRUE(b.cached);
  EXPECT_EQ(a.library, b.library);
  EXPECT_EQ(a.spec_hash, ape::spec_fingerprint(a.spec_text));
  EXPECT_EQ(std::string(b.entry->cpu_level), b.level);
  // Registered: found by name like a built-in encoding; the same spec again is the same entry.
  const ape::SpecLibrary &r = ape::register_spec(kSpecs + "/strict_window.mlir", options());
  EXPECT_EQ(&ape::find_kernel("strict_window"), r.entry);
  EXPECT_EQ(&ape::register_spec(kSpecs + "/strict_window.mlir", options()), &r);
  EXPECT_EQ(ape::registered_spec("strict_window"), &r);
  // The record a checkpoint keeps rebuilds the same kernel; a record whose text was edited is refused.
  nlohmann::json rec = r.record();
  EXPECT_NO_THROW(ape::register_checkpoint_spec({{"spec", rec}}, "x.ckpt", options()));
  rec["text"] = rec["text"].get<std::string>() + "\n// edited\n";
  EXPECT_ERROR(ape::load_spec_record(rec, options()), "does not match its fnv");
  rec["fnv"] = ape::spec_fingerprint(rec["text"].get<std::string>());
  EXPECT_ERROR(ape::register_checkpoint_spec({{"spec", rec}}, "x.ckpt", options()),
               "checkpoint x.ckpt was trained from another spec of encoding 'strict_window'");
}

// A library damaged in the cache (here cut to 4 KiB: dlopen of it would crash with SIGBUS) fails its
// fingerprint and is compiled again, with a note; the next load finds it whole. (A truncated copy
// is renamed over it: the library this process has loaded keeps its own pages.)
TEST(SpecLibrary, ADamagedCachedLibraryIsCompiledAgain) {
  namespace fs = std::filesystem;
  const ape::SpecLibrary a = ape::load_spec_library(kSpecs + "/strict_window.mlir", options());
  const auto size = fs::file_size(a.library);
  {
    std::ifstream in(a.library, std::ios::binary);
    std::string head(4096, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    std::ofstream(a.library + ".cut", std::ios::binary) << head;
  }
  fs::rename(a.library + ".cut", a.library);
  std::ostringstream log;
  ape::SpecLibraryOptions o = options();
  o.log = &log;
  const ape::SpecLibrary b = ape::load_spec_library(kSpecs + "/strict_window.mlir", o);
  EXPECT_FALSE(b.cached);
  EXPECT_NE(log.str().find("is damaged or unverified in the cache: compiling it again"), std::string::npos)
      << log.str();
  EXPECT_EQ(fs::file_size(b.library), size);
  EXPECT_TRUE(ape::load_spec_library(kSpecs + "/strict_window.mlir", options()).cached);
}

// A cache folder whose library is gone (a cleaner that deletes old files and keeps folders; a
// library that is not a regular file takes the same way) is compiled again: a first version found the folder there and failed every later run at
// the rename ("Directory not empty").
TEST(SpecLibrary, ACacheFolderWithoutItsLibraryIsCompiledAgain) {
  namespace fs = std::filesystem;
  // A cache of its own: ctest runs the tests of this suite at once, and the others load from theirs.
  ape::SpecLibraryOptions o = options();
  o.cache_dir += "-missing";
  fs::remove_all(o.cache_dir);
  const ape::SpecLibrary a = ape::load_spec_library(kSpecs + "/strict_window.mlir", o);
  fs::remove(a.library);
  std::ostringstream log;
  o.log = &log;
  const ape::SpecLibrary b = ape::load_spec_library(kSpecs + "/strict_window.mlir", o);
  EXPECT_FALSE(b.cached);
  EXPECT_TRUE(fs::is_regular_file(b.library));
  EXPECT_NE(log.str().find("compiling it again"), std::string::npos) << log.str();
}

// A work folder of a process that looks dead by its pid (another PID namespace, another host) but
// holds its owner file's lock is left alone; one whose lock is free is removed.
TEST(SpecLibrary, AWorkFolderIsRemovedOnlyOnceItsOwnerIsGone) {
  namespace fs = std::filesystem;
  const fs::path kernels = fs::path(APE_TEST_SPEC_CACHE) / "kernels";
  fs::create_directories(kernels);
  // pid 2^22 + 7 exceeds Linux's pid_max: kill(pid, 0) says ESRCH, as for a process elsewhere.
  const fs::path live = kernels / ".apec-4194311-0", dead = kernels / ".apec-4194311-1";
  for (const auto &d : {live, dead}) {
    fs::create_directories(d), std::ofstream(d / ".owner").flush();
    // Two minutes old: a younger folder may be between its making and its lock, and stays.
    fs::last_write_time(d, fs::file_time_type::clock::now() - std::chrono::minutes(2));
  }
  const int fd = ::open((live / ".owner").c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  ape::load_spec_library(kSpecs + "/strict_window.mlir", options());  // sweeps the work folders
  EXPECT_TRUE(fs::exists(live));
  EXPECT_FALSE(fs::exists(dead));
  ::close(fd);
  fs::remove_all(live);
}

// A checkpoint's spec record names a file in the cache: a name that is not an identifier is
// refused before any path is made of it, and the cached copy of the text is the record's (a copy
// replaced by another spec of the same name is written again, not compiled).
TEST(SpecLibrary, ARecordsNameAndCachedTextAreChecked) {
  namespace fs = std::filesystem;
  const ape::SpecLibrary a = ape::load_spec_library(kSpecs + "/strict_window.mlir", options());
  nlohmann::json rec = a.record();
  nlohmann::json bad = rec;
  bad["name"] = "../../outside/evil";
  EXPECT_ERROR(ape::load_spec_record(bad, options()), "the encoding name '../../outside/evil' is not an identifier");
  const fs::path copy = fs::path(APE_TEST_SPEC_CACHE) / "specs" /
                        ("strict_window-" + rec["fnv"].get<std::string>() + ".mlir");
  ape::load_spec_record(rec, options());
  ASSERT_TRUE(fs::is_regular_file(copy));
  std::ofstream(copy, std::ios::trunc) << "ape.encoding @strict_window {\n}\n";  // another spec, same name
  const ape::SpecLibrary b = ape::load_spec_record(rec, options());
  EXPECT_EQ(b.library, a.library);
  EXPECT_EQ(ape::read_file(copy), rec["text"].get<std::string>());
}

// Without APE_CACHE_DIR, XDG_CACHE_HOME and HOME (a service), the cache is under the user's home
// from the password database, never a folder in /tmp that another user may have made.
TEST(SpecLibrary, TheDefaultCacheWithoutHomeIsTheUsersOwn) {
  const char *names[] = {"APE_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
  std::vector<std::optional<std::string>> saved;
  for (const char *n : names) {
    const char *v = std::getenv(n);
    saved.push_back(v ? std::optional<std::string>(v) : std::nullopt);
    ::unsetenv(n);
  }
  const std::string dir = ape::default_spec_cache_dir();
  for (size_t i = 0; i < saved.size(); ++i)
    if (saved[i]) ::setenv(names[i], saved[i]->c_str(), 1);
  const passwd *pw = ::getpwuid(::getuid());
  ASSERT_NE(pw, nullptr);
  if (std::string(pw->pw_dir) != "/" && ::access(pw->pw_dir, W_OK | X_OK) == 0)
    EXPECT_EQ(dir, std::string(pw->pw_dir) + "/.cache/ape");
  else
    EXPECT_EQ(dir, (std::filesystem::temp_directory_path() / ("ape-cache-" + std::to_string(::getuid()))).string());
}

TEST(SpecLibrary, SpecErrorsAreApecsLocatedDiagnostics) {
  EXPECT_ERROR(ape::load_spec_library(kSpecs + "/bad_spec.mlir", options()), "bad_spec.mlir:5:");
  EXPECT_ERROR(ape::load_spec_library(kSpecs + "/no_such.mlir", options()), "no_such.mlir: no such file");
  ape::SpecLibraryOptions o = options();
  o.apec = "/nonexistent/apec";
  EXPECT_ERROR(ape::load_spec_library(kSpecs + "/strict_window.mlir", o), "cannot run apec (/nonexistent/apec)");
  o = options();
  o.cxx = "/nonexistent/c++";
  EXPECT_ERROR(ape::load_spec_library(kSpecs + "/strict_window.mlir", o),
               "the C++ compiler '/nonexistent/c++' does not run");
}

TEST(SpecLibrary, ABuiltInNameIsRefused) {
  const auto names = ape::kernel_names();
  ASSERT_NE(std::find(names.begin(), names.end(), "alibi"), names.end());
  // examples/encodings/alibi.mlir is a good spec, but its name is taken by the built-in kernel:
  // refused after apec, before anything is compiled.
  EXPECT_ERROR(ape::register_spec(std::string(APE_SOURCE_DIR) + "/examples/encodings/alibi.mlir", options()),
               "defines encoding 'alibi', which exists already");
}

// A compiler killed for memory (the out-of-memory killer: g++ says "Killed signal terminated
// program cc1plus"; or the compiler itself dies of SIGKILL) is the machine's state, said so, not "a
// bug in APE: please report it" with the spec, as it had been.
TEST(SpecLibrary, ACompilerKilledForMemoryIsNotReportedAsABug) {
  namespace fs = std::filesystem;
  const std::string dir = tmp_path("oom_compiler");
  fs::create_directories(dir);
  for (const std::string end : {"echo 'c++: fatal error: Killed signal terminated program cc1plus' >&2; exit 1",
                                "kill -9 $$"}) {
    const std::string cxx = dir + "/cxx";
    std::ofstream(cxx) << "#!/bin/sh\nif [ \"$1\" = --version ]; then echo fake-c++ 1.0; exit 0; fi\n" << end << "\n";
    fs::permissions(cxx, fs::perms::owner_all);
    ape::SpecLibraryOptions o = options();
    o.cxx = cxx;
    o.cache_dir = dir + "/cache";
    fs::remove_all(o.cache_dir);
    try {
      ape::load_spec_library(kSpecs + "/strict_window.mlir", o);
      ADD_FAILURE() << "no error: " << end;
    } catch (const std::runtime_error &e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("the compiler was killed or its memory ran out"), std::string::npos) << what;
      EXPECT_EQ(what.find("a bug in APE"), std::string::npos) << what;
    }
  }
}

// --spec on a GPU: the spec's CUDA kernels compiled at run time by nvcc (SpecLibrary.h,
// load_spec_cuda), cached beside the CPU library, then found by the CUDA attention like the build's
// (CudaAttention.h, cuda_compile_spec). sm_80, f32 at head dim 32: the cheapest variant to compile;
// running it needs a GPU (scripts/gpu-check.sh).
TEST(SpecLibrary, CudaKernelsCompileAtRunTime) {
  const ape::SpecLibrary &lib = ape::register_spec(kSpecs + "/strict_window.mlir", options());
  const ape::KernelEntry &entry = *lib.entry;
  if (!ape::cuda_attention_built()) {  // a build without nvcc: the reason, not a crash
    EXPECT_NE(ape::cuda_attention_problem(entry, at::kFloat, 32).find("no CUDA kernels"), std::string::npos);
    return;
  }
  EXPECT_NE(ape::cuda_attention_problem(entry, at::kFloat, 32).find("compiled at run time (--spec)"),
            std::string::npos);
  std::ostringstream log;
  ape::cuda_compile_spec(entry, at::kFloat, 32, "80", &log);
  EXPECT_NE(log.str().find("[spec] strict_window: CUDA kernels for sm_80 (f32 at head dim 32)"), std::string::npos)
      << log.str();
  EXPECT_EQ(ape::cuda_attention_problem(entry, at::kFloat, 32), "");
  const std::string other = ape::cuda_attention_problem(entry, at::kBFloat16, 32);
  EXPECT_NE(other.find("has no bf16 CUDA kernel at head dim 32 in this build (it has f32/hd32"), std::string::npos)
      << other;
  bool listed = false;
  for (const auto &k : ape::cuda_attention_kernels()) listed |= k == "strict_window: f32/hd32";
  EXPECT_TRUE(listed);
  // The same library again: from the cache (the entry is the one registered above).
  std::ostringstream again;
  ape::SpecLibraryOptions o = options();
  o.log = &again;
  EXPECT_NE(ape::load_spec_cuda(lib, ape::SpecCudaOptions{"80", {"f32"}, {32}}, o), nullptr);
  EXPECT_NE(again.str().find("from the cache"), std::string::npos) << again.str();
  EXPECT_ERROR(ape::load_spec_cuda(lib, ape::SpecCudaOptions{"sm90", {"f32"}, {32}}, o), "bad GPU architecture");
  // A library whose kernel headers are not the program's (here: a program that expects another
  // fingerprint) is refused, as a CPU library is.
  EXPECT_ERROR(ape::load_spec_cuda(lib, ape::SpecCudaOptions{"80", {"f32"}, {32}, /*expected_abi=*/1}, o),
               "was compiled against other kernel headers than this program was built with");
}
