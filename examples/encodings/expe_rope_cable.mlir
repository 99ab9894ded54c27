// Components at three sites fused into one kernel: ExPE overwrites the first l inputs of the
// q/k projections, RoPE rotates the resulting q and k, Cable adds its cumulative bias to the
// logits. The compiler puts the override's additive term before the rotation (it acts on the
// projection input): q' = R(t)·(W[:, l:]·x[l:] + a + t·b).
ape.encoding @expe_rope_cable {
  ape.override {l = 16, start = 0.0 : f64, theta = 4.8828125e-04 : f64, targets = "qk"}
  ape.rotary {base = 10000.0 : f64, fraction = 1.0 : f64, pairing = "half"}
  ape.cable {kernel = "none"}
}
