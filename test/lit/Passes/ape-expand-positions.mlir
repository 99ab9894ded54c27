// RUN: ape-opt %s -split-input-file -ape-expand | FileCheck %s
// The RoPE scalings, xPos and the absolute encodings after expansion.

// Position interpolation: the factor is a fixed scalar param read at run time, θ' = θ/s.
// CHECK-LABEL: ape.encoding @pi
// CHECK: %[[S:.*]] = ape.param "rope_factor" ["1"] init = "constant" {max = 0x4170000000000000 : f64, min = 5.9604644775390625E-8 : f64, value = 4.000000e+00 : f64}
// CHECK: ape.q_mod attributes {pairing = "half"} {
// CHECK: %[[THETA:.*]] = math.powf %{{.*}}, %{{.*}} : f32
// CHECK: %[[SV:.*]] = ape.load %[[S]][%{{.*}}] : !ape.param
// CHECK-NEXT: %[[SCALED:.*]] = arith.divf %[[THETA]], %[[SV]] : f32
// CHECK: arith.mulf %{{.*}}, %[[SCALED]] : f32
// CHECK: ape.k_mod attributes {pairing = "half"} {
ape.encoding @pi {
  ape.rotary {scaling = "linear", factor = 4.0 : f64}
}

// -----

// NTK-aware: base' = base·s^(r/(r-2)), then θ' = base'^(-2k/r).
// CHECK-LABEL: ape.encoding @ntk
// CHECK: ape.param "rope_factor" ["1"] init = "constant" {max = 0x4170000000000000 : f64, min = 5.9604644775390625E-8 : f64, value = 2.000000e+00 : f64}
// CHECK-NOT: rope_original_length
// CHECK: ape.q_mod
// CHECK: %[[S:.*]] = ape.load
// CHECK: %[[G:.*]] = math.powf %[[S]], %{{.*}} : f32
// CHECK: %[[BASE:.*]] = arith.mulf %{{.*}}, %[[G]] : f32
// CHECK-NEXT: math.powf %[[BASE]], %{{.*}} : f32
ape.encoding @ntk {
  ape.rotary {scaling = "ntk", factor = 2.0 : f64}
}

// -----

// Dynamic NTK reads the run-time sequence length: l = max(T, L).
// CHECK-LABEL: ape.encoding @dynamic
// CHECK: %[[S:.*]] = ape.param "rope_factor" ["1"] init = "constant" {max = 0x4170000000000000 : f64, min = 5.9604644775390625E-8 : f64, value = 4.000000e+00 : f64}
// CHECK-NEXT: %[[L:.*]] = ape.param "rope_original_length" ["1"] init = "constant" {integer, max = {{.*}} : f64, min = 1.000000e+00 : f64, value = 2.048000e+03 : f64}
// CHECK: ape.q_mod
// CHECK: %[[LV:.*]] = ape.load %[[L]]
// CHECK-NEXT: %[[T:.*]] = ape.dim "seq_len"
// CHECK: %[[TF:.*]] = arith.sitofp %{{.*}} : i64 to f32
// CHECK-NEXT: arith.maximumf %[[TF]], %[[LV]] : f32
ape.encoding @dynamic {
  ape.rotary {scaling = "dynamic_ntk", factor = 4.0 : f64, original_length = 2048}
}

// -----

// YaRN: a clamped ramp between floor/ceil of the dimension indices, and mscale on the output
// (all coordinates: the multiply comes after the select that passes unrotated ones through).
// CHECK-LABEL: ape.encoding @yarn
// CHECK: ape.param "rope_factor"
// CHECK: ape.param "rope_original_length" ["1"] init = "constant" {integer, max = {{.*}} : f64, min = 1.000000e+00 : f64, value = 1.280000e+02 : f64}
// CHECK: ape.q_mod
// CHECK: math.log
// CHECK: math.floor
// CHECK: math.ceil
// CHECK: ape.constant 1.000000e-01
// CHECK: %[[MS:.*]] = arith.select %{{.*}}, %{{.*}}, %{{.*}} : f32
// CHECK: %[[OUT:.*]] = arith.select %{{.*}}, %{{.*}}, %arg0 : f32
// CHECK-NEXT: %[[SCALED:.*]] = arith.mulf %[[OUT]], %[[MS]] : f32
// CHECK-NEXT: ape.yield %[[SCALED]] : f32
ape.encoding @yarn {
  ape.rotary {scaling = "yarn", factor = 4.0 : f64, original_length = 128}
}

// -----

// Llama-3: constants 2π that f32 cannot hold exactly stay exact as ape.constant.
// CHECK-LABEL: ape.encoding @llama3
// CHECK: ape.q_mod
// CHECK: %[[TWOPI:.*]] = ape.constant 6.2831853071795862
// CHECK: arith.divf %[[TWOPI]], %{{.*}} : f32
// CHECK: arith.cmpf ogt
// CHECK: arith.cmpf olt
ape.encoding @llama3 {
  ape.rotary {base = 500000.0 : f64, scaling = "llama3", factor = 8.0 : f64, original_length = 8192}
}

// -----

// xPos: interleaved rotation times ζ^(±t_c/B), with t_c = t - floor(T/2); q uses +1/B, k -1/B.
// CHECK-LABEL: ape.encoding @xpos
// CHECK: ape.q_mod attributes {pairing = "interleaved"} {
// CHECK: ape.constant 1.400000e+00
// CHECK: %[[T:.*]] = ape.dim "seq_len"
// CHECK-NEXT: %[[HALF:.*]] = arith.divui %[[T]], %{{.*}} : index
// CHECK-NEXT: arith.subi %{{.*}}, %[[HALF]] : index
// CHECK: arith.constant 0.001953125 : f32
// CHECK: %[[DECAY:.*]] = math.powf
// CHECK-NEXT: arith.mulf %{{.*}}, %[[DECAY]] : f32
// CHECK: ape.k_mod attributes {pairing = "interleaved"} {
// CHECK: arith.constant -0.001953125 : f32
ape.encoding @xpos {
  ape.xpos {gamma = 0.4 : f64, scale_base = 512.0 : f64}
}

// -----

// Sinusoidal absolute positions: a table region of (n, c, d).
// CHECK-LABEL: ape.encoding @sinusoidal
// CHECK-NOT: ape.absolute
// CHECK: ape.position_embedding table {
// CHECK-NEXT: ^bb0(%[[N:.*]]: index, %[[C:.*]]: index, %[[D:.*]]: index):
// CHECK: arith.remui %[[C]], %{{.*}} : index
// CHECK: math.powf
// CHECK: math.sin
// CHECK: math.cos
// CHECK: ape.yield
ape.encoding @sinusoidal {
  ape.absolute {kind = "sinusoidal"}
}

// -----

// Learned absolute positions: a trained table, no region.
// CHECK-LABEL: ape.encoding @learned
// CHECK-NEXT: ape.position_embedding {learned, max_length = 1024 : i64, scale_embedding}
// CHECK-NEXT: {{^}}  }
ape.encoding @learned {
  ape.absolute {kind = "learned", max_length = 1024, scale_embedding}
}
