// RoPE written for models of head_dim 64 (the runtime refuses others; ape-check's default grid
// checks it at D = 64).
ape.encoding @pinned_head_dim attributes {head_dim = 64} {
  ape.rotary {base = 10000.0 : f64}
}
