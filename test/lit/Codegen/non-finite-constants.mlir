// Non-finite region constants (-inf to mask a key, +inf, NaN) are spelled with
// std::numeric_limits<T> in every backend (CPU, CUDA, C ABI), and each output compiles. The CUDA
// header includes <limits> for them (the CPU template includes it already); a kernel without such
// constants is unchanged (cuda-rope.mlir).
// -inf and +inf are given both as hex f32 (0xFF800000, 0x7F800000) and in f64 decimal notation,
// NaN as hex (0x7FC00000).
// RUN: rm -rf %t && apec %s -o %t --emit=cpu,cuda,c-abi --cuda-dtypes=f32 --cuda-head-dims=64
// RUN: FileCheck %s --input-file=%t/window_cpu.cpp
// RUN: FileCheck %s --check-prefixes=CUDA,CHECK --input-file=%t/window_cuda.cuh
// RUN: FileCheck %s --input-file=%t/window_c_abi/window_cpu.cpp
// RUN: FileCheck %s --check-prefix=NOLITERAL --input-file=%t/window_cpu.cpp
// RUN: FileCheck %s --check-prefix=NOLITERAL --input-file=%t/window_cuda.cuh
// RUN: %cxx -std=c++17 -Wall -fsyntax-only -fopenmp -I %ape_templates %t/window_cpu.cpp
// RUN: %cxx -std=c++17 -Wall -fsyntax-only -fopenmp -I %t/window_c_abi %t/window_c_abi/ape_window_c.cpp
// RUN: %cxx -std=c++17 -fsyntax-only -x c++ -DAPE_SIMT -I %ape_templates -I %t %t/window_cuda_f32_hd64.cu

// CUDA: #include <limits>
// CHECK-DAG: const T [[NINF:v[0-9]+]] = (-std::numeric_limits<T>::infinity());
// CHECK-DAG: const T [[PINF:v[0-9]+]] = std::numeric_limits<T>::infinity();
// CHECK-DAG: const T [[NAN:v[0-9]+]] = std::numeric_limits<T>::quiet_NaN();
// CHECK: ? [[NINF]] : s);
// CHECK: ? [[PINF]] :
// CHECK: ? [[NAN]] :

// What the old printer wrote (T(-INF), T(INF), T(NAN)) must not appear:
// NOLITERAL-NOT: INF)
// NOLITERAL-NOT: NAN)

// Keys more than 3 positions back are masked (-inf); the two other constants sit in branches
// the canonicaliser cannot fold (a key j = i + 1 never occurs under causality; j < 0 never
// occurs), so they reach the output.
ape.encoding @window {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %ninf = arith.constant 0xFF800000 : f32
    %pinf = arith.constant 0x7F800000 : f32
    %nan = arith.constant 0x7FC00000 : f32
    %w = arith.constant 3 : index
    %one = arith.constant 1 : index
    %zero = arith.constant 0 : index
    %d = arith.subi %i, %j : index
    %far = arith.cmpi sgt, %d, %w : index
    %ip1 = arith.addi %i, %one : index
    %next = arith.cmpi eq, %j, %ip1 : index
    %neg = arith.cmpi slt, %j, %zero : index
    %a = arith.select %far, %ninf, %s : f32
    %b1 = arith.select %next, %pinf, %a : f32
    %r = arith.select %neg, %nan, %b1 : f32
    ape.yield %r : f32
  }
}
