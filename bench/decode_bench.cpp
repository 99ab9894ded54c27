// ape-bench-decode: tokens/s of cached decoding (LanguageModel::forward_cached, docs/decoding.md)
// against recomputing the full forward over the whole sequence for every new token, at several
// context lengths. A randomly initialised model (the speed does not depend on the weights).
//
//   ape-bench-decode [--encodings rope,alibi,cable] [--lengths 256,1024,4096] [--new 32] [--batch 1]
//                    [--d-model 256 --layers 4 --heads 4 --kv-heads 0] [--threads 0] [--csv out.csv]
//                    [--device cpu|cuda[:N]] [--precision auto|f32|bf16|f16]
//
// Per (encoding, length L): prefill L - 1 tokens of each of `batch` sequences into a cache and run
// one untimed single-token step (the first launch of its kernels), then time `new` single-token
// steps (contexts L+1 .. L+new): cached tokens/s (batch tokens a step). Recompute: time forwards
// over L+1 tokens of each sequence (the work one new token costs without a cache), at least 3 and
// at least 1 s: recompute tokens/s.
// --threads 0 (the default): all hardware threads, and the cached steps take fewer as the tools'
// do (runtime/Threads.h, SmallWorkThreads); --threads N: N throughout.
// --device cuda: the model on the GPU (runtime/Decode.cpp's cache, the generated CUDA kernels; bf16
// autocast by default), each timing ending when the GPU is done. A one-token step there splits its
// keys over blocks where the slices alone leave SMs idle (CudaAttnArgs::num_splits);
// APE_CUDA_NUM_SPLITS=1 times it unsplit. --kv-heads N (0: --heads): grouped-query attention, each
// of N key heads read by heads / N query heads; on the GPU a one-token step of an encoding whose
// scores are scale q'·k' alone (NoPE, RoPE, xPos) packs each group's rows into one block
// (docs/decoding.md), APE_CUDA_PACK_GQA=0 times the flash kernels' rows instead.
#include <chrono>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "runtime/Device.h"
#include "runtime/Model.h"
#include "runtime/Threads.h"

namespace {
std::vector<std::string> split(const std::string &s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');) out.push_back(t);
  return out;
}
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int main(int argc, char **argv) {
  ape::prepare_threads(argv);
  std::string encodings = "nope,rope,rope_dynamic_ntk,alibi,cable,shaw", lengths = "256,1024,4096", csv;
  std::string device = "cpu", precision = "auto";
  int64_t n_new = 32, d_model = 256, layers = 4, heads = 4, kv_heads = 0, threads = 0, batch = 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) { std::cerr << a << " needs a value\n"; std::exit(2); }
      if (!*argv[i + 1]) { std::cerr << "ape-bench-decode: " << a << ": the value is empty\n"; std::exit(2); }
      return argv[++i];
    };
    if (a == "--encodings") encodings = next();
    else if (a == "--lengths") lengths = next();
    else if (a == "--new") n_new = std::stoll(next());
    else if (a == "--batch") batch = std::stoll(next());
    else if (a == "--d-model") d_model = std::stoll(next());
    else if (a == "--layers") layers = std::stoll(next());
    else if (a == "--heads") heads = std::stoll(next());
    else if (a == "--kv-heads") kv_heads = std::stoll(next());
    else if (a == "--threads") threads = std::stoll(next());
    else if (a == "--csv") csv = next();
    else if (a == "--device") device = next();
    else if (a == "--precision") precision = next();
    else { std::cerr << "unknown option " << a << " (see the top of bench/decode_bench.cpp)\n"; return 2; }
  }
  if (n_new < 1 || batch < 1) {
    std::cerr << (n_new < 1 ? "--new" : "--batch") << " must be at least 1\n";
    return 2;
  }
  ape::set_threads(threads);
  ape::ComputeDevice dev;
  try {
    dev = ape::choose_device(device, precision);
  } catch (const std::exception &e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  // The GPU's queued work done (a copy to the host waits for it); nothing on the CPU.
  auto done = [&](const at::Tensor &t) {
    if (dev.is_cuda()) (void)t.sum().item<float>();
  };
  std::ostringstream rows;
  rows << "encoding,length,cached_tok_s,recompute_tok_s,speedup,batch\n";
  std::cout << "d_model " << d_model << ", " << layers << " layers, " << heads << " heads"
            << (kv_heads > 0 ? " reading " + std::to_string(kv_heads) + " key/value heads" : std::string()) << ", "
            << dev.str() << ", " << n_new
            << " new tokens per length, batch " << batch << "\n\n"
            << std::left << std::setw(18) << "encoding" << std::right << std::setw(8) << "L" << std::setw(14)
            << "cached tok/s" << std::setw(16) << "recompute tok/s" << std::setw(10) << "speedup\n";
  for (const auto &enc : split(encodings)) {
    for (const auto &ls : split(lengths)) {
      const int64_t L = std::stoll(ls);
      if (L < 2) {
        std::cerr << "--lengths: each length must be at least 2 (got " << L << ")\n";
        return 2;
      }
      at::manual_seed(1);
      ape::ModelConfig mc;
      mc.encoding = enc, mc.vocab = 4096, mc.d_model = d_model, mc.layers = layers, mc.heads = heads;
      mc.kv_heads = kv_heads;
      ape::LanguageModel model(mc);
      try {
        model->place(dev, &std::cerr);
      } catch (const std::exception &e) {
        std::cerr << enc << ": " << e.what() << "\n";
        return 2;
      }
      model->eval();
      at::NoGradGuard ng;
      // The prefill of L - 1 tokens and one untimed one-token step (its kernels' first launch),
      // then n_new timed steps (contexts L + 1 .. L + n_new).
      at::Tensor tokens = at::randint(mc.vocab, {batch, L + n_new}, at::kLong);
      ape::KvCache cache(L + n_new);
      done(model->forward_cached(tokens.narrow(1, 0, L - 1), cache));
      done(model->forward_cached(tokens.narrow(1, L - 1, 1), cache));
      double t0 = now();
      at::Tensor last;
      for (int64_t s = 0; s < n_new; ++s) last = model->forward_cached(tokens.narrow(1, L + s, 1), cache);
      done(last);
      const double cached = double(n_new * batch) / (now() - t0);
      int64_t reps = 0;
      const at::Tensor window = tokens.narrow(1, 0, L + 1).to(dev.device);
      t0 = now();
      while (reps < 3 || now() - t0 < 1.0) {
        last = model->forward(window), ++reps;
        if (dev.is_cuda()) done(last);
      }
      const double recompute = double(reps * batch) / (now() - t0);
      std::cout << std::left << std::setw(18) << enc << std::right << std::setw(8) << L << std::fixed
                << std::setprecision(1) << std::setw(14) << cached << std::setw(16) << recompute
                << std::setw(9) << cached / recompute << "x\n";
      rows << enc << "," << L << "," << cached << "," << recompute << "," << cached / recompute << "," << batch << "\n";
    }
  }
  if (!csv.empty()) std::ofstream(csv) << rows.str();
  return 0;
}
