// Composition: RoPE on q and k with T5's bucketed learned bias on the logits, one kernel.
ape.encoding @rope_t5 {
  ape.rotary
  ape.t5_bias
}
