// i1 as MLIR defines it: true is 1 unsigned and -1 signed, so a mask sign-extended (arith.sitofp,
// arith.extsi) gives -1 and zero-extended (arith.extui) 1, as the canonicalizer folds constant
// ones; and a param index that a region argument cannot keep in range (j on a fixed dimension of
// 16: j runs to the sequence length) is clamped, in the forward and the gradient alike. The output
// compiles.
// RUN: rm -rf %t && apec %s -o %t --emit=cpu
// RUN: FileCheck %s --input-file=%t/masks_cpu.cpp
// RUN: %cxx -std=c++17 -fsyntax-only -fopenmp -I %ape_templates %t/masks_cpu.cpp

// CHECK: static T score_mod(
// CHECK: const T [[W:v[0-9]+]] = ctx.params[0][(std::clamp<int64_t>(j, 0, int64_t(16) - 1))];
// CHECK: const bool [[M:v[0-9]+]] = (static_cast<uint64_t>(j) < static_cast<uint64_t>({{v[0-9]+}}));
// CHECK: const T {{v[0-9]+}} = T((-int64_t([[M]])));
// CHECK: const int64_t {{v[0-9]+}} = int64_t((-int64_t([[M]])));
// CHECK: const int64_t {{v[0-9]+}} = int64_t([[M]]);
// CHECK: const bool {{v[0-9]+}} = bool(([[M]] ^ [[M]]));
// CHECK: const bool {{v[0-9]+}} = bool(static_cast<uint64_t>({{v[0-9]+}}) & 1u);
// CHECK: static T score_mod_grad(
// CHECK: ctx.dparams[0][(std::clamp<int64_t>(j, 0, int64_t(16) - 1))] += g;
ape.encoding @masks {
  %p = ape.param "pos_bias" ["16"] init = "zeros" trainable
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %w = ape.load %p[%j] : !ape.param
    %c3 = arith.constant 3 : index
    %m = arith.cmpi ult, %j, %c3 : index
    %f = arith.sitofp %m : i1 to f32
    %e = arith.extsi %m : i1 to i64
    %ef = arith.sitofp %e : i64 to f32
    %u = arith.extui %m : i1 to i64
    %sum = arith.addi %m, %m : i1
    %ji = arith.index_cast %j : index to i64
    %low = arith.trunci %ji : i64 to i1
    %both = arith.andi %sum, %low : i1
    %uf = arith.sitofp %u : i64 to f32
    %zero = arith.constant 0.0 : f32
    %t0 = arith.select %both, %zero, %s : f32
    %t1 = arith.addf %t0, %w : f32
    %t2 = arith.addf %t1, %f : f32
    %t3 = arith.addf %t2, %ef : f32
    %t4 = arith.addf %t3, %uf : f32
    ape.yield %t4 : f32
  }
}
