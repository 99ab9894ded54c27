// ape-cuda-traffic: the global-memory traffic of the CUDA kernels, counted by the SIMT emulator
// (bench/README.md, "GPU traffic without a GPU"; docs/cuda.md).
//
// For each encoding it runs one forward, one backward and one decode step of the emulated kernels (the sources
// nvcc compiles, built by the host compiler against the emulator, which sees every load, store
// and atomic of device memory) and reports per kernel: the bytes its threads read, wrote and
// updated atomically, their share of the pass, the bytes per FLOP of the attention, and the share
// moved by 16-byte accesses or async copies (cp.async, TMA); per pass: the total against the
// minimum (every input read once, every output written once) and the side kernels' share (every
// kernel but the attention kernel itself). The decode step (cuda/decode.h) is one new token at L =
// T over a cache of T - 1 (the device's choice of split; the prefill not counted); its minimum is
// the keys' and values' read, and the new row's q read and o written. These are the threads' requests, what the SMs ask of
// L2 (the kernels load through cp.async.cg / ld.cg, which skip L1), not DRAM bytes.
//
//   build/bench/ape-cuda-traffic [--encodings nope rope ...] [--B 1 --H 2 --T 256 --D 64]
//       [--kv-heads N] [--md FILE] [--csv FILE] [--check BASELINE.csv]
//
// --kv-heads N: grouped-query attention (CudaAttnArgs::kv_heads), k and v (dk, dv, the decode
// cache) of N heads, each read by H / N query heads; the minimum counts k, v, dk and dv of N heads.
//
// --check fails (exit 1) when a kernel moves more than 2% more bytes than in BASELINE (the same
// command's committed CSV), or a kernel appears that BASELINE does not have: the CI's guard
// against traffic regressions. The counts are exact and deterministic (one emulator worker).
#include <ape/contract/value_rules.h>
#include <ape/cuda/bwd_layouts.h>
#include <ape/cuda/kernel_entry.h>
#if __has_include(<ape/cuda/decode.h>)  // (bench/cuda_traffic_at.sh: a revision before it has no decode pass)
#include <ape/cuda/decode.h>
#define APE_TRAFFIC_DECODE 1
#endif
#include <ape/simt/runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ape::cuda {
APE_CUDA_ABI_BEGIN
const CudaKernelEntry *const *cuda_kernel_registry(size_t *count);
APE_CUDA_ABI_END
}  // namespace ape::cuda

namespace {

using ape::cuda::CudaAttnArgs;
using ape::cuda::CudaKernelEntry;
using ape::cuda::DType;

struct Options {
  std::vector<std::string> encodings = {"nope", "rope", "alibi", "t5", "cable", "xpos"};
  int64_t B = 1, H = 2, T = 256, D = 64;
  int64_t kv_heads = 0;  // 0: H (no groups)
  std::string md, csv, check;
};

[[noreturn]] void die(const std::string &msg) {
  std::fprintf(stderr, "ape-cuda-traffic: %s\n", msg.c_str());
  std::exit(2);
}

int64_t parse_int(const char *flag, const char *v) {
  char *end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  if (!*v || *end || x <= 0) die(std::string(flag) + " takes a positive integer, not '" + v + "'");
  return x;
}

Options parse(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char * {
      if (i + 1 >= argc) die(a + " needs a value");
      if (!*argv[i + 1]) die(a + ": the value is empty");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: ape-cuda-traffic [--encodings NAME...] [--B N] [--H N] [--T N] [--D 32|64|128]\n"
          "                        [--kv-heads N] [--md FILE] [--csv FILE] [--check BASELINE.csv]\n"
          "Global-memory bytes of each emulated CUDA kernel, forward, backward and a one-token decode\n"
          "step at L = T, bf16, causal.\n");
      std::exit(0);
    } else if (a == "--encodings") {
      o.encodings.clear();
      while (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) o.encodings.push_back(argv[++i]);
      if (o.encodings.empty()) die("--encodings needs at least one name");
      for (const std::string &e : o.encodings)
        if (e.empty()) die("--encodings: a name is empty");
    } else if (a == "--B") {
      o.B = parse_int("--B", value());
    } else if (a == "--H") {
      o.H = parse_int("--H", value());
    } else if (a == "--T") {
      o.T = parse_int("--T", value());
    } else if (a == "--D") {
      o.D = parse_int("--D", value());
    } else if (a == "--kv-heads") {
      o.kv_heads = parse_int("--kv-heads", value());
    } else if (a == "--md") {
      o.md = value();
    } else if (a == "--csv") {
      o.csv = value();
    } else if (a == "--check") {
      o.check = value();
    } else {
      die("unknown argument '" + a + "' (--help)");
    }
  }
  if (std::string why = ape_rules::check_kv_heads(o.kv_heads, o.H); !why.empty()) die("--kv-heads: " + why);
  return o;
}

// "void ape::cuda::detail::mod_backward_kernel<ape_gen_rope::Enc, __nv_bfloat16, true, 64>(...)"
// -> "mod_backward_kernel<true>": the kernel's name and its bool template arguments (q or k;
// the flash backward's layout, "flash_backward_kernel<wide>"; the flash forward's split,
// "flash_forward_kernel<split>").
std::string short_name(const std::string &full) {
  const size_t lt = full.find('<'), paren = full.find('(');
  const size_t end = std::min(lt, paren);
  std::string base = full.substr(0, end);
  const size_t colon = base.rfind("::");
  if (colon != std::string::npos) base = base.substr(colon + 2);
  const size_t space = base.rfind(' ');
  if (space != std::string::npos) base = base.substr(space + 1);
  if (lt != std::string::npos && lt < paren) {
    std::string args, cur;
    auto take_bool = [&] {  // a bool template argument (q or k) goes into the short name
      const bool t = cur == "true" || cur == " true", f = cur == "false" || cur == " false";
      if (t || f) args += (args.empty() ? "" : ",") + std::string(t ? "true" : "false");
      cur.clear();
    };
    int depth = 0;
    for (size_t i = lt + 1; i < full.size(); ++i) {
      const char c = full[i];
      if (c == '<') ++depth;
      if (c == '>' && depth-- == 0) {
        take_bool();
        break;
      }
      if (c == ',' && depth == 0) {
        take_bool();
        continue;
      }
      cur += c;
    }
    // The flash backward's last argument is its layout (BwdTiles; its name: cuda/bwd_layouts.h).
    if (base == "flash_backward_kernel") {
      const size_t gt = full.rfind('>', paren), comma = full.rfind(',', gt);
      const std::string last = comma == std::string::npos ? "" : full.substr(comma + 1, gt - comma - 1);
      const char *name = last.size() == 2 && last[0] == ' ' && last[1] >= '0' && last[1] <= '9'
                             ? ape::cuda::detail::bwd_layout_name(last[1] - '0')
                             : nullptr;
      if (name) args = name;
    }
    // The flash forward's bool is kSplit (the keys split over blocks): "flash_forward_kernel<split>".
    if (base == "flash_forward_kernel") args = args == "true" ? "split" : "";
    if (!args.empty()) base += "<" + args + ">";
  }
  return base;
}

// The attention kernels themselves; every other kernel of a pass is a side kernel.
bool is_main(const std::string &name) {
  return name.find("forward_kernel") != std::string::npos
             ? name != "token_forward_kernel" && name.rfind("mod_forward_kernel", 0) != 0
             : name.rfind("flash_backward_kernel", 0) == 0 || name == "dkdv_kernel" || name == "dq_kernel" ||
                   name == "packed_decode_kernel";
}

struct Row {
  std::string encoding, pass, kernel;
  size_t launches = 0, read = 0, written = 0, atomic = 0, wide = 0;
  size_t total() const { return read + written + atomic; }
};

// Device buffers of one call (emulated device memory; freed by the process's end).
template <class X> X *device(const std::vector<X> &host) {
  void *raw = nullptr;
  if (cudaMalloc(&raw, sizeof(X) * (host.empty() ? 1 : host.size())) != cudaSuccess) die("cudaMalloc failed");
  X *p = static_cast<X *>(raw);
  if (!host.empty() && cudaMemcpy(p, host.data(), sizeof(X) * host.size(), cudaMemcpyHostToDevice) != cudaSuccess)
    die("cudaMemcpy failed");
  return p;
}

std::vector<Row> take(const std::string &enc, const std::string &pass) {
  std::vector<Row> rows;
  for (const ape::simt::Traffic &t : ape::simt::take_traffic()) {
    const std::string name = short_name(t.kernel);
    Row *r = nullptr;
    for (Row &x : rows)
      if (x.kernel == name) r = &x;
    if (!r) {
      rows.push_back(Row{enc, pass, name});
      r = &rows.back();
    }
    r->launches += t.launches, r->read += t.read, r->written += t.written, r->atomic += t.atomic;
    r->wide += t.by_width[4] + t.by_width[5];
  }
  return rows;
}

std::vector<Row> measure(const CudaKernelEntry &e, const Options &o) {
  const int64_t n = o.B * o.H * o.T * o.D, bht = o.B * o.H * o.T;
  const int64_t KV = o.kv_heads > 0 ? o.kv_heads : o.H, n_kv = o.B * KV * o.T * o.D;
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  auto bf16 = [&](float scale, int64_t elems) {
    std::vector<__nv_bfloat16> x(static_cast<size_t>(elems));
    for (auto &v : x) v = __float2bfloat16_rn(scale * normal(rng));
    return x;
  };
  CudaAttnArgs a;
  a.B = o.B, a.H = o.H, a.T = o.T, a.D = o.D, a.dtype = DType::BF16, a.kv_heads = o.kv_heads;
  a.scale = 1.f / std::sqrt(static_cast<float>(o.D));
  a.q = device(bf16(1.f, n)), a.k = device(bf16(1.f, n_kv)), a.v = device(bf16(1.f, n_kv));
  a.o = device(std::vector<__nv_bfloat16>(static_cast<size_t>(n)));
  a.lse = device(std::vector<float>(static_cast<size_t>(bht)));
  std::vector<const float *> feats, params;
  std::vector<float *> dfeats, dparams;
  for (int f = 0; f < e.num_features; ++f) {
    std::vector<float> x(static_cast<size_t>(bht));
    for (auto &v : x) v = unit(rng);
    feats.push_back(device(x));
    dfeats.push_back(device(std::vector<float>(static_cast<size_t>(bht))));
  }
  for (int p = 0; p < e.num_params; ++p) {
    std::vector<float> x(static_cast<size_t>(e.param_numel(p, o.H, o.D)));
    for (auto &v : x) v = 0.1f * normal(rng);
    params.push_back(device(x));
    dparams.push_back(device(std::vector<float>(x.size())));
  }
  a.features = feats.data(), a.params = params.data();
  ape::simt::take_traffic();
  if (ape::cuda::forward(e, a) != cudaSuccess) die(std::string(e.name) + ": the forward failed");
  std::vector<Row> rows = take(e.name, "forward");
  a.dout = device(bf16(1.f, n));
  a.dq = device(std::vector<__nv_bfloat16>(static_cast<size_t>(n)));
  a.dk = device(std::vector<__nv_bfloat16>(static_cast<size_t>(n_kv)));
  a.dv = device(std::vector<__nv_bfloat16>(static_cast<size_t>(n_kv)));
  a.dfeatures = dfeats.data(), a.dparams = dparams.data();
  a.status = device(std::vector<uint32_t>(1));
  if (ape::cuda::backward(e, a) != cudaSuccess) die(std::string(e.name) + ": the backward failed");
  for (Row &r : take(e.name, "backward")) rows.push_back(r);
#ifdef APE_TRAFFIC_DECODE
  // Decode: a prefill of T - 1 tokens (not counted), then one token at L = T.
  ape::cuda::CudaDecodeCache cache;
  cache.capacity = o.T;
  for (const int64_t m : {o.T - 1, int64_t(1)}) {
    const size_t rows_n = static_cast<size_t>(o.B * o.H * m), elems = rows_n * static_cast<size_t>(o.D);
    auto part = [&](size_t count) {
      std::vector<__nv_bfloat16> x(count);
      for (auto &v : x) v = __float2bfloat16_rn(normal(rng));
      return device(x);
    };
    std::vector<const float *> dfeat;
    for (int f = 0; f < e.num_features; ++f) {
      std::vector<float> x(rows_n);
      for (auto &v : x) v = unit(rng);
      dfeat.push_back(device(x));
    }
    ape::cuda::CudaDecodeArgs d;
    d.B = o.B, d.H = o.H, d.n = m, d.D = o.D, d.dtype = DType::BF16, d.scale = a.scale;
    d.kv_heads = o.kv_heads;
    const size_t kv_elems = static_cast<size_t>(o.B * KV * m * o.D);
    d.q = part(elems), d.k = part(kv_elems), d.v = part(kv_elems);
    d.o = device(std::vector<__nv_bfloat16>(elems));
    d.lse = device(std::vector<float>(rows_n));
    d.features = dfeat.data(), d.params = params.data();
    ape::simt::take_traffic();
    if (ape::cuda::decode_step(e, cache, d) != cudaSuccess) die(std::string(e.name) + ": the decode step failed");
    if (cudaDeviceSynchronize() != cudaSuccess) die(std::string(e.name) + ": a decode kernel failed");
    if (m == 1)
      for (Row &r : take(e.name, "decode")) rows.push_back(r);
  }
#endif
  if (cudaDeviceSynchronize() != cudaSuccess) die(std::string(e.name) + ": a kernel failed");
  if (ape::simt::finding_count() > 0) die(std::string(e.name) + ": the emulator's checks found errors");
  return rows;
}

// FLOPs of the causal attention (FlashAttention's count: 4 B H D T(T+1)/2 forward, 2.5x that
// backward; a decode step's row: 4 B H D T) and the minimum bytes of a pass: bf16 q, k, v read and
// o written, lse (fp32) written; backward: q, k, v, o, dO and lse read, dq, dk, dv written; decode:
// k and v of T keys read, the new row's q read and o and lse written.
double flops(const Options &o, const std::string &pass) {
  if (pass == "decode") return 4.0 * o.B * o.H * o.D * o.T;
  const double f = 4.0 * o.B * o.H * o.D * (o.T * (o.T + 1) / 2.0);
  return pass == "backward" ? 2.5 * f : f;
}
double min_bytes(const Options &o, const std::string &pass) {
  const double KV = double(o.kv_heads > 0 ? o.kv_heads : o.H);
  const double n = double(o.B) * o.H * o.T * o.D, n_kv = double(o.B) * KV * o.T * o.D, bht = double(o.B) * o.H * o.T;
  if (pass == "decode") return 2 * 2 * n_kv + 2 * 2 * double(o.B) * o.H * o.D + 4.0 * o.B * o.H;
  return pass == "backward" ? 2 * (4 * n + 4 * n_kv) + 4 * bht : 2 * (2 * n + 2 * n_kv) + 4 * bht;
}

std::string fmt(const char *f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

}  // namespace

int main(int argc, char **argv) {
  const Options o = parse(argc, argv);
  if (o.D != 32 && o.D != 64 && o.D != 128) die("--D is 32, 64 or 128");
  size_t count = 0;
  const CudaKernelEntry *const *all = ape::cuda::cuda_kernel_registry(&count);
  std::vector<Row> rows;
  for (const std::string &name : o.encodings) {
    const CudaKernelEntry *e = nullptr;
    for (size_t i = 0; i < count; ++i)
      if (name == all[i]->name) e = all[i];
    if (!e) die("no CUDA kernels for encoding '" + name + "' in this build");
    if (!ape::cuda::find_variant(*e, DType::BF16, o.D))
      die("encoding '" + name + "' has no bf16 variant at head dim " + std::to_string(o.D) + " in this build");
    for (const Row &r : measure(*e, o)) rows.push_back(r);
  }

  // Per pass: totals, main kernel, side kernels.
  struct Pass {
    size_t total = 0, side = 0;
  };
  std::map<std::pair<std::string, std::string>, Pass> passes;
  for (const Row &r : rows) {
    Pass &p = passes[{r.encoding, r.pass}];
    p.total += r.total();
    if (!is_main(r.kernel)) p.side += r.total();
  }

  std::ostringstream md;
  md << "| encoding | pass | kernel | launches | read (KB) | written (KB) | atomic (KB) | share of pass | "
        "bytes / kFLOP | 16-byte or async |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const Row &r : rows) {
    const Pass &p = passes[{r.encoding, r.pass}];
    const double f = flops(o, r.pass);
    md << "| " << r.encoding << " | " << r.pass << " | " << r.kernel << " | " << r.launches << " | "
       << fmt("%.1f", r.read / 1024.0) << " | " << fmt("%.1f", r.written / 1024.0) << " | "
       << fmt("%.1f", r.atomic / 1024.0) << " | " << fmt("%.1f%%", 100.0 * r.total() / p.total) << " | "
       << fmt("%.2f", 1000.0 * r.total() / f) << " | "
       << fmt("%.0f%%", r.total() ? 100.0 * r.wide / r.total() : 0.0) << " |\n";
  }
  md << "\n| encoding | pass | bytes / kFLOP | total / minimum | side kernels' share |\n"
        "| --- | --- | --- | --- | --- |\n";
  for (const auto &[key, p] : passes) {
    md << "| " << key.first << " | " << key.second << " | " << fmt("%.2f", 1000.0 * p.total / flops(o, key.second))
       << " | " << fmt("%.2fx", p.total / min_bytes(o, key.second)) << " | "
       << fmt("%.1f%%", 100.0 * p.side / p.total) << " |\n";
  }
  const std::string groups = o.kv_heads > 0 ? ", kv_heads " + std::to_string(o.kv_heads) : "";
  std::printf("B %lld, H %lld%s, T %lld, D %lld, bf16, causal (emulated; bytes the threads request)\n\n%s",
              static_cast<long long>(o.B), static_cast<long long>(o.H), groups.c_str(),
              static_cast<long long>(o.T), static_cast<long long>(o.D), md.str().c_str());

  if (!o.md.empty()) {
    std::ofstream f(o.md);
    f << "B " << o.B << ", H " << o.H << groups << ", T " << o.T << ", D " << o.D << ", bf16, causal\n\n"
      << md.str();
    if (!f) die("cannot write " + o.md);
  }
  if (!o.csv.empty()) {
    std::ofstream f(o.csv);
    // (kv_heads last, and only with --kv-heads: the baselines of calls without groups keep 12 columns)
    f << "encoding,pass,kernel,launches,read,written,atomic,wide,B,H,T,D" << (o.kv_heads > 0 ? ",kv_heads" : "")
      << "\n";
    for (const Row &r : rows) {
      f << r.encoding << "," << r.pass << "," << r.kernel << "," << r.launches << "," << r.read << ","
        << r.written << "," << r.atomic << "," << r.wide << "," << o.B << "," << o.H << "," << o.T << "," << o.D;
      if (o.kv_heads > 0) f << "," << o.kv_heads;
      f << "\n";
    }
    if (!f) die("cannot write " + o.csv);
  }
  if (!o.check.empty()) {
    std::ifstream f(o.check);
    if (!f) die("cannot read the baseline " + o.check);
    std::string line;
    std::getline(f, line);  // header
    std::map<std::string, size_t> base;
    while (std::getline(f, line)) {
      std::vector<std::string> c;
      std::stringstream ss(line);
      for (std::string x; std::getline(ss, x, ',');) c.push_back(x);
      if (c.size() != 12 && c.size() != 13) die("malformed baseline line: " + line);
      try {
        if (std::stoll(c[8]) != o.B || std::stoll(c[9]) != o.H || std::stoll(c[10]) != o.T ||
            std::stoll(c[11]) != o.D || (c.size() == 13 ? std::stoll(c[12]) : 0) != o.kv_heads)
          die("the baseline was measured at another shape: rerun with its B, H, T, D and --kv-heads");
        base[c[0] + "/" + c[1] + "/" + c[2]] = std::stoull(c[4]) + std::stoull(c[5]) + std::stoull(c[6]);
      } catch (const std::logic_error &) {  // stoll / stoull on a field that is not a number
        die("malformed baseline line: " + line);
      }
    }
    int bad = 0;
    for (const Row &r : rows) {
      const std::string key = r.encoding + "/" + r.pass + "/" + r.kernel;
      auto it = base.find(key);
      if (it == base.end()) {
        std::fprintf(stderr, "REGRESSION %s: a kernel the baseline does not have (%zu bytes)\n", key.c_str(), r.total());
        ++bad;
      } else if (static_cast<double>(r.total()) > 1.02 * static_cast<double>(it->second)) {
        std::fprintf(stderr, "REGRESSION %s: %zu bytes, baseline %zu (+%.1f%%)\n", key.c_str(), r.total(),
                     it->second, 100.0 * (double(r.total()) / double(it->second) - 1));
        ++bad;
      }
    }
    if (bad) {
      std::fprintf(stderr,
                   "%d kernel(s) move more bytes than %s: fix them, or regenerate the baseline with the "
                   "same command and --csv if the change is intended (bench/README.md)\n",
                   bad, o.check.c_str());
      return 1;
    }
    std::printf("\nno kernel moves more than 2%% over the baseline %s\n", o.check.c_str());
  }
  return 0;
}
