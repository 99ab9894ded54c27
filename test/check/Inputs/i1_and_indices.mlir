// A spec outside examples/ for ape-check's own test (test/check/ape_check.cmake): i1 as MLIR reads
// it (a mask sign-extended is -1, zero-extended 1; addi on i1 is xor; trunci keeps the low bit) and a
// param read at the key index j on a dimension of 16 (clamped: keys past 15 read entry 15), in the
// kernel compiled now and in the reference alike (test/lit/Codegen/cpu-i1-and-indices.mlir: the code).
ape.encoding @i1_and_indices {
  %p = ape.param "pos_bias" ["16"] init = "normal" trainable {std = 0.5 : f64}
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %w = ape.load %p[%j] : !ape.param
    %c3 = arith.constant 3 : index
    %m = arith.cmpi ult, %j, %c3 : index
    %f = arith.sitofp %m : i1 to f32
    %e = arith.extsi %m : i1 to i64
    %ef = arith.sitofp %e : i64 to f32
    %u = arith.extui %m : i1 to i64
    %sum = arith.addi %m, %m : i1
    %ji = arith.index_cast %j : index to i64
    %low = arith.trunci %ji : i64 to i1
    %both = arith.andi %sum, %low : i1
    %uf = arith.sitofp %u : i64 to f32
    %zero = arith.constant 0.0 : f32
    %t0 = arith.select %both, %zero, %s : f32
    %t1 = arith.addf %t0, %w : f32
    %t2 = arith.addf %t1, %f : f32
    %t3 = arith.addf %t2, %ef : f32
    %t4 = arith.addf %t3, %uf : f32
    ape.yield %t4 : f32
  }
}
