// Absolute positions and exact constants in the generated C++: the sinusoidal table becomes
// Enc::embed_table (filled in double precision for the runtime), the manifest says where the
// table goes, and a constant f32 cannot hold (1/(1 + γ) of xPos) is written with full precision.
// RUN: rm -rf %t && apec %s -o %t --emit=cpu,manifest
// RUN: FileCheck %s --input-file=%t/xpos_sinusoidal_cpu.cpp
// RUN: FileCheck %s --check-prefix=MANIFEST --input-file=%t/xpos_sinusoidal.manifest.json
// RUN: %cxx -std=c++17 -fsyntax-only -fopenmp -I %ape_templates %t/xpos_sinusoidal_cpu.cpp

// CHECK: static constexpr int kQPairing = 2;
// xPos's decay ζ^(t_c/512) on q and ζ^(-t_c/512) on k, ζ = (k/(d/2) + 0.4)/1.4, t_c = t - T/2:
// CHECK: static T q_mod(
// CHECK-NEXT: const T [[QB:v[0-9]+]] = T(1.95312500000000000e-03);
// CHECK: const T [[ROT:v[0-9]+]] = ({{v[0-9]+}} + {{v[0-9]+}});
// CHECK: const T [[OPG:v[0-9]+]] = T(1.39999999999999991e+00);
// CHECK-NEXT: const T [[G:v[0-9]+]] = T(4.00000000000000022e-01);
// CHECK-NEXT: const T [[KD:v[0-9]+]] = ({{v[0-9]+}} / {{v[0-9]+}});
// CHECK-NEXT: const T [[KG:v[0-9]+]] = ([[KD]] + [[G]]);
// CHECK-NEXT: const T [[ZETA:v[0-9]+]] = ([[KG]] / [[OPG]]);
// CHECK-NEXT: const int64_t [[T:v[0-9]+]] = ctx.T;
// CHECK-NEXT: const int64_t [[HALF:v[0-9]+]] = ::ape::int_math::udiv([[T]], {{v[0-9]+}});
// CHECK-NEXT: const int64_t [[TC:v[0-9]+]] = int64_t(static_cast<uint64_t>(t) - static_cast<uint64_t>([[HALF]]));
// CHECK-NEXT: const int64_t [[TCI:v[0-9]+]] = int64_t([[TC]]);
// CHECK-NEXT: const T [[TCF:v[0-9]+]] = T([[TCI]]);
// CHECK-NEXT: const T [[EXP:v[0-9]+]] = ([[TCF]] * [[QB]]);
// CHECK-NEXT: const T [[DECAY:v[0-9]+]] = std::pow([[ZETA]], [[EXP]]);
// CHECK-NEXT: const T [[OUT:v[0-9]+]] = ([[ROT]] * [[DECAY]]);
// CHECK: static T k_mod(
// CHECK-NEXT: const T [[KB:v[0-9]+]] = T(-1.95312500000000000e-03);
// CHECK: const T {{v[0-9]+}} = ({{v[0-9]+}} * [[KB]]);
// The sinusoidal table: sin at even c, cos at odd c, of n / 10000^((c - c mod 2)/d).
// CHECK: static T embed_value(int64_t n, int64_t c, int64_t d) {
// CHECK: const T [[EB:v[0-9]+]] = T(1.00000000000000000e+04);
// CHECK: std::pow([[EB]],
// CHECK: const bool [[EVEN:v[0-9]+]] = ({{v[0-9]+}} == {{v[0-9]+}});
// CHECK-NEXT: const T [[SIN:v[0-9]+]] = std::sin([[A:v[0-9]+]]);
// CHECK-NEXT: const T [[COS:v[0-9]+]] = std::cos([[A]]);
// CHECK-NEXT: const T [[PE:v[0-9]+]] = ([[EVEN]] ? [[SIN]] : [[COS]]);
// CHECK-NEXT: return [[PE]];
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
