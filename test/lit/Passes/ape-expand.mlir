// RUN: ape-opt %s -split-input-file -ape-expand | FileCheck %s

// RoPE: one q_mod and one k_mod rotating pairs (c, c + r/2) by t·θ_c.
// CHECK-LABEL: ape.encoding @rope
// CHECK-NOT: ape.rotary
// CHECK: ape.q_mod attributes {pairing = "half"} {
// CHECK-NEXT: ^bb0(%[[X:.*]]: f32, %[[Y:.*]]: f32, %[[C:.*]]: index, %[[T:.*]]: index, %[[H:.*]]: index):
// r = 2·floor(fraction·d_h/2) unclamped (r = 0 leaves every coordinate alone), in integers
// (d_h·1)/2 for fraction 1: no float rounding; only the divisor r/2 of the frequency index is
// kept >= 1.
// CHECK: %[[DH:.*]] = ape.dim "head_dim"
// CHECK-NEXT: %[[TWO:.*]] = arith.constant 2 : index
// CHECK-NEXT: %[[HALF:.*]] = arith.divui %[[DH]], %[[TWO]] : index
// CHECK: %[[R:.*]] = arith.muli %[[HALF]], %{{.*}} : index
// CHECK: %[[DIV:.*]] = arith.maxui %[[HALF]], %{{.*}} : index
// CHECK-NEXT: %[[INROT:.*]] = arith.cmpi ult, %[[C]], %[[R]] : index
// CHECK-NEXT: %[[K:.*]] = arith.remui %[[C]], %[[DIV]] : index
// CHECK-NEXT: %[[FIRST:.*]] = arith.cmpi ult, %[[C]], %[[DIV]] : index
// CHECK-NEXT: %[[RI:.*]] = arith.index_cast %[[R]] : index to i64
// CHECK-NEXT: %[[RF:.*]] = arith.sitofp %[[RI]] : i64 to f32
// CHECK-NEXT: %[[KI:.*]] = arith.index_cast %[[K]] : index to i64
// CHECK-NEXT: %[[KF:.*]] = arith.sitofp %[[KI]] : i64 to f32
// θ_k = base^(-2k/r), the angle t·θ_k:
// CHECK-NEXT: %[[M2:.*]] = arith.constant -2.000000e+00 : f32
// CHECK-NEXT: %[[KM:.*]] = arith.mulf %[[KF]], %[[M2]] : f32
// CHECK-NEXT: %[[EXP:.*]] = arith.divf %[[KM]], %[[RF]] : f32
// CHECK-NEXT: %[[BASE:.*]] = arith.constant 1.000000e+04 : f32
// CHECK-NEXT: %[[THETA:.*]] = math.powf %[[BASE]], %[[EXP]] : f32
// CHECK-NEXT: %[[TI:.*]] = arith.index_cast %[[T]] : index to i64
// CHECK-NEXT: %[[TF:.*]] = arith.sitofp %[[TI]] : i64 to f32
// CHECK-NEXT: %[[ANGLE:.*]] = arith.mulf %[[TF]], %[[THETA]] : f32
// CHECK-NEXT: %[[COS:.*]] = math.cos %[[ANGLE]] : f32
// CHECK-NEXT: %[[SIN:.*]] = math.sin %[[ANGLE]] : f32
// The first half x cos - y sin, the second x cos + y sin (y the partner):
// CHECK-NEXT: %[[P1:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT: %[[N1:.*]] = arith.constant -1.000000e+00 : f32
// CHECK-NEXT: %[[SG:.*]] = arith.select %[[FIRST]], %[[N1]], %[[P1]] : f32
// CHECK-NEXT: %[[SY:.*]] = arith.mulf %[[SG]], %[[Y]] : f32
// CHECK-NEXT: %[[YS:.*]] = arith.mulf %[[SY]], %[[SIN]] : f32
// CHECK-NEXT: %[[XC:.*]] = arith.mulf %[[X]], %[[COS]] : f32
// CHECK-NEXT: %[[ROT:.*]] = arith.addf %[[XC]], %[[YS]] : f32
// CHECK-NEXT: %[[OUT:.*]] = arith.select %[[INROT]], %[[ROT]], %[[X]] : f32
// CHECK-NEXT: ape.yield %[[OUT]] : f32
// CHECK-NEXT: }
// CHECK-NEXT: ape.k_mod attributes {pairing = "half"} {
ape.encoding @rope {
  ape.rotary {base = 10000.0 : f64}
}

// -----

// Interleaved pairing: partner 2k+1, frequency index c/2.
// CHECK-LABEL: ape.encoding @rope_interleaved
// CHECK: ape.q_mod attributes {fraction = 5.000000e-01 : f64, pairing = "interleaved"}
// CHECK: arith.divui %{{.*}}, %{{.*}} : index
ape.encoding @rope_interleaved {
  ape.rotary {pairing = "interleaved", fraction = 0.5 : f64}
}

// -----

// A fraction that no binary float holds: r/2 = (d_h·21)/80 for 0.525 (0.2625 = 21/80), exact at
// every precision. (As floor(d_h·0.2625f) in float, d_h = 240 gave 62 where the partners are 63
// apart: pairs mixed with the wrong frequencies in every fp32 and 16-bit kernel.)
// CHECK-LABEL: ape.encoding @rope_525
// CHECK: ape.q_mod attributes {fraction = 5.250000e-01 : f64, pairing = "half"}
// CHECK: %[[DH:.*]] = ape.dim "head_dim"
// CHECK-NEXT: %[[P:.*]] = arith.constant 21 : index
// CHECK-NEXT: %[[DP:.*]] = arith.muli %[[DH]], %[[P]] : index
// CHECK-NEXT: %[[Q:.*]] = arith.constant 80 : index
// CHECK-NEXT: %[[HALF:.*]] = arith.divui %[[DP]], %[[Q]] : index
// CHECK-NOT: math.floor
// CHECK: ape.k_mod
ape.encoding @rope_525 attributes {head_dim = 240} {
  ape.rotary {fraction = 0.525 : f64}
}

// -----

// ALiBi: a fixed slope per head and s - m_h·(i - j).
// CHECK-LABEL: ape.encoding @alibi
// CHECK: %[[M:.*]] = ape.param "alibi_slopes" ["heads"] init = "alibi_slopes"{{$}}
// CHECK: ape.score_mod {
// CHECK-NEXT: ^bb0(%[[S:.*]]: f32, %{{.*}}: index, %[[H:.*]]: index, %[[I:.*]]: index, %[[J:.*]]: index):
// CHECK-NEXT: %[[MH:.*]] = ape.load %[[M]][%[[H]]] : !ape.param
// CHECK-NEXT: %[[D:.*]] = arith.subi %[[I]], %[[J]] : index
// CHECK: %[[DF:.*]] = arith.sitofp %{{.*}} : i64 to f32
// CHECK-NEXT: %[[P:.*]] = arith.mulf %[[MH]], %[[DF]] : f32
// CHECK-NEXT: %[[N:.*]] = arith.negf %[[P]] : f32
// CHECK-NEXT: %[[R:.*]] = arith.addf %[[S]], %[[N]] : f32
// CHECK-NEXT: ape.yield %[[R]] : f32
ape.encoding @alibi {
  ape.alibi
}

// -----

// Learned slopes are trainable; a second instance gets a unique name.
// CHECK-LABEL: ape.encoding @alibi_learned
// CHECK: ape.param "alibi_slopes" ["heads"] init = "alibi_slopes" trainable
// CHECK: ape.param "alibi_slopes_1" ["heads"] init = "alibi_slopes"{{$}}
ape.encoding @alibi_learned {
  ape.alibi {learned}
  ape.alibi
}

// -----

// A name the spec wrote itself stays; the component's param, met later or earlier, is renamed.
// CHECK-LABEL: ape.encoding @own_name
// CHECK-DAG: ape.param "alibi_slopes_1" ["heads"] init = "alibi_slopes"{{$}}
// CHECK-DAG: ape.param "alibi_slopes" ["1"] init = "zeros"
ape.encoding @own_name {
  ape.alibi
  %p = ape.param "alibi_slopes" ["1"] init = "zeros"
}

// -----

// Cable: feature -> map(-softplus) -> scan -> s + S_i - S_j.
// CHECK-LABEL: ape.encoding @cable
// CHECK: %[[F:.*]] = ape.token_feature "cable"
// The map: -softplus(x) = -(max(x, 0) + log1p(exp(-|x|))).
// CHECK: %[[B:.*]] = ape.map %[[F]] {
// CHECK-NEXT: ^bb0(%[[FX:.*]]: f32):
// CHECK-NEXT: %[[Z:.*]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT: %[[MX:.*]] = arith.maximumf %[[FX]], %[[Z]] : f32
// CHECK-NEXT: %[[AB:.*]] = math.absf %[[FX]] : f32
// CHECK-NEXT: %[[NAB:.*]] = arith.negf %[[AB]] : f32
// CHECK-NEXT: %[[E:.*]] = math.exp %[[NAB]] : f32
// CHECK-NEXT: %[[L:.*]] = math.log1p %[[E]] : f32
// CHECK-NEXT: %[[SP:.*]] = arith.addf %[[MX]], %[[L]] : f32
// CHECK-NEXT: %[[NSP:.*]] = arith.negf %[[SP]] : f32
// CHECK-NEXT: ape.yield %[[NSP]] : f32
// CHECK: %[[S:.*]] = ape.scan %[[B]]
// CHECK: ape.score_mod {
// CHECK-NEXT: ^bb0(%[[X:.*]]: f32, %[[BB:.*]]: index, %[[H:.*]]: index, %[[I:.*]]: index, %[[J:.*]]: index):
// CHECK-NEXT: %[[SI:.*]] = ape.load %[[S]][%[[BB]], %[[H]], %[[I]]] : !ape.tokens
// CHECK-NEXT: %[[SJ:.*]] = ape.load %[[S]][%[[BB]], %[[H]], %[[J]]] : !ape.tokens
// CHECK-NEXT: %[[D:.*]] = arith.subf %[[SI]], %[[SJ]] : f32
// CHECK-NEXT: arith.addf %[[X]], %[[D]] : f32
ape.encoding @cable {
  ape.cable
}

// -----

// K-Cable: -log1p((S_i - S_j)^2); kappa becomes the encoding's scale.
// CHECK-LABEL: ape.encoding @kcable attributes {scale = 1.000000e+00 : f64}
// CHECK: %[[D:.*]] = arith.subf
// CHECK-NEXT: %[[SQ:.*]] = arith.mulf %[[D]], %[[D]] : f32
// CHECK-NEXT: %[[L:.*]] = math.log1p %[[SQ]] : f32
// CHECK-NEXT: arith.negf %[[L]] : f32
ape.encoding @kcable {
  ape.cable {kernel = "log1p_sq", kappa = 1.0 : f64}
}

// -----

// Overrides are left for -ape-push-override; NoPE stays empty.
// CHECK-LABEL: ape.encoding @expe
// CHECK-NEXT: ape.override {l = 8 : i64}
// CHECK-LABEL: ape.encoding @nope {
// CHECK-NEXT: }
ape.encoding @expe {
  ape.override {l = 8}
}
ape.encoding @nope {
}
