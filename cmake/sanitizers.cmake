# Sanitizer and fuzzing builds (tests/README.md says how to run them).
#
#   -DDELTASERVE_SANITIZE=address,undefined   ASan + UBSan on every target (UBSan does not
#                                             recover: a report fails the test)
#   -DDELTASERVE_SANITIZE=thread              TSan on every target
#   -DDELTASERVE_FUZZ=ON                      libFuzzer harnesses (tests/fuzz/), clang only;
#                                             with DELTASERVE_SANITIZE=address,undefined the
#                                             same build runs the tests and the fuzzers
#
# The flags go on every target (compile and link), with frame pointers kept for the stack
# traces. System libraries (spdlog, Cap'n Proto, UCX, Boost) are not instrumented; the
# suppression files in tests/sanitizers/ name what they report, each with its reason.
set(DELTASERVE_SANITIZE "" CACHE STRING
    "Sanitizers for every target: address,undefined or thread (empty: none)")
option(DELTASERVE_FUZZ "Build the libFuzzer harnesses in tests/fuzz (needs clang)" OFF)

set(DELTASERVE_SANITIZER_FLAGS "")
if(DELTASERVE_SANITIZE)
  string(REPLACE "," ";" _ds_sanitizers "${DELTASERVE_SANITIZE}")
  foreach(s ${_ds_sanitizers})
    if(NOT s MATCHES "^(address|undefined|thread)$")
      message(FATAL_ERROR "DELTASERVE_SANITIZE: '${s}' is not one of address, undefined, thread")
    endif()
  endforeach()
  if("thread" IN_LIST _ds_sanitizers AND "address" IN_LIST _ds_sanitizers)
    message(FATAL_ERROR "DELTASERVE_SANITIZE: thread and address cannot be combined")
  endif()
  list(APPEND DELTASERVE_SANITIZER_FLAGS -fsanitize=${DELTASERVE_SANITIZE}
       -fno-omit-frame-pointer -fno-optimize-sibling-calls)
  if("undefined" IN_LIST _ds_sanitizers)
    list(APPEND DELTASERVE_SANITIZER_FLAGS -fno-sanitize-recover=all)
  endif()
endif()

if(DELTASERVE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "DELTASERVE_FUZZ needs clang (libFuzzer): configure with "
                        "-DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_C_COMPILER=clang-14 "
                        "(Debian 12: apt-get install clang-14 libclang-rt-14-dev), "
                        "or run tests/fuzz/run.sh, which does both")
  endif()
  # Every library carries coverage counters; only the harnesses link libFuzzer's main.
  list(APPEND DELTASERVE_SANITIZER_FLAGS -fsanitize=fuzzer-no-link)
endif()

if(DELTASERVE_SANITIZER_FLAGS)
  message(STATUS "deltaserve: instrumenting every target with ${DELTASERVE_SANITIZER_FLAGS}")
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${DELTASERVE_SANITIZER_FLAGS}>")
  add_link_options(${DELTASERVE_SANITIZER_FLAGS})
endif()
