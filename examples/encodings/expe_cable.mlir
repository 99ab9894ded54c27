// Composition across sites: the ExPE override (projection input) and Cable's cumulative bias
// (logits) in one fused kernel.
ape.encoding @expe_cable {
  ape.override {l = 16, start = 0.0 : f64, theta = 4.8828125e-04 : f64, targets = "qk"}
  ape.cable {kernel = "none"}
}
