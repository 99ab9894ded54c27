// q' = 40 q (ape-check --cuda, test/check/ape_check.cmake): a q mod that amplifies q amplifies the
// bf16 rounding of q' that the 16-bit kernels' tensor cores read. The kernel is correct; its bf16
// rows are some 4e-2 to 8e-2 off, which the fixed 3e-2 failed and the yardstick (the reference
// with q' and k' rounded to bf16) follows.
ape.encoding @amplifying_q_mod {
  ape.q_mod {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    %f = ape.constant 40.0
    %r = arith.mulf %x, %f : f32
    ape.yield %r : f32
  }
}
