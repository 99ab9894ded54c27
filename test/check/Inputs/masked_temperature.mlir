// A -inf mask, then what is computed from the masked logit, for ape-check's own test
// (test/check/ape_check.cmake): each gradient was NaN before passes/Differentiate.cpp's
// reachedByInfinity (0·inf = 0 in the products of a tangent and a value an infinite constant
// reaches, and in g·∂f/∂u):
//   select(i - j > 4, -inf, s) · temp   ∂/∂temp = -inf at the masked pairs, where g = 0
//   r - log(r·r + 1)                    a later nonlinear use of the masked logit: d(r·r) = 0·-inf
ape.encoding @masked_temperature {
  %w = ape.param "temp" ["heads"] init = "constant" trainable {value = 0.5 : f64}
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %d = arith.subi %i, %j : index
    %c4 = arith.constant 4 : index
    %far = arith.cmpi sgt, %d, %c4 : index
    %ninf = arith.constant 0xFF800000 : f32
    %m = arith.select %far, %ninf, %s : f32
    %p = ape.load %w[%h] : !ape.param
    %r = arith.mulf %m, %p : f32
    ape.yield %r : f32
  }
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %sq = arith.mulf %s, %s : f32
    %one = arith.constant 1.0 : f32
    %u = arith.addf %sq, %one : f32
    %l = math.log %u : f32
    %r = arith.subf %s, %l : f32
    ape.yield %r : f32
  }
}
