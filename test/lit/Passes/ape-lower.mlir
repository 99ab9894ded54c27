// The whole pipeline: components at several sites become ONE scheduled,
// differentiated ape.kernel per encoding.
// RUN: ape-opt %s -ape-lower | FileCheck %s

// CHECK-LABEL: ape.kernel @rope_alibi_cable attributes {k_mod_linear, passes = 1 : i64, q_mod_linear, score_bias = "features", tile_k = 64 : i64, tile_q = 64 : i64} {
// CHECK-NOT: ape.encoding
// CHECK: ape.param "alibi_slopes" ["heads"] init = "alibi_slopes"
// CHECK: ape.token_feature "cable"
// CHECK: ape.map
// CHECK: } grad {
// CHECK: ape.scan
// CHECK: ape.q_mod attributes {pairing = "half"} {
// CHECK: } grad {
// CHECK: ape.k_mod attributes {pairing = "half"} {
// CHECK: } grad {
// CHECK: ape.score_mod {
// CHECK: } grad {
// CHECK-NOT: ape.score_mod
// CHECK-NOT: ape.q_mod
// CHECK: }
ape.encoding @rope_alibi_cable {
  ape.rotary
  ape.alibi
  ape.cable
}

// CHECK-LABEL: ape.kernel @expe_cable
// CHECK: ape.param "position_scale" ["1"] init = "constant" {max = 0x4170000000000000 : f64, min = 0xC170000000000000 : f64, value = 1.000000e+00 : f64}
// CHECK: ape.masked_projection {l = 4 : i64, position_scale = "position_scale", targets = "qk"}
// CHECK-COUNT-4: init = "projection_term"
// CHECK: ape.q_mod {
// CHECK: ape.k_mod {
// CHECK: ape.score_mod {
ape.encoding @expe_cable {
  ape.override {l = 4}
  ape.cable
}
