// A syntax error points at its line and column.
// RUN: not apec %s -o %t 2>&1 | FileCheck %s
// CHECK: apec-syntax-error.mlir:[[@LINE+2]]:21: error: expected attribute value
ape.encoding @broken {
  ape.rotary {base = }
}
