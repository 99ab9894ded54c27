// A valid spec written with spaces before the colons of its block arguments (`%s : f32`): not a
// forward reference (apec-forward-reference.test).
ape.encoding @spaced_names {
  %p = ape.param "tab" ["64"] init = "zeros" trainable
  ape.score_mod {
  ^bb0(%s : f32, %b : index, %h : index, %i : index, %j : index):
    %c63 = arith.constant 63 : index
    %d = arith.subi %i, %j : index
    %r = arith.minui %d, %c63 : index
    %v = ape.load %p[%r] : !ape.param
    %o = arith.addf %s, %v : f32
    ape.yield %o : f32
  }
}
