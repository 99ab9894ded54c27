// Distance biases: a score mod of the form s + B(i - j) gets distance_bias / distance_bias_grad
// (kDistanceBias), evaluated once per distance by the templates; B may be a sum of fused terms.
// A mod that reads i or j otherwise, or that is not additive in s, keeps the per-element path.
// RUN: rm -rf %t && split-file %s %t
// RUN: apec %t/sum.mlir -o %t/out --emit=cpu
// RUN: FileCheck %s --check-prefix=SUM --input-file=%t/out/sum_cpu.cpp
// RUN: FileCheck %s --check-prefix=SUMX --input-file=%t/out/sum_cpu.cpp
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

// The bias, step by step: ALiBi's -m_h·d, then T5's causal bucket (d itself below 16, else
// min(16 + floor(ln(d/16)·16/ln 8), 31)) into the [32, heads] table.
// SUMX: static T distance_bias(const ape::HeadCtx<T> &ctx, int64_t d) {
// SUMX-NEXT: const int64_t [[C31:v[0-9]+]] = int64_t(31);
// SUMX-NEXT: const T [[F16:v[0-9]+]] = T(1.60000000000000000e+01);
// SUMX-NEXT: const int64_t [[C16:v[0-9]+]] = int64_t(16);
// SUMX-NEXT: const int64_t [[C0:v[0-9]+]] = int64_t(0);
// SUMX-NEXT: const T [[M:v[0-9]+]] = ctx.params[0][(ctx.h)];
// SUMX-NEXT: const int64_t [[DI:v[0-9]+]] = int64_t(d);
// SUMX-NEXT: const T [[DF:v[0-9]+]] = T([[DI]]);
// SUMX-NEXT: const T [[MD:v[0-9]+]] = ([[M]] * [[DF]]);
// SUMX-NEXT: const T [[NMD:v[0-9]+]] = (-[[MD]]);
// SUMX-NEXT: const T [[X:v[0-9]+]] = (T(0) + [[NMD]]);
// SUMX-NEXT: const int64_t [[N:v[0-9]+]] = std::max<int64_t>(d, [[C0]]);
// SUMX-NEXT: const bool [[SMALL:v[0-9]+]] = ([[N]] < [[C16]]);
// SUMX-NEXT: const int64_t [[NL:v[0-9]+]] = std::max<int64_t>([[N]], [[C16]]);
// SUMX-NEXT: const int64_t [[NLI:v[0-9]+]] = int64_t([[NL]]);
// SUMX-NEXT: const T [[NLF:v[0-9]+]] = T([[NLI]]);
// SUMX-NEXT: const T [[RATIO:v[0-9]+]] = ([[NLF]] / [[F16]]);
// SUMX-NEXT: const T [[LOG:v[0-9]+]] = std::log([[RATIO]]);
// SUMX-NEXT: const T [[K:v[0-9]+]] = T(7.69437355140780532e+00);
// SUMX-NEXT: const T [[LK:v[0-9]+]] = ([[LOG]] * [[K]]);
// SUMX-NEXT: const T [[FL:v[0-9]+]] = std::floor([[LK]]);
// SUMX-NEXT: const int64_t [[FI:v[0-9]+]] = ::ape::float_math::to_int<T>([[FL]]);
// SUMX-NEXT: const int64_t [[FI2:v[0-9]+]] = int64_t([[FI]]);
// SUMX-NEXT: const int64_t [[LARGE:v[0-9]+]] = int64_t(static_cast<uint64_t>([[FI2]]) + static_cast<uint64_t>([[C16]]));
// SUMX-NEXT: const int64_t [[CAP:v[0-9]+]] = std::min<int64_t>([[LARGE]], [[C31]]);
// SUMX-NEXT: const int64_t [[BK:v[0-9]+]] = ([[SMALL]] ? [[N]] : [[CAP]]);
// SUMX-NEXT: const T [[B:v[0-9]+]] = ctx.params[1][((std::clamp<int64_t>([[BK]], 0, int64_t(32) - 1)) * ctx.H + (ctx.h))];
// SUMX-NEXT: const T [[Y:v[0-9]+]] = ([[X]] + [[B]]);
// SUMX-NEXT: return [[Y]];

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
