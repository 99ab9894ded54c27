// RUN: ape-opt %s -split-input-file -ape-push-override | FileCheck %s

// W·override(x, p_n) = W[:, l:]·x[l:] + a + n·b: a masked projection, two
// projection terms per target, and x' = x + a[h, c] + t·b[h, c].
// CHECK-LABEL: ape.encoding @expe
// CHECK-NOT: ape.override
// CHECK: ape.masked_projection {l = 8 : i64, targets = "qk"}
// CHECK-NEXT: %[[A:.*]] = ape.param "override_q_a" ["heads", "head_dim"] init = "projection_term" trainable {columns = 8 : i64, projection = "q", start = 1.000000e+00 : f64, step = 2.500000e-01 : f64}
// CHECK-NEXT: %[[B:.*]] = ape.param "override_q_b" ["heads", "head_dim"] init = "projection_term" trainable {columns = 8 : i64, projection = "q", start = 2.500000e-01 : f64, step = 0.000000e+00 : f64}
// CHECK-NEXT: ape.q_mod {
// CHECK-NEXT: ^bb0(%[[X:.*]]: f32, %{{.*}}: f32, %[[C:.*]]: index, %[[T:.*]]: index, %[[H:.*]]: index):
// CHECK-NEXT: %[[AV:.*]] = ape.load %[[A]][%[[H]], %[[C]]] : !ape.param
// CHECK: %[[TF:.*]] = arith.sitofp %{{.*}} : i64 to f32
// CHECK-NEXT: %[[BV:.*]] = ape.load %[[B]][%[[H]], %[[C]]] : !ape.param
// CHECK-NEXT: %[[TB:.*]] = arith.mulf %[[TF]], %[[BV]] : f32
// CHECK-NEXT: %[[TERM:.*]] = arith.addf %[[AV]], %[[TB]] : f32
// CHECK-NEXT: %[[R:.*]] = arith.addf %[[X]], %[[TERM]] : f32
// CHECK-NEXT: ape.yield %[[R]] : f32
// CHECK: ape.param "override_k_a" {{.*}} projection = "k"
// CHECK: ape.param "override_k_b" {{.*}} projection = "k"
// CHECK: ape.k_mod {
ape.encoding @expe {
  ape.override {l = 8, start = 1.0 : f64, theta = 0.25 : f64}
}

// -----

// Nothing to do without an override.
// CHECK-LABEL: ape.encoding @rope
// CHECK-NEXT: ape.rotary
// CHECK-NOT: ape.masked_projection
ape.encoding @rope {
  ape.rotary
}
