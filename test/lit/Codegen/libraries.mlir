// --emit=torch-library and --emit=c-abi: self-contained folders (docs/frameworks.md) with the
// kernel, the templates it includes, and the input tables; manifest names that are not
// identifiers, reserved (q) or Python keywords (lambda) become distinct argument names. The
// operator library also carries the CUDA kernels of --cuda-dtypes x --cuda-head-dims, and its
// NAME_ops.cpp includes no LibTorch header (it compiles here without one, with or without the
// CUDA kernels' entry).
// RUN: rm -rf %t && apec %s -o %t --emit=torch-library,c-abi --cuda-dtypes=bf16,f32 --cuda-head-dims=64
// RUN: ls %t %t/odd_names_torch_library | FileCheck %s --check-prefix=FILES
// RUN: cd %t/odd_names_torch_library && find ape -type f | LC_ALL=C sort | FileCheck %s --check-prefix=HEADERS
// RUN: ls %t/odd_names_c_abi | FileCheck %s --check-prefix=CFILES
// RUN: cd %t/odd_names_c_abi && find ape -type f | LC_ALL=C sort | FileCheck %s --check-prefix=CHEADERS
// RUN: FileCheck %s --check-prefix=OPS --input-file=%t/odd_names_torch_library/odd_names_ops.cpp
// RUN: FileCheck %s --check-prefix=CMAKE --input-file=%t/odd_names_torch_library/CMakeLists.txt
// RUN: FileCheck %s --check-prefix=PY --input-file=%t/odd_names_torch_library/ape_odd_names.py
// RUN: %cxx -std=c++17 -Wall -Werror -fsyntax-only -I %t/odd_names_torch_library %t/odd_names_torch_library/odd_names_ops.cpp
// RUN: %cxx -std=c++17 -Wall -Werror -fsyntax-only -DAPE_TORCH_OPS_CUDA_KERNELS -I %t/odd_names_torch_library %t/odd_names_torch_library/odd_names_ops.cpp
// Derived params (ExQPE: projection_term and projection_prefix) reach the input tables with
// their projection, columns and constants; relative rows and value rows (Shaw) get their CUDA
// kernels too.
// RUN: apec %ape_src/examples/encodings/exqpe.mlir -o %t --emit=torch-library
// RUN: FileCheck %s --check-prefix=EXQPE --input-file=%t/exqpe_torch_library/exqpe_ops.cpp
// RUN: FileCheck %s --check-prefix=EXQPE-PY --input-file=%t/exqpe_torch_library/ape_exqpe.py
// RUN: apec %ape_src/examples/encodings/shaw.mlir -o %t --emit=torch-library
// RUN: ls %t/shaw_torch_library | FileCheck %s --check-prefix=SHAW-FILES
// RUN: FileCheck %s --check-prefix=SHAW --input-file=%t/shaw_torch_library/shaw_ops.cpp
// RUN: FileCheck %s --check-prefix=SHAW-CMAKE --input-file=%t/shaw_torch_library/CMakeLists.txt
// RUN: FileCheck %s --check-prefix=HEADER --input-file=%t/odd_names_c_abi/ape_odd_names.h
// RUN: FileCheck %s --check-prefix=LEVELS --input-file=%t/odd_names_torch_library/CMakeLists.txt
// RUN: FileCheck %s --check-prefix=LEVELS --input-file=%t/odd_names_c_abi/CMakeLists.txt
// RUN: %cxx -x c -std=c99 -Wall -Wextra -Werror -fsyntax-only -I %t/odd_names_c_abi %t/odd_names_c_abi/ape_odd_names.h
// RUN: %cxx -std=c++17 -Wall -fsyntax-only -fopenmp -I %t/odd_names_c_abi %t/odd_names_c_abi/ape_odd_names_c.cpp
// Re-running apec leaves unchanged files alone (no rebuild):
// RUN: touch -d 2001-01-01 %t/odd_names_c_abi/ape_odd_names.h
// RUN: apec %s -o %t --emit=c-abi && ls -l --time-style=+%%Y %t/odd_names_c_abi/ape_odd_names.h | FileCheck %s --check-prefix=KEPT

// FILES: odd_names_c_abi
// FILES-NEXT: odd_names_torch_library
// FILES: CMakeLists.txt
// FILES-NEXT: README.md
// FILES-NEXT: ape
// FILES-NEXT: ape_odd_names.py
// FILES-NEXT: odd_names.manifest.json
// FILES-NEXT: odd_names_cpu.cpp
// FILES-NEXT: odd_names_cuda.cu
// FILES-NEXT: odd_names_cuda.cuh
// FILES-NEXT: odd_names_cuda_bf16_hd64.cu
// FILES-NEXT: odd_names_cuda_f32_hd64.cu
// FILES-NEXT: odd_names_ops.cpp
// The kernel headers a folder copies: those its sources include, transitively (the CUDA parts too).
// HEADERS: ape/contract/enc_traits.h
// HEADERS-NEXT: ape/contract/float_math.h
// HEADERS-NEXT: ape/contract/int_math.h
// HEADERS-NEXT: ape/contract/kernel_inputs.h
// HEADERS-NEXT: ape/contract/transition.h
// HEADERS-NEXT: ape/contract/value_rules.h
// HEADERS-NEXT: ape/contract/vocabulary.h
// HEADERS-NEXT: ape/cpu/attention.h
// HEADERS-NEXT: ape/cpu/decode.h
// HEADERS-NEXT: ape/cpu/dispatch.h
// HEADERS-NEXT: ape/cpu/kernel_call.h
// HEADERS-NEXT: ape/cpu/kernel_entry.h
// HEADERS-NEXT: ape/cuda/attention.cuh
// HEADERS-NEXT: ape/cuda/backward.cuh
// HEADERS-NEXT: ape/cuda/bwd_layouts.h
// HEADERS-NEXT: ape/cuda/common.cuh
// HEADERS-NEXT: ape/cuda/flash_backward.cuh
// HEADERS-NEXT: ape/cuda/flash_forward.cuh
// HEADERS-NEXT: ape/cuda/flash_tile.cuh
// HEADERS-NEXT: ape/cuda/forward.cuh
// HEADERS-NEXT: ape/cuda/hopper_forward.cuh
// HEADERS-NEXT: ape/cuda/kernel_entry.h
// HEADERS-NEXT: ape/cuda/launch.cuh
// HEADERS-NEXT: ape/cuda/packed_decode.cuh
// HEADERS-NEXT: ape/cuda/platform.cuh
// HEADERS-NEXT: ape/cuda/side_kernels.cuh
// HEADERS-NEXT: ape/cuda/symbols.h
// HEADERS-NEXT: ape/cuda/transition.cuh
// HEADERS-NEXT: ape/torch/autograd.h
// HEADERS-NEXT: ape/torch/derived_params.h
// HEADERS-NEXT: ape/torch/ops.h
// HEADERS-NEXT: ape/torch/ops_cuda.h
// HEADERS-NEXT: ape/torch/ops_impl.h
// HEADERS-NEXT: ape/torch_ops.cpp
// HEADERS-NOT: {{.}}

// CFILES: CMakeLists.txt
// CFILES-NEXT: README.md
// CFILES-NEXT: ape
// CFILES-NEXT: ape_odd_names.h
// CFILES-NEXT: ape_odd_names_c.cpp
// CFILES-NEXT: odd_names.manifest.json
// CFILES-NEXT: odd_names_cpu.cpp
// CHEADERS: ape/c/abi.h
// CHEADERS-NEXT: ape/c/abi_impl.h
// CHEADERS-NEXT: ape/contract/enc_traits.h
// CHEADERS-NEXT: ape/contract/float_math.h
// CHEADERS-NEXT: ape/contract/int_math.h
// CHEADERS-NEXT: ape/contract/kernel_inputs.h
// CHEADERS-NEXT: ape/contract/transition.h
// CHEADERS-NEXT: ape/contract/value_rules.h
// CHEADERS-NEXT: ape/contract/vocabulary.h
// CHEADERS-NEXT: ape/cpu/attention.h
// CHEADERS-NEXT: ape/cpu/decode.h
// CHEADERS-NEXT: ape/cpu/dispatch.h
// CHEADERS-NEXT: ape/cpu/kernel_call.h
// CHEADERS-NEXT: ape/cpu/kernel_entry.h
// CHEADERS-NOT: {{.}}

// OPS: #include "ape/torch/ops.h"
// OPS-NOT: #include <
// OPS: extern "C" const ape::KernelEntry *ape_kernel_entry_odd_names();
// OPS-NEXT: #ifdef APE_TORCH_OPS_CUDA_KERNELS
// OPS-NEXT: extern "C" const ape::cuda::CudaKernelEntry *ape_cuda_kernel_entry_odd_names();
// OPS: static const char *const features[] = {"gate-1"};
// OPS: {"q", 1, {{[{][{]}}ape_abi::Dim::Kind::Heads, 0}}, true, ape_abi::InitKind::Zeros, {}, false, {0, 0, false}, 0.0},  // [heads]
// OPS-NEXT: {"lambda", 2, {{[{][{]}}ape_abi::Dim::Kind::Heads, 0}, {ape_abi::Dim::Kind::HeadDim, 0}}, false, ape_abi::InitKind::Ones, {}, false, {0, 0, false}, 0.0},  // [heads, head_dim]
// OPS: static const ape::KernelInputs inputs{"odd_names", ape_kernel_entry_odd_names(), 1, features, 2, params, false,
// OPS: "attention(Tensor q, Tensor k, Tensor v, Tensor gate_1, Tensor q_, Tensor lambda_, float? scale=None) -> Tensor",
// OPS-NEXT: #ifdef APE_TORCH_OPS_CUDA_KERNELS
// OPS-NEXT: ape_cuda_kernel_entry_odd_names(), nullptr};
// OPS-NEXT: #else
// OPS-NEXT: nullptr, "the library was built without CUDA kernels
// OPS: const ape::torch_ops::Registration registration(library());

// CMAKE: add_library(ape_odd_names_ops SHARED odd_names_cpu.cpp odd_names_ops.cpp)
// CMAKE: add_library(${ape_common} STATIC ${CMAKE_CURRENT_SOURCE_DIR}/ape/torch_ops.cpp)
// CMAKE: set(ape_cuda_sources odd_names_cuda.cu odd_names_cuda_bf16_hd64.cu odd_names_cuda_f32_hd64.cu)

// PY: o = ops.attention(q, k, v, gate_1, q_, lambda_)
// PY: LIBRARY = "libape_odd_names_ops.so"
// PY: ARGUMENTS = ["gate_1", "q_", "lambda_"]
// PY-NEXT: # The params computed
// PY-NEXT: DERIVED = []

// EXQPE: {"position_scale", 1, {{[{][{]}}ape_abi::Dim::Kind::Fixed, 1}}, false, ape_abi::InitKind::Constant, {}, true, {-16777216.0, 16777216.0, false}, 1.0},  // [1]
// EXQPE-NEXT: {"override_q_a", 2, {{[{][{]}}ape_abi::Dim::Kind::Heads, 0}, {ape_abi::Dim::Kind::HeadDim, 0}}, true, ape_abi::InitKind::ProjectionTerm, {true, ape_abi::Projection::Q, 16, 0.0, 0.00048828125, 1.0}, false, {0, 0, false}, 0.0},
// EXQPE-NEXT: {"override_q_b", 2, {{[{][{]}}ape_abi::Dim::Kind::Heads, 0}, {ape_abi::Dim::Kind::HeadDim, 0}}, true, ape_abi::InitKind::ProjectionTerm, {true, ape_abi::Projection::Q, 16, 0.0625, 0.0, 1.0}, false, {0, 0, false}, 0.0},
// EXQPE-NEXT: {"override_q_p", 3, {{[{][{]}}ape_abi::Dim::Kind::Fixed, 16}, {ape_abi::Dim::Kind::Heads, 0}, {ape_abi::Dim::Kind::HeadDim, 0}}, true, ape_abi::InitKind::ProjectionPrefix, {true, ape_abi::Projection::Q, 16, 0.0, 0.0, 0.0625}, false, {0, 0, false}, 0.0},
// EXQPE-NEXT: {"override_k_a", {{.*}}, ape_abi::InitKind::ProjectionTerm, {true, ape_abi::Projection::K, 16,
// EXQPE-PY: DERIVED = ["override_q_a", "override_q_b", "override_q_p", "override_k_a", "override_k_b", "override_k_p"]

// SHAW-FILES: shaw_cuda.cu
// SHAW-FILES: shaw_cuda_bf16_hd64.cu
// SHAW: #ifdef APE_TORCH_OPS_CUDA_KERNELS
// SHAW-CMAKE: set(ape_cuda_sources shaw_cuda.cu shaw_cuda_bf16_hd32.cu

// HEADER: #include "ape/c/abi.h"
// HEADER: #define APE_ODD_NAMES_NUM_FEATURES 1
// HEADER-NEXT: #define APE_ODD_NAMES_NUM_PARAMS 2
// HEADER-NEXT: enum { APE_ODD_NAMES_FEATURE_GATE_1 = 0 };
// HEADER-NEXT: enum { APE_ODD_NAMES_PARAM_Q = 0, APE_ODD_NAMES_PARAM_LAMBDA = 1 };
// HEADER: } ape_odd_names_args;
// HEADER: APE_C_API int ape_odd_names_forward_f32(const ape_odd_names_args *args);
// HEADER: APE_C_API const char *ape_odd_names_last_error(void);
// HEADER: APE_C_API const char *ape_odd_names_cpu_level(void);

// The kernel once per instruction-set level: two wrappers, and the mask of the levels.
// LEVELS: foreach(level 1 2)
// LEVELS: #define APE_KERNEL_LEVEL ${level}\n#include \"${CMAKE_CURRENT_SOURCE_DIR}/odd_names_cpu.cpp\"\n
// LEVELS: set(ape_levels 7)
// LEVELS: target_compile_definitions(ape_odd_names_{{ops|c}} PRIVATE APE_KERNEL_LEVELS=${ape_levels})

// KEPT: 2001
ape.encoding @odd_names {
  %g = ape.token_feature "gate-1" {weight_std = 0.02 : f64, bias = 0.0 : f64}
  %q = ape.param "q" ["heads"] init = "zeros" trainable
  %l = ape.param "lambda" ["heads", "head_dim"] init = "ones"
  ape.q_mod {
  ^bb0(%x: f32, %y: f32, %c: index, %t: index, %h: index):
    %a = ape.load %l[%h, %c] : !ape.param
    %r = arith.mulf %x, %a : f32
    ape.yield %r : f32
  }
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %gi = ape.load %g[%b, %h, %i] : !ape.tokens
    %w = ape.load %q[%h] : !ape.param
    %t = arith.mulf %gi, %w : f32
    %r = arith.addf %s, %t : f32
    ape.yield %r : f32
  }
}
