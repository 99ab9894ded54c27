// Learned absolute positions: a trained table wpe[max_length, d] (init N(0, 0.02)) added once to
// the input embedding. Sequences longer than max_length are an error naming both lengths.
ape.encoding @learned_absolute {
  ape.absolute {kind = "learned", max_length = 1024}
}
