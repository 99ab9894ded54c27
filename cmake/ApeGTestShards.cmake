# ape_gtest_shards(TARGET SHARDS N [LABELS ...] [TIMEOUT S] [ENVIRONMENT ...] [WORKING_DIRECTORY D])
#
# Registers the GoogleTest executable TARGET as N ctest tests, TARGET_shard_<i>_of_<N>, each running
# every N-th test of the executable (GoogleTest's own sharding: GTEST_TOTAL_SHARDS and
# GTEST_SHARD_INDEX; every test runs in exactly one shard). For the large suites, instead of
# gtest_discover_tests' one process per test: each process start loads LibTorch, ~1 s of CPU, and
# the ~1,400 single-test processes of the kernel and emulated-CUDA suites spent ~23 of a CI run's
# CPU minutes starting up. A failing shard's output (ctest --output-on-failure) names each failed
# test; `TARGET --gtest_filter=NAME` reruns one. Each shard writes its GoogleTest report to
# build/Testing/gtest/<test>.xml, from which scripts/test.sh counts the cases, so the counts it
# prints do not depend on how the suites are split. A shard whose
# tests all skip (GTEST_SKIP, e.g. no GPU) still passes: scripts/test.sh counts the skipped cases.
function(ape_gtest_shards target)
  cmake_parse_arguments(A "" "SHARDS;TIMEOUT;WORKING_DIRECTORY" "LABELS;ENVIRONMENT" ${ARGN})
  if(NOT A_SHARDS OR A_SHARDS LESS 1)
    message(FATAL_ERROR "ape_gtest_shards(${target}): SHARDS must be >= 1")
  endif()
  if(NOT A_WORKING_DIRECTORY)
    set(A_WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  endif()
  math(EXPR last "${A_SHARDS} - 1")
  foreach(i RANGE 0 ${last})
    set(name ${target}_shard_${i}_of_${A_SHARDS})
    # The shard's report (scripts/test.sh counts the cases from these; a shard that dies writes none).
    add_test(NAME ${name} COMMAND ${target} --gtest_output=xml:${CMAKE_BINARY_DIR}/Testing/gtest/${name}.xml
             WORKING_DIRECTORY ${A_WORKING_DIRECTORY})
    set(env GTEST_TOTAL_SHARDS=${A_SHARDS} GTEST_SHARD_INDEX=${i} ${A_ENVIRONMENT})
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${env}")
    if(A_LABELS)
      set_tests_properties(${name} PROPERTIES LABELS "${A_LABELS}")
    endif()
    if(A_TIMEOUT)
      set_tests_properties(${name} PROPERTIES TIMEOUT ${A_TIMEOUT})
    endif()
  endforeach()
endfunction()
