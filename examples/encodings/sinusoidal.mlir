// Sinusoidal absolute positions, added once to the input embedding:
// PE[n, 2k] = sin(n / base^(2k/d)), PE[n, 2k+1] = cos(n / base^(2k/d)). The attention kernel is NoPE.
ape.encoding @sinusoidal {
  ape.absolute {kind = "sinusoidal"}
}
