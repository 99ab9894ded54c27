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
gtest_discover_tests(ape_simt_kernels_test
  PROPERTIES LABELS "cuda;simt" TIMEOUT 1200 ENVIRONMENT "APE_SIMT_QUIET=0"
  DISCOVERY_TIMEOUT 120)

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
endif()

add_library(ape_simt_planted STATIC ${APE_SOURCE_DIR}/test/cuda/simt_planted_kernels.cpp)
ape_simt_kernel_flags(ape_simt_planted)
add_executable(ape_simt_checks_test ${APE_SOURCE_DIR}/test/cuda/simt_checks_test.cpp)
target_link_libraries(ape_simt_checks_test PRIVATE ape_simt_planted "${TORCH_LIBRARIES}"
                      GTest::gtest_main)
set_target_properties(ape_simt_checks_test PROPERTIES ENABLE_EXPORTS ON)
gtest_discover_tests(ape_simt_checks_test PROPERTIES LABELS "cuda;simt" DISCOVERY_TIMEOUT 60)
