# GoogleTest suite of the contract between the stages (contract/vocabulary.h): the closed
# vocabularies, the shape symbol, the init-argument table and the shared math (ALiBi slopes, the
# sinusoid, the pairing rule) against values written out here. Header-only, no LibTorch: it builds
# in seconds. Included from test/CMakeLists.txt.
include(GoogleTest)
add_executable(ape_abi_test ${CMAKE_CURRENT_LIST_DIR}/abi_test.cpp)
target_include_directories(ape_abi_test PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../../kernels/include)
target_link_libraries(ape_abi_test PRIVATE GTest::gtest_main)
# The dialect's ODS file, read as text: its vocabulary summaries spell what vocabulary.h accepts.
target_compile_definitions(ape_abi_test PRIVATE
  APE_ODS_FILE="${CMAKE_CURRENT_LIST_DIR}/../../dialect/ApeOps.td")
gtest_discover_tests(ape_abi_test DISCOVERY_TIMEOUT 60)
