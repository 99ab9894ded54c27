// RUN: ape-opt %s -split-input-file -ape-exact-fold | FileCheck %s

// Constant float arithmetic folded in double: ape.constant where f32 cannot hold the value
// (ln 4, 1/3, 2^24 + 1 = 0x4170000010000000, ln 5 of an index constant cast to float),
// arith.constant where it can (2 x 3); chains fold through; an op with a non-constant operand
// stays.
// CHECK-LABEL: ape.encoding @folds
// CHECK: ape.score_mod {
// CHECK-NEXT: ^bb0(%[[S:.*]]: f32, %{{.*}}: index, %{{.*}}: index, %{{.*}}: index, %{{.*}}: index):
// CHECK-DAG: %[[L4:.*]] = ape.constant 1.3862943611198906
// CHECK-DAG: %[[THIRD:.*]] = ape.constant 0.33333333333333331
// CHECK-DAG: %[[SIX:.*]] = arith.constant 6.000000e+00 : f32
// CHECK-DAG: %[[BIG:.*]] = ape.constant 0x4170000010000000
// CHECK-DAG: %[[HALF:.*]] = ape.constant 0.69314718055994529
// CHECK-NOT: math.log {{.*}}: f32
// CHECK: arith.mulf %[[S]], %[[THIRD]] : f32
// CHECK: ape.constant 1.6094379124341003
// CHECK: ape.yield
ape.encoding @folds {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %c4 = arith.constant 4.0 : f32
    %l4 = math.log %c4 : f32
    %c1 = arith.constant 1.0 : f32
    %c3 = arith.constant 3.0 : f32
    %third = arith.divf %c1, %c3 : f32
    %c2 = arith.constant 2.0 : f32
    %six = arith.mulf %c2, %c3 : f32
    %n = arith.constant 16777217 : i64
    %big = arith.sitofp %n : i64 to f32
    %half = arith.divf %l4, %c2 : f32
    %x = arith.mulf %s, %third : f32
    %y = arith.addf %x, %l4 : f32
    %z = arith.addf %y, %six : f32
    %w = arith.addf %z, %big : f32
    %c5 = arith.constant 5 : index
    %i5 = arith.index_cast %c5 : index to i64
    %f5 = arith.sitofp %i5 : i64 to f32
    %l5 = math.log %f5 : f32
    %v = arith.addf %w, %half : f32
    %r = arith.addf %v, %l5 : f32
    ape.yield %r : f32
  }
}

// -----

// A NaN (0/0) and a value past f32's range (exp 100) stay ops here (ape.constant holds finite
// f32 values; the canonicalizer folds them to f32 NaN / inf, exact).
// CHECK-LABEL: ape.encoding @kept
// CHECK: arith.divf
// CHECK: math.exp
ape.encoding @kept {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %c0 = arith.constant 0.0 : f32
    %nan = arith.divf %c0, %c0 : f32
    %c100 = arith.constant 100.0 : f32
    %e = math.exp %c100 : f32
    %x = arith.addf %s, %nan : f32
    %r = arith.minimumf %x, %e : f32
    ape.yield %r : f32
  }
}

// -----

// A value_rows index region takes no ape.constant: there only values f32 holds are folded
// (ln 3 stays an op; 2 x 3 folds).
// CHECK-LABEL: ape.encoding @value_rows
// CHECK: ape.value_rows
// CHECK-NOT: ape.constant
// CHECK: math.log
// CHECK: arith.constant 6.000000e+00 : f32
// CHECK: ape.yield
ape.encoding @value_rows {
  %t = ape.param "av" ["8", "heads", "head_dim"] init = "zeros" trainable
  ape.value_rows %t index {
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c3 = arith.constant 3.0 : f32
    %l = math.log %c3 : f32
    %c2 = arith.constant 2.0 : f32
    %six = arith.mulf %c2, %c3 : f32
    %d = arith.subi %i, %j : index
    %d64 = arith.index_cast %d : index to i64
    %df = arith.sitofp %d64 : i64 to f32
    %q = arith.mulf %df, %l : f32
    %q2 = arith.addf %q, %six : f32
    %r64 = arith.fptosi %q2 : f32 to i64
    %r = arith.index_cast %r64 : i64 to index
    ape.yield %r : index
  }
}
