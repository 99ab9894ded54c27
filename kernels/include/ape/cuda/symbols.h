// Names of the CUDA layer's symbols in the two builds of the same source (docs/cuda.md): for
// nvcc, ape::cuda::... and ape_cuda_kernel_entry_NAME; for the SIMT emulator (-DAPE_SIMT),
// the inline namespace ape::cuda::simt and ape_simt_kernel_entry_NAME, so that a program may
// link emulated and real kernels side by side without two definitions of one name.
#pragma once

#ifdef APE_SIMT
#define APE_CUDA_ABI_BEGIN inline namespace simt {
#define APE_CUDA_ABI_END }
#define APE_CUDA_ENTRY(name) ape_simt_kernel_entry_##name
#else
#define APE_CUDA_ABI_BEGIN
#define APE_CUDA_ABI_END
#define APE_CUDA_ENTRY(name) ape_cuda_kernel_entry_##name
#endif
