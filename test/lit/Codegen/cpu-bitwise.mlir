// arith.andi / ori / xori: logical on i1 (combined masks), bitwise on index (the partner index
// c ^ 1 that -ape-fuse writes for an unpaired mod fused with interleaved pairs); the output compiles.
// RUN: rm -rf %t && apec %s -o %t --emit=cpu
// RUN: FileCheck %s --input-file=%t/masks_cpu.cpp
// RUN: %cxx -std=c++17 -fsyntax-only -fopenmp -I %ape_templates %t/masks_cpu.cpp

// CHECK: static T q_mod(
// CHECK: int64_t(static_cast<uint64_t>(c) ^ static_cast<uint64_t>({{v[0-9]+}}))
// CHECK: static T score_mod(
// CHECK: bool(({{v[0-9]+}} | {{v[0-9]+}}))
// CHECK: bool(({{v[0-9]+}} & {{v[0-9]+}}))
// CHECK: -std::numeric_limits<T>::infinity()
ape.encoding @masks {
  ape.override {l = 4, targets = "qk"}
  ape.rotary {fraction = 0.5 : f64, pairing = "interleaved"}
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %c3 = arith.constant 3 : index
    %c4 = arith.constant 4 : index
    %ij = arith.subi %i, %j : index
    %far = arith.cmpi sgt, %ij, %c4 : index
    %early = arith.cmpi ult, %i, %c3 : index
    %either = arith.ori %far, %early : i1
    %odd = arith.cmpi ne, %j, %c3 : index
    %masked = arith.andi %either, %odd : i1
    %ninf = arith.constant 0xFF800000 : f32
    %r = arith.select %masked, %ninf, %s : f32
    ape.yield %r : f32
  }
}
