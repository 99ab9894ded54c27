// The kernels of simt_planted.h, written as CUDA and compiled for the SIMT emulator (APE_SIMT,
// with the emulator's access instrumentation: test/cuda/cuda_tests.cmake).
#include "simt_planted.h"

#include "ape/cuda/common.cuh"
#include "ape/cuda/decode.h"
#include "ape/cuda/platform.cuh"

#include <algorithm>
#include <cstring>

namespace planted {
namespace {

using ape::cuda::launch;

template <class T> T *device_alloc(size_t n) {
  void *p = nullptr;
  return cudaMalloc(&p, n * sizeof(T)) == cudaSuccess ? static_cast<T *>(p) : nullptr;
}
template <class T> void to_host(std::vector<T> &out, const T *dev, size_t n) {
  out.resize(n);
  cudaMemcpy(out.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost);
}

// ---- races -------------------------------------------------------------------------------------------
__global__ void neighbour_kernel(int *out, bool sync) {
  APE_DYNAMIC_SMEM(smem);
  int *s = reinterpret_cast<int *>(smem);
  const int t = threadIdx.x, n = blockDim.x;
  s[t] = t;
  if (sync) __syncthreads();
  out[t] = s[(t + 1) % n];
}

// The same exchange ordered by a named barrier: of every thread of the block (mode 0, a block
// barrier under another id), of each half of it under its own id (1), or of every thread with the
// last warp arriving by bar.arrive (2: it runs on without waiting for the others' writes); of
// every thread, each half waiting in its own code (two roles), by the aligned bar.sync (3:
// undefined on a GPU) or by the unaligned barrier.sync (4).
__global__ void neighbour_named_kernel(int *out, int mode) {
  namespace ptx = ape::cuda::ptx;
  APE_DYNAMIC_SMEM(smem);
  int *s = reinterpret_cast<int *>(smem);
  const int t = threadIdx.x, n = blockDim.x;
  s[t] = t;
  if (mode == 1) ptx::bar_sync(1 + 2 * t / n, n / 2);
  else if (mode == 2 && t >= n - 32) ptx::bar_arrive(1, n);
  else if (mode == 3 && t < n / 2) ptx::bar_sync(1, n);
  else if (mode == 3) ptx::bar_sync(1, n);
  else if (mode == 4 && t < n / 2) ptx::bar_sync_unaligned(1, n);
  else if (mode == 4) ptx::bar_sync_unaligned(1, n);
  else ptx::bar_sync(1, n);
  out[t] = s[(t + 1) % n];
}

__global__ void read_then_overwrite_kernel(int *out) {
  APE_DYNAMIC_SMEM(smem);
  int *s = reinterpret_cast<int *>(smem);
  const int t = threadIdx.x, n = blockDim.x;
  s[t] = t;
  __syncthreads();
  out[t] = s[t];
  s[(t + 1) % n] = -t;  // thread t+1 may not have read its element yet
}

// ---- named barriers: two groups of 128 threads take turns ----------------------------------------
__global__ void turns_kernel(int *log, int rounds, bool start, bool balanced, int count) {
  namespace ptx = ape::cuda::ptx;
  const int c = static_cast<int>(threadIdx.x / 128);
  if (c == 0 && start) ptx::bar_arrive(1, count);
  for (int r = 0; r < rounds; ++r) {
    ptx::bar_sync(1 + c, count);
    if (threadIdx.x % 128 == 0) log[1 + atomicAdd(log, 1)] = c;
    if (c == 0 || r + 1 < rounds || !balanced) ptx::bar_arrive(1 + (1 - c), count);
  }
}

// ---- bounds -----------------------------------------------------------------------------------------
__global__ void tile_copy_kernel(const float *src, float *dst, int n, bool off_by_one) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (off_by_one ? i <= n : i < n) dst[i < n ? i : n - 1] = src[i];
}

__global__ void traffic_kernel(const float *src, float *dst, float *counter) {
  const int t = threadIdx.x;
  const ape::cuda::ptx::F4 v = ape::cuda::ptx::ld_cg_16(src + 4 * t);
  dst[t] = v.x + v.y + v.z + v.w;
  atomicAdd(counter, 1.f);
}

__global__ void shared_overflow_kernel(float *out) {
  APE_DYNAMIC_SMEM(smem);
  float *s = reinterpret_cast<float *>(smem);
  if (threadIdx.x == 0) {
    s[64] = 1.0f;  // 64 floats were asked for: this is one past the end
    out[0] = 1.0f;
  }
}

__global__ void static_reverse_kernel(const float *src, float *out, bool overflow) {
  APE_DYNAMIC_SMEM(dyn);
  APE_STATIC_SMEM(float, tile, 64);
  const int t = threadIdx.x;
  if (t == 0) reinterpret_cast<float *>(dyn)[0] = 0.f;
  tile[t] = src[t];
  __syncthreads();
  out[t] = tile[63 - t];
  if (overflow && t == 5) tile[64] = 1.f;
}

__global__ void uninitialised_kernel(float *out) {
  APE_DYNAMIC_SMEM(smem);
  float *s = reinterpret_cast<float *>(smem);
  if (threadIdx.x < 16) s[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x];  // threads 16..31 read what nobody wrote
}

__global__ void read_kernel(const float *src, float *dst) { dst[threadIdx.x] = src[threadIdx.x]; }

// ---- synchronisation ------------------------------------------------------------------------------------
__global__ void divergent_barrier_kernel(int *out) {
  if (threadIdx.x < 64) {
    __syncthreads();
    out[threadIdx.x] = 1;
  } else {
    __syncthreads();
    out[threadIdx.x] = 2;
  }
}

__global__ void exited_lane_kernel(int *out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x), 0);
}

__global__ void deadlock_kernel(int *out) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else if (threadIdx.x != 32) {
    out[threadIdx.x] = __shfl_sync(0xffffffffu, 1, 0);
  } else {
    __syncthreads();
  }
}

__global__ void atomics_kernel(int *out, bool plain_read) {
  APE_DYNAMIC_SMEM(smem);
  int *counter = reinterpret_cast<int *>(smem);
  if (threadIdx.x == 0) *counter = 0;
  __syncthreads();
  atomicAdd(counter, 1);
  if (plain_read && threadIdx.x == 7) out[1] = *counter;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = *counter;
}

// ---- cp.async -------------------------------------------------------------------------------------------
__global__ void async_kernel(const float *src, float *dst, int mode, int src_bytes) {
  APE_DYNAMIC_SMEM(smem);
  float *s = reinterpret_cast<float *>(smem);
  const int t = threadIdx.x;
  ape::cuda::ptx::cp_async_16(s + 4 * t, src + 4 * t, src_bytes);
  ape::cuda::ptx::cp_async_commit();
  if (mode == 1) dst[4 * t] = s[4 * t];  // before the wait
  if (mode == 2) return;                 // never waits
  ape::cuda::ptx::cp_async_wait<0>();
  __syncthreads();
  const int u = (t + 1) % blockDim.x;  // another thread's chunk: needs the barrier
  for (int e = 0; e < 4; ++e) dst[4 * u + e] = s[4 * u + e];
}

__global__ void big_shared_kernel(float *out) {
  APE_DYNAMIC_SMEM(smem);
  if (threadIdx.x == 0) {
    reinterpret_cast<float *>(smem)[0] = 2.0f;
    out[0] = reinterpret_cast<float *>(smem)[0];
  }
}

// ---- PTX layouts --------------------------------------------------------------------------------------
__global__ void ldmatrix_kernel(const uint16_t *m, uint32_t *regs, bool trans) {
  APE_DYNAMIC_SMEM(smem);
  uint16_t *s = reinterpret_cast<uint16_t *>(smem);
  const int lane = threadIdx.x;
  for (int e = lane; e < 4 * 64; e += 32) s[e] = m[e];
  __syncthreads();
  // Lane l gives the address of row l % 8 of matrix l / 8.
  const uint16_t *row = s + (lane / 8) * 64 + (lane % 8) * 8;
  uint32_t r[4];
  if (trans) ape::cuda::ptx::ldmatrix<4, true>(r, row);
  else ape::cuda::ptx::ldmatrix<4, false>(r, row);
  for (int k = 0; k < 4; ++k) regs[lane * 4 + k] = r[k];
}

// Each lane's registers regs[4 lane + k] into four 8 x 8 matrices of shared memory by stmatrix,
// then the matrices back to `m` (lane l gives the address of row l % 8 of matrix l / 8; with
// `misalign_lane` >= 0 that lane gives a row address 8 bytes off, not 16-byte aligned).
__global__ void stmatrix_kernel(const uint32_t *regs, uint16_t *m, bool trans, int misalign_lane) {
  APE_DYNAMIC_SMEM(smem);
  uint16_t *s = reinterpret_cast<uint16_t *>(smem);
  const int lane = threadIdx.x;
  for (int e = lane; e < 4 * 64 + 8; e += 32) s[e] = 0;
  __syncthreads();
  uint16_t *row = s + (lane / 8) * 64 + (lane % 8) * 8 + (lane == misalign_lane ? 4 : 0);
  uint32_t r[4];
  for (int k = 0; k < 4; ++k) r[k] = regs[lane * 4 + k];
  if (trans) ape::cuda::ptx::stmatrix_x4<true>(row, r);
  else ape::cuda::ptx::stmatrix_x4<false>(row, r);
  __syncthreads();
  for (int e = lane; e < 4 * 64; e += 32) m[e] = s[e];
}

__global__ void mma_kernel(const uint16_t *a, const uint16_t *b, const float *c, float *d,
                           bool wrong) {
  const int lane = threadIdx.x;
  const int g = wrong ? lane % 4 : lane / 4, t = wrong ? lane / 4 : lane % 4;
  const int gb = lane / 4, tb = lane % 4;
  auto pack = [](uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; };
  uint32_t ra[4], rb[2];
  ra[0] = pack(a[g * 16 + 2 * t], a[g * 16 + 2 * t + 1]);
  ra[1] = pack(a[(g + 8) * 16 + 2 * t], a[(g + 8) * 16 + 2 * t + 1]);
  ra[2] = pack(a[g * 16 + 2 * t + 8], a[g * 16 + 2 * t + 9]);
  ra[3] = pack(a[(g + 8) * 16 + 2 * t + 8], a[(g + 8) * 16 + 2 * t + 9]);
  rb[0] = pack(b[(2 * tb) * 8 + gb], b[(2 * tb + 1) * 8 + gb]);
  rb[1] = pack(b[(2 * tb + 8) * 8 + gb], b[(2 * tb + 9) * 8 + gb]);
  float rc[4] = {c[gb * 8 + 2 * tb], c[gb * 8 + 2 * tb + 1], c[(gb + 8) * 8 + 2 * tb],
                 c[(gb + 8) * 8 + 2 * tb + 1]};
  float rd[4];
  ape::cuda::ptx::mma_m16n8k16<__nv_bfloat16>(rd, ra, rb, rc);
  d[gb * 8 + 2 * tb] = rd[0], d[gb * 8 + 2 * tb + 1] = rd[1];
  d[(gb + 8) * 8 + 2 * tb] = rd[2], d[(gb + 8) * 8 + 2 * tb + 1] = rd[3];
}

__global__ void wmma_kernel(const __nv_bfloat16 *a, const __nv_bfloat16 *b, const float *c,
                            float *d) {
  namespace wmma = nvcuda::wmma;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::load_matrix_sync(acc, c, 16, wmma::mem_row_major);
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

// The canonical wgmma layouts of 16-bit elements in CUTLASS's form (cute GMMA::Layout_*_Atom,
// make_gmma_desc), in elements with T = 8 per 16 bytes and W = swizzle / 16 (1: interleaved):
//   K-major:   ((8, m), (T, 2)) : ((W T, SBO), (1, LBO or T))   interleaved: ((8, m), (T, 2)) : ((T, SBO), (1, LBO))
//   MN-major:  ((T, W, m), (8, k)) : ((1, T, LBO), (W T, SBO))  interleaved: ((T, m), (8, k)) : ((1, SBO), (T, LBO))
// then Swizzle<log2 W, 4, 3> on the byte address. The tiles here: K-major 8-row groups SBO apart
// (interleaved: the two k halves LBO = 128 bytes apart, groups SBO = 256); MN-major atoms of
// 8 k-rows of 8 W elements, the two k halves SBO apart and atom columns LBO apart.
struct WgLayout {
  int W;
  uint32_t lbo, sbo;  // bytes
};
__device__ uint32_t wg_offset(const WgLayout &l, bool mn_major, int x, int k) {
  uint32_t e;
  if (!mn_major)
    e = l.W == 1 ? (x % 8) * 8 + (x / 8) * (l.sbo / 2) + (k % 8) + (k / 8) * (l.lbo / 2)
                 : (x % 8) * 8 * l.W + (x / 8) * (l.sbo / 2) + (k % 8) + (k / 8) * 8;
  else
    e = l.W == 1 ? (x % 8) + (x / 8) * (l.sbo / 2) + (k % 8) * 8 + (k / 8) * (l.lbo / 2)
                 : (x % 8) + ((x / 8) % l.W) * 8 + (x / (8 * l.W)) * (l.lbo / 2) + (k % 8) * 8 * l.W +
                       (k / 8) * (l.sbo / 2);
  uint32_t byte = 2 * e;
  if (l.W > 1) byte ^= ((byte >> 7) & uint32_t(l.W - 1)) << 4;
  return byte;
}
WgLayout wg_layout(int swizzle, bool mn_major, int n) {
  const int W = swizzle / 16 > 0 ? swizzle / 16 : 1;
  if (W == 1) return mn_major ? WgLayout{1, uint32_t(n / 8) * 128, 128} : WgLayout{1, 128, 256};
  return mn_major ? WgLayout{W, uint32_t(2 * 8 * W * 16), uint32_t(8 * W * 16)}
                  : WgLayout{W, 16, uint32_t(8 * W * 16)};
}

template <int N>
__global__ void wgmma_kernel(const uint16_t *a, const uint16_t *b, float *d, int swizzle,
                             bool b_mn_major, bool a_regs, WgmmaMode mode) {
  namespace ptx = ape::cuda::ptx;
  APE_DYNAMIC_SMEM(smem);
  // A: up to 64 rows of 128 bytes (a K-major row holds a whole swizzle row); B after it.
  uint16_t *sA = reinterpret_cast<uint16_t *>(smem), *sB = sA + 64 * 64;
  const WgLayout la = wg_layout(swizzle, false, 64), lb = wg_layout(swizzle, b_mn_major, N);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  for (int e = tid; e < 64 * 16; e += 128) sA[wg_offset(la, false, e / 16, e % 16) / 2] = a[e];
  for (int e = tid; e < 16 * N; e += 128) sB[wg_offset(lb, b_mn_major, e % N, e / N) / 2] = b[e];
  ptx::fence_proxy_async();
  __syncthreads();
  const uint64_t da = ptx::smem_desc(ptx::smem_window_offset(sA), swizzle, la.lbo, la.sbo);
  const uint64_t db = ptx::smem_desc(ptx::smem_window_offset(sB), swizzle, lb.lbo, lb.sbo);
  auto pack = [](uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; };
  const int r0 = 16 * warp;
  const uint32_t ra[4] = {pack(a[(r0 + g) * 16 + 2 * t], a[(r0 + g) * 16 + 2 * t + 1]),
                          pack(a[(r0 + g + 8) * 16 + 2 * t], a[(r0 + g + 8) * 16 + 2 * t + 1]),
                          pack(a[(r0 + g) * 16 + 2 * t + 8], a[(r0 + g) * 16 + 2 * t + 9]),
                          pack(a[(r0 + g + 8) * 16 + 2 * t + 8], a[(r0 + g + 8) * 16 + 2 * t + 9])};
  float acc[N / 2];
  for (float &x : acc) x = -1.f;  // scale_d = 0: ignored
  ptx::wgmma_fence();
  if (b_mn_major) {
    if (a_regs) ptx::wgmma_rs<__nv_bfloat16, N, 1>(acc, ra, db, 0);
    else ptx::wgmma_ss<__nv_bfloat16, N, 1>(acc, da, db, 0);
  } else {
    if (a_regs) ptx::wgmma_rs<__nv_bfloat16, N, 0>(acc, ra, db, 0);
    else ptx::wgmma_ss<__nv_bfloat16, N, 0>(acc, da, db, 0);
  }
  ptx::wgmma_commit();
  float early[N / 2];
  for (int i = 0; i < N / 2; ++i) early[i] = acc[i];
  if (mode != WgmmaMode::NeverWait) ptx::wgmma_wait<0>();
  ptx::fence_regs(acc);
  for (int i = 0; i < N / 2; ++i) {
    const int r = r0 + g + 8 * ((i % 4) / 2), c = 8 * (i / 4) + 2 * t + i % 2;
    d[r * N + c] = mode == WgmmaMode::ReadBeforeWait ? early[i] : acc[i];
  }
}

__global__ void tma_kernel(const __grid_constant__ CUtensorMap map, int row0, int rows, bool arrive,
                           uint16_t *out) {
  namespace ptx = ape::cuda::ptx;
  APE_DYNAMIC_SMEM(smem);
  uint64_t *bar = reinterpret_cast<uint64_t *>(smem);
  uint16_t *tile = reinterpret_cast<uint16_t *>(smem + 1024);
  if (threadIdx.x == 0) {
    ptx::mbar_init(bar, 1);
    ptx::mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0 && arrive) {
    ptx::mbar_arrive_expect_tx(bar, 128u * static_cast<unsigned>(rows));
    ptx::tma_load_3d(tile, &map, 0, row0, 0, bar);
  }
  ptx::mbar_wait(bar, 0);
  for (int e = threadIdx.x; e < rows * 64; e += blockDim.x) {
    const int r = e / 64, c = e % 64;
    out[e] = tile[(r * 128 + (((c / 8) ^ (r % 8)) * 16) + (c % 8) * 2) / 2];
  }
}

// One bulk copy of 64 floats into shared memory (thread 0, mbarrier `full`), read by every thread
// of the block's two warps; `mode` picks how the readers are ordered after the copy (AsyncOrder).
__global__ void async_order_kernel(const float *src, int mode, float *out) {
  namespace ptx = ape::cuda::ptx;
  APE_DYNAMIC_SMEM(smem);
  uint64_t *full = reinterpret_cast<uint64_t *>(smem), *empty = full + 1;
  float *buf = reinterpret_cast<float *>(smem + 1024);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  if (tid == 0) {
    ptx::mbar_init(full, 1);
    ptx::mbar_init(empty, 32);
    ptx::mbar_init_fence();
  }
  __syncthreads();
  auto copy = [&](int half) {
    ptx::mbar_arrive_expect_tx(full, 256);
    ptx::bulk_copy(buf, src + 64 * half, 256, full);
  };
  if (tid == 0) copy(0);
  float v = 0.f;
  switch (mode) {
    case 0:  // every thread waits
      ptx::mbar_wait(full, 0);
      break;
    case 1:  // warp 1 passes a block barrier but never waits: the barrier does not order the copy
      __syncthreads();
      if (warp == 0) ptx::mbar_wait(full, 0);
      break;
    case 2:  // one lane of each warp waits; the warp's collective passes it on
      if (lane == 0) ptx::mbar_wait(full, 0);
      __syncwarp();
      break;
    case 3:  // warp 0 waits and arrives at a named barrier, where warp 1 waits
      if (warp == 0) {
        ptx::mbar_wait(full, 0);
        ptx::bar_arrive(1, 64);
      } else {
        ptx::bar_sync(1, 64);
      }
      break;
    case 4:  // a second copy into the same bytes before its thread waited for the first
    case 5:  // the same after the wait
      if (tid == 0) {
        if (mode == 5) ptx::mbar_wait(full, 0);
        copy(1);
      }
      ptx::mbar_wait(full, 1);
      break;
    case 6:  // warp 1 reads, then releases the buffer (mbarrier `empty`); thread 0 refills it after
    case 7:  // ... but warp 1 releases it before its wait for the copy and its read
      if (warp == 1) {
        if (mode == 7) ptx::mbar_arrive(empty);
        ptx::mbar_wait(full, 0);
        v = buf[lane];
        if (mode == 6) ptx::mbar_arrive(empty);
      }
      if (tid == 0) {
        ptx::mbar_wait(empty, 0);
        copy(1);
      }
      ptx::mbar_wait(full, 1);
      break;
    case 8:  // warp 1 waits for the copy and releases the buffer, then reads it: the refill may land first
      if (warp == 1) {
        ptx::mbar_wait(full, 0);
        ptx::mbar_arrive(empty);
        v = buf[lane];
      }
      if (tid == 0) {
        ptx::mbar_wait(empty, 0);
        copy(1);
      }
      ptx::mbar_wait(full, 1);
      break;
  }
  out[tid] = v + buf[tid];
}

}  // namespace

int tma_box(const std::vector<uint16_t> &src, int T, int row0, int rows, bool arrive,
            std::vector<uint16_t> &out) {
  uint16_t *dsrc = device_alloc<uint16_t>(static_cast<size_t>(T) * 64);
  uint16_t *dout = device_alloc<uint16_t>(static_cast<size_t>(rows) * 64);
  cudaMemcpy(dsrc, src.data(), static_cast<size_t>(T) * 128, cudaMemcpyHostToDevice);
  CUtensorMap map;
  const uint64_t dims[3] = {64, static_cast<uint64_t>(T), 1};
  const uint64_t strides[2] = {128, 128 * static_cast<uint64_t>(T)};
  const uint32_t box[3] = {64, static_cast<uint32_t>(rows), 1};
  int err = ape::cuda::make_tensor_map_16(&map, dsrc, 3, dims, strides, box, 128);
  if (err == 0)
    err = launch(tma_kernel, 1, 64, 1024 + 128 * static_cast<size_t>(rows), nullptr, map, row0, rows,
                 arrive, dout);
  to_host(out, dout, static_cast<size_t>(rows) * 64);
  cudaFree(dsrc), cudaFree(dout);
  return err;
}

int async_order(int mode, std::vector<float> &out) {
  float *src = device_alloc<float>(128), *dout = device_alloc<float>(64);
  std::vector<float> host(128);
  for (int i = 0; i < 128; ++i) host[static_cast<size_t>(i)] = static_cast<float>(i);
  cudaMemcpy(src, host.data(), 128 * sizeof(float), cudaMemcpyHostToDevice);
  const int err = launch(async_order_kernel, 1, 64, 1024 + 256, nullptr, src, mode, dout);
  to_host(out, dout, 64);
  cudaFree(src), cudaFree(dout);
  return err;
}

int wgmma_64xnx16(const std::vector<uint16_t> &a, const std::vector<uint16_t> &b, int n,
                  int swizzle, bool b_mn_major, bool a_regs, WgmmaMode mode, std::vector<float> &d) {
  uint16_t *da = device_alloc<uint16_t>(64 * 16), *db = device_alloc<uint16_t>(16 * n);
  float *dd = device_alloc<float>(64 * n);
  cudaMemcpy(da, a.data(), 64 * 16 * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), 16 * n * 2, cudaMemcpyHostToDevice);
  const size_t smem = 64 * 128 + 128 * static_cast<size_t>(n);
  const int err = n == 64 ? launch(wgmma_kernel<64>, 1, 128, smem, nullptr,
                                   static_cast<const uint16_t *>(da), static_cast<const uint16_t *>(db),
                                   dd, swizzle, b_mn_major, a_regs, mode)
                          : launch(wgmma_kernel<128>, 1, 128, smem, nullptr,
                                   static_cast<const uint16_t *>(da), static_cast<const uint16_t *>(db),
                                   dd, swizzle, b_mn_major, a_regs, mode);
  to_host(d, dd, static_cast<size_t>(64 * n));
  cudaFree(da), cudaFree(db), cudaFree(dd);
  return err;
}

int named_barrier_turns(int rounds, bool start, bool balanced, int count, std::vector<int> &order) {
  int *d = device_alloc<int>(static_cast<size_t>(2 * rounds + 1));
  cudaMemset(d, 0, sizeof(int) * static_cast<size_t>(2 * rounds + 1));
  const int err = launch(turns_kernel, 1, 256, 0, nullptr, d, rounds, start, balanced, count);
  std::vector<int> all;
  to_host(all, d, static_cast<size_t>(2 * rounds + 1));
  order.assign(all.begin() + 1, all.begin() + 1 + std::min(all[0], 2 * rounds));
  cudaFree(d);
  return err;
}

int neighbour_exchange(int threads, bool sync, std::vector<int> &out) {
  int *d = device_alloc<int>(threads);
  const int err = launch(neighbour_kernel, 1, threads, threads * sizeof(int), nullptr, d, sync);
  to_host(out, d, threads);
  cudaFree(d);
  return err;
}

int neighbour_exchange_named(int threads, int mode, std::vector<int> &out) {
  int *d = device_alloc<int>(threads);
  const int err = launch(neighbour_named_kernel, 1, threads, threads * sizeof(int), nullptr, d, mode);
  to_host(out, d, threads);
  cudaFree(d);
  return err;
}

int read_then_overwrite(int threads) {
  int *d = device_alloc<int>(threads);
  const int err = launch(read_then_overwrite_kernel, 1, threads, threads * sizeof(int), nullptr, d);
  cudaFree(d);
  return err;
}

int tile_copy(int n, bool off_by_one, std::vector<float> &out) {
  float *src = device_alloc<float>(n), *dst = device_alloc<float>(n);
  std::vector<float> host(n);
  for (int i = 0; i < n; ++i) host[i] = static_cast<float>(i);
  cudaMemcpy(src, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  const int err = launch(tile_copy_kernel, (n + 63) / 64, 64, 0, nullptr, src, dst, n, off_by_one);
  to_host(out, dst, n);
  cudaFree(src), cudaFree(dst);
  return err;
}

int traffic(int threads, float &counter) {
  float *src = device_alloc<float>(4 * threads), *dst = device_alloc<float>(threads);
  float *count = device_alloc<float>(1);
  std::vector<float> host(4 * threads, 1.0f);
  cudaMemcpy(src, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemset(count, 0, sizeof(float));
  const int err = launch(traffic_kernel, 1, threads, 0, nullptr, static_cast<const float *>(src), dst, count);
  std::vector<float> out;
  to_host(out, count, 1);
  counter = out[0];
  cudaFree(src), cudaFree(dst), cudaFree(count);
  return err;
}

int shared_overflow() {
  float *d = device_alloc<float>(1);
  const int err = launch(shared_overflow_kernel, 1, 32, 64 * sizeof(float), nullptr, d);
  cudaFree(d);
  return err;
}

int static_shared_reverse(bool overflow, std::vector<float> &out) {
  float *src = device_alloc<float>(64), *dst = device_alloc<float>(64);
  std::vector<float> host(64);
  for (int i = 0; i < 64; ++i) host[i] = static_cast<float>(i);
  cudaMemcpy(src, host.data(), 64 * sizeof(float), cudaMemcpyHostToDevice);
  const int err = launch(static_reverse_kernel, 2, 64, 32, nullptr, static_cast<const float *>(src),
                         dst, overflow);
  to_host(out, dst, 64);
  cudaFree(src), cudaFree(dst);
  return err;
}

int uninitialised_shared_read() {
  float *d = device_alloc<float>(32);
  const int err = launch(uninitialised_kernel, 1, 32, 32 * sizeof(float), nullptr, d);
  cudaFree(d);
  return err;
}

int use_after_free() {
  float *src = device_alloc<float>(32), *dst = device_alloc<float>(32);
  cudaMemset(src, 0, 32 * sizeof(float));
  cudaFree(src);
  const int err = launch(read_kernel, 1, 32, 0, nullptr, static_cast<const float *>(src), dst);
  cudaFree(dst);
  return err;
}

int divergent_barriers() {
  int *d = device_alloc<int>(128);
  const int err = launch(divergent_barrier_kernel, 1, 128, 0, nullptr, d);
  cudaFree(d);
  return err;
}

int shuffle_with_exited_lane() {
  int *d = device_alloc<int>(32);
  const int err = launch(exited_lane_kernel, 1, 32, 0, nullptr, d);
  cudaFree(d);
  return err;
}

int deadlock() {
  int *d = device_alloc<int>(64);
  const int err = launch(deadlock_kernel, 1, 64, 0, nullptr, d);
  cudaFree(d);
  return err;
}

int shared_atomics(bool plain_read, int &total) {
  int *d = device_alloc<int>(2);
  const int err = launch(atomics_kernel, 1, 128, sizeof(int), nullptr, d, plain_read);
  cudaMemcpy(&total, d, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d);
  return err;
}

int async_copy(AsyncMode mode, int src_bytes, std::vector<float> &out) {
  const int threads = 32, n = 4 * threads;
  float *src = device_alloc<float>(n), *dst = device_alloc<float>(n);
  std::vector<float> host(n);
  for (int i = 0; i < n; ++i) host[i] = 1.0f + static_cast<float>(i);
  cudaMemcpy(src, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemset(dst, 0, n * sizeof(float));
  const int err = launch(async_kernel, 1, threads, n * sizeof(float), nullptr,
                         static_cast<const float *>(src), dst, static_cast<int>(mode), src_bytes);
  to_host(out, dst, n);
  cudaFree(src), cudaFree(dst);
  return err;
}

int big_shared(int bytes, bool set_attribute) {
  float *d = device_alloc<float>(1);
  int err = 0;
  if (set_attribute)
    err = cudaFuncSetAttribute(big_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == 0) err = launch(big_shared_kernel, 1, 32, static_cast<size_t>(bytes), nullptr, d);
  cudaFree(d);
  return err;
}

int big_shared_occupancy(int threads, int bytes, int &blocks) {
  if (bytes > 48 * 1024)
    (void)cudaFuncSetAttribute(big_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, big_shared_kernel, threads, static_cast<size_t>(bytes));
}

int memcpy_2d(std::vector<unsigned char> &host, std::vector<unsigned char> &back, std::vector<int> &codes) {
  host.resize(7 * 40);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<unsigned char>(i * 7 + 1);
  back.assign(5 * 64, 0xEE);
  unsigned char *src = device_alloc<unsigned char>(host.size()), *dst = device_alloc<unsigned char>(back.size());
  cudaMemcpy(src, host.data(), host.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dst, back.data(), back.size(), cudaMemcpyHostToDevice);
  const int err = cudaMemcpy2DAsync(dst + 8, 64, src + 40 + 3, 40, 24, 5, cudaMemcpyDeviceToDevice);
  to_host(back, dst, back.size());
  codes = {cudaMemcpy2DAsync(dst, 16, src, 40, 24, 2, cudaMemcpyDeviceToDevice),
           cudaMemcpy2DAsync(dst, 64, src, 16, 24, 2, cudaMemcpyDeviceToDevice),
           cudaMemcpy2DAsync(dst, 64, src, 40, 24, 8, cudaMemcpyDeviceToDevice)};
  cudaGetLastError();
  cudaFree(src), cudaFree(dst);
  return err;
}

int decode_copy_rows(int64_t S, size_t max_pitch, std::vector<unsigned char> &src,
                     std::vector<unsigned char> &dst) {
  constexpr size_t W = 12;
  src.resize(static_cast<size_t>(S) * 5 * W);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 5 + 3);
  dst.assign(static_cast<size_t>(S) * 7 * W, 0xEE);
  unsigned char *ds = device_alloc<unsigned char>(src.size()), *dd = device_alloc<unsigned char>(dst.size());
  cudaMemcpy(ds, src.data(), src.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dd, dst.data(), dst.size(), cudaMemcpyHostToDevice);
  const int err = ape::cuda::decode_detail::copy_rows(dd, 7, 2, ds, 5, 3, S, W, nullptr, max_pitch);
  to_host(dst, dd, dst.size());
  cudaFree(ds), cudaFree(dd);
  return err;
}

int host_reads_device() {
  float *d = device_alloc<float>(4);
  cudaMemset(d, 0, 4 * sizeof(float));
  volatile float x = d[2];  // a device pointer dereferenced on the host
  (void)x;
  cudaFree(d);
  return 0;
}

int ldmatrix_x4(const std::vector<uint16_t> &m, bool trans, std::vector<uint32_t> &regs) {
  uint16_t *dm = device_alloc<uint16_t>(256);
  uint32_t *dr = device_alloc<uint32_t>(128);
  cudaMemcpy(dm, m.data(), 256 * sizeof(uint16_t), cudaMemcpyHostToDevice);
  const int err = launch(ldmatrix_kernel, 1, 32, 256 * sizeof(uint16_t), nullptr,
                         static_cast<const uint16_t *>(dm), dr, trans);
  to_host(regs, dr, 128);
  cudaFree(dm), cudaFree(dr);
  return err;
}

int stmatrix_x4(const std::vector<uint32_t> &regs, bool trans, std::vector<uint16_t> &m,
                int misalign_lane) {
  uint32_t *dr = device_alloc<uint32_t>(128);
  uint16_t *dm = device_alloc<uint16_t>(256);
  cudaMemcpy(dr, regs.data(), 128 * sizeof(uint32_t), cudaMemcpyHostToDevice);
  const int err = launch(stmatrix_kernel, 1, 32, (256 + 8) * sizeof(uint16_t), nullptr,
                         static_cast<const uint32_t *>(dr), dm, trans, misalign_lane);
  to_host(m, dm, 256);
  cudaFree(dm), cudaFree(dr);
  return err;
}

int mma_16x8x16(const std::vector<uint16_t> &a, const std::vector<uint16_t> &b,
                const std::vector<float> &c, bool wrong_lanes, std::vector<float> &d) {
  uint16_t *da = device_alloc<uint16_t>(256), *db = device_alloc<uint16_t>(128);
  float *dc = device_alloc<float>(128), *dd = device_alloc<float>(128);
  cudaMemcpy(da, a.data(), 256 * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), 128 * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dc, c.data(), 128 * 4, cudaMemcpyHostToDevice);
  const int err = launch(mma_kernel, 1, 32, 0, nullptr, static_cast<const uint16_t *>(da),
                         static_cast<const uint16_t *>(db), static_cast<const float *>(dc), dd,
                         wrong_lanes);
  to_host(d, dd, 128);
  cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd);
  return err;
}

int wmma_16x16x16(const std::vector<uint16_t> &a, const std::vector<uint16_t> &b,
                  const std::vector<float> &c, std::vector<float> &d) {
  uint16_t *da = device_alloc<uint16_t>(256), *db = device_alloc<uint16_t>(256);
  float *dc = device_alloc<float>(256), *dd = device_alloc<float>(256);
  cudaMemcpy(da, a.data(), 256 * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), 256 * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dc, c.data(), 256 * 4, cudaMemcpyHostToDevice);
  const int err = launch(wmma_kernel, 1, 32, 0, nullptr, reinterpret_cast<const __nv_bfloat16 *>(da),
                         reinterpret_cast<const __nv_bfloat16 *>(db), static_cast<const float *>(dc),
                         dd);
  to_host(d, dd, 256);
  cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd);
  return err;
}

// ---- the token program's scan (a kernel of the project's, cuda/common.cuh) -------------------------
template <bool kReverse> __global__ void token_scan_kernel(const float *src, float *dst, int64_t n) {
  ape::cuda::detail::tok_block_scan<kReverse>(src, dst, n);
}
__global__ void token_scan_from_kernel(const float *src, float *dst, int64_t n, int64_t from, double *carry) {
  ape::cuda::detail::tok_block_scan<false>(src, dst, n, from, carry);
}

int token_scan(int threads, bool reverse, const std::vector<float> &src, std::vector<float> &dst) {
  const int64_t n = static_cast<int64_t>(src.size());
  float *ds = device_alloc<float>(src.size() + 1), *dd = device_alloc<float>(src.size() + 1);
  cudaMemcpy(ds, src.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dd, dst.data(), n * 4, cudaMemcpyHostToDevice);
  const int err = reverse ? launch(token_scan_kernel<true>, 1, threads, 0, nullptr, static_cast<const float *>(ds), dd, n)
                          : launch(token_scan_kernel<false>, 1, threads, 0, nullptr, static_cast<const float *>(ds), dd, n);
  to_host(dst, dd, n);
  cudaFree(ds), cudaFree(dd);
  return err;
}

int token_scan_from(int threads, const std::vector<float> &src, std::vector<float> &dst, int64_t from,
                    double (&carry)[2]) {
  const int64_t n = static_cast<int64_t>(src.size());
  float *ds = device_alloc<float>(src.size() + 1), *dd = device_alloc<float>(src.size() + 1);
  double *dc = device_alloc<double>(2);
  cudaMemcpy(ds, src.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dd, dst.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dc, carry, 16, cudaMemcpyHostToDevice);
  const int err = launch(token_scan_from_kernel, 1, threads, 0, nullptr, static_cast<const float *>(ds), dd, n, from, dc);
  to_host(dst, dd, n);
  cudaMemcpy(carry, dc, 16, cudaMemcpyDeviceToHost);
  cudaFree(ds), cudaFree(dd), cudaFree(dc);
  return err;
}

uint16_t to_bf16(float x) { return __float2bfloat16_rn(x).__x; }
uint16_t to_f16(float x) { return __float2half_rn(x).__x; }
float from_f16(uint16_t h) {
  __half v;
  v.__x = h;
  return __half2float(v);
}

}  // namespace planted
