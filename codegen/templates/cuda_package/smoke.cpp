// ape_cuda_smoke: runs every instantiated variant of every encoding in this package once
// (forward and backward, B = 2, H = 3, T = 77, random inputs) and checks that every output is
// finite. Exits 0 without a GPU (and says so). A smoke test, not a numerics test: the numerics
// suite is test/unit/cuda_kernels_test.cpp in the APE repository.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>

#include "ape/cuda/kernel_entry.h"  // (cuda_kernel_registry: written by CMakeLists.txt)

namespace {

using ape::cuda::CudaAttnArgs;
using ape::cuda::DType;

#define CHECK(call)                                                                    \
  do {                                                                                 \
    cudaError_t err_ = (call);                                                         \
    if (err_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,               \
                   cudaGetErrorString(err_));                                          \
      return false;                                                                    \
    }                                                                                  \
  } while (0)

// Host values -> device buffer of dtype t (f16/bf16 by rounding the fp32 bits; smoke only).
uint16_t to_half_bits(float x, DType t) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (t == DType::BF16) return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
  // f16: values here are small normals (|x| < 8), no overflow handling needed.
  const uint32_t sign = (u >> 16) & 0x8000;
  const int32_t exp = static_cast<int32_t>((u >> 23) & 0xFF) - 127 + 15;
  if (exp <= 0) return static_cast<uint16_t>(sign);
  return static_cast<uint16_t>(sign | (exp << 10) | ((u >> 13) & 0x3FF));
}
float from_half_bits(uint16_t h, DType t) {
  uint32_t u;
  if (t == DType::BF16) {
    u = static_cast<uint32_t>(h) << 16;
  } else {
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    u = exp == 0 ? sign : exp == 31 ? (sign | 0x7F800000u | (man << 13))
                                    : (sign | ((exp - 15 + 127) << 23) | (man << 13));
  }
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

struct Buffer {
  void *p = nullptr;
  ~Buffer() { cudaFree(p); }
};

bool upload(Buffer &b, const std::vector<float> &x, DType t) {
  const size_t es = t == DType::F32 ? 4 : 2;
  std::vector<unsigned char> bytes(x.size() * es);
  for (size_t e = 0; e < x.size(); ++e) {
    if (t == DType::F32) {
      std::memcpy(&bytes[e * 4], &x[e], 4);
    } else {
      const uint16_t h = to_half_bits(x[e], t);
      std::memcpy(&bytes[e * 2], &h, 2);
    }
  }
  CHECK(cudaMalloc(&b.p, bytes.size() + 1));
  CHECK(cudaMemcpy(b.p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  return true;
}

bool all_finite(const Buffer &b, size_t n, DType t, const char *what) {
  const size_t es = t == DType::F32 ? 4 : 2;
  std::vector<unsigned char> bytes(n * es);
  CHECK(cudaMemcpy(bytes.data(), b.p, bytes.size(), cudaMemcpyDeviceToHost));
  for (size_t e = 0; e < n; ++e) {
    float x;
    if (t == DType::F32) {
      std::memcpy(&x, &bytes[e * 4], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &bytes[e * 2], 2);
      x = from_half_bits(h, t);
    }
    if (!std::isfinite(x)) {
      std::fprintf(stderr, "  %s[%zu] = %g\n", what, e, x);
      return false;
    }
  }
  return true;
}

bool run_variant(const ape::cuda::CudaKernelEntry &e, const ape::cuda::CudaVariant &v) {
  const int64_t B = 2, H = 3, T = 77, D = v.head_dim, n = B * H * T * D, nt = B * H * T;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto randn = [&](size_t count, float sigma) {
    std::vector<float> x(count);
    for (auto &y : x) y = sigma * normal(rng);
    return x;
  };
  Buffer q, k, v_, o, dout, dq, dk, dv, lse;
  if (!upload(q, randn(n, 1), v.dtype) || !upload(k, randn(n, 1), v.dtype) ||
      !upload(v_, randn(n, 1), v.dtype) || !upload(dout, randn(n, 1), v.dtype) ||
      !upload(o, randn(n, 0), v.dtype) || !upload(dq, randn(n, 0), v.dtype) ||
      !upload(dk, randn(n, 0), v.dtype) || !upload(dv, randn(n, 0), v.dtype) ||
      !upload(lse, randn(nt, 0), DType::F32))
    return false;
  std::vector<Buffer> feats(e.num_features), dfeats(e.num_features), params(e.num_params),
      dparams(e.num_params);
  std::vector<const float *> fp, pp;
  std::vector<float *> dfp, dpp;
  for (int f = 0; f < e.num_features; ++f) {
    if (!upload(feats[f], randn(nt, 1), DType::F32) || !upload(dfeats[f], randn(nt, 0), DType::F32))
      return false;
    fp.push_back(static_cast<const float *>(feats[f].p));
    dfp.push_back(static_cast<float *>(dfeats[f].p));
  }
  for (int p = 0; p < e.num_params; ++p) {
    const size_t numel = static_cast<size_t>(e.param_numel(p, H, D));
    if (!upload(params[p], randn(numel, 0.02f), DType::F32) ||
        !upload(dparams[p], randn(numel, 0), DType::F32))
      return false;
    pp.push_back(static_cast<const float *>(params[p].p));
    dpp.push_back(static_cast<float *>(dparams[p].p));
  }
  CudaAttnArgs a;
  a.B = B, a.H = H, a.T = T, a.D = D, a.dtype = v.dtype;
  a.q = q.p, a.k = k.p, a.v = v_.p, a.o = o.p, a.lse = static_cast<float *>(lse.p);
  a.features = fp.data(), a.params = pp.data(), a.scale = 1.f / std::sqrt(float(D));
  a.dout = dout.p, a.dq = dq.p, a.dk = dk.p, a.dv = dv.p;
  a.dfeatures = dfp.data(), a.dparams = dpp.data();
  Buffer status;  // the backward's status word (cuda/kernel_entry.h), zeroed
  if (!upload(status, std::vector<float>(1, 0.f), DType::F32)) return false;
  a.status = static_cast<uint32_t *>(status.p);
  CHECK(v.forward(a));
  CHECK(v.backward(a));
  CHECK(cudaDeviceSynchronize());
  uint32_t st = 0;
  CHECK(cudaMemcpy(&st, status.p, sizeof st, cudaMemcpyDeviceToHost));
  if (st & ape::cuda::kStatusErrors) {
    std::printf("  status: %s\n", ape::cuda::status_message(st));
    return false;
  }
  bool ok = all_finite(o, n, v.dtype, "o") && all_finite(lse, nt, DType::F32, "lse") &&
            all_finite(dq, n, v.dtype, "dq") && all_finite(dk, n, v.dtype, "dk") &&
            all_finite(dv, n, v.dtype, "dv");
  for (int f = 0; f < e.num_features; ++f) ok = ok && all_finite(dfeats[f], nt, DType::F32, "dfeature");
  for (int p = 0; p < e.num_params; ++p)
    ok = ok && all_finite(dparams[p], static_cast<size_t>(e.param_numel(p, H, D)), DType::F32, "dparam");
  return ok;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("ape_cuda_smoke: no CUDA device, nothing run (SKIPPED)\n");
    return 0;
  }
  size_t count = 0;
  const ape::cuda::CudaKernelEntry *const *entries = ape::cuda::cuda_kernel_registry(&count);
  int failures = 0, runs = 0;
  for (size_t n = 0; n < count; ++n) {
    const auto &e = *entries[n];
    for (size_t k = 0; k < e.num_variants; ++k) {
      const auto &v = e.variants[k];
      const bool ok = run_variant(e, v);
      std::printf("%-20s %-4s hd%-3lld %s\n", e.name, ape::cuda::dtype_name(v.dtype),
                  static_cast<long long>(v.head_dim), ok ? "ok" : "FAILED");
      failures += !ok;
      ++runs;
    }
  }
  std::printf("ape_cuda_smoke: %d of %d variants ok\n", runs - failures, runs);
  return failures == 0 ? 0 : 1;
}
