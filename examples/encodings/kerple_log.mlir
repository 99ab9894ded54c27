// KERPLE (logarithmic): B_ij = -p_h·ln(1 + a_h·(i - j)), per-head p and a shared by all layers.
ape.encoding @kerple_log {
  ape.kerple {kind = "log", p_init = 1.0 : f64, a_init = 1.0 : f64}
}
