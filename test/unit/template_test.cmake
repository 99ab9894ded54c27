# GoogleTest suite of the CPU attention template (kernels/include/ape) against a LibTorch
# reference. Included from test/CMakeLists.txt; Torch, GTest and OpenMP must already be found.
# Paths are relative to this file, so the fragment also works from a scratch project.
include(GoogleTest)
get_filename_component(APE_TEMPLATE_TEST_ROOT "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)

add_executable(ape_template_test ${CMAKE_CURRENT_LIST_DIR}/cpu_template_test.cpp)
target_include_directories(ape_template_test PRIVATE ${APE_TEMPLATE_TEST_ROOT}/kernels/include)
target_compile_options(ape_template_test PRIVATE -O3 -march=native)
target_link_libraries(ape_template_test PRIVATE GTest::gtest_main OpenMP::OpenMP_CXX
                      "${TORCH_LIBRARIES}")
gtest_discover_tests(ape_template_test DISCOVERY_TIMEOUT 60)
