// MLIR's pass-manager options work through apec.
// RUN: rm -rf %t && apec %s -o %t --emit=manifest --mlir-print-ir-after=ape-fuse 2>&1 | FileCheck %s
// CHECK: IR Dump After ApeFuse
// CHECK: ape.kernel @alibi
ape.encoding @alibi {
  ape.alibi
}
