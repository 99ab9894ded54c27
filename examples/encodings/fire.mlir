// FIRE: a learned MLP (1 -> 32 -> heads, ReLU) of the log distance normalised by the query's
// position, ψ(i - j) / ψ(max(i, 512·L)) with ψ(x) = ln(|c·x| + 1); evaluated inside the kernel.
ape.encoding @fire {
  ape.fire {hidden = 32, c = 0.1 : f64, l_init = 512.0 : f64}
}
