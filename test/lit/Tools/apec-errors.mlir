// A malformed spec gives a located diagnostic and a non-zero exit; so do a
// missing file and an unknown --emit value.
// RUN: not apec %s -o %t 2>&1 | FileCheck %s
// RUN: not apec %t.does-not-exist.mlir -o %t 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not apec %s -o %t --emit=wasm 2>&1 | FileCheck %s --check-prefix=EMIT
// RUN: apec --help | FileCheck %s --check-prefix=HELP

// CHECK: apec-errors.mlir:[[@LINE+2]]:3: error: 'ape.rotary' op fraction must be in (0, 1], got 2
ape.encoding @broken {
  ape.rotary {fraction = 2.0 : f64}
}

// MISSING: apec: cannot read {{.*}}does-not-exist.mlir
// EMIT: apec: unknown --emit value 'wasm' (expected cpu, manifest or kernel-mlir)
// HELP: apec SPEC.mlir -o OUTDIR
// HELP: --mlir-print-ir-after-all
// HELP: --emit=<cpu|manifest|kernel-mlir>
