// Sinusoidal absolute positions with the token embedding multiplied by sqrt(d) first, as in the
// original Transformer: examples/encodings/sinusoidal.mlir adds the table (amplitude 1) to token
// embeddings initialised at std 0.02, so positions swamp tokens at the start of training. The
// extrapolation study (docs/study.md) trains both.
ape.encoding @sinusoidal_scaled {
  ape.absolute {kind = "sinusoidal", scale_embedding}
}
