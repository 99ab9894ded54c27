// Value rows alone, without a score mod (test/cuda/value_rows_simt_test.cpp): o_i gains
// sum_j A_ij table[r] for the clipped distance r = clip(i - j, 0, 8), a learned table [9, heads,
// head_dim]; the logits are plain scaled dot products.
ape.encoding @value_window {
  %t = ape.param "window_value" ["9", "heads", "head_dim"] init = "normal" trainable {std = 0.5 : f64}
  ape.value_rows %t index {
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c0 = arith.constant 0 : index
    %c8 = arith.constant 8 : index
    %d = arith.subi %i, %j : index
    %pos = arith.maxsi %d, %c0 : index
    %r = arith.minsi %pos, %c8 : index
    ape.yield %r : index
  }
}
