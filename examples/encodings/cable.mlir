// Cable: context-aware cumulative biases. b_t = -softplus(w_h·x̃_t + c_h),
// S_t = Σ_{u<=t} b_u, bias B_ij = S_i - S_j.
ape.encoding @cable {
  ape.cable {kernel = "none"}
}
