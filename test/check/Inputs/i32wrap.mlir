// i32 arithmetic that wraps at odd distances ((i - j) * 2^31 is negative in i32): region bodies
// compute on f32, i1, i64 and index only, so this is refused with its location (it was computed in
// int64, masking every off-diagonal key). For ape-check's own test (test/check/ape_check.cmake).
ape.encoding @i32wrap {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %d = arith.subi %i, %j : index
    %d32 = arith.index_cast %d : index to i32
    %big = arith.constant 1073741824 : i32
    %two = arith.constant 2 : i32
    %m = arith.muli %d32, %big : i32
    %m2 = arith.muli %m, %two : i32
    %z = arith.constant 0 : i32
    %neg = arith.cmpi slt, %m2, %z : i32
    %ninf = arith.constant -1.0e4 : f32
    %r = arith.select %neg, %ninf, %s : f32
    ape.yield %r : f32
  }
}
