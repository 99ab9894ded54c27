# ape_nvcc_job_pool(TARGET): compiles TARGET's sources in the Ninja job pool `ape_nvcc`, whose depth
# is the machine's memory divided by APE_NVCC_UNIT_MIB (at least 1, at most the core count): a
# `cmake --build -j$(nproc)` then never runs more nvcc at once than the memory holds. The default
# unit budget is twice the largest peak measured for one CUDA translation unit
# (bench/results/cuda_compile_memory.md). Other generators ignore job pools.
# Included by the top-level CMakeLists.txt, test/cuda/standalone and the emitted CUDA folders carry
# the same few lines (codegen/templates).
set(APE_NVCC_UNIT_MIB 2048 CACHE STRING "Memory budgeted per concurrent nvcc (MiB)")
cmake_host_system_information(RESULT _ape_mem_mib QUERY TOTAL_PHYSICAL_MEMORY)
cmake_host_system_information(RESULT _ape_cores QUERY NUMBER_OF_LOGICAL_CORES)
math(EXPR _ape_nvcc_depth "${_ape_mem_mib} / ${APE_NVCC_UNIT_MIB}")
if(_ape_nvcc_depth LESS 1)
  set(_ape_nvcc_depth 1)
endif()
if(_ape_nvcc_depth GREATER _ape_cores)
  set(_ape_nvcc_depth ${_ape_cores})
endif()
set_property(GLOBAL APPEND PROPERTY JOB_POOLS ape_nvcc=${_ape_nvcc_depth})
function(ape_nvcc_job_pool target)
  set_property(TARGET ${target} PROPERTY JOB_POOL_COMPILE ape_nvcc)
endfunction()
