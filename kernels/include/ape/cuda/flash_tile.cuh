// Register-level tile primitives of the FlashAttention-2-class CUDA kernels (cuda/attention.cuh):
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

#include "ape/cuda/platform.cuh"

#include <cstdint>

namespace ape::cuda {
APE_CUDA_ABI_BEGIN
namespace flash {

// ---- a tile of R rows x D columns of 16-bit values in shared memory ----------------------------------
// Rows are D elements long; the 16-byte chunks of a row are permuted by XOR with a phase that
// changes every 128 bytes of rows, so that the 8 row addresses of an ldmatrix (same logical
// column, 8 consecutive rows) fall in 8 different bank groups: conflict-free for D = 32, 64, 128.
// Tiles start at a multiple of 2 D bytes (the dynamic shared memory is 1024-byte aligned).
template <int D> struct Swizzle {
  static_assert(D == 32 || D == 64 || D == 128, "rows of 32, 64 or 128 elements");
  static constexpr int kChunks = D / 8;                     // 16-byte chunks per row
  static constexpr int kRowsPerLine = kChunks >= 8 ? 1 : 8 / kChunks;  // rows per 128 bytes
  static constexpr int kPhases = kChunks >= 8 ? 8 : kChunks;
  __device__ static int phase(int r) { return (r / kRowsPerLine) & (kPhases - 1); }  // period 8
  __device__ static int offset(int r, int c) {  // element offset of (row, column)
    return r * D + (((c >> 3) ^ phase(r)) << 3) + (c & 7);
  }
};

// Rows [row0, row0 + R) of a (T, D) matrix in global memory into a swizzled tile, 16 bytes per
// cp.async; rows >= T, and the tile's first `skip` rows, are zero-filled without reading. Each
// thread copies the same chunk of every (kThreads / kChunks)-th row, so its shared and global
// addresses step by immediates. The caller commits and waits.
template <int R, int D, int kThreads, class In>
__device__ inline void load_tile_async(In *tile, const In *g, int64_t row0, int64_t T, int skip = 0) {
  static_assert(sizeof(In) == 2, "16-bit inputs");
  constexpr int kChunks = D / 8, kRowStep = kThreads / kChunks, kSteps = R / kRowStep;
  static_assert(kThreads % kChunks == 0 && R % kRowStep == 0 && kRowStep % 8 == 0,
                "whole rows per step, a multiple of the swizzle's period");
  const int tid = static_cast<int>(threadIdx.x), r = tid / kChunks, c = (tid % kChunks) * 8;
  const ptx::SmemAddr dst = ptx::smem_addr_of(tile) + 2 * Swizzle<D>::offset(r, c);
  const int rows = T - row0 < R ? static_cast<int>(T - row0) : R;  // rows that exist
  const In *src = g + (row0 + r) * D + c;
#pragma unroll
  for (int it = 0; it < kSteps; ++it) {
    const bool in = r + it * kRowStep < rows && r + it * kRowStep >= skip;
    // A missing row reads nothing (src-size 0), so its address is never dereferenced.
    ptx::cp_async_16_at(dst + 2 * D * kRowStep * it, src + D * kRowStep * it, in ? 16 : 0);
  }
}

// ---- fragment loads (one warp) ------------------------------------------------------------------------
// An ldmatrix.x4 reads four 8 x 8 matrices; lane l gives the row address of row l % 8 of matrix
// l / 8. For a fragment at (r0, c0) of a swizzled tile (r0 a multiple of 8, c0 of 16), lane l's
// row is r0 + rho, column c0 + 8 beta, and its byte address is
//     ((tile + 2 D rho + 16 (beta ^ phase(rho))) ^ 2 c0) + 2 D r0
// (the XOR touches only the chunk bits, as the tile is 2D-aligned): a lane base computed once,
// one LOP3 per column block and immediate offsets for row blocks.
//   kRowsByQuad:  rho = l % 8 + 8 (m % 2), beta = m / 2 (m = l / 8): A fragments of a [m][k]
//                 tile, and B fragments of a [k][n] tile by ldmatrix.trans (x4 = 2 n-tiles);
//   kColsByQuad:  rho = l % 8 + 8 (m / 2), beta = m % 2: B fragments of a [n][k] tile (x4 = 2
//                 n-tiles), and A fragments of a [k][m] tile by ldmatrix.trans.
enum Pattern { kRowsByQuad, kColsByQuad };
template <int D, Pattern kP>
__device__ inline ptx::SmemAddr lane_base(const void *tile) {
  const int l = static_cast<int>(threadIdx.x % 32), m = l / 8;
  const int rho = l % 8 + 8 * (kP == kRowsByQuad ? m % 2 : m / 2);
  const int beta = kP == kRowsByQuad ? m / 2 : m % 2;
  return ptx::smem_addr_of(tile) + 2 * D * rho + 16 * (beta ^ Swizzle<D>::phase(rho));
}
template <int D>
__device__ inline ptx::SmemAddr frag_at(ptx::SmemAddr lane, int r0, int c0) {
  return (lane ^ static_cast<ptx::SmemAddr>(2 * c0)) + static_cast<ptx::SmemAddr>(2 * D * r0);
}

// A fragment (16 x 16) at `at` = frag_at(lane_base<D, kRowsByQuad>(tile), r0, c0).
__device__ inline void ldsm_a(uint32_t (&a)[4], ptx::SmemAddr at) { ptx::ldmatrix_at<4>(a, at); }
// B fragments of two n-tiles (n0, n0 + 8) at k in [k0, k0 + 16) from a tile stored [n][k] (the
// keys of Q K^T): b[0..1] for n-tile n0, b[2..3] for n0 + 8; at = frag_at(lane_base<D,
// kColsByQuad>(tile), n0, k0).
__device__ inline void ldsm_b_nk(uint32_t (&b)[4], ptx::SmemAddr at) { ptx::ldmatrix_at<4>(b, at); }
// The same from a tile stored [k][n] (the values of P V), transposed by ldmatrix.trans;
// at = frag_at(lane_base<D, kRowsByQuad>(tile), k0, n0).
__device__ inline void ldsm_b_kn(uint32_t (&b)[4], ptx::SmemAddr at) {
  ptx::ldmatrix_at<4, true>(b, at);
}
// A fragment of rows [m0, m0 + 16), columns [k0, k0 + 16) of a matrix stored transposed, as a
// tile [k][m] (the dS of dQ = dS K, kept as dS^T): at = frag_at(lane_base<R, kColsByQuad>(tile),
// k0, m0).
__device__ inline void ldsm_a_t(uint32_t (&a)[4], ptx::SmemAddr at) {
  ptx::ldmatrix_at<4, true>(a, at);
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

// ---- the canonical layouts of wgmma's shared-memory operands (the Hopper kernels) ------------------
// Tiles are stored in the layout wgmma reads, which is the layout a TMA box with the same swizzle
// writes: 8-row groups of swizzle rows (128 bytes; 64 at D = 32) whose 16-byte chunks are
// XOR-permuted by the row, a box per 64 columns.
namespace hopper {
// Bytes per swizzle row of a tile of D 16-bit columns (the TMA boxes' and the descriptors' mode).
template <int D> constexpr int swizzle_bytes() { return 2 * D < 128 ? 2 * D : 128; }
// A matrix descriptor kept as its two words. The high word (stride offset, swizzle) is a constant
// of the tile's layout; the low word holds the start address >> 4 (bits 0-13) and the leading
// offset. Moving the operand by a multiple of 16 bytes adds to the low word alone: the block's
// shared window ends below 256 KiB, so the address field never carries into the leading offset.
// Built once per kernel, a descriptor then costs one uniform add per wgmma (the stage's offset,
// then each 16-deep step's, are constants of the loop), as CUTLASS's descriptor iterators do,
// instead of rebuilding the fields from an address every time.
struct Desc {
  uint32_t lo, hi;
  __device__ Desc plus(uint32_t bytes) const { return Desc{lo + (bytes >> 4), hi}; }
  __device__ uint64_t at(uint32_t bytes) const { return (uint64_t(hi) << 32) | (lo + (bytes >> 4)); }
};
__device__ inline Desc split(uint64_t d) { return Desc{uint32_t(d), uint32_t(d >> 32)}; }
// Canonical tiles of R rows at shared-window offset `base`, kAtomCols boxes of R rows each:
// K-major (the k of the product runs along the row: Q, K'), and MN-major (the k runs down the
// rows: V, whose columns are the product's n). step_*(kk): the byte offset of the 16-deep step kk.
template <int D> __device__ inline Desc desc_k(uint32_t base) {
  return split(ptx::smem_desc(base, swizzle_bytes<D>(), 16, 8 * swizzle_bytes<D>()));
}
template <int R, int D> constexpr uint32_t step_k(int kk) {
  constexpr int kSw = swizzle_bytes<D>();
  return uint32_t(32 * kk / kSw) * R * kSw + uint32_t(32 * kk % kSw);
}
template <int R, int D> __device__ inline Desc desc_mn(uint32_t base) {
  return split(ptx::smem_desc(base, swizzle_bytes<D>(), R * swizzle_bytes<D>(), 8 * swizzle_bytes<D>()));
}
template <int D> constexpr uint32_t step_mn(int kk) { return uint32_t(16 * kk) * swizzle_bytes<D>(); }
// Rows [row0, row0 + R) of a (T, D) matrix in global memory into such a tile (128-byte swizzle:
// D 64 or 128, a box of R rows per 64 columns; chunk c of row r at 16 (c ^ r % 8) in its row),
// 16 bytes per cp.async, rows >= T zero-filled without reading; at D = 64 the layout is
// flash::Swizzle<64>'s. The caller commits, waits, and fences the async proxy before a wgmma reads.
template <int R, int D, int kThreads, class In>
__device__ inline void load_tile_async(In *tile, const In *g, int64_t row0, int64_t T) {
  static_assert(sizeof(In) == 2 && (D == 64 || D == 128), "16-bit inputs, 128-byte rows");
  constexpr int kChunks = D / 8, kRowStep = kThreads / kChunks, kSteps = R / kRowStep;
  static_assert(kThreads % kChunks == 0 && R % kRowStep == 0 && kRowStep % 8 == 0,
                "whole rows per step, a multiple of the swizzle's period");
  const int tid = static_cast<int>(threadIdx.x), r = tid / kChunks, c = tid % kChunks;
  const ptx::SmemAddr dst = ptx::smem_addr_of(tile) + (c / 8) * R * 128 + r * 128 + 16 * ((c % 8) ^ (r % 8));
  const int rows = T - row0 < R ? static_cast<int>(T - row0) : R;
  const In *src = g + (row0 + r) * D + 8 * c;
#pragma unroll
  for (int it = 0; it < kSteps; ++it) {
    const bool in = r + it * kRowStep < rows;
    ptx::cp_async_16_at(dst + 128 * kRowStep * it, src + D * kRowStep * it, in ? 16 : 0);
  }
}
// The R-row tile at `tile` from rows row0.. of slice bh by TMA (the layout above; zeros past the
// map's rows), one box per 64 (32 at D = 32) columns, completing on `bar`.
template <int R, int D, class In>
__device__ inline void tma_tile(In *tile, const CUtensorMap *map, int64_t row0, int64_t bh, uint64_t *bar) {
  constexpr int kCols = swizzle_bytes<D>() / 2;
#pragma unroll
  for (int a = 0; a < D / kCols; ++a)
    ptx::tma_load_3d(tile + a * R * kCols, map, a * kCols, static_cast<int>(row0), static_cast<int>(bh), bar);
}
}  // namespace hopper

namespace detail {
// The TMA descriptors of the [B·H, T, D] tensors a kernel reads or adds to, by value
// (__grid_constant__): the Hopper forward's q', k', v; the flash backward's q' and dO, and its
// fp32 dQ' in boxes of 32 columns (its wgmma layout; the other layouts get them unset and use
// none).
struct HopperMaps {
  CUtensorMap q, k, v;
};
struct BwdMaps {
  CUtensorMap q, dout, dq;
};
}  // namespace detail
APE_CUDA_ABI_END
}  // namespace ape::cuda
