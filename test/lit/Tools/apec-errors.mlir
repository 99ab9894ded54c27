// A malformed spec gives a located diagnostic and a non-zero exit; so do a
// missing file and an unknown --emit value. --help lists every registered emitter
// (codegen/EmitterRegistry.cpp) with what it writes.
// RUN: not apec %s -o %t 2>&1 | FileCheck %s
// RUN: not apec %t.does-not-exist.mlir -o %t 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not apec %s -o %t --emit=wasm 2>&1 | FileCheck %s --check-prefix=EMIT
// RUN: apec --help | FileCheck %s --check-prefix=HELP
// RUN: not apec %ape_src/examples/encodings/rope.mlir -o %t --expect-name=other 2>&1 | FileCheck %s --check-prefix=NAME

// CHECK: apec-errors.mlir:[[@LINE+3]]:3: error: 'ape.rotary' op fraction must be in (0, 1], got 2
// CHECK-NOT: see current operation
ape.encoding @broken {
  ape.rotary {fraction = 2.0 : f64}
}

// MISSING: apec: cannot read {{.*}}does-not-exist.mlir
// EMIT: apec: unknown --emit value 'wasm' (expected cpu, manifest, reference, cuda, cuda-package, torch-library, c-abi or kernel-mlir)
// NAME: error: expected exactly one encoding, @other (a spec file's stem must equal its encoding's name)
// HELP: apec SPEC.mlir [-o OUTDIR] [--emit=KIND,...]     (OUTDIR: default the current folder)
// HELP: (default:
// HELP-NEXT: cpu,manifest,kernel-mlir):
// HELP-NEXT: cpu            OUTDIR/NAME_cpu.cpp: the fused CPU kernel
// HELP: c-abi          OUTDIR/NAME_c_abi/
// HELP: kernel-mlir    OUTDIR/NAME.kernel.mlir
// HELP-NOT: --x86-
// HELP: --mlir-print-ir-after-all
// HELP: --emit=<cpu|manifest|reference|cuda|cuda-package|torch-library|c-abi|kernel-mlir> - what to write (default: cpu,manifest,kernel-mlir)
