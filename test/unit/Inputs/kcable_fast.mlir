// K-Cable marked fast_math (test/cuda/fast_math_simt_test.cpp): its score mod's log1p and the
// backward's division compiled to the GPU's approximate functions (-ape-fast-math), the token
// program (-softplus, the scan) exact.
ape.encoding @kcable_fast attributes {fast_math} {
  ape.cable {kernel = "log1p_sq"}
}
