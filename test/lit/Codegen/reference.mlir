// apec --emit=reference: the encoding after expand and push-override, before fuse, as JSON data
// (codegen/ReferenceEmitter.cpp): params in spec order (the override's first), q_mods unfused in
// order (the override's additive term unpaired, then the rotation with its own pairing and
// fraction), the token program, and non-finite constants spelled "-inf", "inf", "nan".
// RUN: rm -rf %t && apec %s -o %t --emit=reference
// RUN: FileCheck %s --input-file=%t/mix.reference.json
// RUN: not ls %t/mix_cpu.cpp

// CHECK: "encoding": "mix",
// CHECK-NEXT: "features": [
// CHECK-NEXT: {
// CHECK-NEXT: "name": "gate"
// CHECK: "format": "ape-reference/1",
// CHECK-NEXT: "k_mods": [
// CHECK: "pairing": "none"
// CHECK: "pairing": "interleaved"
// CHECK: "params": [
// CHECK: "name": "position_scale",
// CHECK: "name": "override_q_a",
// CHECK-NEXT: "shape": [
// CHECK-NEXT: "heads",
// CHECK-NEXT: "head_dim"
// CHECK-NEXT: ],
// CHECK-NEXT: "trainable": true
// CHECK: "name": "override_q_b",
// CHECK: "name": "override_k_a",
// CHECK: "name": "override_k_b",
// CHECK: "q_mods": [
// CHECK: "pairing": "none"
// CHECK: "fraction": 0.5,
// CHECK-NEXT: "pairing": "interleaved"
// CHECK: "rel_rows": [],
// CHECK-NEXT: "scale": 0.5,
// CHECK-NEXT: "score_mods": [
// CHECK: "op": "ape.load",
// CHECK: "source": {
// CHECK-NEXT: "kind": "tokens",
// CHECK-NEXT: "slot": 2
// CHECK: "value": "-inf"
// CHECK: "value": "inf"
// CHECK: "value": "nan"
// CHECK: "predicate": "ogt",
// CHECK: "predicate": "sgt",
// CHECK: "tokens": [
// CHECK: "op": "feature"
// CHECK: "body": {
// CHECK: "op": "math.exp",
// CHECK: "input": 0,
// CHECK-NEXT: "op": "map"
// CHECK: "input": 1,
// CHECK-NEXT: "op": "scan"
// CHECK: "value_rows": null

ape.encoding @mix attributes {scale = 0.5 : f64} {
  ape.override {l = 4, start = 0.0 : f64, theta = 0.5 : f64, targets = "qk"}
  ape.rotary {base = 10000.0 : f64, fraction = 0.5 : f64, pairing = "interleaved"}
  %g = ape.token_feature "gate" {weight_std = 0.02 : f64, bias = 0.0 : f64}
  %l = ape.map %g {
  ^bb0(%x: f32):
    %y = math.exp %x : f32
    ape.yield %y : f32
  }
  %c = ape.scan %l
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %ci = ape.load %c[%b, %h, %i] : !ape.tokens
    %cj = ape.load %c[%b, %h, %j] : !ape.tokens
    %d = arith.subf %ci, %cj : f32
    %ninf = arith.constant 0xFF800000 : f32
    %pinf = arith.constant 0x7F800000 : f32
    %nan = arith.constant 0x7FC00000 : f32
    %far = arith.cmpf ogt, %d, %pinf : f32
    %m = arith.select %far, %nan, %d : f32
    %i4 = arith.constant 4 : index
    %ij = arith.subi %i, %j : index
    %out = arith.cmpi sgt, %ij, %i4 : index
    %r0 = arith.addf %s, %m : f32
    %r = arith.select %out, %ninf, %r0 : f32
    ape.yield %r : f32
  }
}
