// ExPE on the inputs of all three projections: q and k get the fused a + n·b term, the value
// projection reads the overridden input itself.
ape.encoding @expe_qkv {
  ape.override {l = 16, start = 0.0 : f64, theta = 4.8828125e-04 : f64, targets = "qkv"}
}
