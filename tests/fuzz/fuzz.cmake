# fuzz.cmake - the fuzz targets of tests/fuzz/ (included by tests.cmake).
#
# Every build (gcc or clang, plain, ASan or under valgrind) links each
# target against replay.c and registers ctest `fuzz.<target>`, which runs
# the target over its saved crashing inputs (regressions/<target>/), its
# hand-written seeds (seeds/<target>/) and, for the SSE parser, the
# recorded streams. With -DMIRZA_FUZZ=ON (needs clang; use it together
# with -DMIRZA_SANITIZE=ON) the libFuzzer binaries fuzz_<target> are built
# too, and the engine libraries get coverage instrumentation; scripts/fuzz
# drives them.
option(MIRZA_FUZZ "Build the libFuzzer targets (needs CC=clang)" OFF)

set(FUZZ_DIR ${CMAKE_SOURCE_DIR}/tests/fuzz)
set(FUZZ_TARGETS sse frame http_error json jsonstream guard)

function(mirza_fuzz_link target name)
  if(name STREQUAL "json")
    target_link_libraries(${target} PRIVATE mirza_lua PkgConfig::LUA)
  else()
    target_link_libraries(${target} PRIVATE mirza_core)
  endif()
endfunction()

foreach(t ${FUZZ_TARGETS})
  add_executable(fuzz_replay_${t} ${FUZZ_DIR}/fuzz_${t}.c ${FUZZ_DIR}/replay.c)
  mirza_fuzz_link(fuzz_replay_${t} ${t})
  set(inputs ${FUZZ_DIR}/regressions/${t} ${FUZZ_DIR}/seeds/${t})
  if(t STREQUAL "sse")
    list(APPEND inputs ${CMAKE_SOURCE_DIR}/tests/fixtures ${CMAKE_SOURCE_DIR}/tests/fixtures/traces)
  endif()
  add_test(NAME fuzz.${t} COMMAND fuzz_replay_${t} ${inputs})
  set_tests_properties(fuzz.${t} PROPERTIES LABELS fuzz TIMEOUT 300)
endforeach()

if(MIRZA_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "MIRZA_FUZZ needs clang (CC=clang)")
  endif()
  if(NOT MIRZA_SANITIZE)
    message(WARNING "MIRZA_FUZZ without MIRZA_SANITIZE: only crashes and failed checks are found")
  endif()
  target_compile_options(mirza_core PRIVATE -fsanitize=fuzzer-no-link)
  target_compile_options(mirza_lua PRIVATE -fsanitize=fuzzer-no-link)
  set(bins)
  foreach(t ${FUZZ_TARGETS})
    list(APPEND bins fuzz_${t})
    add_executable(fuzz_${t} ${FUZZ_DIR}/fuzz_${t}.c)
    mirza_fuzz_link(fuzz_${t} ${t})
    target_compile_options(fuzz_${t} PRIVATE -fsanitize=fuzzer)
    target_link_options(fuzz_${t} PRIVATE -fsanitize=fuzzer)
  endforeach()
  add_custom_target(fuzz DEPENDS ${bins})
endif()
