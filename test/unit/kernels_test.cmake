# ape_kernels_test (included from test/CMakeLists.txt): numerics of every generated kernel of
# ape_kernels against an independent fp64 LibTorch reference (kernel_reference.cpp), finite
# differences, the hand-checkable values of the encodings spec, edge cases and the registry. One
# executable, one file per purpose under test/unit/kernels/ (harness.h: the shared harness; the
# encoding lists come from the registry).
# Needs the targets ape_kernels, GTest::gtest, nlohmann_json::nlohmann_json and TORCH_LIBRARIES.
# APE_SOURCE_DIR (default CMAKE_SOURCE_DIR) is the repository root, so that a scratch project
# can include this fragment with an imported ape_kernels.
if(NOT DEFINED APE_SOURCE_DIR)
  set(APE_SOURCE_DIR ${CMAKE_SOURCE_DIR})
endif()
if(NOT TARGET GTest::gtest)
  find_package(GTest REQUIRED)
endif()
if(NOT TARGET nlohmann_json::nlohmann_json)
  find_package(nlohmann_json 3 REQUIRED)
endif()
include(GoogleTest)

set(_ape_kernels_test_dir ${APE_SOURCE_DIR}/test/unit/kernels)
add_executable(ape_kernels_test
  ${_ape_kernels_test_dir}/harness.cpp           # the harness (harness.h) and main()
  ${_ape_kernels_test_dir}/grid_test.cpp         # the grid against the reference
  ${_ape_kernels_test_dir}/gradcheck_test.cpp    # central differences of the fp64 kernels
  ${_ape_kernels_test_dir}/rotations_test.cpp    # RoPE, its scalings, xPos, absolute tables
  ${_ape_kernels_test_dir}/biases_test.cpp       # ALiBi, T5, KERPLE, FIRE
  ${_ape_kernels_test_dir}/cumulative_test.cpp   # Cable, forget gate, K-Cable
  ${_ape_kernels_test_dir}/relative_test.cpp     # Shaw, DeBERTa, Transformer-XL
  ${_ape_kernels_test_dir}/overrides_test.cpp    # ExPE, ExQPE
  ${_ape_kernels_test_dir}/fixed_params_test.cpp # run-time fixed params, dynamic NTK
  ${_ape_kernels_test_dir}/edge_test.cpp         # T = 1, tile boundaries, determinism
  ${_ape_kernels_test_dir}/decode_test.cpp       # KV-cache decoding, the attention transition
  ${_ape_kernels_test_dir}/registry_test.cpp     # the registry and the manifests
  ${_ape_kernels_test_dir}/levels_test.cpp       # instruction-set levels
  ${APE_SOURCE_DIR}/test/unit/kernel_reference.cpp)
target_include_directories(ape_kernels_test PRIVATE
  ${APE_SOURCE_DIR}/kernels/include ${APE_SOURCE_DIR}/test/unit ${_ape_kernels_test_dir}
  ${APE_SOURCE_DIR})  # runtime/FiniteDifference.h (header only): the central differences of ape-check
target_compile_definitions(ape_kernels_test PRIVATE
  APE_EXAMPLE_SPECS_DIR="${APE_SOURCE_DIR}/examples/encodings")
# Compiled as two unity batches of seven files: each file alone would parse LibTorch's headers
# again (~12 s of CPU each, ~8 s even with a precompiled header): clean build without ccache on the
# shared 2-core machine, CPU seconds: the monolith 54, one compilation per file 166 (with a
# precompiled header), two batches 84, which keep both cores busy and recompile half the suite
# after an edit. (kernel_reference.cpp, also a source of the CUDA suites, compiles on its own.)
set_target_properties(ape_kernels_test PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 7)
set_source_files_properties(${APE_SOURCE_DIR}/test/unit/kernel_reference.cpp PROPERTIES
                            SKIP_UNITY_BUILD_INCLUSION ON)
target_compile_options(ape_kernels_test PRIVATE -O2)
target_link_libraries(ape_kernels_test PRIVATE ape_kernels "${TORCH_LIBRARIES}" GTest::gtest
                      nlohmann_json::nlohmann_json)
if(TARGET OpenMP::OpenMP_CXX)  # omp_set_num_threads in the determinism check
  target_link_libraries(ape_kernels_test PRIVATE OpenMP::OpenMP_CXX)
endif()
# ~1,000 tests in 12 shards (cmake/ApeGTestShards.cmake: one process per test spent more CPU
# starting LibTorch than most tests take).
include(${APE_SOURCE_DIR}/cmake/ApeGTestShards.cmake)
ape_gtest_shards(ape_kernels_test SHARDS 12 LABELS kernels TIMEOUT 1200)
