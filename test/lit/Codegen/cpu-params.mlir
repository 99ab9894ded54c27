// Params: flattened row-major loads, per-head and scattered gradients,
// non-trainable params receive none, projection terms in the manifest.
// RUN: rm -rf %t && apec %s -o %t --emit=cpu,manifest
// RUN: FileCheck %s --input-file=%t/mixed_cpu.cpp
// RUN: FileCheck %s --check-prefix=MANIFEST --input-file=%t/mixed.manifest.json
// RUN: %cxx -std=c++17 -fsyntax-only -fopenmp -I %ape_templates %t/mixed_cpu.cpp

// CHECK: static constexpr int kNumParams = 6;
// CHECK: static constexpr bool kHasQMod = true;
// CHECK: static constexpr bool kHasKMod = true;
// CHECK: case 0: return H;  // "alibi_slopes"
// CHECK: case 1: return 32 * H;  // "table"
// CHECK: case 2: return H * D;  // "override_q_a"
// CHECK: static void q_mod_grad(
// CHECK: ctx.dparams[2][((ctx.h) * ctx.D + (c))] +=
// CHECK: ctx.dparams[3][((ctx.h) * ctx.D + (c))] +=
// CHECK: static T score_mod(
// CHECK: ctx.params[0][(ctx.h)]
// CHECK: ctx.params[1][(({{v[0-9]+}}) * ctx.H + (ctx.h))]
// CHECK: static T score_mod_grad(
// CHECK-NOT: ctx.dparams[0]
// CHECK: ctx.dparams[1][(({{p[0-9]+}}) * ctx.H + (ctx.h))] += g;

// MANIFEST: "l": 4,
// MANIFEST-NEXT: "targets": "qk"
// MANIFEST: "init": {
// MANIFEST-NEXT: "kind": "alibi_slopes"
// MANIFEST: "trainable": false
// MANIFEST: "name": "table",
// MANIFEST: "trainable": true
// MANIFEST: "columns": 4,
// MANIFEST-NEXT: "kind": "projection_term",
// MANIFEST-NEXT: "projection": "q",
// MANIFEST-NEXT: "start": 0,
// MANIFEST-NEXT: "step": 0.5
ape.encoding @mixed {
  ape.alibi
  %t = ape.param "table" ["32", "heads"] init = "zeros" trainable
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %d = arith.subi %i, %j : index
    %c31 = arith.constant 31 : index
    %bucket = arith.minui %d, %c31 : index
    %tb = ape.load %t[%bucket, %h] : !ape.param
    %r = arith.addf %s, %tb : f32
    ape.yield %r : f32
  }
  ape.override {l = 4, theta = 0.5 : f64}
}
