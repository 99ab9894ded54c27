// -ape-fast-math: in an encoding marked fast_math, the ops of its score mods get the fast-math flags
// afn and arcp (the CUDA emitter then writes the approximate forms: Codegen/cuda-fast-math.mlir);
// the token program stays exact, and so do the ops whose value reaches a comparison or a rounding
// to an integer (T5's bucket). -ape-differentiate gives a flagged op's derivative its flags.
// RUN: ape-opt %s -split-input-file -ape-expand -ape-fast-math | FileCheck %s
// RUN: ape-opt %s -split-input-file -ape-lower | FileCheck %s --check-prefix=GRAD

// K-Cable: the map (-softplus, the token program) exact, the score mod's log1p flagged.
// CHECK-LABEL: ape.encoding @kcable_fast attributes {fast_math}
// CHECK: ape.map
// CHECK: math.exp %{{[^ ]*}} : f32
// CHECK: math.log1p %{{[^ ]*}} : f32
// CHECK: ape.score_mod
// CHECK: arith.subf %{{.*}} fastmath<arcp,afn> : f32
// CHECK: math.log1p %{{[^ ]*}} fastmath<arcp,afn> : f32
// CHECK: arith.addf %{{.*}} fastmath<arcp,afn> : f32
// The backward: log1p's derivative 2x/(1+x²) divides with log1p's flags.
// GRAD-LABEL: ape.kernel @kcable_fast
// GRAD: ape.score_mod {
// GRAD: math.log1p %{{[^ ]*}} fastmath<arcp,afn> : f32
// GRAD: } grad {
// GRAD: arith.divf %{{.*}} fastmath<arcp,afn> : f32
ape.encoding @kcable_fast attributes {fast_math} {
  ape.cable {kernel = "log1p_sq"}
}

// -----

// Without the mark nothing changes.
// CHECK-LABEL: ape.encoding @kcable {
// CHECK-NOT: fastmath
// GRAD-LABEL: ape.kernel @kcable
// GRAD-NOT: fastmath
ape.encoding @kcable {
  ape.cable {kernel = "log1p_sq"}
}

// -----

// A log that chooses a bucket (floor) stays exact; the division after the lookup does not.
// CHECK-LABEL: ape.encoding @bucket_fast attributes {fast_math}
// CHECK: ape.score_mod
// CHECK: math.log %{{[^ ]*}} : f32
// CHECK: math.floor %{{[^ ]*}} : f32
// CHECK: arith.divf %{{.*}} fastmath<arcp,afn> : f32
// GRAD-LABEL: ape.kernel @bucket_fast
// GRAD: math.log %{{[^ ]*}} : f32
// GRAD: arith.divf %{{.*}} fastmath<arcp,afn> : f32
ape.encoding @bucket_fast attributes {fast_math} {
  %t = ape.param "table" ["8", "heads"] init = "zeros" trainable
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %c1 = arith.constant 1 : index
    %d = arith.subi %i, %j : index
    %d1 = arith.addi %d, %c1 : index
    %di = arith.index_cast %d1 : index to i64
    %df = arith.sitofp %di : i64 to f32
    %l = math.log %df : f32
    %f = math.floor %l : f32
    %fi = arith.fptosi %f : f32 to i64
    %k = arith.index_cast %fi : i64 to index
    %w = ape.load %t[%k, %h] : !ape.param
    %two = arith.constant 2.0 : f32
    %q = arith.divf %w, %two : f32
    %out = arith.addf %s, %q : f32
    ape.yield %out : f32
  }
}

// -----

// Two score mods: the second compares the value the first yields (e = exp(0.09375 (i - j)) >= 938
// masks the key), so the first's exp stays exact, as it would inside one mod; fused, an
// approximate exp (937.9997 where exactly 938.00005) kept a key the spec masks. A third mod that
// only adds to the logit keeps its flags.
// CHECK-LABEL: ape.encoding @chained attributes {fast_math}
// CHECK: ape.score_mod
// CHECK: arith.mulf %{{[^ ]*}}, %{{[^ ]*}} : f32
// CHECK-NEXT: math.exp %{{[^ ]*}} : f32
// CHECK: ape.score_mod
// CHECK: arith.cmpf oge
// CHECK: ape.score_mod
// CHECK: math.exp %{{[^ ]*}} fastmath<arcp,afn> : f32
ape.encoding @chained attributes {fast_math} {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %d = arith.subi %i, %j : index
    %d64 = arith.index_cast %d : index to i64
    %df = arith.sitofp %d64 : i64 to f32
    %c = arith.constant 0.09375 : f32
    %x = arith.mulf %df, %c : f32
    %e = math.exp %x : f32
    ape.yield %e : f32
  }
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %lim = arith.constant 938.0 : f32
    %ninf = arith.constant 0xFF800000 : f32
    %zero = arith.constant 0.0 : f32
    %far = arith.cmpf oge, %s, %lim : f32
    %r = arith.select %far, %ninf, %zero : f32
    ape.yield %r : f32
  }
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %d = arith.subi %i, %j : index
    %d64 = arith.index_cast %d : index to i64
    %df = arith.sitofp %d64 : i64 to f32
    %e = math.exp %df : f32
    %r = arith.addf %s, %e : f32
    ape.yield %r : f32
  }
}
