// Bad attention transitions: each gets a located diagnostic; a training kernel (one without
// inference_only) refuses the transition.
// RUN: ape-opt %s -split-input-file -verify-diagnostics

ape.encoding @e {
  // expected-error @+1 {{'ape.attention_transition' op divisor_offset must be in [1, 1024], got 0}}
  ape.attention_transition {divisor_offset = 0}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.attention_transition' op first_layer must be in [1, 1024], got 0}}
  ape.attention_transition {first_layer = 0}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.attention_transition' op skip_last must be in [0, 1024], got 2000}}
  ape.attention_transition {skip_last = 2000}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.attention_transition' op intervals must be in [1, 64], got 0}}
  ape.attention_transition {intervals = 0}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.attention_transition' op alpha (bound = alpha / e) must be a positive finite number, got 0}}
  ape.attention_transition {alpha = 0.0 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.attention_transition' op beta (the share of the removed mass given back) must be in [0, 1], got 1.5}}
  ape.attention_transition {beta = 1.5 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.attention_transition' op attribute 'alpha' must be a finite number in}}
  ape.attention_transition {alpha = 1.0e300 : f64}
}

// -----

ape.encoding @e {
  ape.attention_transition
  // expected-error @+1 {{'ape.attention_transition' op an encoding takes at most one attention transition}}
  ape.attention_transition {beta = 0.2 : f64}
}

// -----

ape.encoding @e {
  %t = ape.param "table" ["4", "heads", "head_dim"] init = "zeros"
  // expected-error @+1 {{'ape.attention_transition' op does not combine with ape.value_rows yet}}
  ape.attention_transition
  ape.value_rows %t index {
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    ape.yield %i : index
  }
}

// -----

// A training kernel (no inference_only: it would get a backward) cannot hold the transition.
ape.kernel @k {
  // expected-error @+1 {{'ape.attention_transition' op is inference-only (it has no derivative), so it cannot be part of a training kernel: mark the kernel `inference_only` (-ape-fuse does), which gives it no backward}}
  ape.attention_transition
}

// -----

// An inference-only kernel has no backward: a grad region is refused.
ape.kernel @k attributes {inference_only} {
  ape.attention_transition
  // expected-error @+1 {{'ape.score_mod' op has a grad region in an inference_only kernel: such a kernel has no backward (-ape-differentiate leaves it alone)}}
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    ape.yield %s : f32
  } grad {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index, %g: f32):
    ape.yield %g : f32
  }
}

// -----

module {
  // expected-error @+1 {{'ape.attention_transition' op must be directly inside an ape.encoding or ape.kernel}}
  ape.attention_transition
}

// -----

// inference_only comes with a transition only (without one the kernel entry would instantiate a
// backward the functor lacks).
// expected-error @+1 {{'ape.kernel' op is inference_only but holds no ape.attention_transition (only a transition makes a kernel inference-only)}}
ape.kernel @k attributes {inference_only} {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    ape.yield %s : f32
  }
}
