# Instruction-set levels of the CPU kernels (kernels/include/ape/cpu/dispatch.h), included from
# test/CMakeLists.txt after kernels_test.cmake:
#   - kernels_cpu_level_<x>: ape_kernels_test's choice tests with APE_CPU_LEVEL=x for every level
#     and a bad name: a forced lower level runs (and matches the reference through the registry),
#     a level the CPU lacks or an unknown name is refused with its reason. (Every level against
#     the reference, and APE_CPU_LEVEL unset, are the discovered CpuLevels.* tests.)
#   - cpu_levels_isa: objdump of libape_kernels.a: AVX only in the avx2 / avx512 units, and there
#     only in their level's namespace or local code (test/unit/cpu_levels_isa.py);
#   - cpu_levels_qemu: the kernels on emulated older CPUs (qemu-x86_64: Haswell without AVX-512,
#     Nehalem without AVX) choose their level by themselves and match native runs
#     (cpu_levels_qemu.sh, ape_cpu_levels_probe); needs qemu-user (scripts/install-deps.sh).
foreach(level baseline avx2 avx512 sse9)
  add_test(NAME kernels_cpu_level_${level}
           COMMAND ape_kernels_test
                   --gtest_filter=CpuLevelChoice.*:CpuLevels.ChoiceFollowsEnvironment)
  set_tests_properties(kernels_cpu_level_${level} PROPERTIES
                       ENVIRONMENT APE_CPU_LEVEL=${level} LABELS kernels TIMEOUT 120)
endforeach()

# The bf16 products by VDPBF16PS (cpu/attention.h, gemm_avx512bf16; opt-in with
# APE_CPU_AVX512BF16=1 on CPUs with AVX512-BF16 and no AMX), taken on an AMX CPU too: APE_CPU_AMX=0
# turns the tiles off. Skipped where the CPU has no AVX512-BF16.
add_test(NAME kernels_cpu_avx512bf16 COMMAND ape_kernels_test --gtest_filter=*CpuAmxVsReference*)
# Every case skips together (no AVX512-BF16): ctest then reports the test skipped, not passed.
set_tests_properties(kernels_cpu_avx512bf16 PROPERTIES
                     ENVIRONMENT "APE_CPU_AMX=0;APE_CPU_AVX512BF16=1" LABELS kernels TIMEOUT 300
                     SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")

if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND "avx2" IN_LIST APE_CPU_LEVELS
   AND "avx512" IN_LIST APE_CPU_LEVELS)
  find_program(APE_OBJDUMP NAMES objdump)
  if(APE_OBJDUMP)
    add_test(NAME cpu_levels_isa
             COMMAND /usr/bin/python3 ${APE_SOURCE_DIR}/test/unit/cpu_levels_isa.py ${APE_OBJDUMP}
                     $<TARGET_FILE:ape_kernels>)
    set_tests_properties(cpu_levels_isa PROPERTIES LABELS kernels TIMEOUT 300)
  endif()

  add_executable(ape_cpu_levels_probe ${APE_SOURCE_DIR}/test/unit/cpu_levels_probe.cpp)
  target_link_libraries(ape_cpu_levels_probe PRIVATE ape_kernels)
  find_program(APE_QEMU_X86_64 NAMES qemu-x86_64)
  if(APE_QEMU_X86_64)
    add_test(NAME cpu_levels_qemu
             COMMAND ${APE_SOURCE_DIR}/test/unit/cpu_levels_qemu.sh ${APE_QEMU_X86_64}
                     $<TARGET_FILE:ape_cpu_levels_probe> ${CMAKE_CURRENT_BINARY_DIR}/cpu_levels_qemu)
    set_tests_properties(cpu_levels_qemu PROPERTIES LABELS kernels TIMEOUT 600 SKIP_RETURN_CODE 77)
  else()
    message(STATUS "qemu-x86_64 not found: the test of the kernels on emulated older CPUs "
                   "(cpu_levels_qemu) is not registered; scripts/install-deps.sh installs qemu-user")
  endif()
endif()
