// The passes refuse IR they do not take, saying which pass to run first, rather than half lowering
// it: an encoding in a nested module, -ape-differentiate before -ape-fuse, -ape-fast-math before
// -ape-expand, a region of a type outside the region language; -ape-schedule's tile sizes and
// -ape-lower's options are checked.
// RUN: ape-opt %s -split-input-file -verify-diagnostics -ape-expand
// RUN: ape-opt %s -split-input-file -verify-diagnostics -ape-lower
// RUN: ape-opt %S/../../../examples/encodings/rope.mlir --ape-lower="tile-q=16 tile-k=128" | FileCheck %s --check-prefix=TILES
// RUN: not ape-opt %S/../../../examples/encodings/rope.mlir --ape-lower=tile-size=8 2>&1 | FileCheck %s --check-prefix=OPTION
// RUN: not ape-opt %S/../../../examples/encodings/rope.mlir --ape-lower --ape-schedule=tile-q=2048 2>&1 | FileCheck %s --check-prefix=BIG
// RUN: not ape-opt %S/../../../examples/encodings/rope.mlir --ape-expand --ape-push-override --ape-differentiate 2>&1 | FileCheck %s --check-prefix=UNFUSED
// RUN: not ape-opt %s --split-input-file --ape-fast-math 2>&1 | FileCheck %s --check-prefix=FAST

// TILES: ape.kernel @rope attributes {{.*}}tile_k = 128 : i64, tile_q = 16 : i64
// OPTION: no such option tile-size
// BIG: error: ape-schedule: tile sizes must be in [1, 1024], got tile-q=2048, tile-k=64
// UNFUSED: error: 'ape.q_mod' op is not in an ape.kernel: run -ape-fuse before -ape-differentiate
// FAST: error: 'ape.cable' op is a named component: run -ape-expand and -ape-push-override before -ape-fast-math

ape.encoding @outer {
  ape.alibi
}
module @m {
  // expected-error @+1 {{'ape.encoding' op is not at the top level of the file (it is inside a nested module)}}
  ape.encoding @inner {
    ape.alibi
  }
}

// -----

// (Lowered in order by the first two runs; the last runs -ape-fast-math on it unexpanded.)
ape.encoding @k attributes {fast_math} {
  ape.cable {kernel = "log1p_sq"}
}

// -----

// A type outside the region language's (f32, i1, i64, index): refused as apec refuses it, before
// any pass lowers it (the emitters would compute this i32 product in int64, without its wrap).
ape.encoding @i32wrap {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %d = arith.subi %i, %j : index
    // expected-error @+1 {{'arith.index_cast' op uses type i32: region bodies compute on f32, i1, i64 and index only}}
    %d32 = arith.index_cast %d : index to i32
    %big = arith.constant 1073741824 : i32
    %m = arith.muli %d32, %big : i32
    %z = arith.constant 0 : i32
    %neg = arith.cmpi slt, %m, %z : i32
    %ninf = arith.constant -1.0e4 : f32
    %r = arith.select %neg, %ninf, %s : f32
    ape.yield %r : f32
  }
}
