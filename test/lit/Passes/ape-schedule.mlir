// RUN: ape-opt %s -ape-schedule | FileCheck %s --check-prefix=DEFAULT
// RUN: ape-opt %s -ape-schedule="tile-q=32 tile-k=128" | FileCheck %s --check-prefix=TILES

// One pass over K/V (online softmax) and the tile sizes of the CPU kernel.
// DEFAULT: ape.kernel @k attributes {passes = 1 : i64, scale = 1.000000e+00 : f64, tile_k = 64 : i64, tile_q = 64 : i64}
// TILES: ape.kernel @k attributes {passes = 1 : i64, scale = 1.000000e+00 : f64, tile_k = 128 : i64, tile_q = 32 : i64}
ape.kernel @k attributes {scale = 1.0 : f64} {
}
