// Register-level tile primitives of the FlashAttention-2-class CUDA kernels (cuda_attention.cuh):
// swizzled shared-memory tiles filled by 16-byte cp.async, ldmatrix fragment loads and
// mma.sync.m16n8k16 on fragments, with 16-bit inputs (bf16 or f16) and fp32 accumulators.
//
// Fragment layouts (PTX ISA, mma.m16n8k16; g = lane / 4, t = lane % 4):
//   A (16 x 16) uint32_t a[4]: a[0] (g, 2t..2t+1), a[1] (g+8, 2t..), a[2] (g, 2t+8..), a[3] (g+8, 2t+8..)
//   B (16 x 8)  uint32_t b[2]: b[0] (k 2t..2t+1, n g), b[1] (k 2t+8.., n g)
//   C (16 x 8)  float c[4]:    c[0], c[1] (g, 2t), (g, 2t+1); c[2], c[3] (g+8, 2t), (g+8, 2t+1)
// An accumulator tile pair (n-tiles 2k, 2k+1) is an A fragment of the next product once packed
// to 16 bits: that is how P stays in registers for P V.
#pragma once

#include "cuda_platform.cuh"

#include <cstdint>

namespace ape::cuda {
APE_CUDA_ABI_BEGIN
namespace flash {

// ---- a tile of R rows x D columns of 16-bit values in shared memory ----------------------------------
// Rows are D elements long; the 16-byte chunks of a row are permuted by XOR with a phase that
// changes every 128 bytes of rows, so that the 8 row addresses of an ldmatrix (same logical
// column, 8 consecutive rows) fall in 8 different bank groups: conflict-free for D = 32, 64, 128.
template <int D> struct Swizzle {
  static_assert(D == 32 || D == 64 || D == 128, "head_dim 32, 64 or 128");
  static constexpr int kChunks = D / 8;                     // 16-byte chunks per row
  static constexpr int kRowsPerLine = kChunks >= 8 ? 1 : 8 / kChunks;  // rows per 128 bytes
  static constexpr int kPhases = kChunks >= 8 ? 8 : kChunks;
  __device__ static int offset(int r, int c) {  // element offset of (row, column)
    const int phase = (r / kRowsPerLine) & (kPhases - 1);
    return r * D + (((c >> 3) ^ phase) << 3) + (c & 7);
  }
};

// Rows [row0, row0 + R) of a (T, D) matrix in global memory into a swizzled tile, 16 bytes per
// cp.async; rows >= T are zero-filled without reading. The caller commits and waits.
template <int R, int D, int kThreads, class In>
__device__ inline void load_tile_async(In *tile, const In *g, int64_t row0, int64_t T) {
  static_assert(sizeof(In) == 2, "16-bit inputs");
  constexpr int kChunks = D / 8;
  for (int e = threadIdx.x; e < R * kChunks; e += kThreads) {
    const int r = e / kChunks, c = (e % kChunks) * 8;
    const int64_t src = row0 + r;
    const bool in = src < T;
    ptx::cp_async_16(tile + Swizzle<D>::offset(r, c), g + (in ? src : 0) * D + c, in ? 16 : 0);
  }
}

// ---- fragment loads (one warp) ------------------------------------------------------------------------
// A fragment: rows [r0, r0 + 16), columns [c0, c0 + 16) of a row-major tile.
template <int D, class In>
__device__ inline void ldsm_a(uint32_t (&a)[4], const In *tile, int r0, int c0) {
  const int l = static_cast<int>(threadIdx.x % 32), m = l / 8;
  ptx::ldmatrix<4>(a, tile + Swizzle<D>::offset(r0 + (l % 8) + 8 * (m % 2), c0 + 8 * (m / 2)));
}
// B fragments of two n-tiles (n0, n0 + 8) at k in [k0, k0 + 16) from a tile stored [n][k] (the
// keys of Q K^T): b[0..1] for n-tile n0, b[2..3] for n0 + 8.
template <int D, class In>
__device__ inline void ldsm_b_nk(uint32_t (&b)[4], const In *tile, int n0, int k0) {
  const int l = static_cast<int>(threadIdx.x % 32), m = l / 8;
  ptx::ldmatrix<4>(b, tile + Swizzle<D>::offset(n0 + (l % 8) + 8 * (m / 2), k0 + 8 * (m % 2)));
}
// The same from a tile stored [k][n] (the values of P V), transposed by ldmatrix.trans.
template <int D, class In>
__device__ inline void ldsm_b_kn(uint32_t (&b)[4], const In *tile, int k0, int n0) {
  const int l = static_cast<int>(threadIdx.x % 32), m = l / 8;
  ptx::ldmatrix<4, true>(b, tile + Swizzle<D>::offset(k0 + (l % 8) + 8 * (m % 2), n0 + 8 * (m / 2)));
}

// ---- products ---------------------------------------------------------------------------------------
template <class In>
__device__ inline void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t *b) {
  ptx::mma_m16n8k16<In>(c, a, b, c);
}

// Two fp32 values as one register of two 16-bit values (the lower index in the low half).
template <class In> __device__ inline uint32_t pack2(float lo, float hi);
template <> __device__ inline uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}
template <> __device__ inline uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

// A fragment of the accumulator pair (n-tiles 2k, 2k + 1) of one m16 tile, rounded to In.
template <class In>
__device__ inline void acc_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack2<In>(c0[0], c0[1]);
  a[1] = pack2<In>(c0[2], c0[3]);
  a[2] = pack2<In>(c1[0], c1[1]);
  a[3] = pack2<In>(c1[2], c1[3]);
}

// Sum and max over the 4 lanes of a quad (the lanes that hold one accumulator row).
__device__ inline float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ inline float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace flash
APE_CUDA_ABI_END
}  // namespace ape::cuda
