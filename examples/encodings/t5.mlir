// T5 relative bias: one learned table [32, heads] over log-spaced distance buckets, shared by
// every layer: B_ij = T[bucket(i - j), h]. Distances >= 113 share bucket 31.
ape.encoding @t5 {
  ape.t5_bias {buckets = 32, max_distance = 128}
}
