// Numbers and names the float-literal check must let through: 1.5e3, 2.0E-3, a hex 0x1e5, names
// and labels with digits and e (%x1e5, %y-1e5, @e2e3; in a comment: 1e5 here is a comment), strings.
ape.encoding @e2e3 {
  %p = ape.param "p1e5" ["heads"] init = "constant" trainable {value = 1.5e3 : f64}
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %c = arith.constant 2.0E-3 : f32
    %n = arith.constant 0x1e5 : i64
    %f = arith.sitofp %n : i64 to f32
    %x1e5 = arith.mulf %s, %c : f32
    %y-1e5 = arith.addf %x1e5, %f : f32
    %w = ape.load %p[%h] : !ape.param
    %r = arith.addf %y-1e5, %w : f32
    ape.yield %r : f32
  }
}
