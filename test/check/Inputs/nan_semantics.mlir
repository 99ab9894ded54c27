// NaN and float -> int conversions as MLIR means them, in the kernels (contract/float_math.h) and
// the reference alike, for ape-check's own test (test/check/ape_check.cmake). Keys 3 and more
// back get a NaN logit x; each op below turns it into a finite bias, as its meaning says:
//   maxnumf(x, -1e4) = -1e4 (the number), maximumf(x, 1) = NaN, caught by cmpf uno (true on NaN),
//   cmpf ult / uge true on NaN (unordered), ogt false (ordered), and fptosi(NaN) = 0,
//   fptosi(x * 1e30) saturating to int64's range. Before float_math.h the kernels took std::max
//   (NaN in, NaN out), the ordered C++ operators and an undefined conversion.
// The second mod keeps log(a n) where a n > 0 and 0 on the diagonal, where the discarded branch
// is log(0) = -inf with an infinite derivative: the param's gradient is the kept branch's, 1/a per
// key, in the kernel (the derivative taken through the select) and the reference (autograd with
// 0 * inf = 0 at a value whose gradient is zero), where the reference's was NaN.
ape.encoding @nan_semantics {
  %pa = ape.param "a" ["heads"] init = "constant" trainable {value = 1.0 : f64}
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %d = arith.subi %i, %j : index
    %c3 = arith.constant 3 : index
    %far = arith.cmpi sge, %d, %c3 : index
    %nan = arith.constant 0x7FC00000 : f32
    %x = arith.select %far, %nan, %s : f32
    %lo = arith.constant -1.0e4 : f32
    %one = arith.constant 1.0 : f32
    %zero = arith.constant 0.0 : f32
    %big = arith.constant 1.0e30 : f32
    // maxnumf: -1e4 where x is NaN, x elsewhere (x > -1e4)
    %a = arith.maxnumf %x, %lo : f32
    // maximumf propagates NaN; uno is true on it
    %m = arith.maximumf %x, %one : f32
    %u = arith.cmpf uno, %m, %m : f32
    %b1 = arith.select %u, %lo, %zero : f32
    // ult and uge are true on NaN; ogt is false
    %lt = arith.cmpf ult, %x, %lo : f32
    %ge = arith.cmpf uge, %x, %big : f32
    %gt = arith.cmpf ogt, %x, %lo : f32
    %both = arith.andi %lt, %ge : i1
    %b2 = arith.select %both, %lo, %zero : f32
    %b3 = arith.select %gt, %zero, %one : f32
    // fptosi: NaN -> 0; x * 1e30 saturates (|x| > ~1e-11) to +-2^63
    %k = arith.fptosi %x : f32 to i64
    %c0 = arith.constant 0 : i64
    %iszero = arith.cmpi eq, %k, %c0 : i64
    %b4 = arith.select %iszero, %zero, %one : f32
    %xs = arith.mulf %x, %big : f32
    %ks = arith.fptosi %xs : f32 to i64
    %max = arith.constant 9223372036854775807 : i64
    %sat = arith.cmpi eq, %ks, %max : i64
    %b5 = arith.select %sat, %one, %zero : f32
    %t1 = arith.addf %a, %b1 : f32
    %t2 = arith.addf %t1, %b2 : f32
    %t3 = arith.addf %t2, %b3 : f32
    %t4 = arith.addf %t3, %b4 : f32
    %t5 = arith.addf %t4, %b5 : f32
    ape.yield %t5 : f32
  }
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %ah = ape.load %pa[%h] : !ape.param
    %d = arith.subi %i, %j : index
    %n = arith.index_cast %d : index to i64
    %nf = arith.sitofp %n : i64 to f32
    %u = arith.mulf %ah, %nf : f32
    %l = math.log %u : f32
    %zero = arith.constant 0.0 : f32
    %pos = arith.cmpf ogt, %u, %zero : f32
    %bias = arith.select %pos, %l, %zero : f32
    %r = arith.subf %s, %bias : f32
    ape.yield %r : f32
  }
}
