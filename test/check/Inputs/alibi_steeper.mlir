// A spec under a built-in encoding's name (test/check/ape_check.cmake): ALiBi with every slope
// 1.5 times the standard one, named @alibi. ape-check compiles it and must check its kernels, not
// the build's alibi (whose slopes differ by a factor 1.5), on the CPU and with --cuda.
ape.encoding @alibi {
  %m = ape.param "alibi_slopes" ["heads"] init = "alibi_slopes"
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %slope = ape.load %m[%h] : !ape.param
    %f = ape.constant 1.5
    %m2 = arith.mulf %slope, %f : f32
    %d = arith.subi %i, %j : index
    %d64 = arith.index_cast %d : index to i64
    %df = arith.sitofp %d64 : i64 to f32
    %bias = arith.mulf %m2, %df : f32
    %neg = arith.negf %bias : f32
    %r = arith.addf %s, %neg : f32
    ape.yield %r : f32
  }
}
