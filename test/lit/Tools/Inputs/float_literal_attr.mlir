ape.encoding @r {
  ape.rotary {base = 1e5}
}
