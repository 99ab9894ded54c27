// The passes refuse IR they do not take, saying which pass to run first, rather than half lowering
// it: an encoding in a nested module, -ape-differentiate before -ape-fuse, -ape-fast-math before
// -ape-expand; -ape-schedule's tile sizes and -ape-lower's options are checked.
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
