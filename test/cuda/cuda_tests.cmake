# The CUDA suite (included from test/CMakeLists.txt): one source, test/cuda/cuda_kernels_test.cpp,
# built twice:
#   ape_simt_kernels_test  ape_simt_kernels (the kernels compiled by the host compiler) on the SIMT
#                          emulator: runs everywhere, in CI (label "cuda;simt");
#   ape_cuda_kernels_test  ape_cuda_kernels (nvcc) on a GPU: built when nvcc is found, its tests
#                          registered when a GPU was found at configure time (APE_CUDA_GPU_TESTS).
# Plus ape_simt_checks_test: the emulator's own checks, each shown to catch a planted bug.
set(APE_CUDA_TEST_SOURCES ${APE_SOURCE_DIR}/test/cuda/cuda_kernels_test.cpp
    ${APE_SOURCE_DIR}/test/unit/kernel_reference.cpp)

add_executable(ape_simt_kernels_test ${APE_CUDA_TEST_SOURCES})
target_compile_definitions(ape_simt_kernels_test PRIVATE APE_SIMT)
target_include_directories(ape_simt_kernels_test PRIVATE ${APE_SOURCE_DIR}/kernels/include
                           ${APE_SOURCE_DIR}/test/unit)
target_compile_options(ape_simt_kernels_test PRIVATE -O2)
target_link_libraries(ape_simt_kernels_test PRIVATE ape_simt_kernels ape_kernels
                      "${TORCH_LIBRARIES}" GTest::gtest nlohmann_json::nlohmann_json)
set_target_properties(ape_simt_kernels_test PROPERTIES ENABLE_EXPORTS ON)  # kernel names in reports
# ~300 emulated tests in 10 shards (cmake/ApeGTestShards.cmake).
include(${APE_SOURCE_DIR}/cmake/ApeGTestShards.cmake)
ape_gtest_shards(ape_simt_kernels_test SHARDS 10 LABELS cuda simt TIMEOUT 1800
                 ENVIRONMENT APE_SIMT_QUIET=0)

if(APE_HAVE_CUDA)
  add_executable(ape_cuda_kernels_test ${APE_CUDA_TEST_SOURCES})
  target_include_directories(ape_cuda_kernels_test PRIVATE ${APE_SOURCE_DIR}/kernels/include
                             ${APE_SOURCE_DIR}/test/unit)
  target_compile_options(ape_cuda_kernels_test PRIVATE -O2)
  target_link_libraries(ape_cuda_kernels_test PRIVATE ape_cuda_kernels ape_kernels CUDA::cudart
                        "${TORCH_LIBRARIES}" GTest::gtest nlohmann_json::nlohmann_json)
  if(APE_CUDA_GPU_TESTS)
    gtest_discover_tests(ape_cuda_kernels_test
      PROPERTIES LABELS "cuda;gpu" TIMEOUT 600
      DISCOVERY_TIMEOUT 60)
  endif()
  # The largest unit of the example specs (FIRE: an MLP score mod) compiles within 4 GiB, so
  # every spec of that shape reaches a GPU (compile_bounds.sh; bench/results/cuda_compile_memory.md).
  list(GET APE_CUDA_ARCHS 0 _ape_bounds_arch)
  add_test(NAME cuda_compile_bounds
           COMMAND ${APE_SOURCE_DIR}/test/cuda/compile_bounds.sh $<TARGET_FILE:apec>
                   ${CMAKE_CUDA_COMPILER} ${APE_SOURCE_DIR}/kernels/include ${_ape_bounds_arch}
                   ${APE_SOURCE_DIR}/examples/encodings/fire.mlir 4096 900)
  set_tests_properties(cuda_compile_bounds PROPERTIES LABELS "cuda;nvcc" TIMEOUT 1000)
  # The build's nvcc kernels (APE_CUDA_ENCODINGS, rope and cable by default) instantiate no q/k mod
  # with parameters, and the emulator compiles the kernels as host code: ExQPE's variant (its mods'
  # gradients summed by mod_backward_params_kernel) is compiled by nvcc here, so device code that
  # only such encodings reach cannot break without a test failing.
  add_test(NAME cuda_compile_mod_params
           COMMAND ${APE_SOURCE_DIR}/test/cuda/compile_bounds.sh $<TARGET_FILE:apec>
                   ${CMAKE_CUDA_COMPILER} ${APE_SOURCE_DIR}/kernels/include ${_ape_bounds_arch}
                   ${APE_SOURCE_DIR}/examples/encodings/exqpe.mlir 4096 600)
  set_tests_properties(cuda_compile_mod_params PROPERTIES LABELS "cuda;nvcc" TIMEOUT 700)
endif()

add_library(ape_simt_planted STATIC ${APE_SOURCE_DIR}/test/cuda/simt_planted_kernels.cpp)
ape_simt_kernel_flags(ape_simt_planted)
add_executable(ape_simt_checks_test ${APE_SOURCE_DIR}/test/cuda/simt_checks_test.cpp)
target_link_libraries(ape_simt_checks_test PRIVATE ape_simt_planted "${TORCH_LIBRARIES}"
                      GTest::gtest_main)
set_target_properties(ape_simt_checks_test PROPERTIES ENABLE_EXPORTS ON)
gtest_discover_tests(ape_simt_checks_test PROPERTIES LABELS "cuda;simt" DISCOVERY_TIMEOUT 60)

# Test specs, not examples, through the emulated CUDA kernels, each compiled here for the CPU and for
# CUDA (f32 and bf16 at head dim 32); their own CUDA registry, an object of the executable, stands in
# for ape_simt_kernels' (an archive member that is then never pulled in):
#   strict_window  a -inf mask with a fully masked row (masked_rows_simt_test.cpp);
#   value_window   value rows without a score mod (value_rows_simt_test.cpp);
#   kcable_fast    K-Cable marked fast_math: approximate functions in the score mod (fast_math_simt_test.cpp);
#   rowcol_rel     a row/column bias over relative rows, in a forward from first_row (rowcol_rel_simt_test.cpp).
set(_ape_mask_dir ${CMAKE_CURRENT_BINARY_DIR}/masked_rows)
set(_ape_test_specs strict_window value_window kcable_fast rowcol_rel)
set(_ape_mask_sources)
set(_ape_mask_cpu)
set(_ape_mask_decls)
set(_ape_mask_entries)
foreach(spec ${_ape_test_specs})
  set(_spec_file ${APE_SOURCE_DIR}/test/unit/Inputs/${spec}.mlir)
  set(_spec_cu ${spec}_cuda.cu ${spec}_cuda_f32_hd32.cu ${spec}_cuda_bf16_hd32.cu)
  add_custom_command(
    OUTPUT ${_ape_mask_dir}/${spec}_cpu.cpp ${_ape_mask_dir}/${spec}_cuda.cuh
           ${_ape_mask_dir}/${spec}_cuda.cu ${_ape_mask_dir}/${spec}_cuda_f32_hd32.cu
           ${_ape_mask_dir}/${spec}_cuda_bf16_hd32.cu
    COMMAND apec ${_spec_file} -o ${_ape_mask_dir} --emit=cpu,cuda --cuda-dtypes=f32,bf16
            --cuda-head-dims=32 --expect-name ${spec}
    DEPENDS apec ${_spec_file}
    COMMENT "apec --emit=cpu,cuda ${spec}.mlir (test)"
    VERBATIM)
  foreach(cu ${_spec_cu})
    get_filename_component(stem ${cu} NAME_WE)
    file(CONFIGURE OUTPUT ${_ape_mask_dir}/cpp/${stem}.cpp CONTENT
         "// Generated by CMake: ${stem}.cu for the SIMT emulator.\n#include \"${_ape_mask_dir}/${cu}\"\n" @ONLY)
    set_source_files_properties(${_ape_mask_dir}/cpp/${stem}.cpp PROPERTIES OBJECT_DEPENDS ${_ape_mask_dir}/${cu})
    list(APPEND _ape_mask_sources ${_ape_mask_dir}/cpp/${stem}.cpp)
  endforeach()
  list(APPEND _ape_mask_cpu ${_ape_mask_dir}/${spec}_cpu.cpp)
  string(APPEND _ape_mask_decls "extern \"C\" const ape::cuda::CudaKernelEntry *APE_CUDA_ENTRY(${spec})();\n")
  string(APPEND _ape_mask_entries "APE_CUDA_ENTRY(${spec})(), ")
endforeach()
list(LENGTH _ape_test_specs _ape_mask_count)
file(CONFIGURE OUTPUT ${_ape_mask_dir}/registry.cpp CONTENT
"// Generated by CMake: the emulated CUDA registry of the test specs. Do not edit.
#include \"ape/cuda/kernel_entry.h\"

${_ape_mask_decls}namespace ape::cuda {
APE_CUDA_ABI_BEGIN
const CudaKernelEntry *const *cuda_kernel_registry(size_t *count) {
  static const CudaKernelEntry *const entries[] = {${_ape_mask_entries}nullptr};
  *count = ${_ape_mask_count};
  return entries;
}
APE_CUDA_ABI_END
}  // namespace ape::cuda
" @ONLY)
add_library(ape_masked_rows_simt_kernels STATIC ${_ape_mask_sources})
target_include_directories(ape_masked_rows_simt_kernels PRIVATE ${_ape_mask_dir})
ape_simt_kernel_flags(ape_masked_rows_simt_kernels)
add_executable(ape_masked_rows_simt_test ${APE_SOURCE_DIR}/test/cuda/masked_rows_simt_test.cpp
               ${APE_SOURCE_DIR}/test/cuda/value_rows_simt_test.cpp
               ${APE_SOURCE_DIR}/test/cuda/fast_math_simt_test.cpp ${APE_SOURCE_DIR}/test/cuda/rowcol_rel_simt_test.cpp
               ${_ape_mask_cpu} ${_ape_mask_dir}/registry.cpp)
set_source_files_properties(${_ape_mask_dir}/registry.cpp ${APE_SOURCE_DIR}/test/cuda/rowcol_rel_simt_test.cpp
                            PROPERTIES COMPILE_DEFINITIONS APE_SIMT)
target_compile_options(ape_masked_rows_simt_test PRIVATE -O2 -Wno-unused-parameter)
target_link_libraries(ape_masked_rows_simt_test PRIVATE ape_masked_rows_simt_kernels ape_runtime_simt
                      ape_runtime ape_kernels GTest::gtest_main)
set_target_properties(ape_masked_rows_simt_test PROPERTIES ENABLE_EXPORTS ON)
gtest_discover_tests(ape_masked_rows_simt_test PROPERTIES LABELS "cuda;simt" TIMEOUT 300 DISCOVERY_TIMEOUT 60)

# The global-memory bytes of the emulated kernels against the committed counts
# (bench/results/cuda_traffic.csv, from `ape-cuda-traffic --T 1024 --csv ...`): fails when a kernel
# moves more than 2% more bytes, or a new side kernel appears (docs/cuda.md, "Traffic without a
# GPU").
add_test(NAME cuda_traffic_regression
         COMMAND ape-cuda-traffic --T 1024 --check ${APE_SOURCE_DIR}/bench/results/cuda_traffic.csv)
set_tests_properties(cuda_traffic_regression PROPERTIES LABELS "cuda;simt" TIMEOUT 300)
# The same at D = 128 (its own tiles: the flash forward's 8 warps, the backward's 128-key blocks
# at 104-117 KiB) for the encodings the emulated build has at that head dim (cuda_traffic_d128.csv,
# `--T 1024 --D 128 --encodings rope t5 cable --csv ...`).
add_test(NAME cuda_traffic_regression_d128
         COMMAND ape-cuda-traffic --T 1024 --D 128 --encodings rope t5 cable
                 --check ${APE_SOURCE_DIR}/bench/results/cuda_traffic_d128.csv)
set_tests_properties(cuda_traffic_regression_d128 PROPERTIES LABELS "cuda;simt" TIMEOUT 300)
# The general path: relative rows, value rows, per-element token sums, FIRE's MLP
# (cuda_traffic_general.csv, `--T 512 --encodings deberta transformer_xl shaw kcable fire --csv ...`).
add_test(NAME cuda_traffic_regression_general
         COMMAND ape-cuda-traffic --T 512 --encodings deberta transformer_xl shaw kcable fire
                 --check ${APE_SOURCE_DIR}/bench/results/cuda_traffic_general.csv)
set_tests_properties(cuda_traffic_regression_general PROPERTIES LABELS "cuda;simt" TIMEOUT 300)
# Grouped-query attention (4 query heads reading 1 key head): the kernels read the key heads in
# place, forward and backward, and a one-token step packs each group's rows into one block
# (cuda_traffic_gqa.csv, `--T 1024 --H 4 --kv-heads 1 --encodings nope rope expe --csv ...`): a
# copy of k or v to the query heads, or a step that reads them once per query head, fails here.
add_test(NAME cuda_traffic_regression_gqa
         COMMAND ape-cuda-traffic --T 1024 --H 4 --kv-heads 1 --encodings nope rope expe
                 --check ${APE_SOURCE_DIR}/bench/results/cuda_traffic_gqa.csv)
set_tests_properties(cuda_traffic_regression_gqa PROPERTIES LABELS "cuda;simt" TIMEOUT 300)
# The q/k mods whose gradients add to parameters (ExPE's per head and column, ExQPE's per residue
# too): their backward sums those over each thread's rows before its atomics
# (mod_backward_params_kernel; cuda_traffic_mod_params.csv, `--T 1024 --encodings expe exqpe
# --csv ...`): one pair of atomics per term again fails here.
add_test(NAME cuda_traffic_regression_mod_params
         COMMAND ape-cuda-traffic --T 1024 --encodings expe exqpe
                 --check ${APE_SOURCE_DIR}/bench/results/cuda_traffic_mod_params.csv)
set_tests_properties(cuda_traffic_regression_mod_params PROPERTIES LABELS "cuda;simt" TIMEOUT 300)
