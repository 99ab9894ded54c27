// KERPLE (power): B_ij = -a_h·(i - j)^(p_h), per-head a and p (<= 2) shared by all layers.
ape.encoding @kerple_power {
  ape.kerple {kind = "power", p_init = 1.0 : f64, a_init = 0.5 : f64}
}
