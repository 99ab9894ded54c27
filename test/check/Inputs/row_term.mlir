// For ape-check's own test (test/check/ape_check.cmake). A one-sided row term w * C_i, C a
// cumulative sum of positives exp(gate) (it grows with i): the param's gradient is
// sum_i C_i sum_j dS_ij = 0 in exact arithmetic, and a correct kernel's rounding, times C_i,
// exceeded a param floor counted in query-key pairs (SpecCheck.cpp, param_floor_scale: the floor
// follows the param's sensitivity to the logits).
ape.encoding @row_term {
  %w = ape.param "w" ["heads"] init = "constant" trainable {value = 0.01 : f64}
  %g = ape.token_feature "gate" {weight_std = 0.02 : f64, bias = 0.0 : f64}
  %l = ape.map %g {
  ^bb0(%x: f32):
    %y = math.exp %x : f32
    ape.yield %y : f32
  }
  %c = ape.scan %l
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %wh = ape.load %w[%h] : !ape.param
    %ci = ape.load %c[%b, %h, %i] : !ape.tokens
    %t = arith.mulf %wh, %ci : f32
    %r = arith.addf %s, %t : f32
    ape.yield %r : f32
  }
}
