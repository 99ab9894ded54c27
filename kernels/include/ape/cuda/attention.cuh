// CUDA flash-attention template for generated positional encodings (docs/cuda.md).
//
// The sibling of cpu/attention.h: apec emits, per encoding, the same `Enc` functor (token
// program, q/k mods, score mod and their gradients; members declared APE_HD and templated on the
// context type) and explicit instantiations of attention_forward / attention_backward
// (launch.cuh), one per (input dtype, head dim). Plain CUDA C++17: no MLIR, no LibTorch. Build with nvcc
// --expt-relaxed-constexpr (the functors call std::max / std::clamp in device code), sm_80+.
//
// Attention is causal (key j visible from query i iff j <= i). Per (b, h) slice:
//   forward : tok = token_forward(features)           one block per slice (block-parallel scans)
//             q' = q_mod(q), k' = k_mod(k)            16-byte runs, fp32, stored in the input dtype
//             per query tile: s_ij = score_mod(scale q'_i.k'_j), online softmax, o = P v,
//             lse_i = log sum_j exp(s_ij)             16-bit inputs: flash_forward_kernel
//                                                     (mma.sync, docs/cuda.md); f32 inputs and
//                                                     value rows: forward_kernel
//   backward: recompute tok, q', k'; Delta_i = dO_i . O_i; P = exp(s - lse) recomputed;
//             dS = scale score_mod_grad(P (dP - Delta)) with dP = dO V^T;
//             16-bit inputs: flash_backward_kernel, one pass over the key tiles (dV = P^T dO,
//             dK' = dS^T Q' in registers, dQ' = dS K' added in a fixed order; dq, dk written
//             there in the input dtype where no mod or relative rows follow; on wgmma on
//             sm_90 at D 64 and 128 unless APE_CUDA_WGMMA_BACKWARD=0); otherwise
//             dkdv_kernel per key tile and dq_kernel per query tile;
//             then back through the mods (16-byte runs, where the kernel did not write dq, dk)
//             and the token program (one block per slice, reverse scans).
// Deterministic: every float sum has a fixed order. The gradients that the functors accumulate
// into token slots (row/column sums of the score mod) and into params (head sums, scatters,
// token sums of the q/k mods) are added as 128-bit fixed-point integers (two 64-bit words;
// integer atomicAdd is order independent), then converted to float: bitwise reproducible for
// any schedule; what fixed point cannot hold is reported in the status word. Each (i, j)
// contributes once (in the two-kernel backward, dq_kernel's sinks are off).
//
// Shapes: B batch, H heads, T sequence length, D head dim (32, 64 or 128); q, k, v, o, dout, dq,
// dk, dv (B, H, T, D) in the input dtype; lse (B, H, T), features (B, H, T), params: float32.
//
// The parts, each including what it builds on (docs/cuda.md, "Files"):
//   common.cuh          element types, fixed-point sinks, DevCtx, Params, tile configuration
//   side_kernels.cuh    token program, q/k mods, Delta, relative rows, value rows, bias tables
//   forward.cuh         the general forward (f32 inputs, value rows)
//   backward.cuh        the general backward: dkdv_kernel, dq_kernel
//   flash_forward.cuh   the FlashAttention-2-class forward (flash_tile.cuh's mma.sync tiles)
//   hopper_forward.cuh  the Hopper forward (sm_90a: TMA, mbarriers, wgmma)
//   flash_backward.cuh  the flash backward: mma.sync layouts (sm_80+) and a wgmma one (sm_90a,
//                       its default at D 64 and 128)
//   transition.cuh      an attention transition's rows after the forward (inference only)
//   launch.cuh          the host side: attention_forward / attention_backward, APE_CUDA_INSTANTIATE
#pragma once

#include "ape/cuda/launch.cuh"
