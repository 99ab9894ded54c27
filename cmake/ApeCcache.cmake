# Compiler cache: when ccache is installed (scripts/install-deps.sh installs it), every C, C++ and
# CUDA compile of the project goes through it, so a clean checkout (CI's, a second worktree) reuses
# the objects an earlier build of the same sources made. Paths are rewritten relative to the
# checkout (CCACHE_BASEDIR), so checkouts at different paths share the cache. APE_CCACHE=OFF turns
# it off; a machine without ccache builds as before.
option(APE_CCACHE "Compile through ccache when it is installed" ON)
if(APE_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(APE_CCACHE_PROGRAM ccache)
  if(APE_CCACHE_PROGRAM)
    get_filename_component(_ape_checkout "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
    set(_ape_launcher ${CMAKE_COMMAND} -E env CCACHE_BASEDIR=${_ape_checkout} CCACHE_NOHASHDIR=1
        ${APE_CCACHE_PROGRAM})
    foreach(_lang C CXX CUDA)
      set(CMAKE_${_lang}_COMPILER_LAUNCHER ${_ape_launcher})
    endforeach()
    message(STATUS "ccache: ${APE_CCACHE_PROGRAM} (base ${_ape_checkout})")
  endif()
endif()
