// RUN: ape-opt %s -split-input-file -verify-diagnostics -ape-fuse | FileCheck %s

// Components at several sites fuse into one kernel: the token program keeps
// its order, q_mods compose (tracking each coordinate's partner p), score_mods
// chain.
// CHECK-LABEL: ape.kernel @composed attributes {scale = 5.000000e-01 : f64} {
// CHECK-NOT: ape.encoding
// CHECK: %[[F:.*]] = ape.token_feature "f"
// CHECK: %[[M:.*]] = ape.param "m" ["heads"] init = "ones"
// CHECK: ape.q_mod attributes {pairing = "half"} {
// CHECK: ^bb0(%[[X:.*]]: f32, %[[Y:.*]]: f32, %[[C:.*]]: index, %{{.*}}: index, %{{.*}}: index):
// CHECK: ape.dim "head_dim"
// CHECK: %[[P:.*]] = arith.select %{{.*}}, %{{.*}}, %[[C]] : index
// CHECK-NEXT: %[[R1:.*]] = arith.subf %[[X]], %[[Y]] : f32
// CHECK-NEXT: %[[R1P:.*]] = arith.subf %[[Y]], %[[X]] : f32
// CHECK-NEXT: %[[TWO:.*]] = arith.constant 2.000000e+00 : f32
// CHECK-NEXT: %[[R2:.*]] = arith.mulf %[[R1]], %[[TWO]] : f32
// CHECK: ape.yield %[[R2]] : f32
// CHECK-NOT: ape.q_mod
// CHECK: ape.score_mod {
// CHECK-NEXT: ^bb0(%[[S:.*]]: f32, %[[B:.*]]: index, %[[H:.*]]: index, %[[I:.*]]: index, %{{.*}}: index):
// CHECK-NEXT: %[[V:.*]] = ape.load %[[F]][%[[B]], %[[H]], %[[I]]] : !ape.tokens
// CHECK-NEXT: %[[S1:.*]] = arith.addf %[[S]], %[[V]] : f32
// CHECK-NEXT: %[[W:.*]] = ape.load %[[M]][%[[H]]] : !ape.param
// CHECK-NEXT: %[[S2:.*]] = arith.mulf %[[S1]], %[[W]] : f32
// CHECK-NEXT: ape.yield %[[S2]] : f32
// CHECK-NOT: ape.score_mod
ape.encoding @composed attributes {scale = 0.5 : f64} {
  %f = ape.token_feature "f"
  ape.q_mod attributes {pairing = "half"} {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    %r = arith.subf %x, %y : f32
    ape.yield %r : f32
  }
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %v = ape.load %f[%b, %h, %i] : !ape.tokens
    %r = arith.addf %s, %v : f32
    ape.yield %r : f32
  }
  %m = ape.param "m" ["heads"] init = "ones"
  ape.q_mod {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    %two = arith.constant 2.0 : f32
    %r = arith.mulf %x, %two : f32
    ape.yield %r : f32
  }
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %w = ape.load %m[%h] : !ape.param
    %r = arith.mulf %s, %w : f32
    ape.yield %r : f32
  }
}

// -----

// NoPE fuses into an empty kernel.
// CHECK-LABEL: ape.kernel @nope {
// CHECK-NEXT: }
ape.encoding @nope {
}

// -----

// An unpaired transform before a paired one (an additive term, then a
// rotation): the composite applies the first at c and at the partner p and
// feeds both into the second, g(f(x, c), f(y, p)).
// CHECK-LABEL: ape.kernel @add_then_rotate
// CHECK: ape.q_mod attributes {pairing = "interleaved"} {
// CHECK-NEXT: ^bb0(%[[X:.*]]: f32, %[[Y:.*]]: f32, %[[C:.*]]: index, %{{.*}}: index, %[[H:.*]]: index):
// CHECK: %[[P:.*]] = arith.xori %[[C]], %{{.*}} : index
// CHECK: %[[PP:.*]] = arith.select %{{.*}}, %[[P]], %[[C]] : index
// CHECK-NEXT: %[[AC:.*]] = ape.load %[[A:.*]][%[[H]], %[[C]]] : !ape.param
// CHECK-NEXT: %[[XA:.*]] = arith.addf %[[X]], %[[AC]] : f32
// CHECK-NEXT: %[[AP:.*]] = ape.load %[[A]][%[[H]], %[[PP]]] : !ape.param
// CHECK-NEXT: %[[YA:.*]] = arith.addf %[[Y]], %[[AP]] : f32
// CHECK-NEXT: %[[R:.*]] = arith.subf %[[XA]], %[[YA]] : f32
// CHECK: ape.yield %[[R]] : f32
ape.encoding @add_then_rotate {
  %a = ape.param "a" ["heads", "head_dim"] init = "zeros" trainable
  ape.q_mod {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    %ac = ape.load %a[%h, %c] : !ape.param
    %r = arith.addf %x, %ac : f32
    ape.yield %r : f32
  }
  ape.q_mod attributes {pairing = "interleaved"} {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    %r = arith.subf %x, %y : f32
    ape.yield %r : f32
  }
}

// -----

// Two rotations must pair coordinates the same way.
ape.encoding @mixed_pairing {
  // expected-note @+1 {{the earlier q_mod (an ape.rotary is one: it expands to a q_mod and a k_mod of its pairing)}}
  ape.q_mod attributes {pairing = "half"} {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    ape.yield %y : f32
  }
  // expected-error @+1 {{'ape.q_mod' op pairs coordinates differently from an earlier q_mod (pairing "interleaved", fraction 1 against pairing "half", fraction 1): the transforms of one encoding share one pairing and fraction}}
  ape.q_mod attributes {pairing = "interleaved"} {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    ape.yield %y : f32
  }
}

// -----

ape.encoding @unexpanded {
  // expected-error @+1 {{'ape.alibi' op is a named component: run -ape-expand and -ape-push-override before -ape-fuse}}
  ape.alibi
}
