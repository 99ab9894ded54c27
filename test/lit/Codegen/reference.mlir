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
// The rotation: θ = 10000^(-2k/r) (value 26 the base, 25 the exponent).
// CHECK: "value": 10000{{$}}
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "op": "math.powf",
// CHECK-NEXT: "operands": [
// CHECK-NEXT: 26,
// CHECK-NEXT: 25{{$}}
// CHECK: "fraction": 0.5,
// CHECK-NEXT: "pairing": "interleaved"
// CHECK: "rel_rows": [],
// CHECK-NEXT: "scale": 0.5,
// The score mod op by op (values numbered from the 5 arguments: s, b, h, i, j = 0..4):
// S_i - S_j, NaN past +inf, -inf beyond the window i - j > 4.
// CHECK-NEXT: "score_mods": [
// CHECK-NEXT: {
// CHECK-NEXT: "args": 5,
// CHECK-NEXT: "ops": [
// CHECK-NEXT: {
// CHECK-NEXT: "op": "ape.load",
// CHECK-NEXT: "operands": [
// CHECK-NEXT: 1,
// CHECK-NEXT: 2,
// CHECK-NEXT: 3{{$}}
// CHECK-NEXT: ],
// CHECK-NEXT: "source": {
// CHECK-NEXT: "kind": "tokens",
// CHECK-NEXT: "slot": 2{{$}}
// CHECK-NEXT: },
// CHECK-NEXT: "type": "f32"
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "op": "ape.load",
// CHECK-NEXT: "operands": [
// CHECK-NEXT: 1,
// CHECK-NEXT: 2,
// CHECK-NEXT: 4{{$}}
// CHECK-NEXT: ],
// CHECK-NEXT: "source": {
// CHECK-NEXT: "kind": "tokens",
// CHECK-NEXT: "slot": 2{{$}}
// CHECK-NEXT: },
// CHECK-NEXT: "type": "f32"
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "op": "arith.subf",
// CHECK-NEXT: "operands": [
// CHECK-NEXT: 5,
// CHECK-NEXT: 6{{$}}
// CHECK-NEXT: ],
// CHECK-NEXT: "type": "f32"
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "op": "arith.constant",
// CHECK-NEXT: "operands": [],
// CHECK-NEXT: "type": "f32",
// CHECK-NEXT: "value": "-inf"
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "op": "arith.constant",
// CHECK-NEXT: "operands": [],
// CHECK-NEXT: "type": "f32",
// CHECK-NEXT: "value": "inf"
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "op": "arith.constant",
// CHECK-NEXT: "operands": [],
// CHECK-NEXT: "type": "f32",
// CHECK-NEXT: "value": "nan"
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "op": "arith.cmpf",
// CHECK-NEXT: "operands": [
// CHECK-NEXT: 7,
// CHECK-NEXT: 9{{$}}
// CHECK-NEXT: ],
// CHECK-NEXT: "predicate": "ogt",
// CHECK-NEXT: "type": "i1"
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "op": "arith.select",
// CHECK-NEXT: "operands": [
// CHECK-NEXT: 11,
// CHECK-NEXT: 10,
// CHECK-NEXT: 7{{$}}
// CHECK-NEXT: ],
// CHECK-NEXT: "type": "f32"
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "op": "arith.constant",
// CHECK-NEXT: "operands": [],
// CHECK-NEXT: "type": "index",
// CHECK-NEXT: "value": 4{{$}}
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "op": "arith.subi",
// CHECK-NEXT: "operands": [
// CHECK-NEXT: 3,
// CHECK-NEXT: 4{{$}}
// CHECK-NEXT: ],
// CHECK-NEXT: "type": "index"
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "op": "arith.cmpi",
// CHECK-NEXT: "operands": [
// CHECK-NEXT: 14,
// CHECK-NEXT: 13{{$}}
// CHECK-NEXT: ],
// CHECK-NEXT: "predicate": "sgt",
// CHECK-NEXT: "type": "i1"
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "op": "arith.addf",
// CHECK-NEXT: "operands": [
// CHECK-NEXT: 0,
// CHECK-NEXT: 12{{$}}
// CHECK-NEXT: ],
// CHECK-NEXT: "type": "f32"
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "op": "arith.select",
// CHECK-NEXT: "operands": [
// CHECK-NEXT: 15,
// CHECK-NEXT: 8,
// CHECK-NEXT: 16{{$}}
// CHECK-NEXT: ],
// CHECK-NEXT: "type": "f32"
// CHECK-NEXT: }
// CHECK-NEXT: ],
// CHECK-NEXT: "yield": [
// CHECK-NEXT: 17{{$}}
// CHECK-NEXT: ]
// CHECK-NEXT: }
// CHECK-NEXT: ],
// The token program: the feature, exp, the scan.
// CHECK: "tokens": [
// CHECK-NEXT: {
// CHECK-NEXT: "feature": 0,
// CHECK-NEXT: "op": "feature"
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "body": {
// CHECK-NEXT: "args": 1,
// CHECK-NEXT: "ops": [
// CHECK-NEXT: {
// CHECK-NEXT: "op": "math.exp",
// CHECK-NEXT: "operands": [
// CHECK-NEXT: 0{{$}}
// CHECK-NEXT: ],
// CHECK-NEXT: "type": "f32"
// CHECK-NEXT: }
// CHECK-NEXT: ],
// CHECK-NEXT: "yield": [
// CHECK-NEXT: 1{{$}}
// CHECK-NEXT: ]
// CHECK-NEXT: },
// CHECK-NEXT: "input": 0,
// CHECK-NEXT: "op": "map"
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "input": 1,
// CHECK-NEXT: "op": "scan"
// CHECK-NEXT: }
// CHECK-NEXT: ],
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
