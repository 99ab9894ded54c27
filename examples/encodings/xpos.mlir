// xPos: interleaved RoPE times a per-pair decay ζ_k^(±t_c/B), ζ_k = (k/(d_h/2) + γ)/(1 + γ),
// + on q and - on k, positions centred on the middle of the sequence (t_c = t - floor(T/2)) so
// neither factor overflows at long T.
ape.encoding @xpos {
  ape.xpos {gamma = 0.4 : f64, scale_base = 512.0 : f64}
}
