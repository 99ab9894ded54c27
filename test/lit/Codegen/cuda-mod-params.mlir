// The CUDA functor names the trainable params each q/k mod reads (kQModParams / kKModParams):
// the backward sums their gradients over rows in registers (mod_backward_params_kernel). A mod
// without params gets 0, a side without a mod nothing, and the CPU functor neither.
// RUN: rm -rf %t && apec %s -o %t --emit=cuda,cpu --cuda-dtypes=bf16 --cuda-head-dims=64
// RUN: FileCheck %s --input-file=%t/mods_cuda.cuh
// RUN: FileCheck %s --check-prefix=NOMOD --input-file=%t/kmod_only_cuda.cuh
// RUN: FileCheck %s --check-prefix=CPU --input-file=%t/mods_cpu.cpp

// params: 0 "shift" (q mod), 1 "unused_by_mods" (score mod), 2 "kshift" (k mod), 3 "fixed" (k
// mod, not trainable: no gradient); the k mod also reads "shift"
// CHECK: static constexpr unsigned kQModParams = 0x1u;  // trainable, read by the q mod, a bit each
// CHECK-NEXT: static constexpr unsigned kKModParams = 0x5u;  // trainable, read by the k mod, a bit each
ape.encoding @mods {
  %shift = ape.param "shift" ["heads", "head_dim"] init = "zeros" trainable
  %bias = ape.param "unused_by_mods" ["heads"] init = "zeros" trainable
  %kshift = ape.param "kshift" ["heads", "head_dim"] init = "zeros" trainable
  %fixed = ape.param "fixed" ["head_dim"] init = "ones"
  ape.q_mod {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    %s = ape.load %shift[%h, %c] : !ape.param
    %r = arith.addf %x, %s : f32
    ape.yield %r : f32
  }
  ape.k_mod {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    %s = ape.load %shift[%h, %c] : !ape.param
    %k = ape.load %kshift[%h, %c] : !ape.param
    %f = ape.load %fixed[%c] : !ape.param
    %sk = arith.addf %s, %k : f32
    %u = arith.mulf %sk, %f : f32
    %r = arith.addf %x, %u : f32
    ape.yield %r : f32
  }
  ape.score_mod {
  ^bb0(%s: f32, %b0: index, %h: index, %i: index, %j: index):
    %b = ape.load %bias[%h] : !ape.param
    %r = arith.addf %s, %b : f32
    ape.yield %r : f32
  }
}

// NOMOD-NOT: kQModParams
// NOMOD: static constexpr unsigned kKModParams = 0x0u;  // trainable, read by the k mod, a bit each
ape.encoding @kmod_only {
  ape.k_mod {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    %two = arith.constant 2.0 : f32
    %r = arith.mulf %x, %two : f32
    ape.yield %r : f32
  }
}

// CPU-NOT: ModParams
