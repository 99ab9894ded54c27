// RUN: ape-opt %s -split-input-file -ape-expand | FileCheck %s --check-prefix=EXPAND
// RUN: ape-opt %s -split-input-file -ape-lower | FileCheck %s --check-prefix=LOWER
// The learned biases after expansion, and the reduction plan -ape-differentiate chooses for
// each input of their score_mod: scatter by bucket (T5), per-head sums (KERPLE), full
// reductions and per-head sums (FIRE's MLP), row and column sums (Cable), none (fixed slopes).

// T5: bucket(n) = n below 16, else 16 + floor(ln(n/16)·16/ln 8) capped at 31; n >= 16 before the
// log, so ln 0 is never taken. One table for all layers ("shared").
// EXPAND-LABEL: ape.encoding @t5
// EXPAND: %[[T:.*]] = ape.param "t5_table" ["32", "heads"] init = "normal" trainable {shared, std = 2.000000e-02 : f64}
// EXPAND: ape.score_mod {
// EXPAND-NEXT: ^bb0(%[[S:.*]]: f32, %{{.*}}: index, %[[H:.*]]: index, %[[I:.*]]: index, %[[J:.*]]: index):
// EXPAND-NEXT: %[[C0:.*]] = arith.constant 0 : index
// EXPAND-NEXT: %[[D:.*]] = arith.subi %[[I]], %[[J]] : index
// EXPAND-NEXT: %[[N:.*]] = arith.maxsi %[[D]], %[[C0]] : index
// EXPAND-NEXT: %[[EXACT:.*]] = arith.constant 16 : index
// EXPAND-NEXT: %[[SMALL:.*]] = arith.cmpi slt, %[[N]], %[[EXACT]] : index
// EXPAND-NEXT: %[[NL:.*]] = arith.maxsi %[[N]], %[[EXACT]] : index
// EXPAND-NEXT: %[[NI:.*]] = arith.index_cast %[[NL]] : index to i64
// EXPAND-NEXT: %[[NF:.*]] = arith.sitofp %[[NI]] : i64 to f32
// EXPAND-NEXT: %[[F16:.*]] = arith.constant 1.600000e+01 : f32
// EXPAND-NEXT: %[[RATIO:.*]] = arith.divf %[[NF]], %[[F16]] : f32
// EXPAND-NEXT: %[[LOG:.*]] = math.log %[[RATIO]] : f32
// EXPAND-NEXT: %[[K:.*]] = ape.constant 7.6943735514078053
// EXPAND-NEXT: %[[LK:.*]] = arith.mulf %[[LOG]], %[[K]] : f32
// EXPAND-NEXT: %[[FL:.*]] = math.floor %[[LK]] : f32
// EXPAND-NEXT: %[[FI:.*]] = arith.fptosi %[[FL]] : f32 to i64
// EXPAND-NEXT: %[[FX:.*]] = arith.index_cast %[[FI]] : i64 to index
// EXPAND-NEXT: %[[CAP:.*]] = arith.constant 31 : index
// EXPAND-NEXT: %[[SUM:.*]] = arith.addi %[[EXACT]], %[[FX]] : index
// EXPAND-NEXT: %[[LARGE:.*]] = arith.minsi %[[SUM]], %[[CAP]] : index
// EXPAND-NEXT: %[[B:.*]] = arith.select %[[SMALL]], %[[N]], %[[LARGE]] : index
// EXPAND-NEXT: %[[V:.*]] = ape.load %[[T]][%[[B]], %[[H]]] : !ape.param
// EXPAND-NEXT: %[[R:.*]] = arith.addf %[[S]], %[[V]] : f32
// EXPAND-NEXT: ape.yield %[[R]] : f32
// A distance bias (a function of i - j), its table gradient g scattered by bucket:
// LOWER-LABEL: ape.kernel @t5 attributes {passes = 1 : i64, score_bias = "distance",
// LOWER: ape.score_mod {
// LOWER: } grad {
// LOWER-NEXT: ^bb0(%{{.*}}: f32, %{{.*}}: index, %{{.*}}: index, %{{.*}}: index, %{{.*}}: index, %[[G:.*]]: f32):
// LOWER-NEXT: ape.yield %[[G]], %[[G]] : f32, f32
ape.encoding @t5 {
  ape.t5_bias {buckets = 32, max_distance = 128}
}

// -----

// KERPLE power: per-head a and p, clamped; Δ^p only where Δ > 0.
// EXPAND-LABEL: ape.encoding @kerple
// EXPAND: %[[P:.*]] = ape.param "kerple_p" ["heads"] init = "constant" trainable {shared, value = 1.500000e+00 : f64}
// EXPAND: %[[A:.*]] = ape.param "kerple_a" ["heads"] init = "constant" trainable {shared, value = 5.000000e-01 : f64}
// The bias -a·Δ^p, p in [0.01, 2], a >= 0.01, Δ = max(i - j, 0):
// EXPAND: ape.score_mod {
// EXPAND-NEXT: ^bb0(%[[S:.*]]: f32, %{{.*}}: index, %[[H:.*]]: index, %[[I:.*]]: index, %[[J:.*]]: index):
// EXPAND-NEXT: %[[LO1:.*]] = ape.constant 1.000000e-02
// EXPAND-NEXT: %[[PH:.*]] = ape.load %[[P]][%[[H]]] : !ape.param
// EXPAND-NEXT: %[[PC:.*]] = arith.maximumf %[[PH]], %[[LO1]] : f32
// EXPAND-NEXT: %[[LO2:.*]] = ape.constant 1.000000e-02
// EXPAND-NEXT: %[[AH:.*]] = ape.load %[[A]][%[[H]]] : !ape.param
// EXPAND-NEXT: %[[AC:.*]] = arith.maximumf %[[AH]], %[[LO2]] : f32
// EXPAND-NEXT: %[[C0:.*]] = arith.constant 0 : index
// EXPAND-NEXT: %[[D:.*]] = arith.subi %[[I]], %[[J]] : index
// EXPAND-NEXT: %[[N:.*]] = arith.maxsi %[[D]], %[[C0]] : index
// EXPAND-NEXT: %[[NI:.*]] = arith.index_cast %[[N]] : index to i64
// EXPAND-NEXT: %[[DF:.*]] = arith.sitofp %[[NI]] : i64 to f32
// EXPAND-NEXT: %[[TWO:.*]] = arith.constant 2.000000e+00 : f32
// EXPAND-NEXT: %[[PE:.*]] = arith.minimumf %[[PC]], %[[TWO]] : f32
// EXPAND-NEXT: %[[Z:.*]] = arith.constant 0.000000e+00 : f32
// EXPAND-NEXT: %[[POS:.*]] = arith.cmpf ogt, %[[DF]], %[[Z]] : f32
// EXPAND-NEXT: %[[POW:.*]] = math.powf %[[DF]], %[[PE]] : f32
// EXPAND-NEXT: %[[Z2:.*]] = arith.constant 0.000000e+00 : f32
// EXPAND-NEXT: %[[SEL:.*]] = arith.select %[[POS]], %[[POW]], %[[Z2]] : f32
// EXPAND-NEXT: %[[AP:.*]] = arith.mulf %[[AC]], %[[SEL]] : f32
// EXPAND-NEXT: %[[NEG:.*]] = arith.negf %[[AP]] : f32
// EXPAND-NEXT: %[[R:.*]] = arith.addf %[[S]], %[[NEG]] : f32
// EXPAND-NEXT: ape.yield %[[R]] : f32
// Per-head sums of the gradients of p (-g·a·Δ^p·ln Δ) and a (-g·Δ^p):
// LOWER-LABEL: ape.kernel @kerple attributes {passes = 1 : i64, score_bias = "distance",
// LOWER: ape.score_mod {
// LOWER: } grad {
// LOWER-NEXT: ^bb0(%{{.*}}: f32, %{{.*}}: index, %{{.*}}: index, %{{.*}}: index, %{{.*}}: index, %[[G:.*]]: f32):
// LOWER: %[[POW:.*]] = math.powf %[[DF:.*]], %{{.*}} : f32
// LOWER: %[[LN:.*]] = math.log %[[DF]] : f32
// LOWER-NEXT: %[[PLN:.*]] = arith.mulf %[[POW]], %[[LN]] : f32
// LOWER: %[[GP:.*]] = arith.mulf %[[G]], %{{.*}} : f32
// LOWER-NEXT: %[[DP:.*]] = arith.negf %[[GP]] : f32
// LOWER: %[[GA:.*]] = arith.mulf %[[G]], %{{.*}} : f32
// LOWER-NEXT: %[[DA:.*]] = arith.negf %[[GA]] : f32
// LOWER-NEXT: ape.yield %[[G]], %[[DP]], %[[DA]] : f32, f32, f32
ape.encoding @kerple {
  ape.kerple {kind = "power", p_init = 1.5 : f64, a_init = 0.5 : f64}
}

// -----

// FIRE: c and L, then per hidden unit w1[k], b1[k] (full reductions) and w2[k, h] (per head).
// EXPAND-LABEL: ape.encoding @fire
// EXPAND: ape.param "fire_c" ["1"] init = "constant" trainable {value = 1.000000e-01 : f64}
// EXPAND: ape.param "fire_l_mult" ["1"] init = "constant" trainable {value = 1.000000e+00 : f64}
// EXPAND: ape.param "fire_w1" ["2"] init = "normal" trainable {std = 1.000000e+00 : f64}
// EXPAND: ape.param "fire_b1" ["2"] init = "zeros" trainable
// EXPAND: ape.param "fire_w2" ["2", "heads"] init = "normal" trainable {std = 1.000000e-01 : f64}
// EXPAND: ape.param "fire_b2" ["heads"] init = "zeros" trainable
// EXPAND: ape.score_mod {
// EXPAND: arith.maximumf
// EXPAND: math.log1p
// The hidden layer's ReLU as a select on x > 0 (unordered: NaN stays), whose derivative at 0 is 0
// as PyTorch's (b1 starts at 0, so the diagonal's units sit there): max(x, 0) passed x's.
// EXPAND: %[[POS:.*]] = arith.cmpf ugt, %[[PRE:.*]], %{{.*}} : f32
// EXPAND: arith.select %[[POS]], %[[PRE]], %{{.*}} : f32
// LOWER-LABEL: ape.kernel @fire
// LOWER: ape.score_mod {
ape.encoding @fire {
  ape.fire {hidden = 2}
}

// -----

// Composition: RoPE + T5 + Cable + fixed ALiBi slopes in one kernel.
// LOWER-LABEL: ape.kernel @mixed
// LOWER: ape.q_mod
// LOWER: ape.k_mod
// LOWER: ape.score_mod {
// LOWER-NOT: ape.score_mod
ape.encoding @mixed {
  ape.rotary
  ape.t5_bias
  ape.alibi
  ape.cable
}

// -----

// Query-dependent relative terms: q'_i·table_r rows (with an optional bias added to q') and
// k'_j rows, gathered at a computed distance; their gradients go back through the rows.
// LOWER-LABEL: ape.kernel @relative
// LOWER: %[[T:.*]] = ape.param "rel" ["9", "heads", "head_dim"] init = "normal" trainable
// LOWER: %[[V:.*]] = ape.param "v" ["heads", "head_dim"] init = "zeros" trainable
// LOWER: %[[U:.*]] = ape.param "u" ["1", "heads", "head_dim"] init = "zeros" trainable
// LOWER: ape.rel_rows "q" %[[T]] bias %[[V]]
// LOWER: ape.rel_rows "k" %[[U]]
// LOWER: ape.score_mod {
ape.encoding @relative {
  %t = ape.param "rel" ["9", "heads", "head_dim"] init = "normal" trainable {std = 0.02 : f64}
  %v = ape.param "v" ["heads", "head_dim"] init = "zeros" trainable
  %u = ape.param "u" ["1", "heads", "head_dim"] init = "zeros" trainable
  %qr = ape.rel_rows "q" %t bias %v
  %kr = ape.rel_rows "k" %u
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %c0 = arith.constant 0 : index
    %c8 = arith.constant 8 : index
    %d = arith.subi %i, %j : index
    %r = arith.minsi %d, %c8 : index
    %x = ape.load %qr[%b, %h, %i, %r] : !ape.rows
    %y = ape.load %kr[%b, %h, %j, %c0] : !ape.rows
    %z = arith.addf %x, %y : f32
    %o = arith.addf %s, %z : f32
    ape.yield %o : f32
  }
}
