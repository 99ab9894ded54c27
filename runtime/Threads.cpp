#include "runtime/Threads.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

namespace ape {

std::vector<std::pair<std::string, std::string>> thread_env_settings(
    const std::function<const char *(const char *)> &env, int argc, const char *const *argv) {
  if (env("APE_NO_REEXEC")) return {};
  std::vector<std::pair<std::string, std::string>> out;
  if (!env("OMP_WAIT_POLICY")) {
    out.emplace_back("OMP_WAIT_POLICY", "PASSIVE");
    auto above_one = [](const char *v) { return v && std::strtoll(v, nullptr, 10) > 1; };
    bool shared = above_one(env("LOCAL_WORLD_SIZE"));
    for (int i = 1; i < argc && argv[i]; ++i) {
      const std::string a = argv[i];
      if (a == "--world-size" && i + 1 < argc) shared = shared || above_one(argv[i + 1]);
      if (a.rfind("--world-size=", 0) == 0) shared = shared || above_one(a.c_str() + 13);
    }
    if (!env("GOMP_SPINCOUNT") && !shared) out.emplace_back("GOMP_SPINCOUNT", std::to_string(kOpenMpSpin));
  }
  if (!env("MKL_CBWR")) out.emplace_back("MKL_CBWR", "AUTO,STRICT");
  return out;
}

void prepare_threads(char **argv) {
  int argc = 0;
  while (argv[argc]) ++argc;
  const auto settings = thread_env_settings([](const char *name) { return std::getenv(name); }, argc, argv);
  bool reexec = false;
  for (const auto &[name, value] : settings) {
    ::setenv(name.c_str(), value.c_str(), 1);
    reexec = reexec || name.rfind("MKL_", 0) != 0;  // libgomp's, read when it loaded
  }
  if (!reexec) return;
  ::setenv("APE_NO_REEXEC", "1", 1);  // never loop
  ::execv("/proc/self/exe", argv);
  // execv failed: carry on with the default policy.
}

namespace {
// set_threads' count when it chose it (n <= 0), else 0.
std::atomic<int64_t> g_chosen_threads{0};
std::atomic<int> g_last_small_work{0};
}  // namespace

int64_t set_threads(int64_t n) {
  const bool chosen = n <= 0;
  if (chosen) n = std::max(1u, std::thread::hardware_concurrency());
  at::set_num_threads(static_cast<int>(n));
  g_chosen_threads = chosen ? n : 0;
  warm_vector_math();
  return n;
}

SmallWorkThreads::SmallWorkThreads(double macs) {
  const int64_t all = g_chosen_threads.load();
  g_last_small_work = 0;
  if (all <= 1) return;
  const double wanted = std::ceil(std::max(macs, 0.0) / kMacsPerThread);
  const int n = static_cast<int>(std::clamp<double>(wanted, 1.0, double(all)));
  g_last_small_work = n;
  const int current = at::get_num_threads();
  if (n == current) return;
  previous_ = current;
  at::set_num_threads(n);
}

int SmallWorkThreads::last() { return g_last_small_work.load(); }

SmallWorkThreads::~SmallWorkThreads() {
  if (previous_ > 0) at::set_num_threads(previous_);
}

void warm_vector_math() {
  static std::once_flag once;
  std::call_once(once, [] {
    // 64 elements: under LibTorch's grain, so each call runs on this thread only. The functions
    // are those LibTorch routes through MKL's VML (ATen/cpu/vml.h), in both precisions it uses.
    for (const auto dtype : {at::kFloat, at::kDouble}) {
      const at::Tensor x = at::full({64}, 0.5, at::TensorOptions().dtype(dtype));
      const at::Tensor ys[] = {x.sqrt(), x.exp(), x.log(), x.log2(),  x.log10(), x.tanh(), x.erf(),  x.erfc(),
                               x.erfinv(), x.sin(), x.cos(), x.tan(), x.asin(), x.acos(), x.atan(), x.trunc()};
      (void)ys;
    }
  });
}

}  // namespace ape
