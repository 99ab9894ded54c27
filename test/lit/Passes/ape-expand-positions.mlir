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
// dimIdx(R) = r·ln(L/(2πR))/(2 ln base) at R = β_fast = 32 (2π·32, floored) and β_slow = 1 (2π,
// ceiled); θ' = θ/s·ramp + θ·(1 - ramp); mscale = 0.1 ln s + 1.
// CHECK-LABEL: ape.encoding @yarn
// CHECK: %[[S:.*]] = ape.param "rope_factor" ["1"] init = "constant" {max = 0x4170000000000000 : f64, min = 5.9604644775390625E-8 : f64, value = 4.000000e+00 : f64}
// CHECK-NEXT: %[[L:.*]] = ape.param "rope_original_length" ["1"] init = "constant" {integer, max = {{.*}} : f64, min = 1.000000e+00 : f64, value = 1.280000e+02 : f64}
// CHECK: ape.q_mod
// CHECK: %[[THETA:.*]] = math.powf %{{.*}}, %{{.*}} : f32
// CHECK-NEXT: %[[Z:.*]] = arith.constant 0 : index
// CHECK-NEXT: %[[SV:.*]] = ape.load %[[S]][%[[Z]]] : !ape.param
// CHECK-NEXT: %[[Z2:.*]] = arith.constant 0 : index
// CHECK-NEXT: %[[LV:.*]] = ape.load %[[L]][%[[Z2]]] : !ape.param
// CHECK: %[[FAST:.*]] = ape.constant 201.06192982974676
// CHECK-NEXT: arith.divf %[[LV]], %[[FAST]] : f32
// CHECK-NEXT: ape.constant 18.420680743952367
// CHECK: math.floor
// CHECK: %[[SLOW:.*]] = ape.constant 6.2831853071795862
// CHECK-NEXT: arith.divf %[[LV]], %[[SLOW]] : f32
// CHECK-NEXT: ape.constant 18.420680743952367
// CHECK: math.ceil
// CHECK: %[[RMAX:.*]] = arith.maximumf %{{.*}}, %{{.*}} : f32
// CHECK-NEXT: %[[RAMP:.*]] = arith.minimumf %[[RMAX]], %{{.*}} : f32
// CHECK-NEXT: %[[INTERP:.*]] = arith.divf %[[THETA]], %[[SV]] : f32
// CHECK: %[[LNS:.*]] = math.log %[[SV]] : f32
// CHECK-NEXT: %[[TENTH:.*]] = ape.constant 1.000000e-01
// CHECK-NEXT: %{{.*}} = arith.mulf %[[TENTH]], %[[LNS]] : f32
// CHECK: %[[MS:.*]] = arith.select %{{.*}}, %{{.*}}, %{{.*}} : f32
// CHECK-NEXT: %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT: %[[OMR:.*]] = arith.subf %[[ONE]], %[[RAMP]] : f32
// CHECK-NEXT: %[[TO:.*]] = arith.mulf %[[THETA]], %[[OMR]] : f32
// CHECK-NEXT: %[[IR:.*]] = arith.mulf %[[INTERP]], %[[RAMP]] : f32
// CHECK-NEXT: %[[TP:.*]] = arith.addf %[[IR]], %[[TO]] : f32
// CHECK-NEXT: %[[TI:.*]] = arith.index_cast %{{.*}} : index to i64
// CHECK-NEXT: %[[TF:.*]] = arith.sitofp %[[TI]] : i64 to f32
// CHECK-NEXT: arith.mulf %[[TF]], %[[TP]] : f32
// CHECK: %[[OUT:.*]] = arith.select %{{.*}}, %{{.*}}, %arg0 : f32
// CHECK-NEXT: %[[SCALED:.*]] = arith.mulf %[[OUT]], %[[MS]] : f32
// CHECK-NEXT: ape.yield %[[SCALED]] : f32
ape.encoding @yarn {
  ape.rotary {scaling = "yarn", factor = 4.0 : f64, original_length = 128}
}

// -----

// Llama-3: constants 2π that f32 cannot hold exactly stay exact as ape.constant.
// λ = 2π/θ; λ < L/high keeps θ, λ > L/low takes θ/s, between them (1-σ)θ/s + σθ with
// σ = (L/λ - low)/(high - low) (low 1, high 4).
// CHECK-LABEL: ape.encoding @llama3
// CHECK: %[[S:.*]] = ape.param "rope_factor" ["1"] init = "constant" {max = 0x4170000000000000 : f64, min = 5.9604644775390625E-8 : f64, value = 8.000000e+00 : f64}
// CHECK-NEXT: %[[L:.*]] = ape.param "rope_original_length" ["1"] init = "constant" {integer, max = {{.*}} : f64, min = 1.000000e+00 : f64, value = 8.192000e+03 : f64}
// CHECK: ape.q_mod
// CHECK: %[[BASE:.*]] = arith.constant 5.000000e+05 : f32
// CHECK-NEXT: %[[THETA:.*]] = math.powf %[[BASE]], %{{.*}} : f32
// CHECK-NEXT: %[[Z:.*]] = arith.constant 0 : index
// CHECK-NEXT: %[[SV:.*]] = ape.load %[[S]][%[[Z]]] : !ape.param
// CHECK-NEXT: %[[Z2:.*]] = arith.constant 0 : index
// CHECK-NEXT: %[[LV:.*]] = ape.load %[[L]][%[[Z2]]] : !ape.param
// CHECK-NEXT: %[[TWOPI:.*]] = ape.constant 6.2831853071795862
// CHECK-NEXT: %[[LAMBDA:.*]] = arith.divf %[[TWOPI]], %[[THETA]] : f32
// CHECK-NEXT: %[[INTERP:.*]] = arith.divf %[[THETA]], %[[SV]] : f32
// CHECK-NEXT: %[[SPAN:.*]] = arith.constant 3.000000e+00 : f32
// CHECK-NEXT: %[[LOWF:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT: %[[LL:.*]] = arith.divf %[[LV]], %[[LAMBDA]] : f32
// CHECK-NEXT: %[[LLL:.*]] = arith.subf %[[LL]], %[[LOWF]] : f32
// CHECK-NEXT: %[[SIGMA:.*]] = arith.divf %[[LLL]], %[[SPAN]] : f32
// CHECK-NEXT: %[[ST:.*]] = arith.mulf %[[SIGMA]], %[[THETA]] : f32
// CHECK-NEXT: %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT: %[[OMS:.*]] = arith.subf %[[ONE]], %[[SIGMA]] : f32
// CHECK-NEXT: %[[OI:.*]] = arith.mulf %[[OMS]], %[[INTERP]] : f32
// CHECK-NEXT: %[[BLEND:.*]] = arith.addf %[[OI]], %[[ST]] : f32
// CHECK-NEXT: %[[FLOW:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT: %[[LONGL:.*]] = arith.divf %[[LV]], %[[FLOW]] : f32
// CHECK-NEXT: %[[LONG:.*]] = arith.cmpf ogt, %[[LAMBDA]], %[[LONGL]] : f32
// CHECK-NEXT: %[[FHIGH:.*]] = arith.constant 4.000000e+00 : f32
// CHECK-NEXT: %[[SHORTL:.*]] = arith.divf %[[LV]], %[[FHIGH]] : f32
// CHECK-NEXT: %[[SHORT:.*]] = arith.cmpf olt, %[[LAMBDA]], %[[SHORTL]] : f32
// CHECK-NEXT: %[[MID:.*]] = arith.select %[[LONG]], %[[INTERP]], %[[BLEND]] : f32
// CHECK-NEXT: %[[THP:.*]] = arith.select %[[SHORT]], %[[THETA]], %[[MID]] : f32
// CHECK-NEXT: %[[TI:.*]] = arith.index_cast %{{.*}} : index to i64
// CHECK-NEXT: %[[TF:.*]] = arith.sitofp %[[TI]] : i64 to f32
// CHECK-NEXT: arith.mulf %[[TF]], %[[THP]] : f32
ape.encoding @llama3 {
  ape.rotary {base = 500000.0 : f64, scaling = "llama3", factor = 8.0 : f64, original_length = 8192}
}

// -----

// xPos: interleaved rotation times ζ^(±t_c/B), with t_c = t - floor(T/2); q uses +1/B, k -1/B.
// CHECK-LABEL: ape.encoding @xpos
// CHECK: ape.q_mod attributes {pairing = "interleaved"} {
// CHECK-NEXT: ^bb0(%[[X:.*]]: f32, %{{.*}}: f32, %{{.*}}: index, %[[POS:.*]]: index, %{{.*}}: index):
// CHECK: %[[K:.*]] = arith.sitofp %{{.*}} : i64 to f32
// CHECK: %[[BASE:.*]] = arith.constant 1.000000e+04 : f32
// CHECK-NEXT: math.powf %[[BASE]], %{{.*}} : f32
// CHECK: %[[ROT:.*]] = arith.addf %{{.*}}, %{{.*}} : f32
// ζ_k = (k/(d_h/2) + γ)/(1 + γ), γ = 0.4:
// CHECK: %[[HALFD:.*]] = arith.mulf %{{.*}}, %{{.*}} : f32
// CHECK-NEXT: %[[OPG:.*]] = ape.constant 1.400000e+00
// CHECK-NEXT: %[[G:.*]] = ape.constant 4.000000e-01
// CHECK-NEXT: %[[KD:.*]] = arith.divf %[[K]], %[[HALFD]] : f32
// CHECK-NEXT: %[[KG:.*]] = arith.addf %[[KD]], %[[G]] : f32
// CHECK-NEXT: %[[ZETA:.*]] = arith.divf %[[KG]], %[[OPG]] : f32
// CHECK: %[[T:.*]] = ape.dim "seq_len"
// CHECK-NEXT: %[[HALF:.*]] = arith.divui %[[T]], %{{.*}} : index
// CHECK-NEXT: %[[TC:.*]] = arith.subi %[[POS]], %[[HALF]] : index
// CHECK-NEXT: %[[TCI:.*]] = arith.index_cast %[[TC]] : index to i64
// CHECK-NEXT: %[[TCF:.*]] = arith.sitofp %[[TCI]] : i64 to f32
// CHECK-NEXT: %[[INVB:.*]] = arith.constant 0.001953125 : f32
// CHECK-NEXT: %[[EXP:.*]] = arith.mulf %[[TCF]], %[[INVB]] : f32
// CHECK-NEXT: %[[DECAY:.*]] = math.powf %[[ZETA]], %[[EXP]] : f32
// CHECK-NEXT: %[[OUT:.*]] = arith.mulf %[[ROT]], %[[DECAY]] : f32
// CHECK-NEXT: arith.select %{{.*}}, %[[OUT]], %[[X]] : f32
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
// PE[n, c] = sin(n / 10000^((c - c mod 2)/d)) for even c, cos(...) for odd c.
// CHECK-NEXT: %[[TWO:.*]] = arith.constant 2 : index
// CHECK-NEXT: %[[PAR:.*]] = arith.remui %[[C]], %[[TWO]] : index
// CHECK-NEXT: %[[EVEN:.*]] = arith.subi %[[C]], %[[PAR]] : index
// CHECK-NEXT: %[[EI:.*]] = arith.index_cast %[[EVEN]] : index to i64
// CHECK-NEXT: %[[EF:.*]] = arith.sitofp %[[EI]] : i64 to f32
// CHECK-NEXT: %[[DI:.*]] = arith.index_cast %[[D]] : index to i64
// CHECK-NEXT: %[[DF:.*]] = arith.sitofp %[[DI]] : i64 to f32
// CHECK-NEXT: %[[NE:.*]] = arith.negf %[[EF]] : f32
// CHECK-NEXT: %[[EXP:.*]] = arith.divf %[[NE]], %[[DF]] : f32
// CHECK-NEXT: %[[BASE:.*]] = arith.constant 1.000000e+04 : f32
// CHECK-NEXT: %[[W:.*]] = math.powf %[[BASE]], %[[EXP]] : f32
// CHECK-NEXT: %[[NI:.*]] = arith.index_cast %[[N]] : index to i64
// CHECK-NEXT: %[[NF:.*]] = arith.sitofp %[[NI]] : i64 to f32
// CHECK-NEXT: %[[A:.*]] = arith.mulf %[[NF]], %[[W]] : f32
// CHECK-NEXT: %[[Z:.*]] = arith.constant 0 : index
// CHECK-NEXT: %[[ISEVEN:.*]] = arith.cmpi eq, %[[PAR]], %[[Z]] : index
// CHECK-NEXT: %[[SIN:.*]] = math.sin %[[A]] : f32
// CHECK-NEXT: %[[COS:.*]] = math.cos %[[A]] : f32
// CHECK-NEXT: %[[PE:.*]] = arith.select %[[ISEVEN]], %[[SIN]], %[[COS]] : f32
// CHECK-NEXT: ape.yield %[[PE]] : f32
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
