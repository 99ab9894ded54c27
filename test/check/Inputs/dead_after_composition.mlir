// Params that nothing reads once the regions are composed, for ape-check's own test
// (test/check/ape_check.cmake): apec warns and leaves them out of the kernel; ape-check notes it,
// after making sure the reference's output does not depend on them (it had called the kernel's
// manifest an interface mismatch: "the spec declares 2 params, the kernel's manifest 0").
//   w: read by a score_mod whose score the next one ignores (it yields j - i)
//   u: read in a branch of a select a constant decides
ape.encoding @dead_after_composition {
  %w = ape.param "w" ["heads"] init = "ones" trainable
  %u = ape.param "u" ["heads"] init = "ones" trainable
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %p = ape.load %w[%h] : !ape.param
    %r = arith.addf %s, %p : f32
    ape.yield %r : f32
  }
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %d = arith.subi %j, %i : index
    %d64 = arith.index_cast %d : index to i64
    %f = arith.sitofp %d64 : i64 to f32
    %q = ape.load %u[%h] : !ape.param
    %t = arith.constant true
    %fq = arith.addf %f, %q : f32
    %r = arith.select %t, %f, %fq : f32
    ape.yield %r : f32
  }
}
