// Malformed or inconsistent specs: each gets a located diagnostic.
// RUN: ape-opt %s -split-input-file -verify-diagnostics

ape.encoding @e {
  // expected-error @+1 {{'ape.rotary' op base must be a finite number greater than 1, got 0}}
  ape.rotary {base = 0.0 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.rotary' op fraction must be in (0, 1], got 1.5}}
  ape.rotary {fraction = 1.5 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{custom op 'ape.rotary' attribute 'pairing' failed to satisfy constraint: "half" or "interleaved"}}
  ape.rotary {pairing = "diagonal"}
}

// -----

ape.encoding @e {
  ape.rotary
  // expected-error @+1 {{'ape.rotary' op an encoding takes at most one rotation (ape.rotary or ape.xpos)}}
  ape.rotary {pairing = "interleaved"}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{custom op 'ape.cable' attribute 'kernel' failed to satisfy constraint: "none" or "log1p_sq"}}
  ape.cable {kernel = "gauss"}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.cable' op kappa must be a positive number in [5.42101086e-20, 3.40282347e+38]; got -1 (it becomes the encoding's scale)}}
  ape.cable {kappa = -1.0 : f64}
}

// -----

ape.encoding @e attributes {scale = 0.125 : f64} {
  // expected-error @+1 {{'ape.cable' op kappa 1.000000e+00 conflicts with the logit scale 1.250000e-01 set elsewhere in the encoding}}
  ape.cable {kappa = 1.0 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.override' op l (the number of overwritten inputs) must be in [1, 65536], got 0}}
  ape.override {l = 0}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.override' op theta must be a non-zero finite number, got 0}}
  ape.override {l = 8, theta = 0.0 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{custom op 'ape.override' attribute 'targets' failed to satisfy constraint: "qk" or "qkv"}}
  ape.override {l = 8, targets = "v"}
}

// -----

ape.encoding @e {
  ape.override {l = 8}
  // expected-error @+1 {{'ape.override' op an encoding takes at most one override of the projection input}}
  ape.override {l = 4}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.override' op requires attribute 'l'}}
  ape.override
}

// -----

// expected-error @+1 {{'ape.rotary' op expects parent op 'ape.encoding'}}
ape.rotary

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.param' op dimension "seq" is not "heads", "head_dim" or a positive integer}}
  %p = ape.param "w" ["seq"] init = "zeros"
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.param' op attribute 'init' failed to satisfy constraint: "zeros", "ones", "normal", "constant", "alibi_slopes", "sinusoidal", "projection_term" or "projection_prefix"}}
  %p = ape.param "w" ["heads"] init = "uniform"
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.param' op init "normal" needs a `std` attribute (f64)}}
  %p = ape.param "w" ["heads"] init = "normal" trainable
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.param' op init "alibi_slopes" needs shape ["heads"]}}
  %p = ape.param "m" ["head_dim"] init = "alibi_slopes"
}

// -----

ape.encoding @e {
  %p = ape.param "w" ["heads"] init = "zeros"
  // expected-error @+1 {{'ape.param' op duplicate param name "w"}}
  %q = ape.param "w" ["heads"] init = "ones"
}

// -----

ape.encoding @e {
  %p = ape.param "w" ["heads"] init = "zeros"
  // expected-error @+1 {{'ape.score_mod' op body region must take (s: f32, b: index, h: index, i: index, j: index), got (2 argument(s): f32, index)}}
  ape.score_mod {
  ^bb0(%s: f32, %i: index):
    ape.yield %s : f32
  }
}

// -----

ape.encoding @e {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    // expected-error @+1 {{'ape.yield' op must yield 1 value(s) of type f32 in a score_mod body region, got 2}}
    ape.yield %s, %s : f32, f32
  }
}

// -----

ape.encoding @e {
  %p = ape.param "w" ["heads", "head_dim"] init = "zeros"
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    // expected-error @+1 {{'ape.load' op of param "w" takes 2 index(es), one per dimension, got 1}}
    %w = ape.load %p[%h] : !ape.param
    %r = arith.addf %s, %w : f32
    ape.yield %r : f32
  }
}

// -----

ape.encoding @e {
  %f = ape.token_feature "f"
  %c = ape.scan %f
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    // expected-error @+1 {{'ape.load' op of a token sequence takes 3 indices [batch, head, token], got 2}}
    %v = ape.load %c[%h, %i] : !ape.tokens
    %r = arith.addf %s, %v : f32
    ape.yield %r : f32
  }
}

// -----

ape.encoding @e {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    // expected-error @+1 {{'ape.dim' op attribute 'which' failed to satisfy constraint: "heads", "head_dim" or "seq_len"}}
    %d = ape.dim "width"
    ape.yield %s : f32
  }
}

// -----

ape.encoding @e {
  ape.q_mod attributes {pairing = "half", fraction = 0.0 : f64} {
  // expected-error @-1 {{'ape.q_mod' op fraction must be in (0, 1], got 0}}
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    ape.yield %x : f32
  }
}

// -----

ape.encoding @e {
  %f = ape.token_feature "f"
  // expected-error @+1 {{'ape.map' op body region must take (f32), got (2 argument(s): f32, f32)}}
  %m = ape.map %f {
  ^bb0(%x: f32, %y: f32):
    ape.yield %x : f32
  }
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'arith.constant' op is not an ape op; arith/math ops belong inside regions}}
  %c = arith.constant 1.0 : f32
}

// -----

ape.kernel @k {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    ape.yield %s : f32
  }
  // expected-error @+1 {{'ape.score_mod' op a kernel holds at most one score_mod (fuse composes them)}}
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    ape.yield %s : f32
  }
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.token_feature' op weight_std must be a non-negative finite number, got -1.000000e-01}}
  %f = ape.token_feature "f" {weight_std = -0.1 : f64}
}

// -----

ape.encoding @e {
  %f = ape.token_feature "f"
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %c0 = arith.constant 0 : index
    // expected-error @+1 {{'ape.load' op of a token sequence must read [%b, %h, %i] or [%b, %h, %j] with the arguments of the enclosing ape.score_mod}}
    %v = ape.load %f[%b, %c0, %i] : !ape.tokens
    %r = arith.addf %s, %v : f32
    ape.yield %r : f32
  }
}

// -----

ape.encoding @e {
  %f = ape.token_feature "f"
  ape.q_mod {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    // expected-error @+1 {{'ape.load' op of a token sequence is only allowed in an ape.score_mod (as [%b, %h, %i] or [%b, %h, %j]), not in ape.q_mod}}
    %v = ape.load %f[%c, %h, %t] : !ape.tokens
    %r = arith.addf %x, %v : f32
    ape.yield %r : f32
  }
}

// -----

ape.encoding @e {
  %f = ape.token_feature "f"
  %p = ape.param "w" ["heads"] init = "zeros"
  %m = ape.map %f {
  ^bb0(%x: f32):
    %c0 = arith.constant 0 : index
    // expected-error @+1 {{'ape.load' op of a param is not allowed inside ape.map}}
    %w = ape.load %p[%c0] : !ape.param
    %r = arith.addf %x, %w : f32
    ape.yield %r : f32
  }
}

// -----

// expected-error @+1 {{'ape.encoding' op name @"my-encoding" must be an identifier: a letter or '_' then letters, digits or '_'}}
ape.encoding @"my-encoding" {
}

// -----

// A quote in the name is shown escaped, as it was written (it ended the quoted name early).
// expected-error @+1 {{'ape.encoding' op name @"a\22b" must be an identifier}}
ape.encoding @"a\"b" {
}

// -----

// A name a C or C++ compiler predefines as a macro (GNU mode: linux = 1) would be expanded in the
// emitted entry points.
// expected-error @+1 {{'ape.encoding' op name @linux is a name C or C++ compilers define as a macro or reserve; choose another}}
ape.encoding @linux {
}

// -----

// expected-error @+1 {{'ape.encoding' op name @rope_level ends in "_level", which names the CPU kernels' level entry points; choose another}}
ape.encoding @rope_level {
}

// -----

// A param's name reaches C++ strings and comments, Python and the manifest: plain characters only.
ape.encoding @e {
  // expected-error @+1 {{'ape.param' op name ")APE_MANIFEST" must be a letter or '_', then letters, digits, '_', '-' or '.' (at most 64 characters)}}
  %p = ape.param ")APE_MANIFEST" ["heads"] init = "zeros"
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.token_feature' op name "g\0A#error" must be a letter or '_'}}
  %g = ape.token_feature "g\0A#error"
}

// -----

// An odd number of rotated coordinates: fraction·head_dim must pair up.
ape.encoding @e attributes {head_dim = 6 : i64} {
  // expected-error @+1 {{'ape.rotary' op fraction 0.5 of head_dim 6 gives 3 rotated coordinates; the count must be an even whole number (pairs)}}
  ape.rotary {fraction = 0.5 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.rotary' op fraction must be in (0, 1], got 0}}
  ape.rotary {fraction = 0.0 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.rotary' op scaling "yarn" needs `original_length` (the training length L)}}
  ape.rotary {scaling = "yarn", factor = 4.0 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.rotary' op scaling "linear" needs a `factor` (f64)}}
  ape.rotary {scaling = "linear"}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.rotary' op factor and original_length need a scaling}}
  ape.rotary {factor = 2.0 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{custom op 'ape.rotary' attribute 'scaling' failed to satisfy constraint: "none", "linear", "ntk", "dynamic_ntk", "yarn" or "llama3"}}
  ape.rotary {scaling = "longrope", factor = 2.0 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.rotary' op factor must be a positive number in [5.96046448e-08, 16777216]; got -2}}
  ape.rotary {scaling = "ntk", factor = -2.0 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.rotary' op beta_fast must exceed beta_slow and both be positive, got 1 and 32}}
  ape.rotary {scaling = "yarn", factor = 4.0 : f64, original_length = 2048, beta_fast = 1.0 : f64, beta_slow = 32.0 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.rotary' op high_freq_factor must exceed low_freq_factor and both be positive, got 1 and 4}}
  ape.rotary {scaling = "llama3", factor = 8.0 : f64, original_length = 8192, low_freq_factor = 4.0 : f64, high_freq_factor = 1.0 : f64}
}

// -----

ape.encoding @e {
  ape.rotary
  // expected-error @+1 {{'ape.xpos' op an encoding takes at most one rotation (ape.rotary or ape.xpos)}}
  ape.xpos
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.xpos' op gamma must be a positive finite number, got 0}}
  ape.xpos {gamma = 0.0 : f64}
}

// -----

// The override may not overwrite the whole projection input.
ape.encoding @e attributes {model_dim = 64 : i64} {
  // expected-error @+1 {{'ape.override' op l = 64 overwrites the whole input: it must be less than the encoding's model_dim 64}}
  ape.override {l = 64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{custom op 'ape.override' attribute 'kind' failed to satisfy constraint: "expe" or "exqpe"}}
  ape.override {kind = "rope", l = 8}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.override' op theta1 must be finite and theta2 a non-zero finite number, got 0.25 and 0}}
  ape.override {kind = "exqpe", l = 8, theta1 = 0.25 : f64, theta2 = 0.0 : f64}
}

// -----

// expected-error @+1 {{'ape.encoding' op model_dim 100 is not a multiple of head_dim 64}}
ape.encoding @e attributes {head_dim = 64 : i64, model_dim = 100 : i64} {
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.absolute' op kind "learned" needs `max_length` (the rows of the table)}}
  ape.absolute {kind = "learned"}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.absolute' op max_length applies to kind "learned" only}}
  ape.absolute {kind = "sinusoidal", max_length = 512}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{custom op 'ape.absolute' attribute 'kind' failed to satisfy constraint: "sinusoidal" or "learned"}}
  ape.absolute {kind = "alibi"}
}

// -----

ape.encoding @e {
  ape.absolute {kind = "sinusoidal"}
  // expected-error @+1 {{'ape.absolute' op an encoding takes at most one absolute position embedding}}
  ape.absolute {kind = "learned", max_length = 8}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.position_embedding' op needs `learned` or a table region}}
  ape.position_embedding
}

// -----

ape.encoding @e {
  %p = ape.param "w" ["heads"] init = "zeros"
  ape.position_embedding table {
  ^bb0(%n: index, %c: index, %d: index):
    // expected-error @+1 {{'ape.load' op is only allowed inside a q_mod, k_mod or score_mod region, or in a map (of token sequences)}}
    %w = ape.load %p[%c] : !ape.param
    ape.yield %w : f32
  }
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.param' op init "projection_prefix" needs shape ["8", "heads", "head_dim"]}}
  %p = ape.param "pre" ["heads", "head_dim"] init = "projection_prefix" trainable {projection = "q", columns = 8 : i64, scale = 1.0 : f64}
}

// -----

// A projection_term param is one column of the layer's projection per head: the shape the runtime
// reads (runtime/Manifest.cpp), refused here where apec had accepted it.
ape.encoding @e {
  // expected-error @+1 {{'ape.param' op init "projection_term" needs shape ["heads", "head_dim"]}}
  %p = ape.param "p" ["4"] init = "projection_term" {projection = "q", columns = 4 : i64, start = 0.0 : f64, step = 1.0 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.param' op init "projection_term" needs a `columns` attribute in [1, 65536], got 9223372036854775807}}
  %p = ape.param "p" ["heads", "head_dim"] init = "projection_term" {projection = "q", columns = 9223372036854775807 : i64, start = 0.0 : f64, step = 1.0 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.constant' op is only allowed inside a map, q_mod, k_mod or score_mod region}}
  %c = ape.constant 0.1
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.t5_bias' op buckets must be even and in [2, 65536], got 31}}
  ape.t5_bias {buckets = 31}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.t5_bias' op max_distance 16 must exceed buckets/2 = 16 (the exact buckets)}}
  ape.t5_bias {buckets = 32, max_distance = 16}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{custom op 'ape.kerple' attribute 'kind' failed to satisfy constraint: "log" or "power"}}
  ape.kerple {kind = "cosine"}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.kerple' op p_init of the power kernel must be at most 2, got 3}}
  ape.kerple {kind = "power", p_init = 3.0 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.kerple' op p_init and a_init must be finite and at least 0.01, got 1 and 0}}
  ape.kerple {kind = "log", a_init = 0.0 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.fire' op hidden must be in [1, 256], got 0}}
  ape.fire {hidden = 0}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.fire' op c must be a positive finite number, got -0.1}}
  ape.fire {c = -0.1 : f64}
}

// -----

ape.encoding @e {
  %t = ape.param "rel" ["heads", "head_dim"] init = "zeros" trainable
  // expected-error @+1 {{'ape.rel_rows' op table must be an ape.param of shape [rows, "heads", "head_dim"] with an integer number of rows}}
  %r = ape.rel_rows "q" %t
}

// -----

ape.encoding @e {
  %t = ape.param "rel" ["4", "heads", "head_dim"] init = "zeros" trainable
  // expected-error @+1 {{'ape.rel_rows' op attribute 'side' failed to satisfy constraint: "q" or "k"}}
  %r = ape.rel_rows "v" %t
}

// -----

ape.encoding @e {
  %t = ape.param "rel" ["4", "heads", "head_dim"] init = "zeros" trainable
  %r = ape.rel_rows "k" %t
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %c0 = arith.constant 0 : index
    // expected-error @+1 {{'ape.load' op of key rows must read [%b, %h, %j, %r] with the arguments of the enclosing ape.score_mod}}
    %x = ape.load %r[%b, %h, %i, %c0] : !ape.rows
    %o = arith.addf %s, %x : f32
    ape.yield %o : f32
  }
}

// -----

ape.encoding @e {
  %t = ape.param "av" ["4", "heads", "head_dim"] init = "zeros" trainable
  // expected-error @+1 {{'ape.value_rows' op index region must yield one index (the row)}}
  ape.value_rows %t index {
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %f = arith.constant 1.0 : f32
    ape.yield %f : f32
  }
}

// -----

// An empty region block (the fuzzer's find: the verifier read a terminator that was not there).
ape.encoding @e {
  // expected-error @+1 {{'ape.position_embedding' op table region must end with ape.yield}}
  ape.position_embedding table {
  ^bb0(%n: index, %c: index, %d: index):
  }
}

// -----

ape.encoding @e {
  %t = ape.param "av" ["4", "heads", "head_dim"] init = "zeros" trainable
  // expected-error @+1 {{'ape.value_rows' op index region must yield one index (the row)}}
  ape.value_rows %t index {
  ^bb0(%b: index, %h: index, %i: index, %j: index):
  }
}

// -----

ape.encoding @e {
  %f = ape.token_feature "f"
  // expected-error @+1 {{empty block: expect at least a terminator}}
  %m = ape.map %f {
  ^bb0(%x: f32):
  }
}

// -----

// A component missing a required attribute: its own verifier reports it before the encoding's
// checks across components read it (the fuzzer's find: they read the absent `l`).
ape.encoding @e attributes {model_dim = 256 : i64} {
  // expected-error @+1 {{'ape.override' op requires attribute 'l'}}
  ape.override {kind = "exqpe", targets = "qkv", theta2 = 0.125 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.param' op requires attribute 'name'}}
  %p = "ape.param"() {shape = ["heads"], init = "zeros"} : () -> !ape.param
  %q = ape.param "w" ["heads"] init = "zeros"
}

// -----

// An init kind takes exactly its arguments (ape/contract/vocabulary.h, init_arg_use).
ape.encoding @e {
  // expected-error @+1 {{'ape.param' op init "zeros" takes no `std` attribute}}
  %p = ape.param "w" ["heads"] init = "zeros" trainable {std = 0.02 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.param' op init "projection_term" needs a `step` attribute (f64)}}
  %p = ape.param "a" ["heads", "head_dim"] init = "projection_term" trainable {projection = "q", columns = 4 : i64, start = 0.0 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{custom op 'ape.param' attribute 'projection' failed to satisfy constraint: "q", "k" or "v"}}
  %p = ape.param "a" ["heads", "head_dim"] init = "projection_term" trainable {projection = "o", columns = 4 : i64, start = 0.0 : f64, step = 1.0 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.param' op init "projection_prefix" is derived from a per-layer projection: it cannot be `shared`}}
  %p = ape.param "p" ["4", "heads", "head_dim"] init = "projection_prefix" trainable {projection = "k", columns = 4 : i64, scale = 1.0 : f64, shared}
}

// -----

// A misspelt argument is refused rather than ignored.
ape.encoding @e {
  // expected-error @+1 {{'ape.param' op has no attribute 'stdev' (did you mean 'std'?); its attributes: std, value, projection, columns, start, step, scale, min, max, integer and shared}}
  %p = ape.param "w" ["heads"] init = "normal" trainable {stdev = 0.02 : f64}
}

// -----

ape.kernel @k {
  // expected-error @+1 {{custom op 'ape.q_mod' attribute 'pairing' failed to satisfy constraint: "none", "half" or "interleaved"}}
  ape.q_mod attributes {pairing = "diagonal"} {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    ape.yield %x : f32
  }
}

// -----

// A misspelt argument is an error, not a default (MLIR keeps unknown attributes otherwise).
ape.encoding @e {
  // expected-error @+1 {{'ape.rotary' op has no attribute 'bsae' (did you mean 'base'?); its attributes: base, beta_fast}}
  ape.rotary {bsae = 500000.0 : f64}
}

// -----

// expected-error @+1 {{'ape.encoding' op has no attribute 'fastmath' (did you mean 'fast_math'?)}}
ape.encoding @e attributes {fastmath} {
  ape.alibi
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.token_feature' op has no attribute 'weight_sd' (did you mean 'weight_std'?)}}
  %g = ape.token_feature "g" {weight_sd = 0.5 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.q_mod' op has no attribute 'paring' (did you mean 'pairing'?)}}
  ape.q_mod attributes {paring = "half"} {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    ape.yield %x : f32
  }
}

// -----

ape.encoding @e {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    // expected-error @+1 {{'arith.negf' op has no attribute 'flags'; its attributes: fastmath}}
    %n = arith.negf %s {flags = 1 : i64} : f32
    ape.yield %n : f32
  }
}

// -----

// The right count with a wrong type: the message shows the types.
ape.encoding @e {
  // expected-error @+1 {{'ape.score_mod' op body region must take (s: f32, b: index, h: index, i: index, j: index), got (5 argument(s): f64, index, index, index, index)}}
  ape.score_mod {
  ^bb0(%s: f64, %b: index, %h: index, %i: index, %j: index):
    %c = arith.constant 0.0 : f32
    ape.yield %c : f32
  }
}

// -----

ape.encoding @e {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    // expected-error @+1 {{'ape.yield' op must yield 1 value(s) of type f32 in a score_mod body region, got 1 (index)}}
    ape.yield %i : index
  }
}

// -----

// A name with a '-' (MLIR's symbol ends there) is said to be a bad name, not a missing region.
// expected-error @+1 {{name @sliding-alibi must be an identifier: a letter or '_' then letters, digits or '_'}}
ape.encoding @sliding-alibi {
}

// -----

ape.encoding @e {
  // expected-error @+1 {{argument 'value' = 9007199254740993 is not exactly a double; write it as a float (`9007199254740992.0 : f64`)}}
  %w = ape.param "w" ["1"] init = "constant" {value = 9007199254740993}
}

// -----

ape.encoding @e {
  // `200 : i8` is kept as the bits of -56: not guessed at.
  // expected-error @+1 {{argument 'value' = -56 or 200 : i8 (a signless integer holds the bits of both); write it as a float, or as a plain number (an i64)}}
  %w = ape.param "w" ["1"] init = "constant" {value = 200 : i8}
}

// -----

ape.encoding @e {
  // So is `-3 : i32` (the bits of 4294967293); `-3` alone (an i64) is -3.
  // expected-error @+1 {{argument 'bias' = -3 or 4294967293 : i32}}
  %f = ape.token_feature "f" {bias = -3 : i32}
  %g = ape.token_feature "g" {bias = -3}
}

// -----

// expected-error @+1 {{custom op 'ape.encoding' attribute 'scale' failed to satisfy constraint: 64-bit float attribute}}
ape.encoding @e attributes {scale = "2"} {
}

// -----

ape.encoding @e {
  // expected-error @+1 {{attribute 'value' failed to satisfy constraint: 64-bit float attribute}}
  %w = ape.param "w" ["1"] init = "constant" {value = "64"}
}
