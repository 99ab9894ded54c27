// Absolute positions and exact constants in the generated C++: the sinusoidal table becomes
// Enc::embed_table (filled in double precision for the runtime), the manifest says where the
// table goes, and a constant f32 cannot hold (1/(1 + γ) of xPos) is written with full precision.
// RUN: rm -rf %t && apec %s -o %t --emit=cpu,manifest
// RUN: FileCheck %s --input-file=%t/xpos_sinusoidal_cpu.cpp
// RUN: FileCheck %s --check-prefix=MANIFEST --input-file=%t/xpos_sinusoidal.manifest.json
// RUN: %cxx -std=c++17 -fsyntax-only -fopenmp -I %ape_templates %t/xpos_sinusoidal_cpu.cpp

// CHECK: static constexpr int kQPairing = 2;
// CHECK: static T q_mod(
// CHECK: = T(1.39999999999999991e+00);
// CHECK: = T(4.00000000000000022e-01);
// CHECK: = ctx.T;
// CHECK: static T embed_value(int64_t n, int64_t c, int64_t d) {
// CHECK: std::sin(
// CHECK: std::cos(
// CHECK: static void embed_table(int64_t rows, int64_t d, double *out) {
// CHECK-NEXT: for (int64_t n = 0; n < rows; ++n)
// CHECK-NEXT: for (int64_t c = 0; c < d; ++c) out[n * d + c] = embed_value<double>(n, c, d);

// MANIFEST: "embedding": {
// MANIFEST-NEXT: "kind": "table",
// MANIFEST-NEXT: "scale_embedding": false
// MANIFEST: "params": [],
ape.encoding @xpos_sinusoidal {
  ape.xpos {gamma = 0.4 : f64, scale_base = 512.0 : f64}
  ape.absolute {kind = "sinusoidal"}
}
