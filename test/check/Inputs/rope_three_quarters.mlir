// RoPE on three quarters of each head's coordinates (ape-check --cuda, test/check/ape_check.cmake):
// at head dim 32, 24 rotated columns in halves of 12, so that no 8-column run (bf16) has a run of
// partners of its own and the linear mod kernels pair its columns one by one; 4-column runs (f32)
// and head dim 64 (halves of 24) pair whole runs; the last quarter is unrotated.
ape.encoding @rope_three_quarters {
  ape.rotary {fraction = 0.75 : f64}
}
