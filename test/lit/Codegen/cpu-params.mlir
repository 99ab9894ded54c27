// Params: flattened row-major loads, per-head and scattered gradients,
// non-trainable params receive none, projection terms in the manifest.
// RUN: rm -rf %t && apec %s -o %t --emit=cpu,manifest
// RUN: FileCheck %s --input-file=%t/mixed_cpu.cpp
// RUN: FileCheck %s --check-prefix=MANIFEST --input-file=%t/mixed.manifest.json
// RUN: %cxx -std=c++17 -fsyntax-only -fopenmp -I %ape_templates %t/mixed_cpu.cpp

// CHECK: static constexpr int kNumParams = 7;
// CHECK: static constexpr bool kHasQMod = true;
// CHECK: static constexpr bool kHasKMod = true;
// CHECK: case 0: return 1;  // "position_scale"
// CHECK: case 1: return H * D;  // "override_q_a"
// CHECK: case 5: return H;  // "alibi_slopes"
// CHECK: case 6: return 32 * H;  // "table"
// The fixed scalar σ is read at a (clamped) constant index and gets no gradient:
// CHECK: static T q_mod(
// CHECK: ctx.params[0][(std::clamp<int64_t>({{v[0-9]+}}, 0, int64_t(1) - 1))]
// CHECK: static void q_mod_grad(
// CHECK-NOT: ctx.dparams[0]
// CHECK: ctx.dparams[1][((ctx.h) * ctx.D + (c))] += [[TA:g[0-9]+]];
// CHECK-NEXT: ctx.dparams[2][((ctx.h) * ctx.D + (c))] += [[TG:g[0-9]+]];
// A computed index is clamped to its dimension:
// CHECK: static T score_mod(
// CHECK: ctx.params[5][(ctx.h)]
// CHECK: ctx.params[6][((std::clamp<int64_t>([[B:v[0-9]+]], 0, int64_t(32) - 1)) * ctx.H + (ctx.h))]
// CHECK: static T score_mod_grad(
// CHECK-NOT: ctx.dparams[5]
// CHECK: ctx.dparams[6][((std::clamp<int64_t>({{p[0-9]+}}, 0, int64_t(32) - 1)) * ctx.H + (ctx.h))] += g;

// MANIFEST: "kind": "expe",
// MANIFEST-NEXT: "l": 4,
// MANIFEST-NEXT: "position_scale": "position_scale",
// MANIFEST-NEXT: "start": 0,
// MANIFEST-NEXT: "targets": "qk"
// MANIFEST: "kind": "constant",
// MANIFEST-NEXT: "value": 1
// MANIFEST: "name": "position_scale",
// MANIFEST-NEXT: "per_layer": true,
// MANIFEST-NEXT: "range": {
// MANIFEST-NEXT: "integer": false,
// MANIFEST-NEXT: "max": 16777216,
// MANIFEST-NEXT: "min": -16777216
// MANIFEST-NEXT: },
// MANIFEST-NEXT: "shape": [
// MANIFEST-NEXT: 1
// MANIFEST: "trainable": false
// MANIFEST: "columns": 4,
// MANIFEST-NEXT: "kind": "projection_term",
// MANIFEST-NEXT: "projection": "q",
// MANIFEST-NEXT: "start": 0,
// MANIFEST-NEXT: "step": 0.5
// MANIFEST: "kind": "alibi_slopes"
// MANIFEST: "trainable": false
// MANIFEST: "name": "table",
// MANIFEST-NEXT: "per_layer": true,
// MANIFEST-NEXT: "shape": [
// MANIFEST-NEXT: 32,
// MANIFEST-NEXT: "heads"
// MANIFEST: "trainable": true
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
