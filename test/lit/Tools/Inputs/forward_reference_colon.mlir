// %9 read with no space before its type's colon (`%9: i64`), as a block argument is written, and
// defined in the next q_mod, which fails: the input of apec-forward-reference.test.
ape.encoding @forward_reference_colon {
  ape.q_mod attributes {pairing = "half"} {
  ^bb0(%x: f32, %y: f32, %b: index, %h: index, %t: index, %c: index):
    %10 = arith.sitofp %9: i64 to f32
    ape.yield %10, %10 : f32, f32
  }
  ape.q_mod attributes {pairing = "half"} {
  ^bb0(%x: f32, %y: f32, %b: index, %h: index, %t: index, %c: index):
    %9 = arith.index_cast %c : index to i64
  } grad {
