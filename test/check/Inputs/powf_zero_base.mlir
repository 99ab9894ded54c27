// A power whose base is 0 on the diagonal, for ape-check's own test (test/check/ape_check.cmake):
// B_ij = -a_h (c_h (i - j))^p_h with the scale c and the exponent p trainable. The gradients are
// torch.pow's: d/dc of 0^p (p > 0) is 0 and d/dp of 0^p is 0, where r (p da / a + ln a dp) is
// 0 · inf or 0 / 0 (NaN: every param gradient of the slice was NaN before).
ape.encoding @powf_zero_base {
  %a = ape.param "pw_a" ["heads"] init = "constant" trainable {value = 0.5 : f64}
  %c = ape.param "pw_c" ["heads"] init = "constant" trainable {value = 0.1 : f64}
  %p = ape.param "pw_p" ["heads"] init = "constant" trainable {value = 1.5 : f64}
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %ah = ape.load %a[%h] : !ape.param
    %ch = ape.load %c[%h] : !ape.param
    %ph = ape.load %p[%h] : !ape.param
    %d = arith.subi %i, %j : index
    %d64 = arith.index_cast %d : index to i64
    %df = arith.sitofp %d64 : i64 to f32
    %x = arith.mulf %df, %ch : f32
    %y = math.powf %x, %ph : f32
    %z = arith.mulf %y, %ah : f32
    %r = arith.subf %s, %z : f32
    ape.yield %r : f32
  }
}
