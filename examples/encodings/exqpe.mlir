// ExQPE: counter-style override of the first l projection inputs,
// p_{n,j} = start + j·θ1 + θ2·c_j(n), c_j(n) = floor(n/l) + [j <= n mod l]. The compiler pushes it
// through the projection as a + floor(n/l)·b + P[n mod l]. Fixed param "position_scale" (σ)
// scales the positions at evaluation: ape-eval --set position_scale=0.5.
ape.encoding @exqpe {
  ape.override {kind = "exqpe", l = 16, start = 0.0 : f64, theta1 = 4.8828125e-04 : f64,
                theta2 = 6.25e-02 : f64, targets = "qk"}
}
