// ExPE: overwrite the first l inputs of the q/k projections by position values
// p_{n,i} = start + θ·(n + i); the compiler pushes the override through the projection.
ape.encoding @expe {
  ape.override {l = 16, start = 0.0 : f64, theta = 4.8828125e-04 : f64, targets = "qk"}
}
