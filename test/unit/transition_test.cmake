# GoogleTest suite of the attention transition (kernels/include/ape/contract/transition.h): the
# spec's hand row and the fused kernel against a materialised reference, with hand-written functors
# (no generated code, no LibTorch: it builds in seconds). Included from test/CMakeLists.txt.
include(GoogleTest)
add_executable(ape_transition_test ${CMAKE_CURRENT_LIST_DIR}/transition_test.cpp)
target_include_directories(ape_transition_test PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../../kernels/include)
target_compile_options(ape_transition_test PRIVATE -O2)
target_link_libraries(ape_transition_test PRIVATE GTest::gtest_main OpenMP::OpenMP_CXX)
gtest_discover_tests(ape_transition_test DISCOVERY_TIMEOUT 60)
