// The CUDA surface of the SIMT emulator (docs/cuda.md, "The emulator").
//
// A kernel source written for nvcc compiles unchanged against this header with the host C++
// compiler (-DAPE_SIMT; ape/cuda/platform.cuh picks it instead of the CUDA headers) and runs on
// the CPU: every thread of a block is a fiber, `__syncthreads` is a block barrier, warp
// collectives (shuffles, votes, WMMA, mma.sync, ldmatrix, wgmma) are executed once per warp when every
// lane of their mask has arrived, with each lane's registers laid out as the PTX ISA documents,
// and cp.async copies land only when a wait allows them. The kernel translation units are
// compiled with gcc's -fsanitize=thread instrumentation but linked WITHOUT its runtime: the
// emulator's own hooks (kernels/simt/Checks.cpp) see every load and store and check bounds,
// shared-memory races between barriers and reads of memory never written.
//
// What lives here: qualifiers, built-in variables, the runtime API subset the kernel entries
// call, bf16/f16 storage types with the hardware's rounding, device math, atomics, warp
// intrinsics and nvcuda::wmma. The emulator's own controls (arch, errors) are in
// ape/simt/runtime.h.
#pragma once

#ifndef APE_SIMT
#error "ape/simt/cuda.h is the SIMT emulator's CUDA surface: compile with -DAPE_SIMT"
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- qualifiers ------------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __restrict__ __restrict
#define __align__(n) alignas(n)
#define __launch_bounds__(...)
#define __constant__ static
#define __grid_constant__

// The driver's opaque tensor map (cuda.h): the emulator keeps its own encoding in it.
typedef struct CUtensorMap_st {
  alignas(64) unsigned long long opaque[16];
} CUtensorMap;

// ---- built-in vector types and variables ----------------------------------------------------------
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace ape::simt {

// What a running thread sees of itself; set by the scheduler before each switch.
struct ThreadCtx {
  uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
  unsigned lane, warp;  // lane in its warp, warp in its block
};
extern thread_local ThreadCtx *tl_thread;

}  // namespace ape::simt

#define threadIdx (::ape::simt::tl_thread->thread_idx)
#define blockIdx (::ape::simt::tl_thread->block_idx)
#define blockDim (::ape::simt::tl_thread->block_dim)
#define gridDim (::ape::simt::tl_thread->grid_dim)
#define warpSize 32

// ---- runtime API (the subset kernel entries call) -------------------------------------------------
enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidPitchValue = 12,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
};
enum cudaMemcpyKind : int {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaFuncAttribute : int {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};
enum cudaDeviceAttr : int {
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMultiProcessorCount = 16,
};
struct CUstream_st;
using cudaStream_t = CUstream_st *;

cudaError_t cudaMalloc(void **ptr, size_t bytes);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream);
cudaError_t cudaMemset(void *ptr, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
// height rows of width bytes, dst and src rows dpitch and spitch bytes apart (pitches >= width).
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                              size_t height, cudaMemcpyKind kind, cudaStream_t stream = nullptr);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
// Events order one stream's work after another's; the emulator runs every call when it is made,
// in program order, so they order nothing more (a created event is a distinct non-null handle).
struct CUevent_st;
using cudaEvent_t = CUevent_st *;
constexpr unsigned cudaEventDisableTiming = 2;
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);
cudaError_t cudaEventDestroy(cudaEvent_t event);
// Streams: distinct handles; the emulator runs every call in program order whatever its stream.
constexpr unsigned cudaStreamNonBlocking = 1;
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
// No graph capture: every stream is not capturing.
enum cudaStreamCaptureStatus : int {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus *status);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char *cudaGetErrorString(cudaError_t err);

namespace ape::simt {
cudaError_t func_set_attribute(const void *kernel, cudaFuncAttribute attr, int value);
}
template <class F> cudaError_t cudaFuncSetAttribute(F *kernel, cudaFuncAttribute attr, int value) {
  return ::ape::simt::func_set_attribute(reinterpret_cast<const void *>(kernel), attr, value);
}
namespace ape::simt {
cudaError_t occupancy(int *blocks, const void *kernel, int threads, size_t dynamic_smem);
}
// Blocks of `kernel` an SM holds at once by its threads and shared memory (the architecture's
// limits; 0 where the launch would be refused). The emulator has no register file: a real GPU's
// answer can be lower where registers limit the blocks.
template <class F>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, F *kernel, int threads, size_t dynamic_smem) {
  return ::ape::simt::occupancy(blocks, reinterpret_cast<const void *>(kernel), threads, dynamic_smem);
}

// ---- launches ----------------------------------------------------------------------------------------
namespace ape::simt {

// A type-erased reference to the body every thread of a launch runs.
struct Body {
  void (*call)(void *);
  void *self;
};

// Runs `body` on every thread of the grid (blocks in order, threads of a block as fibers).
// `kernel` identifies the kernel (its attributes, its name in reports).
cudaError_t launch_grid(const void *kernel, dim3 grid, dim3 block, size_t dynamic_smem,
                        cudaStream_t stream, Body body);

// The block's dynamic shared memory (extern __shared__), 128-byte aligned.
unsigned char *dynamic_smem();

// Static __shared__ storage: `bytes` reserved once per block for the declaration `id`.
void *static_smem(const void *id, size_t bytes, size_t align);

template <class... KP, class... A>
cudaError_t launch(void (*kernel)(KP...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   A &&...args) {
  // Kernel parameters are passed by value: each thread gets its own copy, as from constant memory.
  std::tuple<std::decay_t<KP>...> params(std::forward<A>(args)...);
  struct Closure {
    void (*kernel)(KP...);
    std::tuple<std::decay_t<KP>...> *params;
    static void run(void *self) {
      auto *c = static_cast<Closure *>(self);
      std::apply(c->kernel, *c->params);
    }
  } closure{kernel, &params};
  return launch_grid(reinterpret_cast<const void *>(kernel), grid, block, smem, stream,
                     Body{&Closure::run, &closure});
}

// ---- block and warp synchronisation (kernels/simt/Runtime.cpp) -----------------------------------
// `file`, `line`: the caller's source line (where a stuck thread waits, in reports).
void syncthreads(const char *file, int line);
// bar.sync (wait) or bar.arrive id, count (ids 1-15): a round completes when `count` threads, in
// whole warps, arrived; the race check does not count it as ordering (kernels/simt/Runtime.cpp).
// `aligned` (bar.sync, not barrier.sync): a round's waiters must all wait at one source line.
void named_barrier(int id, int count, bool wait, bool aligned, const char *file, int line);
void syncwarp(unsigned mask, const char *file, int line);
unsigned ballot(unsigned mask, bool pred, const char *file, int line);
// __match_any_sync: the lanes of mask whose value equals this lane's.
unsigned match_any(unsigned mask, uint64_t value, const char *file, int line);
// Shuffles move 4 or 8 bytes; `mode`: 0 idx, 1 up, 2 down, 3 xor.
uint64_t shfl(unsigned mask, uint64_t value, int src, int width, int mode, int bytes,
              const char *file, int line);
unsigned active_mask();

// Atomics on global or shared memory: checked as atomic accesses, then applied.
float atomic_add_f32(float *p, float v);
// p[0] += a, p[1] += b as one 8-byte access (sm_90's red.global.add.v2.f32; p 8-byte aligned).
void atomic_add_f32x2(float *p, float a, float b);
double atomic_add_f64(double *p, double v);
unsigned long long atomic_add_u64(unsigned long long *p, unsigned long long v);
unsigned atomic_add_u32(unsigned *p, unsigned v);
int atomic_add_i32(int *p, int v);
unsigned atomic_or_u32(unsigned *p, unsigned v);
unsigned long long atomic_or_u64(unsigned long long *p, unsigned long long v);
int atomic_max_i32(int *p, int v);
int atomic_exch_i32(int *p, int v);
unsigned atomic_cas_u32(unsigned *p, unsigned compare, unsigned v);
unsigned long long atomic_cas_u64(unsigned long long *p, unsigned long long compare,
                                  unsigned long long v);

}  // namespace ape::simt

#define APE_SIMT_HERE const char *file = __builtin_FILE(), int line = __builtin_LINE()
inline void __syncthreads(APE_SIMT_HERE) { ::ape::simt::syncthreads(file, line); }
inline void __syncwarp(unsigned mask = 0xffffffffu, APE_SIMT_HERE) {
  ::ape::simt::syncwarp(mask, file, line);
}
inline unsigned __ballot_sync(unsigned mask, int pred, APE_SIMT_HERE) {
  return ::ape::simt::ballot(mask, pred != 0, file, line);
}
inline int __any_sync(unsigned mask, int pred, APE_SIMT_HERE) {
  return ::ape::simt::ballot(mask, pred != 0, file, line) != 0;
}
inline int __all_sync(unsigned mask, int pred, APE_SIMT_HERE) {
  return ::ape::simt::ballot(mask, pred != 0, file, line) == (mask & ::ape::simt::active_mask());
}
inline unsigned __match_any_sync(unsigned mask, unsigned long long value, APE_SIMT_HERE) {
  return ::ape::simt::match_any(mask, value, file, line);
}
inline unsigned __activemask() { return ::ape::simt::active_mask(); }
inline void __threadfence() {}
inline void __threadfence_block() {}

namespace ape::simt::detail {
template <class T>
T shfl_as(unsigned mask, T v, int src, int width, int mode, const char *file, int line) {
  static_assert(std::is_trivially_copyable_v<T> && (sizeof(T) == 4 || sizeof(T) == 8 ||
                                                    sizeof(T) == 2),
                "shuffles move 2-, 4- or 8-byte values");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = shfl(mask, bits, src, width, mode, sizeof(T) == 8 ? 8 : 4, file, line);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}
}  // namespace ape::simt::detail

template <class T> T __shfl_sync(unsigned mask, T v, int src, int width = 32, APE_SIMT_HERE) {
  return ::ape::simt::detail::shfl_as(mask, v, src, width, 0, file, line);
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32, APE_SIMT_HERE) {
  return ::ape::simt::detail::shfl_as(mask, v, static_cast<int>(delta), width, 1, file, line);
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32, APE_SIMT_HERE) {
  return ::ape::simt::detail::shfl_as(mask, v, static_cast<int>(delta), width, 2, file, line);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32, APE_SIMT_HERE) {
  return ::ape::simt::detail::shfl_as(mask, v, lane_mask, width, 3, file, line);
}

inline float atomicAdd(float *p, float v) { return ::ape::simt::atomic_add_f32(p, v); }
inline double atomicAdd(double *p, double v) { return ::ape::simt::atomic_add_f64(p, v); }
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
  return ::ape::simt::atomic_add_u64(p, v);
}
inline unsigned atomicAdd(unsigned *p, unsigned v) { return ::ape::simt::atomic_add_u32(p, v); }
inline int atomicAdd(int *p, int v) { return ::ape::simt::atomic_add_i32(p, v); }
inline unsigned atomicOr(unsigned *p, unsigned v) { return ::ape::simt::atomic_or_u32(p, v); }
inline unsigned long long atomicOr(unsigned long long *p, unsigned long long v) {
  return ::ape::simt::atomic_or_u64(p, v);
}
inline int atomicMax(int *p, int v) { return ::ape::simt::atomic_max_i32(p, v); }
inline int atomicExch(int *p, int v) { return ::ape::simt::atomic_exch_i32(p, v); }
inline unsigned atomicCAS(unsigned *p, unsigned c, unsigned v) {
  return ::ape::simt::atomic_cas_u32(p, c, v);
}
inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long c,
                                    unsigned long long v) {
  return ::ape::simt::atomic_cas_u64(p, c, v);
}

// ---- half and bfloat16 ----------------------------------------------------------------------------
// Storage types with the conversions of the hardware: float -> 16 bits rounds to nearest even
// (cvt.rn), NaN stays NaN (canonical quiet NaN), overflow of f16 gives infinity, f16 subnormals
// are kept; 16 bits -> float is exact.
namespace ape::simt {
inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16_rn(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);  // to nearest, ties to even
  return static_cast<uint16_t>((u + rounding) >> 16);
}
inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }
uint16_t f32_to_f16_rn(float f);  // Runtime.cpp: IEEE binary16, nearest even, subnormals
float f16_to_f32(uint16_t h);
}  // namespace ape::simt

struct __nv_bfloat16 {
  uint16_t __x;
  __nv_bfloat16() = default;
  explicit __nv_bfloat16(float f) : __x(::ape::simt::f32_to_bf16_rn(f)) {}
  operator float() const { return ::ape::simt::bf16_to_f32(__x); }
};
struct __half {
  uint16_t __x;
  __half() = default;
  explicit __half(float f) : __x(::ape::simt::f32_to_f16_rn(f)) {}
  operator float() const { return ::ape::simt::f16_to_f32(__x); }
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
struct __half2 {
  __half x, y;
};
static_assert(sizeof(__nv_bfloat16) == 2 && sizeof(__half) == 2 && sizeof(__nv_bfloat162) == 4);

inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return static_cast<float>(h); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __float2half(float f) { return __half(f); }
inline float __half2float(__half h) { return static_cast<float>(h); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {__nv_bfloat16(a), __nv_bfloat16(b)};
}
inline __half2 __floats2half2_rn(float a, float b) { return {__half(a), __half(b)}; }

// ---- device math ----------------------------------------------------------------------------------
// Accurate functions are the host's (correctly rounded or within 1-2 ulp, as CUDA's). The fast
// intrinsics follow their hardware definition: __expf(x) = ex2.approx(x * log2 e),
// __logf(x) = lg2.approx(x) * ln 2 (here exact exp2/log2 of the rounded product).
inline float __expf(float x) { return std::exp2(x * 1.44269504088896341f); }
inline float __logf(float x) { return std::log2(x) * 0.693147180559945309f; }
inline float __log2f(float x) { return std::log2(x); }
// a · rcp.approx(b): 0 for 2^126 < |b| < 2^128 (the reciprocal is subnormal and flushed).
inline float __fdividef(float a, float b) {
  const float m = std::fabs(b);
  return m > 0x1p126f && m < INFINITY ? a * 0.0f : a / b;
}
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __int_as_float(int i) { return ::ape::simt::bits_f32(static_cast<uint32_t>(i)); }
inline int __float_as_int(float f) { return static_cast<int>(::ape::simt::f32_bits(f)); }
inline float __uint_as_float(unsigned u) { return ::ape::simt::bits_f32(u); }
inline unsigned __float_as_uint(float f) { return ::ape::simt::f32_bits(f); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }

// ---- PTX-level operations (ape/cuda/platform.cuh wraps them; kernels/simt/Warp.cpp) -------------
namespace ape::simt {
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32: d = a b + c with the PTX ISA's
// fragment layouts (`elem` 1 f16, 2 bf16). Warp collective (all 32 lanes).
void mma_m16n8k16(int elem, float *d, const uint32_t *a, const uint32_t *b, const float *c);
// ldmatrix.sync.aligned.m8n8.x{count}[.trans].shared.b16: `count` 8x8 matrices, each row's 16-byte
// address given by one lane (lanes 8m..8m+7 for matrix m); lane l receives in regs[m] the pair
// (row l/4, columns 2(l%4), 2(l%4)+1) of matrix m (transposed with `trans`). Warp collective.
void ldmatrix(int count, bool trans, uint32_t *regs, const void *row_addr);
// stmatrix.sync.aligned.m8n8.x{count}[.trans].shared.b16 (sm_90): ldmatrix's inverse, the same
// lanes give the rows' addresses and regs[m] of lane l is the pair (row l/4, columns 2(l%4),
// 2(l%4)+1) of matrix m (transposed with `trans`), written to shared memory. Warp collective.
void stmatrix(int count, bool trans, const uint32_t *regs, void *row_addr);
// cp.async.{ca,cg}.shared.global [dst], [src], bytes, src_bytes: copies src_bytes and zero-fills
// the rest; the bytes land when a cp.async.wait_group lets them (as late as allowed).
void cp_async(void *smem_dst, const void *gmem_src, int bytes, int src_bytes);
// One 16-byte global load or store (ld/st.global.cg.v4): checked and counted as one access of 16
// bytes, however the host compiler would split a copy of the value.
void global_load16(void *dst, const void *src);
void global_store16(void *dst, const void *src);
void cp_async_commit();
void cp_async_wait(int pending_groups);
// wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{bf16,f16}.{bf16,f16} (`elem` 1 f16, 2 bf16): the
// calling warp's 16 rows (warp % 4 of its warpgroup) of D (+)= A B; A from the lanes' registers
// `a` (m16n8k16 A fragments) or, when `a` is null, from the descriptor `a_desc` (K-major, or
// MN-major with `trans_a`); B from `b_desc` (K-major, or MN-major with `trans_b`). Warp collective. The product is recorded when
// issued and computed when a wgmma_wait lets its group complete (reading shared memory and D
// then, as late as the program allows); `a` is read when issued.
void wgmma(int elem, int n, float *d, const uint32_t *a, uint64_t a_desc, uint64_t b_desc,
           bool scale_d, bool trans_b, bool trans_a = false);
void wgmma_fence();
void wgmma_commit();
void wgmma_wait(int pending_groups);
void fence_proxy_async();
// mbarrier.init.shared.b64 [bar], count.
void mbar_init(void *bar, unsigned count);
// mbarrier.arrive[.expect_tx].shared.b64: `tx_bytes` > 0 first adds them to the phase's
// expected transaction bytes.
void mbar_arrive(void *bar, unsigned tx_bytes);
// mbarrier.try_wait.parity in a loop: blocks until the phase of parity `parity` has completed
// (the count of completed phases has the other parity).
void mbar_wait(void *bar, unsigned parity);
// cuTensorMapEncodeTiled for 16-bit or 32-bit elements, interleave none, L2 promotion and OOB
// fill as the kernels ask (zeros): dims and box innermost first, strides (bytes) of dims 1..;
// swizzle 0, 32, 64 or 128 bytes. False (and a finding) when the driver would refuse it.
bool tensor_map_encode(void *map, int elem_bytes, int rank, const void *base, const uint64_t *dims,
                       const uint64_t *strides, const uint32_t *box, int swizzle_bytes);
// cp.async.bulk.tensor.Nd.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [map,
// coords], [bar]: the box at `coords` (innermost first; out-of-bounds elements are zero), rows
// of the box's inner extent laid out one after another in shared memory with the map's swizzle;
// the box's bytes complete on `bar`. The copy lands when issued.
void tma_load(void *dst, const void *map, const int *coords, void *bar);
// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], bytes, [bar].
void bulk_copy(void *dst, const void *src, unsigned bytes, void *bar);
// cp.reduce.async.bulk.tensor.Nd.global.shared::cta.add.tile.bulk_group [map, coords], [src]: the
// fp32 box at `coords` += the box at `src` (laid out as tma_load leaves it, swizzle included),
// each element an atomic add, elements out of bounds not written. In flight until the thread's
// waits: the source is read at cp.async.bulk.wait_group.read (or wait_group) that lets its group
// complete, the adds land at wait_group (or when the thread returns), the latest a GPU may: a
// kernel that rewrites the source or releases the sums too early computes wrong numbers here.
void tma_reduce_add(const void *map, const int *coords, const void *src);
// cp.async.bulk.commit_group; cp.async.bulk.wait_group[.read] n.
void bulk_commit();
void bulk_wait(int pending_groups, bool read_only);
// A release fence (fence.acq_rel): orders what the thread wrote before it, but not the adds of its
// TMA reductions still in flight (only a completed wait_group brings those into its order). The
// emulator reports a fence issued with such adds in flight: the kernels release sums with it.
void fence_release();
// The semaphores that order blocks (cuda/platform.cuh: ld_relaxed_gpu polls, red_relaxed_gpu_add
// releases; the flash backward's dQ' order), each after its atomic access. sem_polled notes the
// value a poll read: a worker whose thread reads the same word twice with the same value is
// spinning. sem_released, with APE_SIMT_STALL_RELEASES=1 and blocks at once (APE_SIMT_WORKERS > 1),
// holds the releasing block (its worker: every thread of it) until each other worker spins on a
// semaphore, is held too or has no block left: the widest window a GPU may leave between a
// release and what the releasing block does next, so that a write the release should have covered
// and did not (one that comes after it in the block's order) lands after the acquiring block's
// reads and adds, deterministically, rather than once in many runs.
void sem_polled(const int *p, int value);
void sem_released();
// setmaxnreg: nothing to emulate.
// The offset of a shared-memory address from the block's dynamic shared memory (which stands at
// a 1024-byte aligned offset of the shared window on a GPU): what wgmma descriptors hold.
uint32_t smem_window_offset(const void *p);
}  // namespace ape::simt

// ---- tensor cores: nvcuda::wmma ------------------------------------------------------------------
// Fragments hold each lane's elements in the layout of the sm_80 implementation: matrix_a is one
// mma.m16n8k16 A fragment, matrix_b and the accumulator two m16n8k16 fragments (columns 0-7 and
// 8-15); __half A/B fragments have 16 elements of which 8..15 repeat 0..7 (CUDA's element count
// for f16). The PTX ISA leaves the WMMA element order to the implementation: kernels must only use
// load/store/mma/fill and elementwise operations on x[].
namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major = 0, mem_col_major = 1 };

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulator implements wmma m16n16k16");
  static constexpr int num_elements =
      std::is_same_v<Use, accumulator> ? 8 : (std::is_same_v<T, __half> ? 16 : 8);
  T x[num_elements];
};

}  // namespace nvcuda::wmma

namespace ape::simt {
// Warp-collective WMMA operations (kernels/simt/Warp.cpp). `elem`: 0 float, 1 __half, 2 bf16.
void wmma_load(int use, int elem, bool col_major, void *frag, const void *ptr, unsigned ld);
void wmma_store(float *ptr, const float *frag, unsigned ld, bool col_major);
void wmma_mma(int elem, float *d, const void *a, const void *b, const float *c);
template <class T> constexpr int elem_code() {
  return std::is_same_v<T, float> ? 0 : std::is_same_v<T, __half> ? 1 : 2;
}
}  // namespace ape::simt

namespace nvcuda::wmma {
template <class Use, int M, int N, int K, class T, class L>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L> &f, const T *ptr, unsigned ld) {
  static_assert(!std::is_same_v<Use, accumulator>, "accumulators load with a layout_t");
  ::ape::simt::wmma_load(std::is_same_v<Use, matrix_a> ? 0 : 1, ::ape::simt::elem_code<T>(),
                         std::is_same_v<L, col_major>, f.x, ptr, ld);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *ptr,
                             unsigned ld, layout_t layout) {
  ::ape::simt::wmma_load(2, 0, layout == mem_col_major, f.x, ptr, ld);
}
inline void store_matrix_sync(float *ptr, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ld, layout_t layout) {
  ::ape::simt::wmma_store(ptr, f.x, ld, layout == mem_col_major);
}
template <class Use, int M, int N, int K, class T, class L>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, T v) {
  for (int e = 0; e < fragment<Use, M, N, K, T, L>::num_elements; ++e) f.x[e] = v;
}
template <class T, class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c) {
  ::ape::simt::wmma_mma(::ape::simt::elem_code<T>(), d.x, a.x, b.x, c.x);
}
}  // namespace nvcuda::wmma
