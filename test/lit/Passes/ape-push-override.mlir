// RUN: ape-opt %s -split-input-file -ape-push-override | FileCheck %s

// ExPE: W·override(x, σp_n) = W[:, l:]·x[l:] + σ(a + n·b): the fixed scalar σ, a masked
// projection, two projection terms per target, and x' = x + σ·(a[h, c] + t·b[h, c]).
// CHECK-LABEL: ape.encoding @expe
// CHECK-NOT: ape.override
// CHECK: %[[SIGMA:.*]] = ape.param "position_scale" ["1"] init = "constant" {max = 0x4170000000000000 : f64, min = 0xC170000000000000 : f64, value = 1.000000e+00 : f64}
// CHECK-NEXT: ape.masked_projection {l = 8 : i64, position_scale = "position_scale", start = 1.000000e+00 : f64, targets = "qk", theta = 2.500000e-01 : f64}
// CHECK-NEXT: %[[A:.*]] = ape.param "override_q_a" ["heads", "head_dim"] init = "projection_term" trainable {columns = 8 : i64, projection = "q", start = 1.000000e+00 : f64, step = 2.500000e-01 : f64}
// CHECK-NEXT: %[[B:.*]] = ape.param "override_q_b" ["heads", "head_dim"] init = "projection_term" trainable {columns = 8 : i64, projection = "q", start = 2.500000e-01 : f64, step = 0.000000e+00 : f64}
// CHECK-NEXT: ape.q_mod {
// CHECK-NEXT: ^bb0(%[[X:.*]]: f32, %{{.*}}: f32, %[[C:.*]]: index, %[[T:.*]]: index, %[[H:.*]]: index):
// CHECK-NEXT: %[[AV:.*]] = ape.load %[[A]][%[[H]], %[[C]]] : !ape.param
// CHECK-NEXT: %[[TI:.*]] = arith.index_cast %[[T]] : index to i64
// CHECK-NEXT: %[[TF:.*]] = arith.sitofp %[[TI]] : i64 to f32
// CHECK-NEXT: %[[BV:.*]] = ape.load %[[B]][%[[H]], %[[C]]] : !ape.param
// CHECK-NEXT: %[[TB:.*]] = arith.mulf %[[TF]], %[[BV]] : f32
// CHECK-NEXT: %[[TERM:.*]] = arith.addf %[[AV]], %[[TB]] : f32
// CHECK-NEXT: %[[Z:.*]] = arith.constant 0 : index
// CHECK-NEXT: %[[S:.*]] = ape.load %[[SIGMA]][%[[Z]]] : !ape.param
// CHECK-NEXT: %[[ST:.*]] = arith.mulf %[[S]], %[[TERM]] : f32
// CHECK-NEXT: %[[R:.*]] = arith.addf %[[X]], %[[ST]] : f32
// CHECK-NEXT: ape.yield %[[R]] : f32
// The k side alike, with its own a and b:
// CHECK: %[[KA:.*]] = ape.param "override_k_a" {{.*}} projection = "k"
// CHECK: %[[KB:.*]] = ape.param "override_k_b" {{.*}} projection = "k"
// CHECK: ape.k_mod {
// CHECK-NEXT: ^bb0(%[[KX:.*]]: f32, %{{.*}}: f32, %[[KC:.*]]: index, %[[KT:.*]]: index, %[[KH:.*]]: index):
// CHECK-NEXT: %[[KAV:.*]] = ape.load %[[KA]][%[[KH]], %[[KC]]] : !ape.param
// CHECK-NEXT: %[[KTI:.*]] = arith.index_cast %[[KT]] : index to i64
// CHECK-NEXT: %[[KTF:.*]] = arith.sitofp %[[KTI]] : i64 to f32
// CHECK-NEXT: %[[KBV:.*]] = ape.load %[[KB]][%[[KH]], %[[KC]]] : !ape.param
// CHECK-NEXT: %[[KTB:.*]] = arith.mulf %[[KTF]], %[[KBV]] : f32
// CHECK-NEXT: %[[KTERM:.*]] = arith.addf %[[KAV]], %[[KTB]] : f32
// CHECK-NEXT: %[[KZ:.*]] = arith.constant 0 : index
// CHECK-NEXT: %[[KS:.*]] = ape.load %[[SIGMA]][%[[KZ]]] : !ape.param
// CHECK-NEXT: %[[KST:.*]] = arith.mulf %[[KS]], %[[KTERM]] : f32
// CHECK-NEXT: %[[KR:.*]] = arith.addf %[[KX]], %[[KST]] : f32
// CHECK-NEXT: ape.yield %[[KR]] : f32
ape.encoding @expe {
  ape.override {l = 8, start = 1.0 : f64, theta = 0.25 : f64}
}

// -----

// ExQPE: W[:, :l]·p_n = a + floor(n/l)·b + P[n mod l] with P a [l, heads, head_dim]
// prefix-sum param; "qkv" keeps the value override in the masked projection (the
// runtime builds the overridden value input from these attributes).
// CHECK-LABEL: ape.encoding @exqpe
// CHECK: ape.masked_projection {kind = "exqpe", l = 4 : i64, position_scale = "position_scale", targets = "qkv", theta1 = 2.500000e-01 : f64, theta2 = 1.000000e+00 : f64}
// CHECK-NEXT: %[[A:.*]] = ape.param "override_q_a" ["heads", "head_dim"] init = "projection_term" trainable {columns = 4 : i64, projection = "q", start = 0.000000e+00 : f64, step = 2.500000e-01 : f64}
// CHECK-NEXT: %[[B:.*]] = ape.param "override_q_b" ["heads", "head_dim"] init = "projection_term" trainable {columns = 4 : i64, projection = "q", start = 1.000000e+00 : f64, step = 0.000000e+00 : f64}
// CHECK-NEXT: %[[P:.*]] = ape.param "override_q_p" ["4", "heads", "head_dim"] init = "projection_prefix" trainable {columns = 4 : i64, projection = "q", scale = 1.000000e+00 : f64}
// CHECK-NEXT: ape.q_mod {
// CHECK-NEXT: ^bb0(%[[X:.*]]: f32, %{{.*}}: f32, %[[C:.*]]: index, %[[T:.*]]: index, %[[H:.*]]: index):
// CHECK-NEXT: %[[AV:.*]] = ape.load %[[A]][%[[H]], %[[C]]] : !ape.param
// CHECK-NEXT: %[[L:.*]] = arith.constant 4 : index
// CHECK-NEXT: %[[BLK:.*]] = arith.divui %[[T]], %[[L]] : index
// CHECK-NEXT: %[[BI:.*]] = arith.index_cast %[[BLK]] : index to i64
// CHECK-NEXT: %[[BF:.*]] = arith.sitofp %[[BI]] : i64 to f32
// CHECK-NEXT: %[[BV:.*]] = ape.load %[[B]][%[[H]], %[[C]]] : !ape.param
// CHECK-NEXT: %[[BB:.*]] = arith.mulf %[[BF]], %[[BV]] : f32
// CHECK-NEXT: %[[AB:.*]] = arith.addf %[[AV]], %[[BB]] : f32
// CHECK-NEXT: %[[L2:.*]] = arith.constant 4 : index
// CHECK-NEXT: %[[RES:.*]] = arith.remui %[[T]], %[[L2]] : index
// CHECK-NEXT: %[[PV:.*]] = ape.load %[[P]][%[[RES]], %[[H]], %[[C]]] : !ape.param
// CHECK-NEXT: %[[TERM:.*]] = arith.addf %[[AB]], %[[PV]] : f32
// CHECK-NEXT: %[[Z:.*]] = arith.constant 0 : index
// CHECK-NEXT: %[[S:.*]] = ape.load %{{.*}}[%[[Z]]] : !ape.param
// CHECK-NEXT: %[[ST:.*]] = arith.mulf %[[S]], %[[TERM]] : f32
// CHECK-NEXT: %[[R:.*]] = arith.addf %[[X]], %[[ST]] : f32
// CHECK-NEXT: ape.yield %[[R]] : f32
// CHECK: ape.param "override_k_p" ["4", "heads", "head_dim"] init = "projection_prefix" trainable {columns = 4 : i64, projection = "k", scale = 1.000000e+00 : f64}
// CHECK: ape.k_mod {
// CHECK-NOT: projection = "v"
ape.encoding @exqpe {
  ape.override {kind = "exqpe", l = 4, start = 0.0 : f64, theta1 = 0.25 : f64, theta2 = 1.0 : f64, targets = "qkv"}
}

// -----

// The override's terms go before a rotation, whatever the order in the spec.
// CHECK-LABEL: ape.encoding @rope_expe
// CHECK: ape.masked_projection
// CHECK: ape.q_mod {
// CHECK: ape.k_mod {
// CHECK: ape.rotary
ape.encoding @rope_expe {
  ape.rotary
  ape.override {l = 4}
}

// -----

// Nothing to do without an override.
// CHECK-LABEL: ape.encoding @rope
// CHECK-NEXT: ape.rotary
// CHECK-NOT: ape.masked_projection
ape.encoding @rope {
  ape.rotary
}
