# ape-train, ape-eval and ape-generate (included from tools/CMakeLists.txt). Plain LibTorch executables: they link
# the runtime and the generated kernels library (ape_kernels defines ape::kernel_registry).
find_package(CLI11 CONFIG QUIET)  # header-only; /usr/include/CLI is found without it
foreach(_ape_tool train eval generate)
  add_executable(ape-${_ape_tool} ${CMAKE_CURRENT_LIST_DIR}/ape_${_ape_tool}.cpp)
  target_link_libraries(ape-${_ape_tool} PRIVATE ape_runtime ape_kernels)
  if(TARGET CLI11::CLI11)
    target_link_libraries(ape-${_ape_tool} PRIVATE CLI11::CLI11)
  endif()
endforeach()
unset(_ape_tool)
