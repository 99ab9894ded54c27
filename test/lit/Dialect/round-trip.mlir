// Every op of the ape dialect prints in a form that parses back to the same IR (text, generic and
// bytecode).
// RUN: ape-opt %s | ape-opt | FileCheck %s
// RUN: ape-opt %s --mlir-print-op-generic | ape-opt | FileCheck %s
// RUN: ape-opt %s --emit-bytecode | ape-opt | FileCheck %s

// CHECK-LABEL: ape.encoding @named
// CHECK-NEXT: ape.rotary {base = 5.000000e+05 : f64, fraction = 5.000000e-01 : f64, pairing = "interleaved"}
// CHECK-NEXT: ape.alibi
// CHECK-NEXT: ape.alibi {learned}
// CHECK-NEXT: ape.cable {kappa = 1.000000e+00 : f64, kernel = "log1p_sq"}
// CHECK-NEXT: ape.override {l = 16 : i64}
ape.encoding @named {
  ape.rotary {base = 500000.0 : f64, fraction = 0.5 : f64, pairing = "interleaved"}
  ape.alibi
  ape.alibi {learned}
  ape.cable {kernel = "log1p_sq", kappa = 1.0 : f64}
  ape.override {l = 16, start = 0.0 : f64, theta = 4.8828125e-04 : f64, targets = "qk"}
}

// CHECK-LABEL: ape.encoding @nope {
// CHECK-NEXT: }
ape.encoding @nope {
}

// CHECK-LABEL: ape.encoding @scaled attributes {scale = 1.000000e+00 : f64}
ape.encoding @scaled attributes {scale = 1.0 : f64} {
  ape.rotary
}

// CHECK-LABEL: ape.encoding @generic
// CHECK: %[[F:.*]] = ape.token_feature "gate" {bias = 2.000000e+00 : f64}
// CHECK: %[[M:.*]] = ape.map %[[F]] {
// CHECK: ^bb0(%[[X:.*]]: f32):
// CHECK: math.exp %[[X]] : f32
// CHECK: ape.yield
// CHECK: %[[S:.*]] = ape.scan %[[M]]
// CHECK: %[[P:.*]] = ape.param "w" ["heads", "4"] init = "normal" trainable {std = 2.000000e-02 : f64}
// CHECK: %[[Z:.*]] = ape.param "z" ["head_dim"] init = "zeros"
// CHECK: ape.param "window" ["1"] init = "constant" {integer, max = 1.000000e+09 : f64, min = 1.000000e+00 : f64, value = 6.400000e+01 : f64}
// CHECK: ape.masked_projection {l = 8 : i64, targets = "qk"}
// CHECK: ape.q_mod attributes {pairing = "half"} {
// CHECK: ape.dim "head_dim"
// CHECK: ape.load %[[Z]][%{{.*}}] : !ape.param
// CHECK: ape.k_mod {
// CHECK: ape.score_mod {
// CHECK: ape.load %[[S]][%{{.*}}, %{{.*}}, %{{.*}}] : !ape.tokens
// CHECK: ape.load %[[P]][%{{.*}}, %{{.*}}] : !ape.param
ape.encoding @generic {
  %f = ape.token_feature "gate" {bias = 2.0 : f64}
  %m = ape.map %f {
  ^bb0(%x: f32):
    %y = math.exp %x : f32
    ape.yield %y : f32
  }
  %s = ape.scan %m
  %p = ape.param "w" ["heads", "4"] init = "normal" trainable {std = 0.02 : f64}
  %z = ape.param "z" ["head_dim"] init = "zeros"
  // A whole number for a float argument is that number.
  %win = ape.param "window" ["1"] init = "constant" {value = 64, min = 1, max = 1000000000, integer}
  ape.masked_projection {l = 8 : i64, targets = "qk"}
  ape.q_mod attributes {pairing = "half"} {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    %d = ape.dim "head_dim"
    %zc = ape.load %z[%c] : !ape.param
    %r = arith.addf %x, %zc : f32
    ape.yield %r : f32
  }
  ape.k_mod {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    ape.yield %x : f32
  }
  ape.score_mod {
  ^bb0(%sc: f32, %b: index, %h: index, %i: index, %j: index):
    %v = ape.load %s[%b, %h, %i] : !ape.tokens
    %c3 = arith.constant 3 : index
    %w = ape.load %p[%h, %c3] : !ape.param
    %a = arith.addf %sc, %v : f32
    %r = arith.addf %a, %w : f32
    ape.yield %r : f32
  }
}

// CHECK-LABEL: ape.kernel @fused attributes {passes = 1 : i64, scale = 1.250000e-01 : f64, tile_k = 32 : i64, tile_q = 16 : i64}
// CHECK: ape.map
// CHECK: } grad {
// CHECK: ^bb0(%{{.*}}: f32, %{{.*}}: f32):
// CHECK: ape.score_mod {
// CHECK: } grad {
ape.kernel @fused attributes {scale = 0.125 : f64, passes = 1, tile_q = 16, tile_k = 32} {
  %f = ape.token_feature "f"
  %m = ape.map %f {
  ^bb0(%x: f32):
    ape.yield %x : f32
  } grad {
  ^bb0(%x: f32, %g: f32):
    ape.yield %g : f32
  }
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %v = ape.load %m[%b, %h, %i] : !ape.tokens
    %r = arith.addf %s, %v : f32
    ape.yield %r : f32
  } grad {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index, %g: f32):
    ape.yield %g, %g : f32, f32
  }
}

// Positions: scalings, xPos, absolute tables, ExQPE, shape hints.
// CHECK-LABEL: ape.encoding @positions attributes {head_dim = 64 : i64, model_dim = 256 : i64}
// CHECK-NEXT: ape.rotary {factor = 4.000000e+00 : f64, original_length = 2048 : i64, scaling = "yarn"}
// CHECK-NEXT: ape.absolute {kind = "learned", max_length = 1024 : i64, scale_embedding}
// CHECK-NEXT: ape.override {kind = "exqpe", l = 24 : i64, targets = "qkv", theta2 = 1.250000e-01 : f64}
ape.encoding @positions attributes {head_dim = 64 : i64, model_dim = 256 : i64} {
  ape.rotary {scaling = "yarn", factor = 4.0 : f64, original_length = 2048}
  ape.absolute {kind = "learned", max_length = 1024, scale_embedding}
  ape.override {kind = "exqpe", l = 24, theta2 = 0.125 : f64, targets = "qkv"}
}

// CHECK-LABEL: ape.encoding @xpos_sin
// CHECK-NEXT: ape.xpos {gamma = 5.000000e-01 : f64}
// CHECK-NEXT: ape.absolute {kind = "sinusoidal"}
ape.encoding @xpos_sin {
  ape.xpos {gamma = 0.5 : f64}
  ape.absolute {kind = "sinusoidal"}
}

// CHECK-LABEL: ape.kernel @lowered
// CHECK-NEXT: ape.param "sigma" ["1"] init = "constant" {value = 1.000000e+00 : f64}
// CHECK-NEXT: ape.masked_projection {kind = "exqpe", l = 4 : i64, position_scale = "sigma", targets = "qkv"}
// CHECK-NEXT: ape.position_embedding table {
// CHECK-NEXT: ^bb0(%{{.*}}: index, %{{.*}}: index, %{{.*}}: index):
// CHECK-NEXT: %[[C:.*]] = ape.constant 1.000000e-01
// CHECK-NEXT: ape.yield %[[C]] : f32
ape.kernel @lowered {
  %sigma = ape.param "sigma" ["1"] init = "constant" {value = 1.0 : f64}
  ape.masked_projection {kind = "exqpe", l = 4 : i64, position_scale = "sigma", targets = "qkv"}
  ape.position_embedding table {
  ^bb0(%n: index, %c: index, %d: index):
    %v = ape.constant 0.1
    ape.yield %v : f32
  }
}

// CHECK-LABEL: ape.kernel @learned_table
// CHECK-NEXT: ape.position_embedding {learned, max_length = 8 : i64, std = 1.000000e-01 : f64}
ape.kernel @learned_table {
  ape.position_embedding {learned, max_length = 8 : i64, std = 0.1 : f64}
}

// CHECK-LABEL: ape.encoding @biases
// CHECK-NEXT: ape.t5_bias {max_distance = 256 : i64}
// CHECK-NEXT: ape.kerple {kind = "log"}
// CHECK-NEXT: ape.fire {hidden = 16 : i64}
ape.encoding @biases {
  ape.t5_bias {max_distance = 256}
  ape.kerple {kind = "log"}
  ape.fire {hidden = 16}
}

// A whole number for a float argument is that number (MLIR reads `500000` as an i64); one equal to
// its default prints as the default does (not at all).
// CHECK-LABEL: ape.encoding @whole_numbers
// CHECK-NEXT: ape.rotary {base = 5.000000e+05 : f64}
// CHECK-NEXT: ape.fire {l_init = 1.024000e+03 : f64}{{$}}
// CHECK-NEXT: ape.token_feature "g" {bias = -1.000000e+00 : f64}{{$}}
ape.encoding @whole_numbers {
  ape.rotary {base = 500000, fraction = 1}
  ape.fire {l_init = 1024, c = 0.1 : f64}
  %g = ape.token_feature "g" {bias = -1, weight_std = 0.02 : f64}
}

// The same in the encoding's `scale`, a q/k mod's `fraction` and the position embedding's `std`.
// CHECK-LABEL: ape.encoding @whole_numbers_too attributes {scale = 2.000000e+00 : f64}
// CHECK-NEXT: ape.position_embedding {learned, max_length = 16 : i64, std = 1.000000e+00 : f64}{{$}}
// CHECK-NEXT: ape.q_mod attributes {pairing = "half"} {
// CHECK: ape.k_mod attributes {pairing = "interleaved"} {
ape.encoding @whole_numbers_too attributes {scale = 2} {
  ape.position_embedding {learned, max_length = 16, std = 1}
  ape.q_mod attributes {pairing = "half", fraction = 1} {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    ape.yield %x : f32
  }
  ape.k_mod attributes {pairing = "interleaved", fraction = 1} {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    ape.yield %x : f32
  }
}
