// ape.attention_transition (the prob site) prints in a form that parses back to the same IR,
// in an encoding and in an inference-only kernel; the defaults are the spec's.
// RUN: ape-opt %s | ape-opt | FileCheck %s
// RUN: ape-opt %s --mlir-print-op-generic | ape-opt | FileCheck %s

// CHECK-LABEL: ape.encoding @defaults
// CHECK-NEXT: ape.rotary
// CHECK-NEXT: ape.attention_transition{{$}}
ape.encoding @defaults {
  ape.rotary
  ape.attention_transition
}

// CHECK-LABEL: ape.encoding @custom
// CHECK-NEXT: ape.attention_transition {alpha = 2.500000e-01 : f64, beta = 2.000000e-01 : f64, divisor_offset = 2 : i64, first_layer = 2 : i64, intervals = 3 : i64, skip_last = 1 : i64}
ape.encoding @custom {
  ape.attention_transition {divisor_offset = 2, first_layer = 2, skip_last = 1, intervals = 3,
                            alpha = 0.25 : f64, beta = 0.2 : f64}
}

// CHECK-LABEL: ape.kernel @k attributes {inference_only}
// CHECK-NEXT: ape.attention_transition{{$}}
ape.kernel @k attributes {inference_only} {
  ape.attention_transition
}
