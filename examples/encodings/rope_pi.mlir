// RoPE with position interpolation: every frequency divided by the factor s, θ'_k = θ_k / s.
// `factor` lowers to the fixed param "rope_factor": ape-eval --set rope_factor=S changes it
// without recompiling (s = 1 is plain RoPE).
ape.encoding @rope_pi {
  ape.rotary {scaling = "linear", factor = 4.0 : f64}
}
