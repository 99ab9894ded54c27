// Partial rotary: only the first half of each head's coordinates rotate (d_r = d_h/2);
// the rest carry no position.
ape.encoding @rope_partial {
  ape.rotary {fraction = 0.5 : f64}
}
