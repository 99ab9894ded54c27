// RoPE with the attention transition (docs/encodings-math.md, "Attention transition (P)"):
// the rope kernel plus a post-softmax redistribution of attention mass while a prompt is
// processed. Inference only: it has no backward. Train with `rope` and evaluate with this
// encoding (no trainable params differ):
//   ape-eval -c runs/rope.ckpt --encoding rope_transition
//   ape-generate -c runs/rope.ckpt --encoding rope_transition --score book.txt --chunk 100000
// The attributes are the spec's: I = floor(T / (N + 1)) rounded down to 5, layers 1 .. N-3,
// two intervals per layer, alpha = 0.5, beta = 0.1. A model needs N >= 4 layers for any layer
// to be transformed.
ape.encoding @rope_transition {
  ape.rotary {base = 10000.0 : f64, fraction = 1.0 : f64, pairing = "half"}
  ape.attention_transition {divisor_offset = 1, first_layer = 1, skip_last = 2, intervals = 2,
                            alpha = 0.5 : f64, beta = 0.1 : f64}
}
