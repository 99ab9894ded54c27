// A spec outside examples/ for ape-check's own test (test/check/ape_check.cmake), compiled at run
// time (runtime/SpecLibrary.h): an ExPE override fused with an interleaved partial rotation (the
// fused partner index c ^ 1), a gate map and scan, and -inf masks: keys more than 4 back, and
// every key of the first 3 queries (rows with no visible key: o = 0, lse = -inf, zero gradients).
ape.encoding @masked_mix attributes {scale = 0.5 : f64} {
  ape.override {l = 4, start = 0.0 : f64, theta = 0.5 : f64, targets = "qk"}
  ape.rotary {base = 10000.0 : f64, fraction = 0.5 : f64, pairing = "interleaved"}
  %g = ape.token_feature "gate" {weight_std = 0.02 : f64, bias = 0.0 : f64}
  %l = ape.map %g {
  ^bb0(%x: f32):
    %y = math.exp %x : f32
    ape.yield %y : f32
  }
  %c = ape.scan %l
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %ci = ape.load %c[%b, %h, %i] : !ape.tokens
    %cj = ape.load %c[%b, %h, %j] : !ape.tokens
    %d = arith.subf %cj, %ci : f32
    %r0 = arith.addf %s, %d : f32
    %ninf = arith.constant 0xFF800000 : f32
    %c4 = arith.constant 4 : index
    %c3 = arith.constant 3 : index
    %ij = arith.subi %i, %j : index
    %far = arith.cmpi sgt, %ij, %c4 : index
    %early = arith.cmpi ult, %i, %c3 : index
    %masked = arith.ori %far, %early : i1
    %r = arith.select %masked, %ninf, %r0 : f32
    ape.yield %r : f32
  }
}
