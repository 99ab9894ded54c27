// -ape-classify records on each ape.kernel the facts that choose its fast paths
// (analysis/KernelFacts.h); the emitters read these attributes (cpu-linear-mods.mlir,
// cpu-distance-bias.mlir, cpu-row-col-bias.mlir check what each one emits).
// RUN: ape-opt %s -ape-lower | FileCheck %s
// RUN: ape-opt %s -ape-lower -ape-classify -ape-classify | FileCheck %s

// A rotation is linear in the rotated data: its coefficients are tabulated once per call.
// CHECK-LABEL: ape.kernel @rope attributes {k_mod_linear, passes = 1 : i64, q_mod_linear, tile_k = 64 : i64, tile_q = 64 : i64}
ape.encoding @rope {
  ape.rotary {base = 10000.0 : f64, fraction = 1.0 : f64, pairing = "half"}
}

// xPos scales by a power of the distance from the middle of the sequence: linear, and it reads the
// length, so decoding recomputes its cached k'.
// CHECK-LABEL: ape.kernel @xpos attributes {k_mod_linear, k_mod_reads_length, passes = 1 : i64, q_mod_linear,
ape.encoding @xpos {
  ape.xpos {gamma = 0.4 : f64, scale_base = 512.0 : f64}
}

// ALiBi, T5, KERPLE: s + B(i - j), B once per distance.
// CHECK-LABEL: ape.kernel @alibi attributes {passes = 1 : i64, score_bias = "distance",
ape.encoding @alibi {
  ape.alibi
}

// A penalty written as a subtraction, s - a_h log(1 + |i - j|): s + B(i - j) too.
// CHECK-LABEL: ape.kernel @log_penalty attributes {passes = 1 : i64, score_bias = "distance",
ape.encoding @log_penalty {
  %a = ape.param "a" ["heads"] init = "constant" trainable {value = 0.5 : f64}
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %ah = ape.load %a[%h] : !ape.param
    %d = arith.subi %i, %j : index
    %d64 = arith.index_cast %d : index to i64
    %df = arith.sitofp %d64 : i64 to f32
    %l = math.log1p %df : f32
    %p = arith.mulf %ah, %l : f32
    %r = arith.subf %s, %p : f32
    ape.yield %r : f32
  }
}

// The logit subtracted (B - s) is not a bias of s: no fact.
// CHECK-LABEL: ape.kernel @minus_logit attributes {passes = 1 : i64, tile_k = 64 : i64, tile_q = 64 : i64}
ape.encoding @minus_logit {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %d = arith.subi %i, %j : index
    %d64 = arith.index_cast %d : index to i64
    %df = arith.sitofp %d64 : i64 to f32
    %r = arith.subf %df, %s : f32
    ape.yield %r : f32
  }
}

// RoPE with ALiBi: both facts.
// CHECK-LABEL: ape.kernel @rope_alibi attributes {k_mod_linear, passes = 1 : i64, q_mod_linear, score_bias = "distance",
ape.encoding @rope_alibi {
  ape.rotary {base = 10000.0 : f64, fraction = 1.0 : f64, pairing = "half"}
  ape.alibi
}

// Cable: s + S_i - S_j of a cumulative sum, a row term and a column term.
// CHECK-LABEL: ape.kernel @cable attributes {passes = 1 : i64, score_bias = "row_col",
ape.encoding @cable {
  ape.cable {kernel = "none"}
}

// ALiBi's m (i - j) reads both positions at once, so ALiBi with Cable is neither a distance nor a
// row/column bias; its loads are features (the slope of the slice, S_i of the row, S_j of the
// column), as K-Cable's S_i and S_j inside its kernel are.
// CHECK-LABEL: ape.kernel @alibi_cable attributes {passes = 1 : i64, score_bias = "features", tile_k = 64 : i64, tile_q = 64 : i64}
ape.encoding @alibi_cable {
  ape.alibi
  ape.cable {kernel = "none"}
}

// CHECK-LABEL: ape.kernel @kcable attributes {passes = 1 : i64, score_bias = "features", tile_k = 64 : i64, tile_q = 64 : i64}
ape.encoding @kcable {
  ape.cable {kernel = "log1p_sq"}
}

// FIRE divides by a function of the query position alone, and its MLP reads more parameters
// than the feature steps hold: no fact.
// CHECK-LABEL: ape.kernel @fire attributes {passes = 1 : i64, tile_k = 64 : i64, tile_q = 64 : i64}
ape.encoding @fire {
  ape.fire {hidden = 4, c = 0.1 : f64, l_init = 512.0 : f64}
}

// The row/column split serves the backward only: an inference-only kernel records none.
// CHECK-LABEL: ape.kernel @cable_transition attributes {inference_only, passes = 3 : i64, tile_k = 64 : i64, tile_q = 64 : i64}
ape.encoding @cable_transition {
  ape.cable {kernel = "none"}
  ape.attention_transition {divisor_offset = 1, first_layer = 1, skip_last = 2, intervals = 2,
                            alpha = 0.5 : f64, beta = 0.1 : f64}
}

// A fact recorded before that no longer holds is removed.
// CHECK-LABEL: ape.kernel @stale attributes {passes = 1 : i64, tile_k = 64 : i64, tile_q = 64 : i64} {
ape.kernel @stale attributes {q_mod_linear, k_mod_reads_length, score_bias = "row_col"} {
}
