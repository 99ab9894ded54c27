// Values no kernel can use, each refused with a located diagnostic (dialect/ValueRules.h: reals
// must fit f32, lengths stay below 2^24, dimensions below 2^16, rotations rotate whole pairs, fixed
// params stay in their declared range). The runtime checks the same rules (ape-eval --set, a
// model's head_dim) through the manifest.
// RUN: ape-opt %s -split-input-file -verify-diagnostics

// A logit scale that overflows f32 (1e308 would be inf in the kernel).
// expected-error @+1 {{'ape.encoding' op scale must be a positive number in [5.42101086e-20, 3.40282347e+38]; got 1e+308}}
ape.encoding @e attributes {scale = 1.0e308 : f64} {
}

// -----

// A logit scale below 2^-64 (the CUDA kernels keep biases as B / scale: 1e-37 gave NaN in bf16).
// expected-error @+1 {{'ape.encoding' op scale must be a positive number in [5.42101086e-20, 3.40282347e+38]; got 1e-37}}
ape.encoding @e attributes {scale = 1.0e-37 : f64} {
}

// -----

// An INT64_MAX shape hint.
// expected-error @+1 {{'ape.encoding' op head_dim must be in [1, 65536], got 9223372036854775807}}
ape.encoding @e attributes {head_dim = 9223372036854775807} {
}

// -----

// A model_dim hint past the dimension limit.
// expected-error @+1 {{'ape.encoding' op model_dim must be in [1, 65536], got 100000}}
ape.encoding @e attributes {model_dim = 100000} {
}

// -----

// xPos rotates every pair: head_dim 3 leaves a coordinate without a partner.
ape.encoding @e attributes {head_dim = 3} {
  // expected-error @+1 {{'ape.xpos' op fraction 1 of head_dim 3 gives 3 rotated coordinates; the count must be an even whole number (pairs)}}
  ape.xpos
}

// -----

// head_dim 1: the rotation would rotate nothing (silently NoPE).
ape.encoding @e attributes {head_dim = 1} {
  // expected-error @+1 {{'ape.rotary' op fraction 1 of head_dim 1 gives 1 rotated coordinates; the count must be an even whole number (pairs)}}
  ape.rotary
}

// -----

// A rotary base that overflows f32.
ape.encoding @e {
  // expected-error @+1 {{'ape.rotary' op attribute 'base' must be a finite number in [-3.40282347e+38, 3.40282347e+38]; got 1e+300}}
  ape.rotary {base = 1.0e300 : f64}
}

// -----

// An INT64_MAX original length.
ape.encoding @e {
  // expected-error @+1 {{'ape.rotary' op original_length must be a whole number in [1, 16777216]; got 9.22337204e+18}}
  ape.rotary {scaling = "yarn", factor = 4.0 : f64, original_length = 9223372036854775807}
}

// -----

// A scaling factor that overflows f32.
ape.encoding @e {
  // expected-error @+1 {{'ape.rotary' op attribute 'factor' must be a finite number in [-3.40282347e+38, 3.40282347e+38]; got 1e+39}}
  ape.rotary {scaling = "linear", factor = 1.0e39 : f64}
}

// -----

// A scaling factor below 2^-24: positions t/s (t < 2^24) beyond 2^48, and below the smallest
// normal f32, inf (a NaN loss).
ape.encoding @e {
  // expected-error @+1 {{'ape.rotary' op factor must be a positive number in [5.96046448e-08, 16777216]; got 1e-45}}
  ape.rotary {scaling = "linear", factor = 1.0e-45 : f64}
}

// -----

ape.encoding @e {
  // expected-error @+1 {{'ape.rotary' op factor must be a positive number in [5.96046448e-08, 16777216]; got 1e-10}}
  ape.rotary {scaling = "yarn", factor = 1.0e-10 : f64, original_length = 64}
}

// -----

// An original length past 2^24 (positions stop being exact in f32).
ape.encoding @e {
  // expected-error @+1 {{'ape.rotary' op original_length must be a whole number in [1, 16777216]; got 16777217}}
  ape.rotary {scaling = "llama3", factor = 8.0 : f64, original_length = 16777217}
}

// -----

// An xPos scale base that overflows f32.
ape.encoding @e {
  // expected-error @+1 {{'ape.xpos' op attribute 'scale_base' must be a finite number in [-3.40282347e+38, 3.40282347e+38]; got 1e+308}}
  ape.xpos {scale_base = 1.0e308 : f64}
}

// -----

// An INT64_MAX learned table.
ape.encoding @e {
  // expected-error @+1 {{'ape.absolute' op max_length must be in [1, 16777216], got 9223372036854775807}}
  ape.absolute {kind = "learned", max_length = 9223372036854775807}
}

// -----

// An INT64_MAX T5 max_distance.
ape.encoding @e {
  // expected-error @+1 {{'ape.t5_bias' op max_distance must be in [1, 16777216], got 9223372036854775807}}
  ape.t5_bias {buckets = 32, max_distance = 9223372036854775807}
}

// -----

// A T5 table with more buckets than the dimension limit.
ape.encoding @e {
  // expected-error @+1 {{'ape.t5_bias' op buckets must be even and in [2, 65536], got 131072}}
  ape.t5_bias {buckets = 131072, max_distance = 1000000}
}

// -----

// A FIRE c that overflows f32.
ape.encoding @e {
  // expected-error @+1 {{'ape.fire' op attribute 'c' must be a finite number in [-3.40282347e+38, 3.40282347e+38]; got 1e+300}}
  ape.fire {c = 1.0e300 : f64}
}

// -----

// A Cable kappa that overflows f32.
ape.encoding @e {
  // expected-error @+1 {{'ape.cable' op attribute 'kappa' must be a finite number in [-3.40282347e+38, 3.40282347e+38]; got 1e+308}}
  ape.cable {kappa = 1.0e308 : f64}
}

// -----

// A Cable kappa below the logit scale's minimum (it becomes the encoding's scale: 2^-64).
ape.encoding @e {
  // expected-error @+1 {{'ape.cable' op kappa must be a positive number in [5.42101086e-20, 3.40282347e+38]; got 1e-30 (it becomes the encoding's scale)}}
  ape.cable {kappa = 1.0e-30 : f64}
}

// -----

// An INT64_MAX override width.
ape.encoding @e {
  // expected-error @+1 {{'ape.override' op l (the number of overwritten inputs) must be in [1, 65536], got 9223372036854775807}}
  ape.override {l = 9223372036854775807}
}

// -----

// An override theta that overflows f32.
ape.encoding @e {
  // expected-error @+1 {{'ape.override' op attribute 'theta' must be a finite number in [-3.40282347e+38, 3.40282347e+38]; got 1e+300}}
  ape.override {l = 8, theta = 1.0e300 : f64}
}

// -----

// A param dimension beyond any int a runtime would allocate.
ape.encoding @e {
  // expected-error @+1 {{'ape.param' op dimension 99999999999 exceeds 65536}}
  %p = ape.param "p" ["99999999999"] init = "zeros"
}

// -----

// Integer dimensions whose product overflows the element limit.
ape.encoding @e {
  // expected-error @+1 {{'ape.param' op integer dimensions of 4294967296+ elements exceed 268435456}}
  %p = ape.param "p" ["65536", "65536"] init = "zeros"
}

// -----

// A fixed param whose value lies outside its declared range.
ape.encoding @e {
  // expected-error @+1 {{'ape.param' op value must be a positive number in [1, 2]; got 0.5}}
  %p = ape.param "p" ["1"] init = "constant" {value = 0.5 : f64, min = 1.0 : f64, max = 2.0 : f64}
}

// -----

// An integer range holding a fraction.
ape.encoding @e {
  // expected-error @+1 {{'ape.param' op value must be a whole number in [1, 2]; got 1.5}}
  %p = ape.param "p" ["1"] init = "constant" {value = 1.5 : f64, min = 1.0 : f64, max = 2.0 : f64, integer}
}

// -----

// A range with only one bound.
ape.encoding @e {
  // expected-error @+1 {{'ape.param' op a value range needs both `min` and `max` (f64)}}
  %p = ape.param "p" ["1"] init = "constant" {value = 1.0 : f64, min = 1.0 : f64}
}

// -----

// A range whose min exceeds its max.
ape.encoding @e {
  // expected-error @+1 {{'ape.param' op min 3 exceeds max 2}}
  %p = ape.param "p" ["1"] init = "constant" {value = 1.0 : f64, min = 3.0 : f64, max = 2.0 : f64}
}

// -----

// A range on a trainable param (ranges are for values a runtime sets).
ape.encoding @e {
  // expected-error @+1 {{'ape.param' op a value range applies to a fixed param (init "constant", not trainable): the values a runtime may set}}
  %p = ape.param "p" ["1"] init = "zeros" trainable {min = 0.0 : f64, max = 2.0 : f64}
}

// -----

// A constant param value that overflows f32.
ape.encoding @e {
  // expected-error @+1 {{'ape.param' op attribute 'value' must be a finite number in [-3.40282347e+38, 3.40282347e+38]; got 1e+300}}
  %p = ape.param "p" ["1"] init = "constant" {value = 1.0e300 : f64}
}

// -----

// A normal init std that overflows f32.
ape.encoding @e {
  // expected-error @+1 {{'ape.param' op attribute 'std' must be a finite number in [-3.40282347e+38, 3.40282347e+38]; got 1e+39}}
  %p = ape.param "p" ["heads"] init = "normal" trainable {std = 1.0e39 : f64}
}

// -----

// A token feature bias that overflows f32.
ape.encoding @e {
  // expected-error @+1 {{'ape.token_feature' op attribute 'bias' must be a finite number in [-3.40282347e+38, 3.40282347e+38]; got 1e+300}}
  %f = ape.token_feature "f" {bias = 1.0e300 : f64}
}

// -----

// An ape.constant that f32 kernels cannot hold.
ape.encoding @e {
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    // expected-error @+1 {{'ape.constant' op value must be a finite number in [-3.40282347e+38, 3.40282347e+38]; got 1e+300 (kernels compute in f32)}}
    %c = ape.constant 1.0e300
    %r = arith.addf %s, %c : f32
    ape.yield %r : f32
  }
}

// -----

// A tile no kernel template can hold.
// expected-error @+1 {{'ape.kernel' op tile_q must be in [1, 1024], got 1000000}}
ape.kernel @k attributes {tile_q = 1000000 : i64} {
}

// -----

// More K/V passes than any schedule needs.
// expected-error @+1 {{'ape.kernel' op passes must be in [1, 3], got 9}}
ape.kernel @k attributes {passes = 9 : i64} {
}

// -----

// A score bias no template has a fast path for (-ape-classify records "distance" or "row_col").
// expected-error @+1 {{'ape.kernel' op score_bias must be "distance", "row_col" or "features", got "diagonal"}}
ape.kernel @k attributes {score_bias = "diagonal"} {
}

// -----

// An infinite kernel scale.
// expected-error @+1 {{'ape.kernel' op scale must be a positive number in [5.42101086e-20, 3.40282347e+38]; got inf}}
ape.kernel @k attributes {scale = 0x7FF0000000000000 : f64} {
}

// -----

// A zero head_dim hint.
// expected-error @+1 {{'ape.encoding' op head_dim must be in [1, 65536], got 0}}
ape.encoding @e attributes {head_dim = 0} {
}

// -----

// The manifest names σ's param: it must exist (the runtime refused such manifests; found by the fuzzer).
ape.kernel @k {
  // expected-error @+1 {{'ape.masked_projection' op position_scale "sigma" names no ape.param of this kernel}}
  ape.masked_projection {l = 4 : i64, position_scale = "sigma", targets = "qk"}
}

// -----

// ... and be a fixed scalar.
ape.kernel @k {
  %s = ape.param "sigma" ["heads"] init = "ones" trainable
  // expected-error @+1 {{'ape.masked_projection' op position_scale "sigma" must name a fixed param of shape ["1"] (init "constant", not trainable)}}
  ape.masked_projection {l = 4 : i64, position_scale = "sigma", targets = "qk"}
}

// -----

// The manifest holds one embedding: a second would be dropped silently.
ape.kernel @k {
  ape.position_embedding {learned, max_length = 8 : i64}
  // expected-error @+1 {{'ape.position_embedding' op a kernel holds at most one position embedding}}
  ape.position_embedding {learned, max_length = 16 : i64}
}
