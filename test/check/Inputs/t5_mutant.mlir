// A deliberately wrong spec for ape-check's own test (test/check/ape_check.cmake): T5's bias with
// max_distance 64 instead of examples/encodings/t5.mlir's 128. Same params (the table [32, heads]),
// other buckets for distances >= 20: the registry's t5 kernel checked against this spec's
// reference (ape-check --kernel t5) must fail, and only where such distances occur (T > 20).
ape.encoding @t5 {
  ape.t5_bias {buckets = 32, max_distance = 64}
}
