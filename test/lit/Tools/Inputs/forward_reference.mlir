// %9 is read in the first q_mod and defined in the second, which then fails to parse (the input
// of test/lit/Tools/apec-forward-reference.test).
ape.encoding @forward_reference {
  ape.q_mod attributes {pairing = "half"} {
  ^bb0(%x: f32, %y: f32, %b: index, %h: index, %t: index, %c: index):
    %10 = arith.sitofp %9 : i64 to f32
    ape.yield %10, %10 : f32, f32
  }
  ape.q_mod attributes {pairing = "half"} {
    %9 = arith.index_cast %4 : index to i64
  } grad {
