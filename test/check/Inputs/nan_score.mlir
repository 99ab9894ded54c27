// A spec that computes NaN (log(-1) added to every score), for ape-check's own test
// (test/check/ape_check.cmake): the kernel computes the same NaNs as the reference, and the check
// must still fail, not pass on NaN == NaN.
ape.encoding @nan_score {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %m1 = arith.constant -1.0 : f32
    %l = math.log %m1 : f32
    %o = arith.addf %s, %l : f32
    ape.yield %o : f32
  }
}
