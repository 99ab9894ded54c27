// Two chunks for ape-opt -split-input-file: the first defines %min before its use, the second
// uses it first (apec-forward-reference.test).
ape.encoding @forget_gate {
  %g = ape.token_feature "gate" {weight_std = 0.02 : f64, bias = 2.0 : f64}
  %l = ape.map %g {
  ^bb0(%x: f32):
    %zero = arith.constant 0.0 : f32
    %min = arith.minimumf %x, %zero : f32
    %abs = math.absf %x : f32
    %neg = arith.negf %abs : f32
    %e = math.exp %neg : f32
    %lp = math.log1p %e : f32
    %y = arith.subf %min, %lp : f32
    ape.yield %y : f32
  }
  %c = ape.scan %l
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %ci = ape.load %c[%b, %h, %i] : !ape.tokens
    %cj = ape.load %c[%b, %h, %j] : !ape.tokens
    %d = arith.subf %ci, %cj : f32
    %r = arith.addf %s, %d : f32
    ape.yield %r : f32
  }
}

// -----

ape.encoding @fg2 {
  %g = ape.token_feature "gate" {weight_std = 0.02 : f64, bias = 2.0 : f64}
  %l = ape.map %g {
  ^bb0(%x: f32):
    %zero = arith.constant 0.0 : f32
    %abs = math.absf %min : f32
    %min = arith.minimumf %x, %zero : f32
    %neg = arith.negf %abs : f32
    %e = math.exp %neg : f32
    %lp = math.log1p %e : f32
    %y = arith.subf %min, %lp : f32
    ape.yield %y : f32
  }
  %c = ape.scan %l
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %ci = ape.load %c[%b, %h, %i] : !ape.tokens
    %cj = ape.load %c[%b, %h, %j] : !ape.tokens
    %d = arith.subf %ci, %cj : f32
    %r = arith.addf %s, %d : f32
    ape.yield %r : f32
  }
}
