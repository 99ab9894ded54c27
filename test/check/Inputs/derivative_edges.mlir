// Derivatives at the edges of floating point and of integers, for ape-check's own test
// (test/check/ape_check.cmake): each term failed before passes/Differentiate.cpp's 0·inf = 0
// tangents (zmul, zdiv), its maxnumf rule, and codegen/RegionWriter.cpp's wrapping i64 arithmetic.
//   log(max(lw - 0.1 n, 0)) + 0.1 i   -inf past distance 10 lw (masked pairs; per element): the
//                                      tangent of log at 0 was 0/0 = NaN, and 0 · NaN stays NaN
//   4 / (1 + e^(sa + 2 (n - 20)))      e^ overflows in f32 past n ~ 64: r·db = 0·inf in the
//                                      quotient rule (d e / d sa = e: no tangent overflows
//                                      before its value, which the kernels do not handle)
//   -sqrt(sq n)                        d/dsq = n / (2 sqrt(sq n)) = 0/0 on the diagonal
//   maxnumf(na, x), x NaN 3 keys back  the number's derivative, na's (the comparison alone took x's)
//   -2 where (n · 2^62 : i64) < 0      wraps for n = 2, 3 mod 4 (signed overflow was undefined in
//                                      the C++, folded to n < 0)
//   exp(log(max(g, 0)))                a token map whose derivative is 0/0 where the gate is <= 0
ape.encoding @derivative_edges {
  %lw = ape.param "lw" ["heads"] init = "constant" trainable {value = 3.0 : f64}
  %sa = ape.param "sa" ["heads"] init = "constant" trainable {value = 0.5 : f64}
  %sq = ape.param "sq" ["heads"] init = "constant" trainable {value = 0.5 : f64}
  %na = ape.param "na" ["heads"] init = "constant" trainable {value = -0.5 : f64}
  %g = ape.token_feature "gate" {weight_std = 0.02 : f64, bias = 0.0 : f64}
  %lg = ape.map %g {
  ^bb0(%x: f32):
    %z = arith.constant 0.0 : f32
    %v = arith.maximumf %x, %z : f32
    %y = math.log %v : f32
    ape.yield %y : f32
  }
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %d = arith.subi %i, %j : index
    %d64 = arith.index_cast %d : index to i64
    %n = arith.sitofp %d64 : i64 to f32
    %zero = arith.constant 0.0 : f32
    %one = arith.constant 1.0 : f32
    // log(max(lw - 0.1 n, 0)) + 0.1 i
    %lwh = ape.load %lw[%h] : !ape.param
    %k = arith.constant 0.1 : f32
    %nk = arith.mulf %n, %k : f32
    %u = arith.subf %lwh, %nk : f32
    %v = arith.maximumf %u, %zero : f32
    %l = math.log %v : f32
    %i64 = arith.index_cast %i : index to i64
    %fi = arith.sitofp %i64 : i64 to f32
    %ik = arith.mulf %fi, %k : f32
    %t1 = arith.addf %l, %ik : f32
    // 4 / (1 + e^(sa + 2 (n - 20)))
    %sah = ape.load %sa[%h] : !ape.param
    %c20 = arith.constant 20.0 : f32
    %n20 = arith.subf %n, %c20 : f32
    %n2 = arith.addf %n20, %n20 : f32
    %x = arith.addf %sah, %n2 : f32
    %e = math.exp %x : f32
    %den = arith.addf %one, %e : f32
    %four = arith.constant 4.0 : f32
    %t2 = arith.divf %four, %den : f32
    // -sqrt(sq n)
    %sqh = ape.load %sq[%h] : !ape.param
    %sn = arith.mulf %sqh, %n : f32
    %t3 = math.sqrt %sn : f32
    // maxnumf(na, NaN 3 keys back, else 5)
    %nah = ape.load %na[%h] : !ape.param
    %c3 = arith.constant 3 : index
    %far = arith.cmpi sge, %d, %c3 : index
    %nan = arith.constant 0x7FC00000 : f32
    %five = arith.constant 5.0 : f32
    %xm = arith.select %far, %nan, %five : f32
    %t4 = arith.maxnumf %nah, %xm : f32
    // -2 where (n 2^62 : i64) < 0
    %big = arith.constant 4611686018427387904 : i64
    %m = arith.muli %d64, %big : i64
    %z64 = arith.constant 0 : i64
    %neg = arith.cmpi slt, %m, %z64 : i64
    %pen = arith.constant -2.0 : f32
    %t5 = arith.select %neg, %pen, %zero : f32
    // exp(log(max(g_j, 0))) / 2
    %lgj = ape.load %lg[%b, %h, %j] : !ape.tokens
    %eg = math.exp %lgj : f32
    %half = arith.constant 0.5 : f32
    %t6 = arith.mulf %eg, %half : f32
    %a1 = arith.addf %s, %t1 : f32
    %a2 = arith.addf %a1, %t2 : f32
    %a3 = arith.subf %a2, %t3 : f32
    %a4 = arith.addf %a3, %t4 : f32
    %a5 = arith.addf %a4, %t5 : f32
    %a6 = arith.addf %a5, %t6 : f32
    ape.yield %a6 : f32
  }
}
