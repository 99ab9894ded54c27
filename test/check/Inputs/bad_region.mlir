// A malformed spec for ape-check's own test: apec's located diagnostic must reach the user.
ape.encoding @broken {
  ape.score_mod {
  ^bb0(%s: f32):
    ape.yield %s : f32
  }
}
