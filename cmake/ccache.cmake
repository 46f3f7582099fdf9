# Compiles through ccache where it is installed (deploy/setup.sh installs it), so a second
# build of the same sources (a fresh clone, CI's, a sanitizer build made again) takes the
# objects from ~/.cache/ccache instead of compiling them. Paths under the source folder are
# hashed relative to it (CCACHE_BASEDIR) and the build folder is left out of the hash
# (CCACHE_NOHASHDIR), so two clones in different places share the cache. A launcher given
# on the command line (-DCMAKE_CXX_COMPILER_LAUNCHER=...) wins; -DDELTASERVE_CCACHE=OFF
# turns it off.
option(DELTASERVE_CCACHE "Compile through ccache when it is installed" ON)
if(DELTASERVE_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(DELTASERVE_CCACHE_PROGRAM ccache)
  if(DELTASERVE_CCACHE_PROGRAM)
    set(_ds_launcher env CCACHE_BASEDIR=${CMAKE_SOURCE_DIR} CCACHE_NOHASHDIR=true
                     ${DELTASERVE_CCACHE_PROGRAM})
    set(CMAKE_C_COMPILER_LAUNCHER ${_ds_launcher})
    set(CMAKE_CXX_COMPILER_LAUNCHER ${_ds_launcher})
    set(CMAKE_CUDA_COMPILER_LAUNCHER ${_ds_launcher})
    message(STATUS "Compiling through ${DELTASERVE_CCACHE_PROGRAM}")
  endif()
endif()
