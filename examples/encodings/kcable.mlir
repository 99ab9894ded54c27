// K-Cable: Cable's cumulative biases through the kernel -log(1 + (S_i - S_j)^2), computed on the
// full pairwise difference.
ape.encoding @kcable {
  ape.cable {kernel = "log1p_sq"}
}
