// xPos: interleaved RoPE times a per-pair decay ζ_k^(±t_c/B), ζ_k = (k/(d_h/2) + γ)/(1 + γ),
// + on q and - on k, positions centred on the middle of the sequence (t_c = t - floor(T/2)), which
// halves the exponents without removing them: q' and k' are stored in the input dtype, and the
// first pair's factor 3.5^(|t_c|/512) passes float16's largest value near T = 9,000 and float32's
// (and bfloat16's) near T = 72,000 (inf, then NaN scores; k' loses float16 precision from about
// T = 8,000). Beyond those lengths xPos as specified does not fit these dtypes.
ape.encoding @xpos {
  ape.xpos {gamma = 0.4 : f64, scale_base = 512.0 : f64}
}
