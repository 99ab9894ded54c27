/* APE C ABI: the types shared by every generated ape_<name>.h (docs/frameworks.md).
 *
 * Plain C99. Each encoding's header (apec --emit=c-abi) declares, for its encoding NAME,
 *   int ape_NAME_forward_f32(const ape_NAME_args *args);   and _backward_f32, _f64 twins,
 * which return an ape_status and never let an exception, a longjmp or a signal of their own
 * cross the boundary. Several encodings' headers can be included together: this file's
 * definitions are shared (one include guard).
 *
 * Memory contract (every entry point):
 *   - The caller owns every buffer; none is kept after the call returns. Temporary workspace
 *     (per-(b, h) tiles; a grouped backward's per-query-head dk, dv for a wave of heads;
 *     contiguous copies of strided arguments) is allocated inside the call; a failed allocation
 *     returns APE_ERROR_OUT_OF_MEMORY. Two caches outlive a call, for the next one: each thread
 *     that ran a call or its OpenMP work keeps freed blocks of 64 KiB or more (at most 32 MiB per
 *     thread, freed when the thread ends), and an encoding whose q/k rotations have no params
 *     keeps its rotation tables for the last two (T, D, H) it ran (a few T x D arrays per
 *     precision) until the library is unloaded. Nothing else is kept.
 *   - Element (b, h, t, d) of a [B, H, T, D] ape_tensor x is
 *       ((T_*) x.data)[b*x.strides[0] + h*x.strides[1] + t*x.strides[2] + d*x.strides[3]]
 *     with strides in elements (not bytes) and T_ = float (_f32) or double (_f64); a [B, H, T]
 *     tensor uses strides[0..2]. strides == NULL means contiguous (row-major). Strided arguments
 *     are copied to contiguous buffers inside the call (inputs before, outputs after the kernel).
 *   - Params (and their gradients) are contiguous arrays, shapes per ape_NAME_param_numel.
 *   - Outputs must not overlap inputs or each other. lse (written by forward) must be kept and
 *     passed unchanged, with o, to backward.
 *   - Thread safety: the functions are reentrant; concurrent calls on distinct outputs are safe.
 *     Each call parallelises over (b, h) with OpenMP when the library was built with it
 *     (OMP_NUM_THREADS / omp_set_num_threads); results do not depend on the thread count.
 *     A process forked after a call that used OpenMP threads must not call the library in the
 *     child (GNU OpenMP's thread pool does not survive fork(): the call hangs), unless
 *     OMP_NUM_THREADS is 1; start worker processes with spawn (Python's multiprocessing
 *     "spawn", DataLoader's multiprocessing_context) or before the first call.
 */
#ifndef APE_C_ABI_H
#define APE_C_ABI_H

#include <stdint.h>

#define APE_C_ABI_VERSION 2  /* 2: ape_NAME_args::kv_heads (grouped-query attention) */

#if defined(_WIN32)
#define APE_C_API __declspec(dllexport)
#elif defined(__GNUC__)
#define APE_C_API __attribute__((visibility("default")))
#else
#define APE_C_API
#endif

/* What an entry point returns. ape_NAME_error_string(status) names it; ape_NAME_last_error()
 * says which argument was wrong and why. */
typedef enum ape_status {
  APE_OK = 0,
  APE_ERROR_NULL_POINTER = 1,  /* args, a required data pointer or a required array is NULL */
  APE_ERROR_INVALID_SHAPE = 2, /* B, H, T < 0, D < 1, kv_heads not dividing H, or B*H*T*D overflows */
  APE_ERROR_INVALID_VALUE = 3, /* scale is not finite; a layer out of range; a fixed param out of its range */
  APE_ERROR_OUT_OF_MEMORY = 4, /* a workspace allocation failed */
  APE_ERROR_INTERNAL = 5,      /* any other failure inside the kernel */
  APE_ERROR_CPU_LEVEL = 6,     /* APE_CPU_LEVEL names an instruction-set level that this CPU or
                                  library cannot run (ape_NAME_last_error() says which) */
  APE_ERROR_NOT_SUPPORTED = 7  /* the backward of an inference-only encoding (an attention
                                  transition: it has no derivative) */
} ape_status;

/* A strided view of a float (or double) array; see the memory contract above. */
typedef struct ape_tensor {
  void *data;             /* inputs are only read through it */
  const int64_t *strides; /* 4 (or 3) element strides, or NULL = contiguous */
} ape_tensor;

#endif /* APE_C_ABI_H */
