// A deliberately wrong spec for ape-check's own test (test/check/ape_check.cmake): the attention
// transition skipping the last layer only (skip_last 1) instead of the last two, as
// examples/encodings/rope_transition.mlir does. At 6 layers the reference transforms layer 4 too;
// the registry's rope_transition kernel (ape-check --kernel rope_transition) must fail there, at
// layer 4 and nowhere else.
ape.encoding @rope_transition {
  ape.rotary {base = 10000.0 : f64, fraction = 1.0 : f64, pairing = "half"}
  ape.attention_transition {divisor_offset = 1, first_layer = 1, skip_last = 1, intervals = 2,
                            alpha = 0.5 : f64, beta = 0.1 : f64}
}
