// NTK-aware RoPE: the base grows with the factor s, base' = base·s^(d_r/(d_r-2)), so the lowest
// frequencies are interpolated and the highest kept. Fixed param "rope_factor" (s = 1: plain RoPE).
ape.encoding @rope_ntk {
  ape.rotary {scaling = "ntk", factor = 4.0 : f64}
}
