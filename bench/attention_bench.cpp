// ape-bench-attention: APE's generated CPU flash-attention kernels (ape_kernels, reached only
// through ape::kernel_registry()) against LibTorch's materialised causal attention, fp32.
//
// For every encoding E and length T it measures, at B=1, H=4, D=64 by default:
//   - fwd alone and fused fwd+bwd time (median of an adaptive number of repetitions),
//     effective GFLOP/s from the napkin count 4*T^2*D*B*H/2 per forward (causal) and 2.5x that
//     per backward, the LibTorch/APE speed-up;
//   - the peak resident memory of the method: every (method, E, T) measurement runs in a fresh
//     process (this binary re-executed in `--one` mode), which reports its VmHWM after its first
//     fwd+bwd; a baseline process that only allocates the inputs is subtracted.
// Methods: `ape`, `libtorch` (the materialised reference as installed) and `libtorch-tuned` (the
// same code with glibc malloc kept from unmapping freed memory and passive OpenMP waiting).
// A correctness gate runs first (also in child processes): for every (E, T) APE's o and dq must
// be within --tol (max abs error, default 1e-3) of an fp64 LibTorch reference, and so must the
// fp32 LibTorch path that is timed; otherwise the bench aborts.
//
// The LibTorch path is an independent re-implementation of each encoding from its spec
// (examples/encodings/*.mlir) with plain LibTorch ops and autograd:
//   s = (q' @ k'^T) * kappa (+ bias), causal mask, softmax, @ v; backward by autograd.
//     nope : q' = q, k' = k
//     rope : q' = q*cos + rotate_half(q)*sin (base 10000, all dims, "half" pairing), same for k
//     alibi: bias_ij = -m_h * (i - j), m_h = 2^(-8(h+1)/H) (the manifest's alibi_slopes)
//     cable: b = -softplus(f), S = cumsum_t(b), bias_ij = S_i - S_j (f: the token feature)
// Constant tables (cos/sin, the causal mask, the i-j distance matrix) are built once outside the
// timed region, as a tuned PyTorch implementation would cache them.
//
// Usage: see bench/README.md and `ape-bench-attention --help`.
#include <ape/cpu/kernel_call.h>
#include "runtime/Manifest.h"  // ape::alibi_slopes: the slope rule the runtime uses

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <malloc.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ape {
const KernelEntry *const *kernel_registry(size_t *count);
}

namespace {

// ---- options ------------------------------------------------------------------------------------

struct Options {
  std::vector<std::string> encodings = {"nope", "rope", "alibi", "cable"};
  std::vector<int64_t> lengths = {256, 1024, 2048, 4096};
  std::vector<std::string> methods = {"ape", "libtorch", "libtorch-tuned"};
  int64_t B = 1, H = 4, D = 64;
  int threads = 2;
  int min_reps = 5;
  double min_time = 2.0;  // seconds per timed quantity
  int max_reps = 1000;
  double tol = 1e-3;
  uint64_t seed = 1234;
  bool check = true;
  std::string csv;
};

[[noreturn]] void die(const std::string &msg) {
  std::fprintf(stderr, "ape-bench-attention: %s\n", msg.c_str());
  std::exit(2);
}

std::vector<std::string> split(const std::string &s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

int64_t to_int(const std::string &s) {
  try {
    size_t pos = 0;
    const long long v = std::stoll(s, &pos);
    if (pos != s.size()) throw std::invalid_argument(s);
    return v;
  } catch (...) {
    die("not an integer: '" + s + "'");
  }
}

double to_double(const std::string &s) {
  try {
    size_t pos = 0;
    const double v = std::stod(s, &pos);
    if (pos != s.size()) throw std::invalid_argument(s);
    return v;
  } catch (...) {
    die("not a number: '" + s + "'");
  }
}

const char kUsage[] =
    "usage: ape-bench-attention [options]\n"
    "  --csv FILE          also write the results as CSV\n"
    "                      (encoding,T,method,fwd_ms,fwdbwd_ms,peak_mib,gflops)\n"
    "  --quick             smoke run: T in {256, 1024}\n"
    "  --T LIST            sequence lengths, comma separated (default 256,1024,2048,4096)\n"
    "  --encodings LIST    default nope,rope,alibi,cable\n"
    "  --methods LIST      ape,libtorch,libtorch-tuned (default all three); libtorch-tuned:\n"
    "                      the LibTorch path with MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_=1e12\n"
    "                      and OMP_WAIT_POLICY=passive\n"
    "  --B N --H N --D N   batch, heads, head dim (default 1, 4, 64)\n"
    "  --threads N         intra-op threads of both methods (default 2)\n"
    "  --min-reps N        at least N timed repetitions (default 5)\n"
    "  --min-time S        and at least S seconds of timed repetitions (default 2)\n"
    "  --max-reps N        at most N repetitions (default 1000)\n"
    "  --tol X             correctness gate: max abs error of o and dq (default 1e-3)\n"
    "  --seed N            input seed (default 1234)\n"
    "  --skip-check        skip the correctness gate (profiling only)\n"
    "  --one MODE ENC T    internal: one measurement in this process, MODE in\n"
    "                      inputs|ape|libtorch|libtorch-tuned|check; prints a RESULT line\n";

// ---- encodings: manifest and inputs -------------------------------------------------------------

const ape::KernelEntry *find_entry(const std::string &name) {
  size_t n = 0;
  const ape::KernelEntry *const *all = ape::kernel_registry(&n);
  for (size_t i = 0; i < n; ++i)
    if (name == all[i]->name) return all[i];
  return nullptr;
}

// What the bench needs from the manifest; checked against what the LibTorch reference implements.
struct EncInfo {
  const ape::KernelEntry *entry = nullptr;
  int num_features = 0;
  std::vector<std::string> param_inits;  // init kind of each param, all of shape [heads]
  double scale = 0;                      // kappa (0: 1/sqrt(D))
};

EncInfo load_encoding(const std::string &name) {
  EncInfo info;
  info.entry = find_entry(name);
  if (!info.entry) die("encoding '" + name + "' is not in ape::kernel_registry()");
  const auto m = nlohmann::json::parse(info.entry->manifest_json);
  if (!m.value("causal", false)) die(name + ": the bench only handles causal kernels");
  info.num_features = static_cast<int>(m.at("features").size());
  for (const auto &p : m.at("params")) {
    const auto &shape = p.at("shape");
    if (shape.size() != 1 || shape[0] != "heads")
      die(name + ": param '" + p.at("name").get<std::string>() + "' has an unsupported shape");
    info.param_inits.push_back(p.at("init").at("kind").get<std::string>());
  }
  if (!m.at("scale").is_null()) info.scale = m.at("scale").get<double>();
  // The reference below implements these four encodings; the manifest must agree with it.
  struct Expect {
    int features;
    std::vector<std::string> params;
  };
  static const std::map<std::string, Expect> kExpect = {
      {"nope", {0, {}}}, {"rope", {0, {}}}, {"alibi", {0, {"alibi_slopes"}}}, {"cable", {1, {}}}};
  const auto it = kExpect.find(name);
  if (it == kExpect.end())
    die("no LibTorch reference for encoding '" + name + "' (known: nope, rope, alibi, cable)");
  if (it->second.features != info.num_features || it->second.params != info.param_inits)
    die(name +
        ": the manifest's features/params differ from what the bench's reference implements");
  return info;
}

// fp32 inputs, identical in every process (seeded).
struct Inputs {
  torch::Tensor q, k, v, dout;        // (B, H, T, D)
  std::vector<torch::Tensor> feats;   // (B, H, T) each
  std::vector<torch::Tensor> params;  // (H) each
  double scale = 0;
};

Inputs make_inputs(const Options &opt, const EncInfo &info, int64_t T) {
  torch::manual_seed(opt.seed);
  Inputs in;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  in.q = torch::randn({opt.B, opt.H, T, opt.D}, f32);
  in.k = torch::randn({opt.B, opt.H, T, opt.D}, f32);
  in.v = torch::randn({opt.B, opt.H, T, opt.D}, f32);
  in.dout = torch::randn({opt.B, opt.H, T, opt.D}, f32);
  for (int n = 0; n < info.num_features; ++n)
    in.feats.push_back(torch::randn({opt.B, opt.H, T}, f32));
  for (const auto &kind : info.param_inits) {
    if (kind != "alibi_slopes") die("unsupported param init '" + kind + "'");
    const auto s = ape::alibi_slopes(opt.H);
    in.params.push_back(torch::tensor(s, torch::kFloat64).to(torch::kFloat32));
  }
  in.scale = info.scale != 0 ? info.scale : 1.0 / std::sqrt(double(opt.D));
  return in;
}

// ---- APE ----------------------------------------------------------------------------------------

struct ApeRun {
  const ape::KernelEntry *entry;
  std::vector<float> o, lse, dq, dk, dv;
  std::vector<std::vector<float>> dfeats, dparams;
  std::vector<const float *> feat_ptrs, param_ptrs;
  std::vector<float *> dfeat_ptrs, dparam_ptrs;
  ape::AttnArgs<float> a{};

  ApeRun(const EncInfo &info, const Inputs &in) : entry(info.entry) {
    const int64_t B = in.q.size(0), H = in.q.size(1), T = in.q.size(2), D = in.q.size(3);
    const size_t n = size_t(B * H * T * D), nt = size_t(B * H * T);
    o.assign(n, 0.f), dq.assign(n, 0.f), dk.assign(n, 0.f), dv.assign(n, 0.f);
    lse.assign(nt, 0.f);
    for (const auto &f : in.feats) {
      feat_ptrs.push_back(f.data_ptr<float>());
      dfeats.emplace_back(nt, 0.f);
    }
    for (const auto &p : in.params) {
      param_ptrs.push_back(p.data_ptr<float>());
      dparams.emplace_back(size_t(p.numel()), 0.f);
    }
    for (auto &d : dfeats) dfeat_ptrs.push_back(d.data());
    for (auto &d : dparams) dparam_ptrs.push_back(d.data());
    auto ptrs = [](auto &v) { return v.empty() ? nullptr : v.data(); };
    a = ape::backward_args(
        ape::forward_args<float>({B, H, T, D}, in.scale, in.q.data_ptr<float>(),
                                 in.k.data_ptr<float>(), in.v.data_ptr<float>(), ptrs(feat_ptrs),
                                 ptrs(param_ptrs), o.data(), lse.data()),
        in.dout.data_ptr<float>(), dq.data(), dk.data(), dv.data(), ptrs(dfeat_ptrs),
        ptrs(dparam_ptrs));
  }
  void forward() { entry->forward_f32(a); }
  void backward() { entry->backward_f32(a); }
};

// ---- LibTorch materialised reference ------------------------------------------------------------

struct RefConsts {         // built once per (encoding, T, dtype), outside the timed region
  torch::Tensor mask;      // (T, T) bool, true above the diagonal (j > i)
  torch::Tensor cos, sin;  // rope: (T, D)
  torch::Tensor dist;      // alibi: (T, T) i - j
  torch::Tensor slopes;    // alibi: (1, H, 1, 1)
};

RefConsts make_consts(const std::string &enc, const Inputs &in, torch::Dtype dtype) {
  const int64_t H = in.q.size(1), T = in.q.size(2), D = in.q.size(3);
  const auto opt = torch::TensorOptions().dtype(dtype);
  RefConsts c;
  c.mask = torch::ones({T, T}, torch::kBool).triu(1);
  if (enc == "rope") {
    // theta_k = base^(-2k/D), k < D/2; "half" pairing: column c pairs with c +- D/2.
    const auto k = torch::arange(D / 2, torch::kFloat64);
    const auto theta = torch::pow(10000.0, -2.0 * k / double(D));
    const auto ang = torch::outer(torch::arange(T, torch::kFloat64), theta);  // (T, D/2)
    c.cos = torch::cat({ang.cos(), ang.cos()}, -1).to(dtype);
    c.sin = torch::cat({ang.sin(), ang.sin()}, -1).to(dtype);
  } else if (enc == "alibi") {
    const auto t = torch::arange(T, opt);
    c.dist = t.unsqueeze(1) - t.unsqueeze(0);
    c.slopes = in.params.at(0).to(dtype).view({1, H, 1, 1});
  }
  return c;
}

torch::Tensor rotate_half(const torch::Tensor &x) {
  const int64_t h = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

// o = softmax(mask((q' k'^T) * scale + bias)) v; feat: the (B, H, T) token feature (cable).
torch::Tensor ref_forward(const std::string &enc, const torch::Tensor &q, const torch::Tensor &k,
                          const torch::Tensor &v, const torch::Tensor &feat, const RefConsts &c,
                          double scale) {
  torch::Tensor qq = q, kk = k;
  if (enc == "rope") {
    qq = q * c.cos + rotate_half(q) * c.sin;
    kk = k * c.cos + rotate_half(k) * c.sin;
  }
  torch::Tensor s = torch::matmul(qq, kk.transpose(-2, -1)) * scale;
  if (enc == "alibi") {
    s = s - c.slopes * c.dist;
  } else if (enc == "cable") {
    const torch::Tensor S = torch::cumsum(-torch::softplus(feat), -1);  // (B, H, T)
    s = s + (S.unsqueeze(-1) - S.unsqueeze(-2));
  }
  s = s.masked_fill(c.mask, -std::numeric_limits<double>::infinity());
  return torch::matmul(torch::softmax(s, -1), v);
}

struct RefRun {
  std::string enc;
  RefConsts c;
  torch::Tensor q, k, v, dout, feat;  // leaves (q, k, v, feat require grad)
  std::vector<torch::Tensor> leaves;
  double scale;

  RefRun(const std::string &e, const Inputs &in, torch::Dtype dtype)
      : enc(e), c(make_consts(e, in, dtype)), scale(in.scale) {
    q = in.q.to(dtype).detach().requires_grad_(true);
    k = in.k.to(dtype).detach().requires_grad_(true);
    v = in.v.to(dtype).detach().requires_grad_(true);
    dout = in.dout.to(dtype);
    leaves = {q, k, v};
    if (!in.feats.empty()) {
      feat = in.feats[0].to(dtype).detach().requires_grad_(true);
      leaves.push_back(feat);
    }
  }
  torch::Tensor forward() const { return ref_forward(enc, q, k, v, feat, c, scale); }
  // o and the gradients of q, k, v (and feat).
  std::vector<torch::Tensor> forward_backward() const {
    torch::Tensor o = forward();
    std::vector<torch::Tensor> g = torch::autograd::grad({o}, leaves, {dout});
    g.insert(g.begin(), o);
    return g;
  }
};

// ---- measurement helpers ------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;

struct Timing {
  double median_ms = 0, min_ms = 0;
  double cpu_ms = 0;  // median CPU time (user + sys, all threads) of one repetition
  int reps = 0;
};

// CPU time (user + sys) of all threads of this process so far, ms.
double cpu_time_ms() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return (double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
          double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-3);
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const size_t n = x.size();
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

// One warm-up call, then repetitions until both min_reps and min_time are reached (or max_reps).
template <class F>
Timing time_median(const Options &opt, F &&f) {
  f();
  std::vector<double> ms, cpu;
  const auto start = Clock::now();
  while (int(ms.size()) < opt.max_reps) {
    const double c0 = cpu_time_ms();
    const auto t0 = Clock::now();
    f();
    const auto t1 = Clock::now();
    cpu.push_back(cpu_time_ms() - c0);
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    const double elapsed = std::chrono::duration<double>(t1 - start).count();
    if (int(ms.size()) >= opt.min_reps && elapsed >= opt.min_time) break;
  }
  Timing t;
  t.median_ms = median(ms);
  t.min_ms = *std::min_element(ms.begin(), ms.end());
  t.cpu_ms = median(cpu);
  const size_t n = ms.size();
  t.reps = int(n);
  return t;
}

// Peak resident set of this process (VmHWM), KiB.
long vm_hwm_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
  return -1;
}

double max_abs_diff(const torch::Tensor &a, const torch::Tensor &b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

double max_abs(const torch::Tensor &a) { return a.to(torch::kFloat64).abs().max().item<double>(); }

torch::Tensor wrap(std::vector<float> &buf, const torch::Tensor &like) {
  return torch::from_blob(buf.data(), like.sizes(), torch::kFloat32);
}

// ---- child process: one measurement -------------------------------------------------------------

void print_timings(const Timing &fwd, const Timing &fb) {
  std::printf(
      " fwd_ms=%.6f fwdbwd_ms=%.6f fwd_min_ms=%.6f fwdbwd_min_ms=%.6f fwd_cpu_ms=%.6f "
      "fwdbwd_cpu_ms=%.6f fwd_reps=%d fwdbwd_reps=%d",
      fwd.median_ms, fb.median_ms, fwd.min_ms, fb.min_ms, fwd.cpu_ms, fb.cpu_ms, fwd.reps, fb.reps);
}

int run_one(const Options &opt, const std::string &mode, const std::string &enc, int64_t T) {
  torch::set_num_threads(opt.threads);
  const EncInfo info = load_encoding(enc);
  Inputs in = make_inputs(opt, info, T);
  std::printf("RESULT");
  // Peak memory: VmHWM right after the method's first fwd+bwd (its setup included), before the
  // timing loops, whose hundreds of repetitions would add the allocator's fragmentation.
  long hwm_kib = -1;
  if (mode == "inputs") {
    // Baseline: torch loaded and the inputs allocated, nothing else.
    hwm_kib = vm_hwm_kib();
  } else if (mode == "ape") {
    ApeRun run(info, in);
    run.forward();
    run.backward();
    hwm_kib = vm_hwm_kib();
    const Timing fwd = time_median(opt, [&] { run.forward(); });
    const Timing fb = time_median(opt, [&] {
      run.forward();
      run.backward();
    });
    print_timings(fwd, fb);
    // The instruction-set level the registry chose (ape/cpu/dispatch.h; APE_CPU_LEVEL forces one).
    std::printf(" level=%s", info.entry->cpu_level ? info.entry->cpu_level : "unknown");
  } else if (mode == "libtorch" || mode == "libtorch-tuned") {
    if (mode == "libtorch-tuned") {  // the driver also sets tuned_env() before the exec
      mallopt(M_MMAP_MAX, 0);
      mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
    }
    RefRun run(enc, in, torch::kFloat32);
    { auto g = run.forward_backward(); }
    hwm_kib = vm_hwm_kib();
    const Timing fwd = time_median(opt, [&] { torch::Tensor o = run.forward(); });
    const Timing fb = time_median(opt, [&] { auto g = run.forward_backward(); });
    print_timings(fwd, fb);
  } else if (mode == "check") {
    // APE fp32 and the timed LibTorch fp32 path, both against an fp64 LibTorch reference.
    ApeRun ape(info, in);
    ape.forward();
    ape.backward();
    const std::vector<torch::Tensor> ref = RefRun(enc, in, torch::kFloat64).forward_backward();
    const std::vector<torch::Tensor> lt = RefRun(enc, in, torch::kFloat32).forward_backward();
    std::vector<torch::Tensor> got = {wrap(ape.o, in.q), wrap(ape.dq, in.q), wrap(ape.dk, in.q),
                                      wrap(ape.dv, in.q)};
    if (!in.feats.empty()) got.push_back(wrap(ape.dfeats[0], in.feats[0]));
    const char *names[] = {"o", "dq", "dk", "dv", "dfeat"};
    for (size_t i = 0; i < got.size(); ++i)
      std::printf(" ape_%s=%.3e libtorch_%s=%.3e ref_max_%s=%.3e", names[i],
                  max_abs_diff(got[i], ref[i]), names[i], max_abs_diff(lt[i], ref[i]), names[i],
                  max_abs(ref[i]));
  } else {
    die("unknown --one mode '" + mode + "'");
  }
  // hwm_end_kib: VmHWM at the end (after the timing loops, or the check).
  std::printf(" hwm_kib=%ld hwm_end_kib=%ld\n", hwm_kib, vm_hwm_kib());
  std::fflush(stdout);
  return 0;
}

// ---- parent: spawn children ---------------------------------------------------------------------

std::vector<std::string> child_args(const Options &opt, const std::string &mode,
                                    const std::string &enc, int64_t T) {
  return {"--one",      mode,
          enc,          std::to_string(T),
          "--B",        std::to_string(opt.B),
          "--H",        std::to_string(opt.H),
          "--D",        std::to_string(opt.D),
          "--threads",  std::to_string(opt.threads),
          "--min-reps", std::to_string(opt.min_reps),
          "--min-time", std::to_string(opt.min_time),
          "--max-reps", std::to_string(opt.max_reps),
          "--seed",     std::to_string(opt.seed)};
}

using Env = std::vector<std::pair<std::string, std::string>>;

// Environment of the libtorch-tuned children: glibc malloc never unmaps or trims freed memory
// (LibTorch's large T x T temporaries are otherwise mmapped and page-faulted in anew at every
// call), and idle OpenMP threads sleep instead of spinning (LibTorch's OpenMP pool and OpenBLAS's
// own pthread pool otherwise compete for the cores).
Env tuned_env() {
  return {{"MALLOC_MMAP_MAX_", "0"},
          {"MALLOC_TRIM_THRESHOLD_", "1000000000000"},
          {"OMP_WAIT_POLICY", "passive"}};
}

std::string tuned_env_text() {
  std::string t;
  for (const auto &[k, v] : tuned_env()) t += (t.empty() ? "" : " ") + k + "=" + v;
  return t;
}

// Runs this binary with `args` in a fresh process; returns the key=value pairs of its RESULT line.
std::map<std::string, double> spawn(const std::vector<std::string> &args, const Env &env = {}) {
  int fds[2];
  if (pipe(fds) != 0) die("pipe failed");
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) die("fork failed");
  if (pid == 0) {
    for (const auto &[k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char *> argv;
    static char self[] = "ape-bench-attention";
    argv.push_back(self);
    for (const auto &a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    std::perror("execv /proc/self/exe");
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  std::string cmd;
  for (const auto &a : args) cmd += " " + a;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    die("child failed (" + std::to_string(status) + "):" + cmd + "\n" + out);
  const size_t at = out.rfind("RESULT");
  if (at == std::string::npos) die("child printed no RESULT:" + cmd + "\n" + out);
  std::map<std::string, double> kv;
  std::stringstream ss(out.substr(at + 6));
  std::string tok;
  while (ss >> tok) {
    const size_t eq = tok.find('=');
    if (eq != std::string::npos) kv[tok.substr(0, eq)] = std::atof(tok.c_str() + eq + 1);
  }
  return kv;
}

struct Row {
  std::string enc, method;
  int64_t T;
  double fwd_ms, fwdbwd_ms, peak_mib;  // medians, MiB above the baseline
  double fwd_min_ms, fwdbwd_min_ms;    // best of the repetitions
  double fwd_cpu_ms, fwdbwd_cpu_ms;    // median CPU time of all threads
};

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

double fwd_flops(const Options &opt, int64_t T) {
  return 4.0 * double(T) * double(T) * double(opt.D) * double(opt.B * opt.H) / 2.0;
}
double gflops(double flops, double ms) { return flops / (ms * 1e-3) / 1e9; }

std::string fmtd(const char *f, double x) {
  char b[64];
  std::snprintf(b, sizeof b, f, x);
  return b;
}

int run_driver(const Options &opt) {
  std::fprintf(stderr, "ape-bench-attention: B=%ld H=%ld D=%ld threads=%d (OMP_NUM_THREADS=%s)\n",
               long(opt.B), long(opt.H), long(opt.D), opt.threads, std::getenv("OMP_NUM_THREADS"));
  for (const auto &e : opt.encodings) (void)load_encoding(e);  // fail early on unknown names

  const std::string load_start = loadavg();
  // 1. Correctness gate.
  if (opt.check) {
    for (const auto &e : opt.encodings)
      for (int64_t T : opt.lengths) {
        auto r = spawn(child_args(opt, "check", e, T));
        std::fprintf(stderr,
                     "check %-6s T=%-5ld max|err| vs fp64: APE o %.2e dq %.2e dk %.2e dv %.2e",
                     e.c_str(), long(T), r["ape_o"], r["ape_dq"], r["ape_dk"], r["ape_dv"]);
        if (r.count("ape_dfeat")) std::fprintf(stderr, " dfeat %.2e", r["ape_dfeat"]);
        std::fprintf(stderr, " | LibTorch fp32 o %.2e dq %.2e\n", r["libtorch_o"],
                     r["libtorch_dq"]);
        for (const char *m : {"ape", "libtorch"})
          for (const char *q : {"o", "dq"}) {
            const double err = r[std::string(m) + "_" + q];
            if (!(err <= opt.tol)) {
              std::fprintf(stderr,
                           "ape-bench-attention: CORRECTNESS GATE FAILED: %s %s T=%ld: max abs "
                           "error of %s = %.3e > %.1e (vs the fp64 LibTorch reference); "
                           "aborting before timing\n",
                           m, e.c_str(), long(T), q, err, opt.tol);
              return 1;
            }
          }
        for (const char *q : {"dk", "dv", "dfeat"}) {
          const std::string key = std::string("ape_") + q;
          if (r.count(key) && r[key] > opt.tol)
            std::fprintf(stderr, "  warning: APE %s error %.3e > %.1e (relative %.2e)\n", q, r[key],
                         opt.tol, r[key] / std::max(1e-30, r[std::string("ref_max_") + q]));
        }
      }
    std::fprintf(stderr, "correctness gate passed (tol %.1e on o and dq)\n", opt.tol);
  }

  // 2. Timing and memory, one process per (method, encoding, T).
  std::vector<Row> rows;
  for (const auto &e : opt.encodings)
    for (int64_t T : opt.lengths) {
      const double base_kib = spawn(child_args(opt, "inputs", e, T))["hwm_kib"];
      for (const auto &m : opt.methods) {
        auto r = spawn(child_args(opt, m, e, T), m == "libtorch-tuned" ? tuned_env() : Env{});
        if (r["hwm_kib"] <= 0) die("no memory reading from the " + m + " child");
        Row row{e,
                m,
                T,
                r["fwd_ms"],
                r["fwdbwd_ms"],
                (r["hwm_kib"] - base_kib) / 1024.0,
                r["fwd_min_ms"],
                r["fwdbwd_min_ms"],
                r["fwd_cpu_ms"],
                r["fwdbwd_cpu_ms"]};
        std::fprintf(stderr,
                     "%-6s T=%-5ld %-14s fwd %9.2f ms (%d reps)  fwd+bwd %9.2f ms (%d reps)"
                     "  peak %8.1f MiB (%.1f after the timing loops)\n",
                     e.c_str(), long(T), m.c_str(), row.fwd_ms, int(r["fwd_reps"]), row.fwdbwd_ms,
                     int(r["fwdbwd_reps"]), row.peak_mib, (r["hwm_end_kib"] - base_kib) / 1024.0);
        rows.push_back(row);
      }
    }

  // 3. Tables.
  auto find = [&](const std::string &e, int64_t T, const std::string &m) -> const Row * {
    for (const auto &r : rows)
      if (r.enc == e && r.T == T && r.method == m) return &r;
    return nullptr;
  };
  std::vector<std::string> others;  // the LibTorch methods, compared with APE
  for (const auto &m : opt.methods)
    if (m != "ape") others.push_back(m);
  const bool have_ape =
      std::find(opt.methods.begin(), opt.methods.end(), "ape") != opt.methods.end();
  const std::string rule(84, '-');
  std::printf(
      "\nAPE vs LibTorch materialised attention, fp32, causal, B=%ld H=%ld D=%ld, %d threads\n",
      long(opt.B), long(opt.H), long(opt.D), opt.threads);
  std::printf("load average (1, 5, 15 min) at start: %s, at end: %s\n", load_start.c_str(),
              loadavg().c_str());
  std::printf("environment:");
  for (const char *v : {"OMP_NUM_THREADS", "OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS",
                        "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "MALLOC_MMAP_MAX_"})
    if (const char *x = std::getenv(v)) std::printf(" %s=%s", v, x);
  std::printf("\n");
  std::printf(
      "time: median ms (effective GFLOP/s: fwd = 4*T^2*D*B*H/2, fwd+bwd = 3.5x fwd); "
      "peak: MiB above the inputs-only baseline\n");
  std::printf(
      "libtorch-tuned: the same LibTorch code, glibc malloc kept from returning memory to the OS "
      "and\nsleeping idle OpenMP threads (%s)\n\n",
      tuned_env_text().c_str());
  std::printf("%-6s %5s | %-16s %20s %22s %10s\n", "enc", "T", "method", "fwd ms (GF/s)",
              "fwd+bwd ms (GF/s)", "peak MiB");
  std::printf("%s\n", rule.c_str());
  for (const auto &e : opt.encodings)
    for (int64_t T : opt.lengths) {
      const double ff = fwd_flops(opt, T), fbf = 3.5 * ff;
      for (const auto &m : opt.methods) {
        const Row *r = find(e, T, m);
        std::printf("%-6s %5ld | %-16s %10.2f (%6.1f) %12.2f (%6.1f) %10.1f\n", e.c_str(), long(T),
                    m.c_str(), r->fwd_ms, gflops(ff, r->fwd_ms), r->fwdbwd_ms,
                    gflops(fbf, r->fwdbwd_ms), r->peak_mib);
      }
      const Row *a = find(e, T, "ape");
      for (const auto &m : others) {
        const Row *l = find(e, T, m);
        if (!a || !l) continue;
        const std::string label = m == "libtorch" ? "speed-up" : "speed-up (tuned)";
        std::printf("%-6s %5ld | %-16s %19sx %21sx %9sx\n", "", long(T), label.c_str(),
                    fmtd("%.2f", l->fwd_ms / a->fwd_ms).c_str(),
                    fmtd("%.2f", l->fwdbwd_ms / a->fwdbwd_ms).c_str(),
                    fmtd("%.1f", l->peak_mib / std::max(a->peak_mib, 0.1)).c_str());
      }
    }
  std::printf(
      "(speed-up = LibTorch time / APE time, > 1: APE faster; in the peak column: LibTorch peak / "
      "APE peak)\n");

  // fwd+bwd best-of-N and CPU time: less sensitive to other load on the machine than the median.
  if (have_ape && !others.empty()) {
    std::printf(
        "\nfwd+bwd, less sensitive to other processes than the median wall time: best of N (min) "
        "wall ms,\nmedian CPU ms of one repetition (user + sys, all threads), and LibTorch / APE "
        "ratios of both\n\n");
    std::printf("%-6s %5s | %16s", "enc", "T", "ape min / CPU");
    for (const auto &m : others) std::printf(" | %-30s", (m + " min / CPU (ratios)").c_str());
    std::printf("\n%s\n", rule.c_str());
    for (const auto &e : opt.encodings)
      for (int64_t T : opt.lengths) {
        const Row *a = find(e, T, "ape");
        std::printf("%-6s %5ld | %7.2f %8.2f", e.c_str(), long(T), a->fwdbwd_min_ms,
                    a->fwdbwd_cpu_ms);
        for (const auto &m : others) {
          const Row *l = find(e, T, m);
          std::printf(" | %7.2f %8.2f (%5.2fx %5.2fx)", l->fwdbwd_min_ms, l->fwdbwd_cpu_ms,
                      l->fwdbwd_min_ms / a->fwdbwd_min_ms, l->fwdbwd_cpu_ms / a->fwdbwd_cpu_ms);
        }
        std::printf("\n");
      }
  }

  // Memory growth: log2(peak(T2) / peak(T1)) / log2(T2 / T1) over the two largest lengths.
  if (opt.lengths.size() >= 2) {
    const int64_t T1 = opt.lengths[opt.lengths.size() - 2], T2 = opt.lengths.back();
    std::printf("\nmemory growth exponent between T=%ld and T=%ld (1 = linear, 2 = quadratic):\n",
                long(T1), long(T2));
    for (const auto &m : opt.methods) {
      std::printf("  %-16s", m.c_str());
      for (const auto &e : opt.encodings) {
        const Row *r1 = find(e, T1, m), *r2 = find(e, T2, m);
        const double x = std::log2(std::max(r2->peak_mib, 1e-3) / std::max(r1->peak_mib, 1e-3)) /
                         std::log2(double(T2) / double(T1));
        std::printf("  %s %.2f", e.c_str(), x);
      }
      std::printf("\n");
    }
  }

  // 4. CSV.
  if (!opt.csv.empty()) {
    std::ofstream f(opt.csv);
    if (!f) die("cannot write " + opt.csv);
    f << "encoding,T,method,fwd_ms,fwdbwd_ms,peak_mib,gflops\n";
    for (const auto &r : rows)
      f << r.enc << ',' << r.T << ',' << r.method << ',' << fmtd("%.4f", r.fwd_ms) << ','
        << fmtd("%.4f", r.fwdbwd_ms) << ',' << fmtd("%.2f", r.peak_mib) << ','
        << fmtd("%.2f", gflops(3.5 * fwd_flops(opt, r.T), r.fwdbwd_ms)) << '\n';
    std::fprintf(stderr, "wrote %s\n", opt.csv.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  Options opt;
  std::string one_mode, one_enc;
  int64_t one_T = 0;
  bool one = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + a);
      if (!*argv[i + 1]) die(a + ": the value is empty");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--csv") {
      opt.csv = next();
    } else if (a == "--quick") {
      opt.lengths = {256, 1024};
    } else if (a == "--T") {
      opt.lengths.clear();
      for (const auto &s : split(next(), ',')) opt.lengths.push_back(to_int(s));
    } else if (a == "--encodings") {
      opt.encodings = split(next(), ',');
    } else if (a == "--methods") {
      opt.methods = split(next(), ',');
      for (const auto &m : opt.methods)
        if (m != "ape" && m != "libtorch" && m != "libtorch-tuned")
          die("unknown method '" + m + "'");
    } else if (a == "--B") {
      opt.B = to_int(next());
    } else if (a == "--H") {
      opt.H = to_int(next());
    } else if (a == "--D") {
      opt.D = to_int(next());
    } else if (a == "--threads") {
      opt.threads = int(to_int(next()));
    } else if (a == "--min-reps") {
      opt.min_reps = int(to_int(next()));
    } else if (a == "--min-time") {
      opt.min_time = to_double(next());
    } else if (a == "--max-reps") {
      opt.max_reps = int(to_int(next()));
    } else if (a == "--tol") {
      opt.tol = to_double(next());
    } else if (a == "--seed") {
      opt.seed = uint64_t(to_int(next()));
    } else if (a == "--skip-check") {
      opt.check = false;
    } else if (a == "--one") {
      one = true;
      one_mode = next();
      one_enc = next();
      one_T = to_int(next());
    } else {
      std::fputs(kUsage, stderr);
      die("unknown argument '" + a + "'");
    }
  }
  if (opt.B < 1 || opt.H < 1 || opt.D < 2 || opt.D % 2 || opt.threads < 1 || opt.min_reps < 1 ||
      opt.max_reps < opt.min_reps || opt.lengths.empty() || opt.encodings.empty() ||
      opt.methods.empty())
    die("bad options (see --help)");
  for (int64_t T : opt.lengths)
    if (T < 1) die("T must be >= 1");
  if (one) return run_one(opt, one_mode, one_enc, one_T);
  // Children inherit the environment: the OpenMP runtime shared by APE and LibTorch gets the
  // thread count before it starts (torch::set_num_threads sets it again in each child).
  setenv("OMP_NUM_THREADS", std::to_string(opt.threads).c_str(), 1);
  return run_driver(opt);
}
