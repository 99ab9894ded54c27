# ape_runtime_test (included from test/CMakeLists.txt): GoogleTest suite of the LibTorch runtime,
# one file per part under test/unit/runtime/ (runtime_fixtures.h: the shared private test kernels
# and helpers), plus the suites of resuming, the spec library, data parallelism and the spec
# reference. It links ape_kernels because the runtime's registry lookup needs ape::kernel_registry;
# the tests use private test-only kernels, and also smoke-test every registered (generated)
# encoding.
if(NOT TARGET GTest::gtest_main)
  find_package(GTest REQUIRED)
endif()
include(GoogleTest)
set(_ape_runtime_test_dir ${CMAKE_CURRENT_LIST_DIR}/runtime)
add_executable(ape_runtime_test
  ${_ape_runtime_test_dir}/manifest_test.cpp    # the manifest, ALiBi slopes, init kinds
  ${_ape_runtime_test_dir}/attention_test.cpp   # fused_attention against the reference
  ${_ape_runtime_test_dir}/model_test.cpp       # the model: overrides, tables, fixed params
  ${_ape_runtime_test_dir}/data_test.cpp        # token cache, windows, corpus
  ${_ape_runtime_test_dir}/checkpoint_test.cpp  # checkpoints
  ${_ape_runtime_test_dir}/train_test.cpp       # the training loop
  ${_ape_runtime_test_dir}/eval_test.cpp        # evaluation tables
  ${_ape_runtime_test_dir}/registered_test.cpp  # every generated encoding through the runtime
  ${_ape_runtime_test_dir}/generate_test.cpp    # ape-generate's scoring and sampling
  ${_ape_runtime_test_dir}/device_test.cpp      # --device / --precision, CUDA refusals, GPU habits
  ${CMAKE_CURRENT_LIST_DIR}/resume_test.cpp ${CMAKE_CURRENT_LIST_DIR}/spec_library_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/distributed_test.cpp ${CMAKE_CURRENT_LIST_DIR}/spec_reference_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/spec_check_test.cpp)
target_include_directories(ape_runtime_test PRIVATE ${CMAKE_CURRENT_LIST_DIR} ${_ape_runtime_test_dir})
# Two unity batches, as ape_kernels_test (kernels_test.cmake): one compilation per file would parse
# LibTorch's headers 13 times (clean build without ccache, CPU seconds: before the split, five
# files, 80; one per file with a precompiled header 125; two batches, spec_library_test.cpp on its
# own for its definitions, 65).
set_target_properties(ape_runtime_test PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 7)
target_link_libraries(ape_runtime_test PRIVATE ape_runtime ape_kernels GTest::gtest_main)
target_compile_definitions(ape_runtime_test PRIVATE APE_TEST_DATA_DIR="${CMAKE_SOURCE_DIR}/data/pg30")
# spec_library_test.cpp: its specs, and the kernel cache it compiles them into (runtime/SpecLibrary.h).
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/spec_library_test.cpp PROPERTIES COMPILE_DEFINITIONS
  "APE_TEST_SPEC_DIR=\"${CMAKE_CURRENT_LIST_DIR}/Inputs\";APE_TEST_SPEC_CACHE=\"${CMAKE_BINARY_DIR}/spec-cache\";APE_SOURCE_DIR=\"${CMAKE_SOURCE_DIR}\"")
add_dependencies(ape_runtime_test apec)
gtest_discover_tests(ape_runtime_test
  WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}
  PROPERTIES LABELS runtime TIMEOUT 300
  DISCOVERY_TIMEOUT 60)

# Training through the emulated CUDA kernels (runtime/SimtAttention.h).
add_executable(ape_runtime_simt_test ${CMAKE_CURRENT_LIST_DIR}/runtime_simt_test.cpp)
target_link_libraries(ape_runtime_simt_test PRIVATE ape_runtime_simt ape_runtime ape_kernels
                      GTest::gtest_main)
set_target_properties(ape_runtime_simt_test PROPERTIES ENABLE_EXPORTS ON)
gtest_discover_tests(ape_runtime_simt_test
  PROPERTIES LABELS "runtime;cuda;simt" TIMEOUT 900
  DISCOVERY_TIMEOUT 60)
