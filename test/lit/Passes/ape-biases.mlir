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
// EXPAND: %[[D:.*]] = arith.subi %[[I]], %[[J]] : index
// EXPAND-NEXT: %[[N:.*]] = arith.maxsi %[[D]], %{{.*}} : index
// EXPAND: %[[SMALL:.*]] = arith.cmpi slt, %[[N]], %[[EXACT:.*]] : index
// EXPAND-NEXT: arith.maxsi %[[N]], %[[EXACT]] : index
// EXPAND: math.log
// EXPAND: ape.constant 7.6943735514078053
// EXPAND: math.floor
// EXPAND: %[[LARGE:.*]] = arith.minsi %{{.*}}, %{{.*}} : index
// EXPAND-NEXT: %[[B:.*]] = arith.select %[[SMALL]], %[[N]], %[[LARGE]] : index
// EXPAND-NEXT: %[[V:.*]] = ape.load %[[T]][%[[B]], %[[H]]] : !ape.param
// EXPAND-NEXT: %[[R:.*]] = arith.addf %[[S]], %[[V]] : f32
// LOWER-LABEL: ape.kernel @t5
// LOWER: ape.score_mod {
ape.encoding @t5 {
  ape.t5_bias {buckets = 32, max_distance = 128}
}

// -----

// KERPLE power: per-head a and p, clamped; Δ^p only where Δ > 0.
// EXPAND-LABEL: ape.encoding @kerple
// EXPAND: %[[P:.*]] = ape.param "kerple_p" ["heads"] init = "constant" trainable {shared, value = 1.500000e+00 : f64}
// EXPAND: %[[A:.*]] = ape.param "kerple_a" ["heads"] init = "constant" trainable {shared, value = 5.000000e-01 : f64}
// EXPAND: ape.score_mod {
// EXPAND-DAG: ape.load %[[P]]
// EXPAND-DAG: ape.load %[[A]]
// EXPAND-DAG: ape.constant 1.000000e-02
// EXPAND: arith.minimumf
// EXPAND: %[[POS:.*]] = arith.cmpf ogt
// EXPAND: %[[POW:.*]] = math.powf
// EXPAND: arith.select %[[POS]], %[[POW]], %{{.*}} : f32
// LOWER-LABEL: ape.kernel @kerple
// LOWER: ape.score_mod {
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
// EXPAND: math.log1p
// EXPAND: arith.maximumf
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
