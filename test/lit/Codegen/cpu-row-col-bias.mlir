// Row/column biases: a score mod of the form s + R(i) + C(j) gets row_bias / col_bias and their
// gradients (kRowColBias), evaluated once per query and key of a tile by the CUDA flash kernels.
// Terms split at additions, subtractions and negations; a term that reads both positions, or a
// load whose gradient does, keeps the per-element path.
// RUN: rm -rf %t && split-file %s %t
// RUN: apec %t/cable.mlir -o %t/out --emit=cpu
// RUN: FileCheck %s --check-prefix=CABLE --input-file=%t/out/cable_cpu.cpp
// RUN: %cxx -std=c++17 -fsyntax-only -fopenmp -I %ape_templates %t/out/cable_cpu.cpp
// RUN: apec %t/twoside.mlir -o %t/out --emit=cpu
// RUN: FileCheck %s --check-prefix=TWO --input-file=%t/out/twoside_cpu.cpp
// RUN: %cxx -std=c++17 -fsyntax-only -fopenmp -I %ape_templates %t/out/twoside_cpu.cpp
// RUN: apec %t/shared.mlir -o %t/out --emit=cpu
// RUN: FileCheck %s --check-prefix=NOT --input-file=%t/out/shared_cpu.cpp
// RUN: apec %t/mixed.mlir -o %t/out --emit=cpu
// RUN: FileCheck %s --check-prefix=NOT --input-file=%t/out/mixed_cpu.cpp
// RUN: apec %t/cable.mlir -o %t/cuda --emit=cuda --cuda-dtypes=bf16 --cuda-head-dims=64
// RUN: FileCheck %s --check-prefix=CUDA --input-file=%t/cuda/cable_cuda.cuh

// Cable: s + (S_i - S_j) of the scanned token feature.
// CABLE: static constexpr bool kRowColBias = true;
// CABLE: static T row_bias(const ape::HeadCtx<T> &ctx, int64_t i) {
// CABLE-NEXT: const T [[R:v[0-9]+]] = ctx.tok[2 * ctx.tok_stride() + (i)];
// CABLE-NEXT: return T(0) + [[R]];
// CABLE: static void row_bias_grad(const ape::HeadCtx<T> &ctx, int64_t i, T g) {
// CABLE-NEXT: ctx.dtok[2 * ctx.tok_stride() + (i)] += g;
// CABLE-NEXT: }
// CABLE: static T col_bias(const ape::HeadCtx<T> &ctx, int64_t j) {
// CABLE-NEXT: const T [[C:v[0-9]+]] = ctx.tok[2 * ctx.tok_stride() + (j)];
// CABLE-NEXT: return T(0) - [[C]];
// CABLE: static void col_bias_grad(const ape::HeadCtx<T> &ctx, int64_t j, T g) {
// CABLE: ctx.dtok[2 * ctx.tok_stride() + (j)] += {{g[0-9]+}};
// CABLE-NEXT: }

// CUDA: static constexpr bool kRowColBias = true;
// CUDA: APE_HD static T row_bias(const Ctx &ctx, int64_t i) {
// CUDA: APE_HD static void col_bias_grad(const Ctx &ctx, int64_t j, T g) {

// Two trainable per-head weights, one per side: s + w1_h i - w2_h j.
// TWO: static T row_bias(const ape::HeadCtx<T> &ctx, int64_t i) {
// TWO-NOT: {{[ (]}}j{{[ ),;]}}
// TWO: return T(0) + {{v[0-9]+}};
// TWO: static void row_bias_grad(const ape::HeadCtx<T> &ctx, int64_t i, T g) {
// TWO-NOT: dparams[1]
// TWO: ctx.dparams[0][(ctx.h)] += {{g[0-9]+}};
// TWO-NEXT: }
// TWO: static T col_bias(const ape::HeadCtx<T> &ctx, int64_t j) {
// TWO-NOT: {{[ (]}}i{{[ ),;]}}
// TWO: return T(0) - {{v[0-9]+}};
// TWO: static void col_bias_grad(const ape::HeadCtx<T> &ctx, int64_t j, T g) {
// TWO-NOT: dparams[0]
// TWO: ctx.dparams[1][(ctx.h)] += {{g[0-9]+}};
// TWO-NEXT: }

// NOT-NOT: kRowColBias

//--- cable.mlir
ape.encoding @cable {
  ape.cable {kernel = "none"}
}

//--- twoside.mlir
ape.encoding @twoside {
  %w1 = ape.param "w1" ["heads"] init = "zeros" trainable
  %w2 = ape.param "w2" ["heads"] init = "zeros" trainable
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %a = ape.load %w1[%h] : !ape.param
    %c = ape.load %w2[%h] : !ape.param
    %i64 = arith.index_cast %i : index to i64
    %fi = arith.sitofp %i64 : i64 to f32
    %j64 = arith.index_cast %j : index to i64
    %fj = arith.sitofp %j64 : i64 to f32
    %r = arith.mulf %a, %fi : f32
    %k = arith.mulf %c, %fj : f32
    %x = arith.subf %r, %k : f32
    %y = arith.addf %s, %x : f32
    ape.yield %y : f32
  }
}

//--- shared.mlir
// One weight for both sides: w_h (i - j) read as w_h i - w_h j; w's gradient g (i - j) reads
// both positions, so no row/column split (the distance form i - j is not used either).
ape.encoding @shared {
  %w = ape.param "w" ["heads"] init = "zeros" trainable
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %a = ape.load %w[%h] : !ape.param
    %i64 = arith.index_cast %i : index to i64
    %fi = arith.sitofp %i64 : i64 to f32
    %j64 = arith.index_cast %j : index to i64
    %fj = arith.sitofp %j64 : i64 to f32
    %r = arith.mulf %a, %fi : f32
    %k = arith.mulf %a, %fj : f32
    %x = arith.subf %r, %k : f32
    %y = arith.addf %s, %x : f32
    ape.yield %y : f32
  }
}

//--- mixed.mlir
// A term of both positions: s + i j / T.
ape.encoding @mixed {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %p = arith.muli %i, %j : index
    %p64 = arith.index_cast %p : index to i64
    %f = arith.sitofp %p64 : i64 to f32
    %y = arith.addf %s, %f : f32
    ape.yield %y : f32
  }
}
