// RoPE: rotate each pair of q/k coordinates by position·θ_k, θ_k = base^(-2k/d_h).
ape.encoding @rope {
  ape.rotary {base = 10000.0 : f64, fraction = 1.0 : f64, pairing = "half"}
}
