// Integer division by an index difference that is 0 on the diagonal, for ape-check's own test
// (test/check/ape_check.cmake): the kernels and the reference define x / 0 = 0 and x % 0 = x
// (kernels/include/ape/contract/int_math.h), where C++ would trap (SIGFPE) on every diagonal
// element. Signed, unsigned and floor division, and the remainder, of positive and negative values.
ape.encoding @int_division {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %d = arith.subi %i, %j : index
    %nd = arith.subi %j, %i : index
    %c64 = arith.constant 64 : index
    %c7 = arith.constant 7 : index
    %q = arith.divsi %c64, %d : index
    %r = arith.remsi %i, %d : index
    %u = arith.divui %c7, %d : index
    %f = arith.floordivsi %c7, %nd : index
    %n1 = arith.subi %q, %r : index
    %n2 = arith.addi %n1, %u : index
    %n3 = arith.addi %n2, %f : index
    %n = arith.index_cast %n3 : index to i64
    %x = arith.sitofp %n : i64 to f32
    %k = arith.constant 0.01 : f32
    %t = arith.mulf %x, %k : f32
    %o = arith.addf %s, %t : f32
    ape.yield %o : f32
  }
}
