// RUN: ape-opt %s -split-input-file -verify-diagnostics -ape-differentiate | FileCheck %s

// Cable's bias S_i - S_j: ∂/∂s = 1, the query-row load gets g (row sum into
// S_i), the key-column load -g (column sum into S_j).
// CHECK-LABEL: ape.kernel @cable
// CHECK: ape.map %{{.*}} {
// CHECK: } grad {
// The map's derivative: -sigmoid(x)·g, as step(x) - sign(x)·e^-|x|/(1 + e^-|x|).
// CHECK-NEXT: ^bb0(%[[X:.*]]: f32, %[[G:.*]]: f32):
// CHECK-NEXT: %[[MONE:.*]] = arith.constant -1.000000e+00 : f32
// CHECK-NEXT: %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT: %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT: %[[AB:.*]] = math.absf %[[X]] : f32
// CHECK-NEXT: %[[NAB:.*]] = arith.negf %[[AB]] : f32
// CHECK-NEXT: %[[E:.*]] = math.exp %[[NAB]] : f32
// CHECK-NEXT: %[[NN:.*]] = arith.cmpf oge, %[[X]], %[[ZERO]] : f32
// CHECK-NEXT: %[[SGN:.*]] = arith.select %[[NN]], %[[ONE]], %[[MONE]] : f32
// CHECK-NEXT: %[[SZ:.*]] = arith.cmpf oeq, %[[SGN]], %[[ZERO]] : f32
// CHECK-NEXT: %[[SE:.*]] = arith.mulf %[[SGN]], %[[E]] : f32
// CHECK-NEXT: %[[NUM:.*]] = arith.select %[[SZ]], %[[ZERO]], %[[SE]] : f32
// CHECK-NEXT: %[[DEN:.*]] = arith.addf %[[E]], %[[ONE]] : f32
// CHECK-NEXT: %[[Q:.*]] = arith.divf %[[NUM]], %[[DEN]] : f32
// CHECK-NEXT: %[[STEP:.*]] = arith.select %[[NN]], %[[ONE]], %[[ZERO]] : f32
// CHECK-NEXT: %[[SIG:.*]] = arith.subf %[[STEP]], %[[Q]] : f32
// CHECK-NEXT: %[[R:.*]] = arith.mulf %[[G]], %[[SIG]] : f32
// CHECK-NEXT: %[[NR:.*]] = arith.negf %[[R]] : f32
// CHECK-NEXT: ape.yield %[[NR]] : f32
// CHECK: ape.score_mod {
// CHECK: } grad {
// CHECK-NEXT: ^bb0(%{{.*}}: f32, %{{.*}}: index, %{{.*}}: index, %{{.*}}: index, %{{.*}}: index, %[[GS:.*]]: f32):
// CHECK-NEXT: %[[NEG:.*]] = arith.negf %[[GS]] : f32
// CHECK-NEXT: ape.yield %[[GS]], %[[GS]], %[[NEG]] : f32, f32, f32
ape.kernel @cable {
  %f = ape.token_feature "cable"
  %b = ape.map %f {
  ^bb0(%x: f32):
    %zero = arith.constant 0.0 : f32
    %a = math.absf %x : f32
    %n = arith.negf %a : f32
    %e = math.exp %n : f32
    %l = math.log1p %e : f32
    %m = arith.maximumf %x, %zero : f32
    %sp = arith.addf %m, %l : f32
    %r = arith.negf %sp : f32
    ape.yield %r : f32
  }
  %c = ape.scan %b
  ape.score_mod {
  ^bb0(%s: f32, %bb: index, %h: index, %i: index, %j: index):
    %ci = ape.load %c[%bb, %h, %i] : !ape.tokens
    %cj = ape.load %c[%bb, %h, %j] : !ape.tokens
    %d = arith.subf %ci, %cj : f32
    %r = arith.addf %s, %d : f32
    ape.yield %r : f32
  }
}

// -----

// K-Cable: ∂/∂S_i = -2(S_i - S_j)/(1 + (S_i - S_j)²)·g and ∂/∂S_j its negation:
// the two tangents agree up to sign (carried as a flag), so one chain and one
// division serve both.
// CHECK-LABEL: ape.kernel @kcable
// CHECK: } grad {
// CHECK-NEXT: ^bb0(%{{.*}}: f32, %[[B:.*]]: index, %[[H:.*]]: index, %[[I:.*]]: index, %[[J:.*]]: index, %[[GK:.*]]: f32):
// CHECK-NEXT: %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT: %[[SI:.*]] = ape.load %{{.*}}[%[[B]], %[[H]], %[[I]]] : !ape.tokens
// CHECK-NEXT: %[[SJ:.*]] = ape.load %{{.*}}[%[[B]], %[[H]], %[[J]]] : !ape.tokens
// CHECK-NEXT: %[[D:.*]] = arith.subf %[[SI]], %[[SJ]] : f32
// CHECK-NEXT: %[[SQ:.*]] = arith.mulf %[[D]], %[[D]] : f32
// CHECK-NEXT: %[[TWO:.*]] = arith.addf %[[D]], %[[D]] : f32
// CHECK-NEXT: %[[DEN:.*]] = arith.addf %[[SQ]], %[[ONE]] : f32
// CHECK-NEXT: %[[Q:.*]] = arith.divf %[[TWO]], %[[DEN]] : f32
// CHECK-NEXT: %[[GQ:.*]] = arith.mulf %[[GK]], %[[Q]] : f32
// CHECK-NEXT: %[[NGQ:.*]] = arith.negf %[[GQ]] : f32
// CHECK-NEXT: ape.yield %[[GK]], %[[NGQ]], %[[GQ]] : f32, f32, f32
ape.kernel @kcable {
  %f = ape.token_feature "cable"
  %c = ape.scan %f
  ape.score_mod {
  ^bb0(%s: f32, %bb: index, %h: index, %i: index, %j: index):
    %ci = ape.load %c[%bb, %h, %i] : !ape.tokens
    %cj = ape.load %c[%bb, %h, %j] : !ape.tokens
    %d = arith.subf %ci, %cj : f32
    %sq = arith.mulf %d, %d : f32
    %l = math.log1p %sq : f32
    %r = arith.subf %s, %l : f32
    ape.yield %r : f32
  }
}

// -----

// A learned slope per head reduces per head; a table read at a computed
// index (T5-style) scatters.
// CHECK-LABEL: ape.kernel @slopes
// CHECK: ape.score_mod {
// CHECK: } grad {
// CHECK-NEXT: ^bb0(%{{.*}}: f32, %{{.*}}: index, %{{.*}}: index, %[[I:.*]]: index, %[[J:.*]]: index, %[[G:.*]]: f32):
// CHECK: %[[D:.*]] = arith.subi %[[I]], %[[J]] : index
// CHECK-NEXT: %[[DI:.*]] = arith.index_cast %[[D]] : index to i64
// CHECK-NEXT: %[[DF:.*]] = arith.sitofp %[[DI]] : i64 to f32
// CHECK-NEXT: %[[GM:.*]] = arith.mulf %[[G]], %[[DF]] : f32
// CHECK-NEXT: %[[NGM:.*]] = arith.negf %[[GM]] : f32
// CHECK-NEXT: ape.yield %[[G]], %[[NGM]], %[[G]] : f32, f32, f32
ape.kernel @slopes {
  %m = ape.param "m" ["heads"] init = "alibi_slopes" trainable
  %t = ape.param "table" ["32", "heads"] init = "zeros" trainable
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %mh = ape.load %m[%h] : !ape.param
    %d = arith.subi %i, %j : index
    %di = arith.index_cast %d : index to i64
    %df = arith.sitofp %di : i64 to f32
    %p = arith.mulf %mh, %df : f32
    %r = arith.subf %s, %p : f32
    %c31 = arith.constant 31 : index
    %bucket = arith.minui %d, %c31 : index
    %tb = ape.load %t[%bucket, %h] : !ape.param
    %r2 = arith.addf %r, %tb : f32
    ape.yield %r2 : f32
  }
}

// -----

// RoPE's backward is the transpose rotation: ∂x'/∂x = cos, ∂x'/∂y = ∓sin.
// CHECK-LABEL: ape.kernel @rotation
// CHECK: ape.q_mod attributes {pairing = "half"} {
// CHECK: } grad {
// CHECK-NEXT: ^bb0(%{{.*}}: f32, %{{.*}}: f32, %{{.*}}: index, %[[T:.*]]: index, %{{.*}}: index, %[[G:.*]]: f32):
// CHECK: %[[A:.*]] = arith.sitofp %{{.*}} : i64 to f32
// CHECK-DAG: %[[COS:.*]] = math.cos %[[A]] : f32
// CHECK-DAG: %[[SIN:.*]] = math.sin %[[A]] : f32
// CHECK-NEXT: %[[DX:.*]] = arith.mulf %[[G]], %[[COS]] : f32
// CHECK-NEXT: %[[GS:.*]] = arith.mulf %[[G]], %[[SIN]] : f32
// CHECK-NEXT: %[[DY:.*]] = arith.negf %[[GS]] : f32
// CHECK-NEXT: ape.yield %[[DX]], %[[DY]] : f32, f32
ape.kernel @rotation {
  ape.q_mod attributes {pairing = "half"} {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    %ti = arith.index_cast %t : index to i64
    %a = arith.sitofp %ti : i64 to f32
    %cs = math.cos %a : f32
    %sn = math.sin %a : f32
    %xc = arith.mulf %x, %cs : f32
    %ys = arith.mulf %y, %sn : f32
    %r = arith.subf %xc, %ys : f32
    ape.yield %r : f32
  }
}

// -----

// Params inside a q_mod (ExPE's a + t·b) reduce over tokens.
// CHECK-LABEL: ape.kernel @additive
// CHECK: ape.q_mod {
// CHECK: } grad {
// CHECK-NEXT: ^bb0(%{{.*}}: f32, %{{.*}}: f32, %{{.*}}: index, %[[T:.*]]: index, %{{.*}}: index, %[[G:.*]]: f32):
// CHECK: %[[TF:.*]] = arith.sitofp
// CHECK: %[[GT:.*]] = arith.mulf %[[G]], %[[TF]] : f32
// CHECK: ape.yield %[[G]], %{{.*}}, %[[G]], %[[GT]] : f32, f32, f32, f32
ape.kernel @additive {
  %a = ape.param "a" ["heads", "head_dim"] init = "zeros" trainable
  %b = ape.param "b" ["heads", "head_dim"] init = "zeros" trainable
  ape.q_mod {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    %av = ape.load %a[%h, %c] : !ape.param
    %ti = arith.index_cast %t : index to i64
    %tf = arith.sitofp %ti : i64 to f32
    %bv = ape.load %b[%h, %c] : !ape.param
    %tb = arith.mulf %tf, %bv : f32
    %term = arith.addf %av, %tb : f32
    %r = arith.addf %x, %term : f32
    ape.yield %r : f32
  }
}

// -----

ape.kernel @no_rule {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    // expected-error @+1 {{'math.atan' op has no derivative rule}}
    %r = math.atan %s : f32
    ape.yield %r : f32
  }
}

// -----

// The derivative of s / 3 is the double 1/3 (an ape.constant), not the float 0.333333343 that
// folding in the ops' f32 type gave: an fp64 kernel's backward agrees with its forward.
// CHECK-LABEL: ape.kernel @third
// CHECK: } grad {
// CHECK-NEXT: ^bb0(%{{.*}}: f32, %{{.*}}: index, %{{.*}}: index, %{{.*}}: index, %{{.*}}: index, %[[G:.*]]: f32):
// CHECK: %[[T:.*]] = ape.constant 0.33333333333333331
// CHECK: arith.mulf %[[G]], %[[T]] : f32
// CHECK-NOT: 0.333333343
ape.kernel @third {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %c3 = arith.constant 3.0 : f32
    %r = arith.divf %s, %c3 : f32
    ape.yield %r : f32
  }
}

// -----

// A -inf mask, then a learned temperature and a later nonlinear use of the masked logit: where
// the mask holds, g = 0 and the partials are infinite. The products of a tangent and a value an
// infinite constant reaches, and g·∂f/∂u, keep 0·inf = 0 (they were NaN); products of finite
// values stay plain.
// CHECK-LABEL: ape.kernel @masked_temperature
// CHECK: } grad {
// CHECK-NEXT: ^bb0(%{{.*}}: f32, %{{.*}}: index, %{{.*}}: index, %{{.*}}: index, %{{.*}}: index, %[[G:.*]]: f32):
// CHECK-NEXT: %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK: %[[M:.*]] = arith.select %{{.*}}, %{{.*}}, %{{.*}} : f32
// CHECK: %[[R:.*]] = arith.mulf %[[M]], %[[P:.*]] : f32
// CHECK: %[[TS:.*]] = arith.mulf %{{.*}}, %[[P]] : f32
// CHECK-NEXT: %[[TZ:.*]] = arith.cmpf oeq, %[[TS]], %[[ZERO]] : f32
// CHECK-NEXT: %[[TR:.*]] = arith.mulf %[[TS]], %[[R]] : f32
// CHECK-NEXT: arith.select %[[TZ]], %[[ZERO]], %[[TR]] : f32
// CHECK: %[[GD:.*]] = arith.mulf %[[G]], %{{.*}} : f32
// CHECK-NEXT: %[[GZ:.*]] = arith.cmpf oeq, %[[G]], %[[ZERO]] : f32
// CHECK-NEXT: %[[DS:.*]] = arith.select %[[GZ]], %[[ZERO]], %[[GD]] : f32
// CHECK: %[[GP:.*]] = arith.mulf %[[G]], %{{.*}} : f32
// CHECK-NEXT: %[[DP:.*]] = arith.select %[[GZ]], %[[ZERO]], %[[GP]] : f32
// CHECK-NEXT: ape.yield %[[DS]], %[[DP]] : f32, f32
ape.kernel @masked_temperature {
  %w = ape.param "temp" ["heads"] init = "constant" trainable {value = 0.5 : f64}
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %d = arith.subi %i, %j : index
    %c4 = arith.constant 4 : index
    %far = arith.cmpi sgt, %d, %c4 : index
    %ninf = arith.constant 0xFF800000 : f32
    %m = arith.select %far, %ninf, %s : f32
    %p = ape.load %w[%h] : !ape.param
    %r = arith.mulf %m, %p : f32
    %sq = arith.mulf %r, %r : f32
    %one = arith.constant 1.0 : f32
    %u = arith.addf %sq, %one : f32
    %l = math.log %u : f32
    %o = arith.subf %r, %l : f32
    ape.yield %o : f32
  }
}
