// Linear q/k mods: mod(x, y) = a(t, c) x + b(t, c) y with coefficients that read only positions,
// columns, constants, dims and fixed params at head-free indices get kQModLinear / kKModLinear;
// the CPU template then tabulates a and b once per call (ape/cpu/attention.h, mod_coefs). A mod
// that reads the head, a trainable param, a token sequence, or is not linear in x and y keeps the
// per-element path.
// RUN: rm -rf %t && split-file %s %t
// RUN: apec %t/lin.mlir -o %t/out --emit=cpu
// RUN: FileCheck %s --check-prefix=LIN --input-file=%t/out/lin_cpu.cpp
// RUN: %cxx -std=c++17 -fsyntax-only -fopenmp -I %ape_templates %t/out/lin_cpu.cpp
// RUN: apec %t/head.mlir -o %t/out --emit=cpu
// RUN: FileCheck %s --check-prefix=NOT --input-file=%t/out/head_cpu.cpp
// RUN: apec %t/square.mlir -o %t/out --emit=cpu
// RUN: FileCheck %s --check-prefix=NOT --input-file=%t/out/square_cpu.cpp
// RUN: apec %t/affine.mlir -o %t/out --emit=cpu
// RUN: FileCheck %s --check-prefix=NOT --input-file=%t/out/affine_cpu.cpp
// RUN: apec %t/trained.mlir -o %t/out --emit=cpu
// RUN: FileCheck %s --check-prefix=NOT --input-file=%t/out/trained_cpu.cpp

// A rotation by a fixed param's angle per column and position, a select on the column, and a
// k mod that scales by a power of the position: both linear.
// LIN: static constexpr bool kQModLinear = true;
// LIN: static constexpr bool kKModLinear = true;
//--- lin.mlir
ape.encoding @lin {
  %w = ape.param "w" ["head_dim"] init = "ones"
  ape.q_mod attributes {pairing = "half"} {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    %wc = ape.load %w[%c] : !ape.param
    %ti = arith.index_cast %t : index to i64
    %tf = arith.sitofp %ti : i64 to f32
    %a = arith.mulf %tf, %wc : f32
    %co = math.cos %a : f32
    %si = math.sin %a : f32
    %xc = arith.mulf %x, %co : f32
    %ys = arith.mulf %si, %y : f32
    %ny = arith.negf %ys : f32
    %r = arith.subf %xc, %ny : f32
    %half = arith.constant 4 : index
    %lo = arith.cmpi ult, %c, %half : index
    %s = arith.select %lo, %r, %x : f32
    ape.yield %s : f32
  }
  ape.k_mod {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    %ti = arith.index_cast %t : index to i64
    %tf = arith.sitofp %ti : i64 to f32
    %b = arith.constant 0.99 : f32
    %p = math.powf %b, %tf : f32
    %r = arith.divf %x, %p : f32
    ape.yield %r : f32
  }
}

// NOT-NOT: ModLinear
//--- head.mlir
ape.encoding @head {
  ape.q_mod {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    %hi = arith.index_cast %h : index to i64
    %hf = arith.sitofp %hi : i64 to f32
    %r = arith.mulf %x, %hf : f32
    ape.yield %r : f32
  }
}

//--- square.mlir
ape.encoding @square {
  ape.q_mod {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    %r = arith.mulf %x, %y : f32
    ape.yield %r : f32
  }
}

//--- affine.mlir
ape.encoding @affine {
  ape.k_mod {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    %one = arith.constant 1.0 : f32
    %r = arith.addf %x, %one : f32
    ape.yield %r : f32
  }
}

//--- trained.mlir
ape.encoding @trained {
  %w = ape.param "w" ["head_dim"] init = "ones" trainable
  ape.q_mod {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    %wc = ape.load %w[%c] : !ape.param
    %r = arith.mulf %x, %wc : f32
    ape.yield %r : f32
  }
}
