// YaRN: per-frequency blend of interpolation (θ/s) and extrapolation (θ) by a linear ramp over
// the dimensions between β_fast and β_slow rotations in the original length L, and q, k both
// scaled by mscale = 0.1·ln(s) + 1. Fixed params "rope_factor" and "rope_original_length".
ape.encoding @rope_yarn {
  ape.rotary {scaling = "yarn", factor = 4.0 : f64, original_length = 128,
              beta_fast = 32.0 : f64, beta_slow = 1.0 : f64}
}
