// What CUDA kernel sources of the kernel layer include instead of the CUDA headers: the same
// source then compiles with nvcc for a GPU, and with the host C++ compiler (-DAPE_SIMT) against
// the SIMT emulator (ape/simt/cuda.h; docs/cuda.md, "The emulator"). The few things that differ
// are spelled through this header:
//   ape::cuda::launch(kernel, grid, block, smem, stream, args...)   instead of <<<...>>>
//   APE_DYNAMIC_SMEM(name)            extern __shared__ __align__(1024) unsigned char name[]
//   APE_STATIC_SMEM(T, name, n)       __shared__ T name[n] (name is then a T*)
//   APE_DEVICE_CODE                   defined while compiling code that runs on the device
//   ape::cuda::ptx::*                 mma.sync, ldmatrix, cp.async, wgmma (inline PTX under nvcc)
#pragma once

#include "ape/cuda/symbols.h"
#ifdef APE_SIMT
#include "ape/simt/cuda.h"
#define APE_DEVICE_CODE 1
#define APE_DYNAMIC_SMEM(name) unsigned char *name = ::ape::simt::dynamic_smem()
// Reserved once per block (keyed by the address of a static marker), after the dynamic part.
#define APE_STATIC_SMEM(T, name, n)                                                       \
  static const char name##_ape_smem_id = 0;                                               \
  T *name = static_cast<T *>(::ape::simt::static_smem(&name##_ape_smem_id, sizeof(T) * (n), \
                                                      alignof(T)))
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda.h>  // CUtensorMap and its enums (types only: no driver library is linked)
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <mma.h>
#ifdef __CUDA_ARCH__
#define APE_DEVICE_CODE 1
#endif
#define APE_DYNAMIC_SMEM(name) extern __shared__ __align__(1024) unsigned char name[]
#define APE_STATIC_SMEM(T, name, n) __shared__ T name[n]
#endif

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <utility>

#ifndef APE_HD
#define APE_HD __host__ __device__
#endif

// On a member function of a generated functor (apec, codegen/FunctorWriter.cpp: a score mod of more
// than kOutOfLineOps operations): one copy that the kernels call, instead of a copy inlined at
// every element of their unrolled tile loops (FIRE's MLP and its ~100 gradient sinks, inlined
// there, drove ptxas past 23 GB; bench/results/cuda_compile_memory.md). Under the emulator:
// nothing (a host compiler handles either).
#ifndef APE_NOINLINE
#ifdef APE_SIMT
#define APE_NOINLINE
#else
#define APE_NOINLINE __noinline__
#endif
#endif

// Defined where device code may use sm_90a instructions (wgmma, TMA, mbarrier): the sm_90a
// compilation pass and the emulator. Kernels built on them compile to a trap elsewhere.
#if defined(APE_SIMT) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define APE_SM90A_CODE 1
#endif

namespace ape::cuda {
APE_CUDA_ABI_BEGIN

// Launches `kernel` on (grid, block) with `smem` bytes of dynamic shared memory on `stream`;
// the launch's error (cudaGetLastError).
template <class... KP, class... A>
cudaError_t launch(void (*kernel)(KP...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   A &&...args) {
#ifdef APE_SIMT
  return ::ape::simt::launch(kernel, grid, block, smem, stream, std::forward<A>(args)...);
#else
  kernel<<<grid, block, smem, stream>>>(std::forward<A>(args)...);
  return cudaGetLastError();
#endif
}

// CUDA's limit on a grid's y (and z) size, 65,535 blocks. Grids whose y runs over a slice's query or key
// tiles (the general kernels', the FlashAttention-2-class forward's) pass it near T = 1M to 8M
// tokens: they go in launches of at most max_grid_y() blocks on y, each from its own first tile
// (Params::tile0). APE_CUDA_MAX_GRID_Y=N below the limit lowers it: a test's way to reach several
// launches with a short sequence.
constexpr int64_t kMaxGridY = 65535;
inline int64_t max_grid_y() {
  const char *env = std::getenv("APE_CUDA_MAX_GRID_Y");
  const long long n = env ? std::atoll(env) : 0;
  return n > 0 && n < kMaxGridY ? int64_t(n) : kMaxGridY;
}

// ---- PTX-level operations (sm_80+) ---------------------------------------------------------------
// Lane layouts: the PTX ISA's (kernels/simt/Warp.cpp states them in full).
namespace ptx {

// Whether code may use what sm_90 added (stmatrix, 8-byte reductions): code compiled for sm_90 or
// later runs on no older device, so it is true there and false in code for an older target, both
// known to the compiler (the other path is not compiled in); the emulator, one build for every
// architecture it poses as, follows `device_sm90` (the launch's test of the device).
__device__ inline bool sm90_code(bool device_sm90) {
#if defined(APE_SIMT)
  return device_sm90;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  (void)device_sm90;
  return true;
#else
  (void)device_sm90;
  return false;
#endif
}

// p[0] += a, p[1] += b (p 8-byte aligned). `v2`: as one 8-byte reduction (sm_90's
// red.global.add.v2.f32: a warp's fragment rows then fill whole 32-byte L2 sectors, where two
// scalar reductions each fill half of twice as many); the caller sets it where the device is
// sm_90 or later. Code compiled for sm_90 or later takes it without a test (it runs on no older
// device); code for an older target makes two fp32 reductions; the emulator follows `v2`.
__device__ inline void red_add2(float *p, float a, float b, bool v2) {
#if defined(APE_SIMT)
  if (v2) {
    ::ape::simt::atomic_add_f32x2(p, a, b);
    return;
  }
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  (void)v2;  // code for sm_90 and later runs on such devices only: no test, no second path
  atomicAdd(reinterpret_cast<float2 *>(p), make_float2(a, b));
#else
  (void)v2;
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

// d = a b + c for one m16n8k16 tile: a 4 registers (8 x 16-bit), b 2 registers, c and d 4 floats.
// In = __nv_bfloat16 or __half.
template <class In>
__device__ inline void mma_m16n8k16(float *d, const uint32_t *a, const uint32_t *b, const float *c) {
#ifdef APE_SIMT
  ::ape::simt::mma_m16n8k16(std::is_same_v<In, __half> ? 1 : 2, d, a, b, c);
#else
  if constexpr (std::is_same_v<In, __half>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
#endif
}

#ifndef APE_SIMT
__device__ inline unsigned smem_addr(const void *p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
#endif

// An address in shared memory as the instructions take it: a 32-bit offset in the block's
// shared window on the GPU (so address arithmetic is 32-bit and needs no generic-to-shared
// conversion per access), the host address under the emulator.
#ifdef APE_SIMT
using SmemAddr = uintptr_t;
inline SmemAddr smem_addr_of(const void *p) { return reinterpret_cast<uintptr_t>(p); }
#else
using SmemAddr = uint32_t;
__device__ inline SmemAddr smem_addr_of(const void *p) { return smem_addr(p); }
#endif

// ldmatrix.sync.aligned.m8n8.x{N}[.trans].shared.b16: `a` is this lane's row address.
template <int N, bool kTrans = false>
__device__ inline void ldmatrix_at(uint32_t *regs, SmemAddr a) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
#ifdef APE_SIMT
  ::ape::simt::ldmatrix(N, kTrans, regs, reinterpret_cast<const void *>(a));
#else
  if constexpr (N == 4 && !kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(regs[0]), "=r"(regs[1]), "=r"(regs[2]), "=r"(regs[3]) : "r"(a));
  else if constexpr (N == 4)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(regs[0]), "=r"(regs[1]), "=r"(regs[2]), "=r"(regs[3]) : "r"(a));
  else if constexpr (N == 2 && !kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(regs[0]), "=r"(regs[1]) : "r"(a));
  else if constexpr (N == 2)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(regs[0]), "=r"(regs[1]) : "r"(a));
  else if constexpr (!kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(regs[0]) : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(regs[0]) : "r"(a));
#endif
}
template <int N, bool kTrans = false>
__device__ inline void ldmatrix(uint32_t *regs, const void *row) {
  ldmatrix_at<N, kTrans>(regs, smem_addr_of(row));
}

// stmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (sm_90+): ldmatrix's inverse. `a` is this lane's
// row address (lanes 8m..8m+7 give the rows of matrix m); regs[m] holds this lane's pair of matrix m
// (row l/4, columns 2(l%4) and 2(l%4)+1; transposed with kTrans): four m16n8k16 A fragments'
// registers store a 16 x 16 tile in one instruction where 32-bit stores take four.
template <bool kTrans = false>
__device__ inline void stmatrix_x4_at(SmemAddr a, const uint32_t *regs) {
#ifdef APE_SIMT
  ::ape::simt::stmatrix(4, kTrans, regs, reinterpret_cast<void *>(a));
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (!kTrans)
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n"
                 ::"r"(a), "r"(regs[0]), "r"(regs[1]), "r"(regs[2]), "r"(regs[3]) : "memory");
  else
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n"
                 ::"r"(a), "r"(regs[0]), "r"(regs[1]), "r"(regs[2]), "r"(regs[3]) : "memory");
#else
  __trap();  // sm_90 and later only: callers choose it by architecture
#endif
}
template <bool kTrans = false>
__device__ inline void stmatrix_x4(void *row, const uint32_t *regs) {
  stmatrix_x4_at<kTrans>(smem_addr_of(row), regs);
}

// cp.async.cg.shared.global: 16 bytes, of which the first `src_bytes` come from `src` and the
// rest are zero (src_bytes = 0: a zero fill that reads nothing).
__device__ inline void cp_async_16_at(SmemAddr dst, const void *src, int src_bytes = 16) {
#ifdef APE_SIMT
  ::ape::simt::cp_async(reinterpret_cast<void *>(dst), src, 16, src_bytes);
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
#endif
}
__device__ inline void cp_async_16(void *dst, const void *src, int src_bytes = 16) {
  cp_async_16_at(smem_addr_of(dst), src, src_bytes);
}
__device__ inline void cp_async_commit() {
#ifdef APE_SIMT
  ::ape::simt::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most N committed groups of this thread are still in flight.
template <int N> __device__ inline void cp_async_wait() {
#ifdef APE_SIMT
  ::ape::simt::cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// 16 bytes of global memory through L2 only (ld/st.global.cg: never a stale line of this SM's
// L1): data another block wrote and released by a fence and a flag, like the flash backward's
// dQ' tiles. `p` is 16-byte aligned.
struct alignas(16) F4 {
  float x, y, z, w;
};
struct alignas(8) F2 {
  float x, y;
};
// The flash backward's semaphores (cuda/flash_backward.cuh), as CUTLASS's generic barrier does
// them: a relaxed load to poll (issued early, its latency hidden until the value is used), a
// gpu-scope acq_rel fence (after a successful poll: acquire; before an increment: release, which
// by cumulativity covers every write of the block ordered before it by a bar.sync) and a
// relaxed reduction to increment. The emulator runs its blocks in launch order with sequentially
// consistent memory: a load, no fence, an add (and its hooks: simt::sem_polled, sem_released).
__device__ inline int ld_relaxed_gpu(const int *p) {
#ifdef APE_SIMT
  const int v = atomicAdd(const_cast<int *>(p), 0);
  ::ape::simt::sem_polled(p, v);
  return v;
#else
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
#endif
}
__device__ inline void fence_acq_rel_gpu() {
#ifdef APE_SIMT
  ::ape::simt::fence_release();
#else
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
#endif
}
__device__ inline void red_relaxed_gpu_add(int *p, int v) {
#ifdef APE_SIMT
  atomicAdd(p, v);
  ::ape::simt::sem_released();
#else
  asm volatile("red.relaxed.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
#endif
}

// A word of shared memory that one thread of a block publishes to others, the order given by an
// mbarrier (arrive: release, wait: acquire; the Hopper forward's tile numbers): relaxed atomic
// accesses, which never race with each other (the emulator's race check, which credits block
// barriers and warp collectives alone with ordering, treats them as atomics).
__device__ inline void st_relaxed_cta(int *p, int v) {
#ifdef APE_SIMT
  atomicExch(p, v);
#else
  asm volatile("st.relaxed.cta.shared.s32 [%0], %1;\n" ::"r"(smem_addr(p)), "r"(v) : "memory");
#endif
}
__device__ inline int ld_relaxed_cta(const int *p) {
#ifdef APE_SIMT
  return atomicAdd(const_cast<int *>(p), 0);
#else
  int v;
  asm volatile("ld.relaxed.cta.shared.s32 %0, [%1];\n" : "=r"(v) : "r"(smem_addr(p)) : "memory");
  return v;
#endif
}

__device__ inline F4 ld_cg_16(const float *p) {
#ifdef APE_SIMT
  F4 v;
  ::ape::simt::global_load16(&v, p);
  return v;
#else
  F4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p));
  return v;
#endif
}
__device__ inline void st_cg_16(float *p, F4 v) {
#ifdef APE_SIMT
  ::ape::simt::global_store16(p, &v);
#else
  asm volatile("st.global.cg.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(v.x), "f"(v.y),
               "f"(v.z), "f"(v.w)
               : "memory");
#endif
}

// 2^x by ex2.approx.ftz.f32 (one MUFU.EX2; max relative error 2^-22, subnormal results flushed
// to 0): the softmax's exponential. exp2f without --use_fast_math adds a range fix-up (a compare
// and two multiplies) around the same instruction. The emulator rounds 2^x to float and
// flushes subnormals as the hardware does.
__device__ inline float ex2(float x) {
#ifdef APE_SIMT
  const float r = exp2f(x);
  return r < 1.17549435e-38f ? 0.f : r;
#else
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
#endif
}

// ---- warpgroup MMA (sm_90a) -------------------------------------------------------------------------
// wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}: a warpgroup (4 consecutive warps, the first
// a multiple of 4) computes D (64 x N, fp32) = A (64 x 16) B (16 x N) (+ D when scale_d != 0).
// Warp w % 4 of the group owns rows 16 (w % 4) .. + 15 of A and D, with mma.m16n8k16's lane
// layouts (cuda/flash_tile.cuh): d[4 j + x] is element (g + 8 (x / 2), 8 j + 2 t + x % 2) of the
// warp's rows, and a register A (the _rs form) is an m16n8k16 A fragment of those rows. Operands
// in shared memory are given by matrix descriptors (smem_desc). The instruction is asynchronous:
// it is issued (wgmma_fence first, whenever registers it reads or accumulates were written since
// the last wgmma), groups are closed by wgmma_commit, and D, like the shared memory it reads, may
// be touched only after wgmma_wait lets its group complete (then fence_regs(D): no read of D may
// be moved above the wait). Shared memory written by ordinary stores or cp.async must be made
// visible to the async proxy (fence_proxy_async) before a wgmma reads it.
//
// A shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): bits 0-13 the start
// address >> 4, 16-29 the leading-dimension byte offset >> 4, 32-45 the stride-dimension byte
// offset >> 4, 62-63 the swizzle (0 none, 1 128-byte, 2 64-byte, 3 32-byte). With a W x 16-byte
// swizzle (W = 8, 4, 2) the canonical layouts of 16-bit elements are, as byte offsets before the
// swizzle (XOR of address bits 4.. 4+log2 W with bits 7.. 7+log2 W):
//   K-major (rows m or n contiguous along k):  (r % 8) 16 W + (r / 8) SBO + 2 k
//   MN-major (contiguous along m or n):        (x % 8W) 2 + (x / 8W) LBO + (k % 8) 16 W + (k / 8) SBO
// i.e. a tile of R rows of 8 W elements per swizzle atom column, 8-row groups SBO = 128 W bytes
// apart; an MN-major operand's next 8 W columns LBO bytes on.
namespace swz {
constexpr uint64_t mode(int width_bytes) {
  return width_bytes == 128 ? 1ull : width_bytes == 64 ? 2ull : width_bytes == 32 ? 3ull : 0ull;
}
}  // namespace swz

// The descriptor of a shared-memory operand at `addr` (an offset in the block's shared window:
// smem_window_offset) with a `width`-byte swizzle and the given byte offsets.
APE_HD constexpr uint64_t smem_desc(uint32_t addr, int width, uint32_t lbo, uint32_t sbo) {
  return (uint64_t(addr >> 4) & 0x3FFF) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (swz::mode(width) << 62);
}

// The offset of `p` in the block's shared window, as descriptors hold it.
__device__ inline uint32_t smem_window_offset(const void *p) {
#ifdef APE_SIMT
  return ::ape::simt::smem_window_offset(p);
#else
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
#endif
}

__device__ inline void wgmma_fence() {
#ifdef APE_SIMT
  ::ape::simt::wgmma_fence();
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ inline void wgmma_commit() {
#ifdef APE_SIMT
  ::ape::simt::wgmma_commit();
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed wgmma groups of the warpgroup are still in flight.
template <int N> __device__ inline void wgmma_wait() {
#ifdef APE_SIMT
  ::ape::simt::wgmma_wait(N);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// fence.proxy.async.shared::cta: this thread's shared-memory writes become visible to the async
// proxy (wgmma's operand reads) once a barrier orders them.
__device__ inline void fence_proxy_async() {
#ifdef APE_SIMT
  ::ape::simt::fence_proxy_async();
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Named barriers (ids 1-15; 0 is __syncthreads'): a round of barrier `id` completes when `count`
// threads (whole warps) arrived. bar_sync arrives and waits for the round, bar_arrive arrives and
// runs on (FlashAttention-3's scheduling of two warpgroups). bar_sync is PTX's aligned form
// (bar.sync = barrier.sync.aligned): every thread that waits in a round must run the same
// instruction; waiters in different code (warp-specialised roles that each reach a block barrier
// in their own code) take bar_sync_unaligned (barrier.sync), else the behaviour is undefined
// (compute-sanitizer's synccheck: "Divergent thread(s) in block"; the emulator reports an aligned
// round waited on at two source lines).
#ifdef APE_SIMT
__device__ inline void bar_sync(int id, int count, APE_SIMT_HERE) {
  ::ape::simt::named_barrier(id, count, true, true, file, line);
}
__device__ inline void bar_sync_unaligned(int id, int count, APE_SIMT_HERE) {
  ::ape::simt::named_barrier(id, count, true, false, file, line);
}
__device__ inline void bar_arrive(int id, int count, APE_SIMT_HERE) {
  ::ape::simt::named_barrier(id, count, false, true, file, line);
}
// A device function's caller's source line, for the emulator's checks of the barriers it reaches
// (APE_CALLER_SITE in the parameters, APE_PASS_SITE after the last argument of the call,
// APE_SITE_ONLY as the only arguments).
#define APE_CALLER_SITE APE_SIMT_HERE
#define APE_PASS_SITE , file, line
#define APE_SITE_ONLY file, line
#else
__device__ inline void bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ inline void bar_sync_unaligned(int id, int count) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ inline void bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
#define APE_CALLER_SITE
#define APE_PASS_SITE
#define APE_SITE_ONLY
#endif
// Keeps the compiler from moving accesses of these registers across the surrounding wgmma
// instructions (they are written asynchronously).
template <int K> __device__ inline void fence_regs(float (&r)[K]) {
#ifndef APE_SIMT
#pragma unroll
  for (int i = 0; i < K; ++i) asm volatile("" : "+f"(r[i])::"memory");
#endif
}
template <int K> __device__ inline void fence_regs(uint32_t (&r)[K]) {
#ifndef APE_SIMT
#pragma unroll
  for (int i = 0; i < K; ++i) asm volatile("" : "+r"(r[i])::"memory");
#endif
}

// D (+)= A B, A and B in shared memory (each K-major, or MN-major with kTransA, kTransB: the
// transposes are for 16-bit inputs only, as here).
template <class In, int N, int kTransB = 0, int kTransA = 0>
__device__ inline void wgmma_ss(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128, "wgmma n of 16, 32, 64 or 128");
#ifdef APE_SIMT
  ::ape::simt::wgmma(std::is_same_v<In, __half> ? 1 : 2, N, d, nullptr, a_desc, b_desc,
                     scale_d != 0, kTransB != 0, kTransA != 0);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (N == 16 && std::is_same_v<In, __nv_bfloat16>) asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, %12;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTransA), "n"(kTransB));
  if constexpr (N == 16 && std::is_same_v<In, __half>) asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, %12;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTransA), "n"(kTransB));
  if constexpr (N == 32 && std::is_same_v<In, __nv_bfloat16>) asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, %19, %20;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTransA), "n"(kTransB));
  if constexpr (N == 32 && std::is_same_v<In, __half>) asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, %19, %20;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTransA), "n"(kTransB));
  if constexpr (N == 64 && std::is_same_v<In, __nv_bfloat16>) asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTransA), "n"(kTransB));
  if constexpr (N == 64 && std::is_same_v<In, __half>) asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTransA), "n"(kTransB));
  if constexpr (N == 128 && std::is_same_v<In, __nv_bfloat16>) asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTransA), "n"(kTransB));
  if constexpr (N == 128 && std::is_same_v<In, __half>) asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTransA), "n"(kTransB));
#else
  (void)d, (void)a_desc, (void)b_desc, (void)scale_d;
  __trap();
#endif
}
// D (+)= A B, A from registers (the warp's m16n8k16 A fragment), B in shared memory.
template <class In, int N, int kTransB = 0>
__device__ inline void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b_desc, int scale_d) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128, "wgmma n of 16, 32, 64 or 128");
#ifdef APE_SIMT
  ::ape::simt::wgmma(std::is_same_v<In, __half> ? 1 : 2, N, d, a, 0, b_desc, scale_d != 0,
                     kTransB != 0);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (N == 16 && std::is_same_v<In, __nv_bfloat16>) asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, %14;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d), "n"(kTransB));
  if constexpr (N == 16 && std::is_same_v<In, __half>) asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, %14;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d), "n"(kTransB));
  if constexpr (N == 32 && std::is_same_v<In, __nv_bfloat16>) asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d), "n"(kTransB));
  if constexpr (N == 32 && std::is_same_v<In, __half>) asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d), "n"(kTransB));
  if constexpr (N == 64 && std::is_same_v<In, __nv_bfloat16>) asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d), "n"(kTransB));
  if constexpr (N == 64 && std::is_same_v<In, __half>) asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d), "n"(kTransB));
  if constexpr (N == 128 && std::is_same_v<In, __nv_bfloat16>) asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d), "n"(kTransB));
  if constexpr (N == 128 && std::is_same_v<In, __half>) asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d), "n"(kTransB));
#else
  (void)d, (void)a, (void)b_desc, (void)scale_d;
  __trap();
#endif
}

// ---- mbarriers, TMA, bulk copies (sm_90) ------------------------------------------------------------
// An mbarrier (8 bytes of shared memory) completes a phase when `count` arrivals and the
// transaction bytes announced by arrive_expect_tx have all come in (the copies that name it
// complete their bytes on it); waiting names the parity of the phase awaited.
__device__ inline void mbar_init(uint64_t *bar, unsigned count) {
#ifdef APE_SIMT
  ::ape::simt::mbar_init(bar, count);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
#endif
}
// Makes the initialised barriers visible to the async proxy (then a __syncthreads).
__device__ inline void mbar_init_fence() {
#if !defined(APE_SIMT) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ inline void mbar_arrive(uint64_t *bar) {
#ifdef APE_SIMT
  ::ape::simt::mbar_arrive(bar, 0);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
#endif
}
__device__ inline void mbar_arrive_expect_tx(uint64_t *bar, unsigned bytes) {
#ifdef APE_SIMT
  ::ape::simt::mbar_arrive(bar, bytes);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes) : "memory");
#endif
}
__device__ inline void mbar_wait(uint64_t *bar, unsigned parity) {
#ifdef APE_SIMT
  ::ape::simt::mbar_wait(bar, parity);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@p bra DONE;\nbra WAIT;\nDONE:\n}\n" ::"r"(smem_addr(bar)), "r"(parity) : "memory");
#endif
}
// A box of a 3-dimensional tensor (coordinates innermost first) into shared memory by TMA.
__device__ inline void tma_load_3d(void *dst, const CUtensorMap *map, int c0, int c1, int c2,
                                   uint64_t *bar) {
#ifdef APE_SIMT
  const int coords[3] = {c0, c1, c2};
  ::ape::simt::tma_load(dst, map, coords, bar);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, "
      "%4, %5}], [%2];\n" ::"r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)),
      "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2) : "memory");
#endif
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory.
__device__ inline void bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
#ifdef APE_SIMT
  ::ape::simt::bulk_copy(dst, src, bytes, bar);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
#endif
}
// The box of a 3-dimensional fp32 tensor at (c0, c1, c2) += the box at `src` in shared memory
// (laid out as a TMA load of the map would leave it, swizzle included), by TMA, in this thread's
// current bulk group (bulk_commit): elements out of the tensor's bounds are not written. Each
// element's add is atomic, as red.add's; the source may be reused after bulk_wait_read, the
// sums are complete (for this thread, then by its release for others) after bulk_wait.
__device__ inline void tma_reduce_add_3d(const CUtensorMap *map, const void *src, int c0, int c1, int c2) {
#ifdef APE_SIMT
  const int coords[3] = {c0, c1, c2};
  ::ape::simt::tma_reduce_add(map, coords, src);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2) : "memory");
#else
  (void)map, (void)src, (void)c0, (void)c1, (void)c2;
  __trap();  // sm_90a only: a build without it must not drop the adds silently
#endif
}
// cp.async.bulk.commit_group: the thread's bulk stores and reductions so far form a group.
__device__ inline void bulk_commit() {
#ifdef APE_SIMT
  ::ape::simt::bulk_commit();
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most N of the thread's bulk groups are in flight: their writes complete
// (bulk_wait), or only their reads of shared memory (bulk_wait_read).
template <int N> __device__ inline void bulk_wait() {
#ifdef APE_SIMT
  ::ape::simt::bulk_wait(N, false);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
template <int N> __device__ inline void bulk_wait_read() {
#ifdef APE_SIMT
  ::ape::simt::bulk_wait(N, true);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
#endif
}
// fence.proxy.async.global: orders this thread's global accesses in the generic proxy against
// its accesses through the async proxy (TMA reductions), either way.
__device__ inline void fence_proxy_async_global() {
#if !defined(APE_SIMT) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}
// setmaxnreg: a warpgroup gives back registers (producers) or takes them (consumers).
template <int N> __device__ inline void setmaxnreg_dec() {
#if !defined(APE_SIMT) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N> __device__ inline void setmaxnreg_inc() {
#if !defined(APE_SIMT) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

}  // namespace ptx

// ---- approximate functions (a spec's fast-math flags) ----------------------------------------------
// What the generated functor calls for an op with the fast-math flag afn (exp, exp2, log, log2,
// log1p) or arcp (a division): an encoding marked fast_math (-ape-fast-math, docs/cuda.md). On the
// device, in float, the GPU's approximate instructions, as --use_fast_math would give them:
//   exp(x)   = __expf(x):   ex2.approx(x · log2 e); relative error 2 + 1.16 |x| ulp (x·log2 e
//                           rounded), subnormal results flushed to 0;
//   exp2(x)  = ex2(x):      ex2.approx.ftz; relative error 2^-22;
//   log(x)   = __logf(x):   lg2.approx · ln 2; absolute error 2^-21.4 for x in [0.5, 2], else
//                           relative 3 ulp; log2(x) = __log2f(x), lg2.approx alone;
//   log1p(x) = __logf(1 + x): the rounding of 1 + x adds an absolute error below 2^-24, so
//                           the result is within ~4e-7 absolutely (not relatively: for |x| below
//                           2^-24 it is 0) — what a logit bias needs, whose rounding to bf16
//                           inputs is 2^-9 relative;
//   div(a, b)= __fdividef(a, b): a · rcp.approx(b); 2 ulp for |b| in [2^-126, 2^126], 0 beyond.
// Elsewhere (the host pass of nvcc, double): the exact functions. The emulator has the same
// intrinsics (ape/simt/cuda.h), each rounding as the hardware's definition says.
namespace approx {
template <class T> APE_HD inline T exp(T x) {
#ifdef APE_DEVICE_CODE
  if constexpr (std::is_same_v<T, float>) return __expf(x);
#endif
  return std::exp(x);
}
template <class T> APE_HD inline T exp2(T x) {
#ifdef APE_DEVICE_CODE
  if constexpr (std::is_same_v<T, float>) return ptx::ex2(x);
#endif
  return std::exp2(x);
}
template <class T> APE_HD inline T log(T x) {
#ifdef APE_DEVICE_CODE
  if constexpr (std::is_same_v<T, float>) return __logf(x);
#endif
  return std::log(x);
}
template <class T> APE_HD inline T log2(T x) {
#ifdef APE_DEVICE_CODE
  if constexpr (std::is_same_v<T, float>) return __log2f(x);
#endif
  return std::log2(x);
}
template <class T> APE_HD inline T log1p(T x) {
#ifdef APE_DEVICE_CODE
  if constexpr (std::is_same_v<T, float>) return __logf(1.0f + x);
#endif
  return std::log1p(x);
}
template <class T> APE_HD inline T div(T a, T b) {
#ifdef APE_DEVICE_CODE
  if constexpr (std::is_same_v<T, float>) return __fdividef(a, b);
#endif
  return a / b;
}
}  // namespace approx

// A tiled TMA descriptor of a tensor of 16-bit (elem_bytes 2) or fp32 (4) elements and `rank` <= 3
// dimensions (innermost first; strides in bytes of dimensions 1..), boxes of `box` elements,
// `swizzle` bytes (0, 32, 64, 128), zeros out of bounds: cuTensorMapEncodeTiled (through the
// runtime's driver entry point, so no driver library is linked), the emulator's own encoding
// under APE_SIMT.
inline cudaError_t make_tensor_map(CUtensorMap *map, int elem_bytes, const void *base, int rank,
                                   const uint64_t *dims, const uint64_t *strides,
                                   const uint32_t *box, int swizzle) {
#ifdef APE_SIMT
  return ::ape::simt::tensor_map_encode(map, elem_bytes, rank, base, dims, strides, box, swizzle)
             ? cudaSuccess
             : cudaErrorInvalidValue;
#else
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (!encode) return cudaErrorNotSupported;
  const cuuint32_t estride[3] = {1, 1, 1};
  const CUtensorMapSwizzle sw = swizzle == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
                                : swizzle == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                : swizzle == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                                                : CU_TENSOR_MAP_SWIZZLE_NONE;
  const CUresult r = encode(map, elem_bytes == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_UINT16,
                            static_cast<cuuint32_t>(rank),
                            const_cast<void *>(base), reinterpret_cast<const cuuint64_t *>(dims),
                            reinterpret_cast<const cuuint64_t *>(strides), box, estride,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
#endif
}
inline cudaError_t make_tensor_map_16(CUtensorMap *map, const void *base, int rank, const uint64_t *dims,
                                      const uint64_t *strides, const uint32_t *box, int swizzle) {
  return make_tensor_map(map, 2, base, rank, dims, strides, box, swizzle);
}
APE_CUDA_ABI_END
}  // namespace ape::cuda
