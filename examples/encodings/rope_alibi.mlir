// Composition across sites: RoPE rotates q and k, ALiBi adds its distance penalty to the logits;
// both fuse into one kernel.
ape.encoding @rope_alibi {
  ape.rotary {base = 10000.0 : f64}
  ape.alibi
}
