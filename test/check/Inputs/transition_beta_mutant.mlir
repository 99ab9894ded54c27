// A deliberately wrong spec for ape-check's own test (test/check/ape_check.cmake): the attention
// transition with beta 0.11 instead of examples/encodings/rope_transition.mlir's 0.1 (a tenth more
// of the removed mass given back to the window). The registry's rope_transition kernel checked
// against this spec's reference (ape-check --kernel rope_transition) must fail in o at the
// transformed layers only; lse (the softmax's) is the same.
ape.encoding @rope_transition {
  ape.rotary {base = 10000.0 : f64, fraction = 1.0 : f64, pairing = "half"}
  ape.attention_transition {divisor_offset = 1, first_layer = 1, skip_last = 2, intervals = 2,
                            alpha = 0.5 : f64, beta = 0.11 : f64}
}
