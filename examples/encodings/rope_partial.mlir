// Partial rotary: about the first half of each head's coordinates rotate (d_r = 2·floor(d_h/4));
// the rest carry no position.
ape.encoding @rope_partial {
  ape.rotary {fraction = 0.5 : f64}
}
