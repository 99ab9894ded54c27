// The prob site through the pipeline: -ape-fuse moves the transition into the kernel and marks it
// inference_only (no backward: -ape-differentiate leaves it alone), -ape-schedule gives it three passes over K/V (row log-sum-exp,
// kept mass and mask sums, output), and the other sites lower as usual.
// RUN: ape-opt %s -ape-lower | FileCheck %s
// RUN: ape-opt %s -ape-expand -ape-push-override -ape-fuse | FileCheck %s --check-prefix=FUSE
// RUN: ape-opt %s -ape-lower | ape-opt -ape-schedule | FileCheck %s --check-prefix=AGAIN

// The inference-only kernel gets no backward from -ape-differentiate: no grad regions.
// CHECK-LABEL: ape.kernel @rope_transition attributes {inference_only, k_mod_linear, passes = 3 : i64, q_mod_linear, tile_k = 64 : i64, tile_q = 64 : i64}
// CHECK: ape.attention_transition {alpha = 2.500000e-01 : f64}
// CHECK: ape.q_mod attributes {pairing = "half"} {
// CHECK-NOT: grad
// CHECK-LABEL: ape.kernel @rope attributes {k_mod_linear, passes = 1 : i64, q_mod_linear, tile_k = 64 : i64, tile_q = 64 : i64}
// CHECK-NOT: ape.attention_transition
// CHECK: ape.q_mod attributes {pairing = "half"}
// CHECK: } grad {

// FUSE-LABEL: ape.kernel @rope_transition attributes {inference_only}
// FUSE-NEXT: ape.attention_transition {alpha = 2.500000e-01 : f64}
// FUSE-LABEL: ape.kernel @rope {

// AGAIN: ape.kernel @rope_transition attributes {inference_only, k_mod_linear, passes = 3 : i64
ape.encoding @rope_transition {
  ape.rotary
  ape.attention_transition {alpha = 0.25 : f64}
}
ape.encoding @rope {
  ape.rotary
}
