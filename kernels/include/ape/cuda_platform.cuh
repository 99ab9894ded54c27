// What CUDA kernel sources of the kernel layer include instead of the CUDA headers: the same
// source then compiles with nvcc for a GPU, and with the host C++ compiler (-DAPE_SIMT) against
// the SIMT emulator (ape/simt/cuda.h; docs/cuda.md, "The emulator"). The few things that differ
// are spelled through this header:
//   ape::cuda::launch(kernel, grid, block, smem, stream, args...)   instead of <<<...>>>
//   APE_DYNAMIC_SMEM(name)            extern __shared__ __align__(128) unsigned char name[]
//   APE_DEVICE_CODE                   defined while compiling code that runs on the device
//   ape::cuda::ptx::*                 mma.sync, ldmatrix, cp.async (inline PTX under nvcc)
#pragma once

#ifdef APE_SIMT
#include "ape/simt/cuda.h"
#define APE_DEVICE_CODE 1
#define APE_DYNAMIC_SMEM(name) unsigned char *name = ::ape::simt::dynamic_smem()
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#ifdef __CUDA_ARCH__
#define APE_DEVICE_CODE 1
#endif
#define APE_DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#endif

#include <cstdint>
#include <type_traits>
#include <utility>

#ifndef APE_HD
#define APE_HD __host__ __device__
#endif

namespace ape::cuda {

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

// ldmatrix.sync.aligned.m8n8.x{N}[.trans].shared.b16: `row` is this lane's row address.
template <int N, bool kTrans = false>
__device__ inline void ldmatrix(uint32_t *regs, const void *row) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
#ifdef APE_SIMT
  ::ape::simt::ldmatrix(N, kTrans, regs, row);
#else
  const unsigned a = smem_addr(row);
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

// cp.async.cg.shared.global: 16 bytes, of which the first `src_bytes` come from `src` and the
// rest are zero (src_bytes = 0: a zero fill that reads nothing).
__device__ inline void cp_async_16(void *dst, const void *src, int src_bytes = 16) {
#ifdef APE_SIMT
  ::ape::simt::cp_async(dst, src, 16, src_bytes);
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes));
#endif
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

}  // namespace ptx
}  // namespace ape::cuda
