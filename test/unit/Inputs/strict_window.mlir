// A windowed mask with -inf (test/unit/spec_library_test.cpp): query i attends to the W = 3 keys
// before it, never to its own position, so row 0 has no key at all (a fully masked row: o = 0
// and zero gradients). ALiBi slopes, trainable, so a param gradient is checked too.
ape.encoding @strict_window {
  %m = ape.param "slopes" ["heads"] init = "alibi_slopes" trainable
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %c0 = arith.constant 0 : index
    %c3 = arith.constant 3 : index
    %ninf = arith.constant 0xFF800000 : f32
    %mh = ape.load %m[%h] : !ape.param
    %d = arith.subi %i, %j : index
    %d64 = arith.index_cast %d : index to i64
    %df = arith.sitofp %d64 : i64 to f32
    %bias = arith.mulf %mh, %df : f32
    %biased = arith.subf %s, %bias : f32
    %self = arith.cmpi eq, %d, %c0 : index
    %far = arith.cmpi sgt, %d, %c3 : index
    %kept = arith.select %far, %ninf, %biased : f32
    %r = arith.select %self, %ninf, %kept : f32
    ape.yield %r : f32
  }
}
