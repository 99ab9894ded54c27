// Distance biases: a score mod of the form s + B(i - j) gets distance_bias / distance_bias_grad
// (kDistanceBias), evaluated once per distance by the templates; B may be a sum of fused terms.
// A mod that reads i or j otherwise, or that is not additive in s, keeps the per-element path.
// RUN: rm -rf %t && split-file %s %t
// RUN: apec %t/sum.mlir -o %t/out --emit=cpu
// RUN: FileCheck %s --check-prefix=SUM --input-file=%t/out/sum_cpu.cpp
// RUN: %cxx -std=c++17 -fsyntax-only -fopenmp -I %ape_templates %t/out/sum_cpu.cpp
// RUN: apec %t/fixed.mlir -o %t/out --emit=cpu
// RUN: FileCheck %s --check-prefix=FIXED --input-file=%t/out/fixed_cpu.cpp
// RUN: apec %t/row.mlir -o %t/out --emit=cpu
// RUN: FileCheck %s --check-prefix=NOT --input-file=%t/out/row_cpu.cpp
// RUN: apec %t/scaled.mlir -o %t/out --emit=cpu
// RUN: FileCheck %s --check-prefix=NOT --input-file=%t/out/scaled_cpu.cpp

// ALiBi and T5 fused: (s + slope (j - i)) + table[bucket(i - j)].
// SUM: static T score_mod(
// SUM: static T score_mod_grad(
// SUM: static constexpr bool kDistanceBias = true;
// SUM: static T distance_bias(const ape::HeadCtx<T> &ctx, int64_t d) {
// SUM-NOT: {{[ (]}}{{i|j}}{{[ ),;]}}
// SUM: const T [[X:v[0-9]+]] = (T(0) + {{v[0-9]+}});
// SUM: const T [[B:v[0-9]+]] = ctx.params[1][((std::clamp<int64_t>({{v[0-9]+}}, 0, int64_t(32) - 1)) * ctx.H + (ctx.h))];
// SUM: const T [[Y:v[0-9]+]] = ([[X]] + [[B]]);
// SUM: return [[Y]];
// SUM: static void distance_bias_grad(const ape::HeadCtx<T> &ctx, int64_t d, T g) {
// SUM: ctx.dparams[0][(ctx.h)] += {{g[0-9]+}};
// SUM-NEXT: ctx.dparams[1][((std::clamp<int64_t>({{p[0-9]+}}, 0, int64_t(32) - 1)) * ctx.H + (ctx.h))] += g;
// SUM-NEXT: }
// SUM-NOT: kBiasFixed

// Standard (fixed) ALiBi slopes: the bias has no gradient, and the backward skips its sums.
// FIXED: static void distance_bias_grad(const ape::HeadCtx<T> &ctx, int64_t d, T g) {
// FIXED-NOT: +=
// FIXED: }
// FIXED-NEXT: // The bias has no gradient: the backward skips its sums (templates: kBiasFixed).
// FIXED-NEXT: static constexpr bool kBiasFixed = true;

// NOT-NOT: kDistanceBias

//--- sum.mlir
ape.encoding @sum {
  ape.alibi {learned}
  ape.t5_bias {buckets = 32, max_distance = 128}
}

//--- fixed.mlir
ape.encoding @fixed {
  ape.alibi
}

//--- row.mlir
// The bias reads the query position by itself (as FIRE's normalisation does).
ape.encoding @row {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %d = arith.subi %i, %j : index
    %n = arith.addi %d, %i : index
    %n64 = arith.index_cast %n : index to i64
    %f = arith.sitofp %n64 : i64 to f32
    %r = arith.addf %s, %f : f32
    ape.yield %r : f32
  }
}

//--- scaled.mlir
// Not additive in the logit: s * (1 + d).
ape.encoding @scaled {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %d = arith.subi %i, %j : index
    %d64 = arith.index_cast %d : index to i64
    %f = arith.sitofp %d64 : i64 to f32
    %c1 = arith.constant 1.0 : f32
    %g = arith.addf %f, %c1 : f32
    %r = arith.mulf %s, %g : f32
    ape.yield %r : f32
  }
}
