# ape-train, ape-eval and ape-generate (included from tools/CMakeLists.txt). Plain LibTorch executables: they link
# the runtime and the generated kernels library (ape_kernels defines ape::kernel_registry).
find_package(CLI11 CONFIG QUIET)  # header-only; /usr/include/CLI is found without it
foreach(_ape_tool train eval generate)
  add_executable(ape-${_ape_tool} ${CMAKE_CURRENT_LIST_DIR}/ape_${_ape_tool}.cpp)
  target_link_libraries(ape-${_ape_tool} PRIVATE ape_runtime ape_kernels)
  add_dependencies(ape-${_ape_tool} apec)  # --spec runs it
  if(TARGET CLI11::CLI11)
    target_link_libraries(ape-${_ape_tool} PRIVATE CLI11::CLI11)
  endif()
endforeach()
unset(_ape_tool)

# ape-check (docs/ape-check.md): a spec's kernel against the reference evaluated from the spec's
# regions. It runs apec (a separate process: this side never links MLIR) and checks the kernel
# compiled into this build from the same example file, or compiles another spec (SpecLibrary).
add_executable(ape-check ${CMAKE_CURRENT_LIST_DIR}/ape_check.cpp)
target_link_libraries(ape-check PRIVATE ape_runtime ape_kernels ape_runtime_simt)
# --cuda loads a spec's emulated CUDA kernels compiled at run time (SpecLibrary: load_spec_simt),
# whose references to the emulator (ape_simt) resolve against this program's exported symbols.
set_target_properties(ape-check PROPERTIES ENABLE_EXPORTS ON)
if(TARGET CLI11::CLI11)
  target_link_libraries(ape-check PRIVATE CLI11::CLI11)
endif()
target_compile_definitions(ape-check PRIVATE APE_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_dependencies(ape-check apec)
