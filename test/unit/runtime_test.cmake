# ape_runtime_test (included from test/CMakeLists.txt): GoogleTest suite of the LibTorch runtime.
# It links ape_kernels because the runtime's registry lookup needs ape::kernel_registry; the tests
# use private test-only kernels, and also smoke-test every registered (generated) encoding.
if(NOT TARGET GTest::gtest_main)
  find_package(GTest REQUIRED)
endif()
include(GoogleTest)
add_executable(ape_runtime_test ${CMAKE_CURRENT_LIST_DIR}/runtime_test.cpp ${CMAKE_CURRENT_LIST_DIR}/resume_test.cpp
               ${CMAKE_CURRENT_LIST_DIR}/spec_library_test.cpp ${CMAKE_CURRENT_LIST_DIR}/distributed_test.cpp
               ${CMAKE_CURRENT_LIST_DIR}/spec_reference_test.cpp)
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
