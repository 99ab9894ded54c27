// RoPE with interleaved pairs (2k, 2k+1), as in GPT-J, instead of rotate-half (k, k + d_r/2).
ape.encoding @rope_interleaved {
  ape.rotary {pairing = "interleaved"}
}
