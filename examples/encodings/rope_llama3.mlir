// Llama-3 RoPE scaling: wavelengths shorter than L/high_freq_factor are kept, longer than
// L/low_freq_factor divided by the factor, and the band between blended smoothly.
ape.encoding @rope_llama3 {
  ape.rotary {base = 500000.0 : f64, scaling = "llama3", factor = 8.0 : f64,
              original_length = 128, low_freq_factor = 1.0 : f64, high_freq_factor = 4.0 : f64}
}
