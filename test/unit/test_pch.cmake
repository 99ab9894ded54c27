# ape_test_precompile_headers(target header...): one precompiled header for the files of a test
# executable that all include LibTorch (parsing its headers costs ~25 s of CPU per file; with the
# precompiled header a test file compiles in seconds). Under ccache, which caches a compilation
# that uses a precompiled header only with sloppiness pch_defines,time_macros, the target's
# launcher sets that sloppiness for its own compilations.
include_guard(GLOBAL)
function(ape_test_precompile_headers target)
  target_precompile_headers(${target} PRIVATE ${ARGN})
  get_target_property(_launcher ${target} CXX_COMPILER_LAUNCHER)
  if(_launcher MATCHES "ccache")
    set_target_properties(${target} PROPERTIES CXX_COMPILER_LAUNCHER
      "${CMAKE_COMMAND};-E;env;CCACHE_SLOPPINESS=pch_defines,time_macros;${_launcher}")
  endif()
endfunction()
