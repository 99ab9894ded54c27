# Instruction-set levels (ape/cpu/dispatch.h): on x86-64 the kernel is compiled three times, as
# it is (baseline x86-64) and through two generated wrappers for AVX2+FMA and AVX-512, and the best
# level the CPU runs is chosen when the library is first used; APE_CPU_LEVEL=baseline|avx2|avx512
# forces one. Elsewhere (aarch64: NEON is its baseline) the baseline unit alone.
set(ape_levels 1)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  foreach(level 1 2)
    set(wrapper ${CMAKE_CURRENT_BINARY_DIR}/@NAME@_cpu_level${level}.cpp)
    file(GENERATE OUTPUT ${wrapper} CONTENT
         "#define APE_KERNEL_LEVEL ${level}\n#include \"${CMAKE_CURRENT_SOURCE_DIR}/@NAME@_cpu.cpp\"\n")
    target_sources(@TARGET@ PRIVATE ${wrapper})
  endforeach()
  set(ape_levels 7)
endif()
target_compile_definitions(@TARGET@ PRIVATE APE_KERNEL_LEVELS=${ape_levels})
# The library has no KV-cache decode API (docs/decoding.md): the decode steps are not compiled.
target_compile_definitions(@TARGET@ PRIVATE APE_KERNEL_DECODE=0)
