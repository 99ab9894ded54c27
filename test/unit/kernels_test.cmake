# ape_kernels_test (included from test/CMakeLists.txt): numerics of every generated kernel of
# ape_kernels against an independent fp64 LibTorch reference (kernel_reference.cpp), finite
# differences, the hand-checkable values of the encodings spec, edge cases and the registry.
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

add_executable(ape_kernels_test
  ${APE_SOURCE_DIR}/test/unit/kernels_test.cpp
  ${APE_SOURCE_DIR}/test/unit/kernel_reference.cpp)
target_include_directories(ape_kernels_test PRIVATE
  ${APE_SOURCE_DIR}/kernels/include ${APE_SOURCE_DIR}/test/unit)
target_compile_options(ape_kernels_test PRIVATE -O2)
target_link_libraries(ape_kernels_test PRIVATE ape_kernels "${TORCH_LIBRARIES}" GTest::gtest
                      nlohmann_json::nlohmann_json)
if(TARGET OpenMP::OpenMP_CXX)  # omp_set_num_threads in the determinism check
  target_link_libraries(ape_kernels_test PRIVATE OpenMP::OpenMP_CXX)
endif()
gtest_discover_tests(ape_kernels_test
  PROPERTIES LABELS kernels TIMEOUT 300
  DISCOVERY_TIMEOUT 60)
