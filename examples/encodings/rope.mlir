// RoPE: rotate each pair of q/k coordinates by position·θ_k, θ_k = base^(-2k/d_r) over the
// d_r = 2⌊d_h/2⌋ rotated coordinates (an odd head dim's last one is left as it is).
ape.encoding @rope {
  ape.rotary {base = 10000.0 : f64, fraction = 1.0 : f64, pairing = "half"}
}
