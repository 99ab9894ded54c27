// A spec error for test/unit/spec_library_test.cpp: the score_mod yields an index, not an f32.
ape.encoding @bad_spec {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    ape.yield %i : index
  }
}
