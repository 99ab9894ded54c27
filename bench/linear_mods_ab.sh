#!/usr/bin/env bash
# A/B of the linear q/k mod tables (docs/internals.md "Linear mods"): the RoPE kernel as apec
# emits it (kQModLinear/kKModLinear: coefficients tabulated once per call) against the same
# kernel with those two flags removed (the mod's pow/sin/cos per element and head), and NoPE, in
# one process, interleaved; fp32 forward and forward+backward, medians of 7.
#   bench/linear_mods_ab.sh BUILD [T] [THREADS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: bench/linear_mods_ab.sh BUILD [T] [THREADS]}
T=${2:-1024}
threads=${3:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/tools/apec" "$root/examples/encodings/rope.mlir" -o "$work" --emit=cpu
"$build/tools/apec" "$root/examples/encodings/nope.mlir" -o "$work" --emit=cpu
grep -v 'ModLinear = true' "$work/rope_cpu.cpp" |
  sed 's/APE_DEFINE_KERNEL_ENTRY(rope,/APE_DEFINE_KERNEL_ENTRY(rope_per_element,/' > "$work/old_cpu.cpp"
cat > "$work/main.cpp" <<'CPP'
#include "ape/cpu/kernel_entry.h"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
extern "C" const ape::KernelEntry *ape_kernel_entry_rope();
extern "C" const ape::KernelEntry *ape_kernel_entry_rope_per_element();
extern "C" const ape::KernelEntry *ape_kernel_entry_nope();
int main(int argc, char **argv) {
  const int64_t B = 1, H = 8, T = atoi(argv[1]), D = 64, n = B * H * T * D;
  std::vector<float> q(n), k(n), v(n), o(n), lse(B * H * T), dout(n), dq(n), dk(n), dv(n), o_ref;
  std::mt19937 g(1);
  std::normal_distribution<float> nd;
  for (auto *x : {&q, &k, &v, &dout}) for (auto &e : *x) e = nd(g);
  ape::AttnArgs<float> a{};
  a.B = B, a.H = H, a.T = T, a.D = D, a.q = q.data(), a.k = k.data(), a.v = v.data();
  a.o = o.data(), a.lse = lse.data(), a.scale = 0.125f, a.dout = dout.data();
  a.dq = dq.data(), a.dk = dk.data(), a.dv = dv.data();
  const ape::KernelEntry *e[3] = {ape_kernel_entry_rope_per_element(), ape_kernel_entry_rope(),
                                  ape_kernel_entry_nope()};
  const char *names[3] = {"rope, per element", "rope, linear table", "nope"};
  std::vector<double> f[3], fb[3];
  for (int rep = 0; rep < 7; ++rep)
    for (int w = 0; w < 3; ++w) {
      auto t0 = std::chrono::steady_clock::now();
      e[w]->forward_f32(a);
      auto t1 = std::chrono::steady_clock::now();
      e[w]->backward_f32(a);
      auto t2 = std::chrono::steady_clock::now();
      f[w].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      fb[w].push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
      if (rep == 0 && w == 0) o_ref = o;
      if (rep == 0 && w == 1) {
        double m = 0;
        for (int64_t i = 0; i < n; ++i) m = std::max(m, double(std::abs(o[i] - o_ref[i])));
        printf("max |o(table) - o(per element)| = %.3g\n", m);
      }
    }
  printf("| kernel | fwd ms | fwd+bwd ms |\n| --- | ---: | ---: |\n");
  for (int w = 0; w < 3; ++w) {
    std::sort(f[w].begin(), f[w].end()), std::sort(fb[w].begin(), fb[w].end());
    printf("| %s | %.1f | %.1f |\n", names[w], f[w][3], fb[w][3]);
  }
}
CPP
flags=(-O3 -DNDEBUG -fno-math-errno -fopenmp -std=gnu++17 -march=native -I"$root/kernels/include")
for u in rope_cpu old_cpu nope_cpu main; do c++ "${flags[@]}" -c "$work/$u.cpp" -o "$work/$u.o" & done
wait
c++ -fopenmp "$work"/*.o -o "$work/ab"
echo "B=1 H=8 T=$T D=64 fp32, $threads threads, $(c++ --version | head -1), load $(cut -d' ' -f1-3 /proc/loadavg)"
OMP_NUM_THREADS=$threads "$work/ab" "$T"
