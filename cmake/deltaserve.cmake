# Small helpers that keep the per-folder CMake files short.

set(DELTASERVE_WARNINGS -Wall -Wextra -Wpedantic -Wno-missing-field-initializers)
if(DELTASERVE_WERROR)
  list(APPEND DELTASERVE_WARNINGS -Werror)
endif()

# The baseline ISA: AVX2 + FMA + F16C (DESIGN.md "Backends"). Wider kernels (AVX-512,
# VNNI) live in their own source files compiled with deltaserve_isa_sources() and are
# chosen at run time from CPUID.
set(DELTASERVE_BASE_ISA -mavx2 -mfma -mf16c)

# deltaserve_add_library(<folder> [DEPS ...] [PRIVATE_DEPS ...])
# Builds deltaserve_<folder> (alias deltaserve::<folder>) from <folder>/src/*.cpp with
# public headers in <folder>/include.
function(deltaserve_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  if(NOT ARG_SOURCES)
    file(GLOB ARG_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/*.cpp)
  endif()
  add_library(deltaserve_${name} STATIC ${ARG_SOURCES})
  add_library(deltaserve::${name} ALIAS deltaserve_${name})
  target_include_directories(deltaserve_${name} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include)
  target_compile_options(deltaserve_${name} PRIVATE ${DELTASERVE_WARNINGS} ${DELTASERVE_BASE_ISA})
  target_link_libraries(deltaserve_${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
endfunction()

# deltaserve_add_test(<name> SOURCES ... DEPS ... [LABELS ...] [COST N] [SERIAL])
function(deltaserve_add_test name)
  cmake_parse_arguments(ARG "SERIAL" "COST" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE ${DELTASERVE_WARNINGS} ${DELTASERVE_BASE_ISA})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} deltaserve_test_support GTest::gtest_main)
  set(props "")
  if(ARG_LABELS)
    list(APPEND props LABELS "${ARG_LABELS}")
  endif()
  # ctest -j starts the costliest tests first; a clean clone has no timings of its own.
  if(ARG_COST)
    list(APPEND props COST ${ARG_COST})
  endif()
  # SERIAL: runs with no other test beside it (it changes what the machine shares).
  if(ARG_SERIAL)
    list(APPEND props RUN_SERIAL TRUE)
  endif()
  if(props)
    list(PREPEND props PROPERTIES)
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 ${props})
endfunction()
