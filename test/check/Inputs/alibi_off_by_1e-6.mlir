// A deliberately wrong spec for ape-check's own test (test/check/ape_check.cmake): ALiBi written
// in its generic form, as -ape-expand writes examples/encodings/alibi.mlir, with every slope
// 1.000001 times too large. ape-check --kernel alibi must fail in fp64 (tolerance 1e-10); the
// difference (~1e-7 relative) is below fp32 rounding, so the fp32 rows pass.
ape.encoding @alibi {
  %m = ape.param "alibi_slopes" ["heads"] init = "alibi_slopes"
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %slope = ape.load %m[%h] : !ape.param
    %f = ape.constant 1.000001
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
