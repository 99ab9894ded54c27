// Arithmetic that single precision gets wrong, in a kernel of every precision:
// - RoPE on 0.525 of head_dim 240 (126 coordinates, 63 pairs): r/2 = floor(240 * 0.2625) in
//   float is 62 (240 * 0.2625f = 62.999996), which paired coordinates 63 apart with 62
//   frequencies in every fp32 kernel (15% error, and the fp32 reference shared it);
// - T5-like buckets with base-4 spacing from math.log of constants: bucket(n) = 16 +
//   floor(8 ln(n/16) / ln 4) for n >= 16, exact at n = 32 (20); ln 4 folded in f32 made the fp64
//   kernel's bucket 19 there;
// - a soft cap 3 tanh(s / 3): the derivative's 1/3 folded in f32 gave the fp64 kernel's backward
//   a 3e-8 relative error against its own forward.
ape.encoding @exact_constants attributes {head_dim = 240} {
  ape.rotary {fraction = 0.525 : f64}
  %t = ape.param "tab" ["32", "heads"] init = "zeros" trainable
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %c16 = arith.constant 16 : index
    %c31 = arith.constant 31 : index
    %n = arith.subi %i, %j : index
    %small = arith.cmpi slt, %n, %c16 : index
    %nl = arith.maxsi %n, %c16 : index
    %n64 = arith.index_cast %nl : index to i64
    %nf = arith.sitofp %n64 : i64 to f32
    %f16 = arith.constant 16.0 : f32
    %ratio = arith.divf %nf, %f16 : f32
    %lr = math.log %ratio : f32
    %f4 = arith.constant 4.0 : f32
    %l4 = math.log %f4 : f32
    %q = arith.divf %lr, %l4 : f32
    %f8 = arith.constant 8.0 : f32
    %steps = arith.mulf %q, %f8 : f32
    %fl = math.floor %steps : f32
    %s64 = arith.fptosi %fl : f32 to i64
    %sidx = arith.index_cast %s64 : i64 to index
    %large0 = arith.addi %c16, %sidx : index
    %large = arith.minsi %large0, %c31 : index
    %bucket = arith.select %small, %n, %large : index
    %v = ape.load %t[%bucket, %h] : !ape.param
    %f3 = arith.constant 3.0 : f32
    %sc = arith.divf %s, %f3 : f32
    %th = math.tanh %sc : f32
    %capped = arith.mulf %f3, %th : f32
    %r = arith.addf %capped, %v : f32
    ape.yield %r : f32
  }
}
