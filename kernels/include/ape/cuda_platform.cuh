// What CUDA kernel sources of the kernel layer include instead of the CUDA headers: the same
// source then compiles with nvcc for a GPU, and with the host C++ compiler (-DAPE_SIMT) against
// the SIMT emulator (ape/simt/cuda.h; docs/cuda.md, "The emulator"). The few things that differ
// are spelled through this header:
//   ape::cuda::launch(kernel, grid, block, smem, stream, args...)   instead of <<<...>>>
//   APE_DYNAMIC_SMEM(name)            extern __shared__ __align__(1024) unsigned char name[]
//   APE_STATIC_SMEM(T, name, n)       __shared__ T name[n] (name is then a T*)
//   APE_DEVICE_CODE                   defined while compiling code that runs on the device
//   ape::cuda::ptx::*                 mma.sync, ldmatrix, cp.async (inline PTX under nvcc)
#pragma once

#include "cuda_abi.h"
#ifdef APE_SIMT
#include "simt/cuda.h"
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
#include <cuda_runtime.h>
#include <mma.h>
#ifdef __CUDA_ARCH__
#define APE_DEVICE_CODE 1
#endif
#define APE_DYNAMIC_SMEM(name) extern __shared__ __align__(1024) unsigned char name[]
#define APE_STATIC_SMEM(T, name, n) __shared__ T name[n]
#endif

#include <cstdint>
#include <type_traits>
#include <utility>

#ifndef APE_HD
#define APE_HD __host__ __device__
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

// ---- PTX-level operations (sm_80+) ---------------------------------------------------------------
// Lane layouts: the PTX ISA's (kernels/simt/Warp.cpp states them in full).
namespace ptx {

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

}  // namespace ptx
APE_CUDA_ABI_END
}  // namespace ape::cuda
