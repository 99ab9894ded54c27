// A param of nine dimensions: the CPU kernel takes it, the generated libraries (at most 8) do not
// (apec-outputs.test: an emitter that fails leaves no output of the others).
ape.encoding @nine_dims {
  %w = ape.param "w" ["heads", "1", "1", "1", "1", "1", "1", "1", "1"] init = "zeros" trainable
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %z = arith.constant 0 : index
    %wh = ape.load %w[%h, %z, %z, %z, %z, %z, %z, %z, %z] : !ape.param
    %r = arith.addf %s, %wh : f32
    ape.yield %r : f32
  }
}
