# ape_cuda_kernels_test (included from test/CMakeLists.txt when CUDA is enabled): the CUDA
# kernels of ape_cuda_kernels against the fp64 LibTorch reference and the CPU kernels. A host
# program (the host compiler, CPU LibTorch); the GPU tests skip cleanly without a device, the
# registry tests run everywhere.
add_executable(ape_cuda_kernels_test
  ${APE_SOURCE_DIR}/test/unit/cuda_kernels_test.cpp
  ${APE_SOURCE_DIR}/test/unit/kernel_reference.cpp)
target_include_directories(ape_cuda_kernels_test PRIVATE
  ${APE_SOURCE_DIR}/kernels/include ${APE_SOURCE_DIR}/test/unit)
target_compile_options(ape_cuda_kernels_test PRIVATE -O2)
target_link_libraries(ape_cuda_kernels_test PRIVATE ape_cuda_kernels ape_kernels CUDA::cudart
                      "${TORCH_LIBRARIES}" GTest::gtest nlohmann_json::nlohmann_json)
gtest_discover_tests(ape_cuda_kernels_test
  PROPERTIES LABELS "cuda" TIMEOUT 600
  DISCOVERY_TIMEOUT 60)
