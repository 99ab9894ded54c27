# Flags and links shared by every MLIR-side target. LLVM/MLIR from Debian are built without
# exceptions and with RTTI; these targets match that and link the shared libMLIR/libLLVM.
function(ape_mlir_target target)
  target_include_directories(${target} PUBLIC ${APE_MLIR_INCLUDES})
  target_compile_definitions(${target} PUBLIC ${APE_LLVM_DEFINITIONS})
  target_compile_options(${target} PRIVATE -fno-exceptions -Wall -Wno-unused-parameter)
  target_link_libraries(${target} PUBLIC MLIR LLVM)
endfunction()
