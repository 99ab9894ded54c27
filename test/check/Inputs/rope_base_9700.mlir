// A mutant of examples/encodings/rope.mlir: base 9,700 for 10,000 (ape_check.cuda_mutant_rope_base).
// RoPE: rotate each pair of q/k coordinates by position·θ_k, θ_k = base^(-2k/d_r) over the
// d_r = 2⌊d_h/2⌋ rotated coordinates (an odd head dim's last one is left as it is).
ape.encoding @rope {
  ape.rotary {base = 9700.0 : f64, fraction = 1.0 : f64, pairing = "half"}
}
