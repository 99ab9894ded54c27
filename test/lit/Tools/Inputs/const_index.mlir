// A constant param index outside its dimension (test/lit/Tools/apec-input.test): the integer
// dimensions always, and the symbolic ones where the encoding pins them.
ape.encoding @const_index attributes {head_dim = 16} {
  %t = ape.param "table" ["32", "heads"] init = "zeros" trainable
  %u = ape.param "u" ["heads", "head_dim"] init = "zeros" trainable
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %c31 = arith.constant 31 : index
    %ok = ape.load %t[%c31, %h] : !ape.param
    %c32 = arith.constant 32 : index
    %bad = ape.load %t[%c32, %h] : !ape.param
    %r = arith.addf %s, %ok : f32
    %r2 = arith.addf %r, %bad : f32
    ape.yield %r2 : f32
  }
  ape.q_mod {
  ^bb0(%x: f32, %y: f32, %c: index, %n: index, %h: index):
    %c16 = arith.constant 16 : index
    %v = ape.load %u[%h, %c16] : !ape.param
    %r = arith.addf %x, %v : f32
    ape.yield %r : f32
  }
}
