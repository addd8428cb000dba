# tests.cmake - every test tier behind ctest:
#   c/            cmocka, one executable per engine file (Lua-free)
#   lua/          busted unit specs, run with build/mirza as the interpreter
#   integration/  busted specs against mirza-sim over real loopback HTTP
set(TEST_ENV
  "MIRZA_BIN=$<TARGET_FILE:mirza>"
  "MIRZA_SIM=$<$<TARGET_EXISTS:mirza-sim>:$<TARGET_FILE:mirza-sim>>"
  "MIRZA_SOURCE_DIR=${CMAKE_SOURCE_DIR}"
  "MIRZA_FIXTURES=${CMAKE_SOURCE_DIR}/tests/fixtures"
  "MIRZA_TRACES=${CMAKE_SOURCE_DIR}/tests/fixtures/traces"
  "MIRZA_BUILD_DIR=${CMAKE_BINARY_DIR}"
  "XDG_RUNTIME_DIR=${CMAKE_BINARY_DIR}/runtime"
  "XDG_STATE_HOME=${CMAKE_BINARY_DIR}/state") # mirza chat saves its conversations there, not in ~
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/runtime)
# The portable build (macOS's code paths) also takes the tests' own ways of
# a system without /proc: ps and lsof in tests/helper.lua and
# tests/leftovers.sh, as on macOS (docs/testing.md, "On macOS"); and the
# stand-ins for GNU tools a Mac lacks: perl's alarm in scripts/timeout
# (every spec's time limit), perl's clock where `date` has no %N
# (tests/sim/smoke.sh).
set(MIRZA_TEST_PROC_ENV "")
if(MIRZA_PORTABLE)
  set(MIRZA_TEST_PROC_ENV "MIRZA_TEST_NO_PROC=1" "MIRZA_TIMEOUT_TOOL=perl" "MIRZA_TEST_NO_GNU_DATE=1")
  list(APPEND TEST_ENV ${MIRZA_TEST_PROC_ENV})
endif()

# ctest's limit for one cmocka or busted test, in seconds (scripts/mutate
# configures its copy with less: a mutant that makes a test hang costs that).
set(MIRZA_TEST_TIMEOUT 300 CACHE STRING "ctest's limit for one C or Lua test, in seconds")

if(CMOCKA_FOUND)
  file(GLOB C_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/c/test_*.c)
  foreach(src ${C_TESTS})
    get_filename_component(name ${src} NAME_WE)
    add_executable(${name} ${src})
    target_link_libraries(${name} PRIVATE mirza_core PkgConfig::CMOCKA)
    add_test(NAME c.${name} COMMAND ${name})
    set_tests_properties(c.${name} PROPERTIES ENVIRONMENT "${TEST_ENV}" LABELS c TIMEOUT ${MIRZA_TEST_TIMEOUT})
  endforeach()
endif()

find_program(BUSTED busted)
if(BUSTED)
  foreach(tier lua integration)
    file(GLOB specs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/${tier}/*_spec.lua)
    foreach(spec ${specs})
      get_filename_component(name ${spec} NAME_WE)
      add_test(NAME ${tier}.${name}
        COMMAND $<TARGET_FILE:mirza> ${BUSTED} --config-file=${CMAKE_SOURCE_DIR}/tests/busted-config.lua
                -o utfTerminal --helper=${CMAKE_SOURCE_DIR}/tests/helper.lua ${spec}
        WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
      set_tests_properties(${tier}.${name} PROPERTIES ENVIRONMENT "${TEST_ENV}" LABELS ${tier} TIMEOUT ${MIRZA_TEST_TIMEOUT})
    endforeach()
  endforeach()
else()
  message(WARNING "busted not found: Lua spec tiers are not registered")
endif()

# --- The benchmarks are built and run briefly, so that they cannot rot
# (their figures are not checked here; see docs/performance.md).
if(TARGET mirza_core)
  file(GLOB C_BENCHES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/c/bench_*.c)
  foreach(src ${C_BENCHES})
    get_filename_component(name ${src} NAME_WE)
    add_executable(${name} ${src})
    target_link_libraries(${name} PRIVATE mirza_core)
    add_test(NAME bench.${name} COMMAND ${name} 20000)
    set_tests_properties(bench.${name} PROPERTIES ENVIRONMENT "${TEST_ENV}" LABELS bench TIMEOUT 120)
  endforeach()
endif()

# --- mirza-sim's own end-to-end smoke test, with curl as an independent client.
find_program(BASH bash)
if(TARGET mirza-sim AND BASH)
  add_test(NAME sim.smoke COMMAND ${BASH} ${CMAKE_SOURCE_DIR}/tests/sim/smoke.sh $<TARGET_FILE:mirza-sim>)
  set_tests_properties(sim.smoke PROPERTIES ENVIRONMENT "${TEST_ENV}" LABELS sim TIMEOUT 300)
  # libcurl alone on a batch's traffic (tests/c/curl_floor.c): the floor the
  # bench prints under its batch rows, run briefly so that it cannot rot
  add_executable(curl_floor ${CMAKE_SOURCE_DIR}/tests/c/curl_floor.c)
  target_link_libraries(curl_floor PRIVATE PkgConfig::CURL)
  add_test(NAME bench.curl_floor COMMAND ${BASH} ${CMAKE_SOURCE_DIR}/tests/sim/floor.sh $<TARGET_FILE:mirza-sim>
    $<TARGET_FILE:curl_floor>)
  set_tests_properties(bench.curl_floor PROPERTIES ENVIRONMENT "${TEST_ENV}" LABELS bench TIMEOUT 120)
endif()

# --- The official OpenAI SDK (npm openai, pinned) against mirza-sim in both dialects
# (issue 21): installed into the build tree on first run; skipped (77) without node/npm.
if(TARGET mirza-sim AND BASH)
  add_test(NAME sdk.conformance COMMAND ${BASH} ${CMAKE_SOURCE_DIR}/tests/sdk/run.sh $<TARGET_FILE:mirza-sim>
                                        ${CMAKE_BINARY_DIR})
  set_tests_properties(sdk.conformance PROPERTIES ENVIRONMENT "${TEST_ENV}" LABELS sim TIMEOUT 600 SKIP_RETURN_CODE 77)
endif()

# --- Fuzz targets: replayed over their saved inputs here; libFuzzer builds with -DMIRZA_FUZZ=ON.
include(${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz.cmake)

# --- No process the suite started outlives it (issue 19): hygiene.start runs
# first and hygiene.leftovers after every other test, also under -j and -R
# (ctest adds both to any selection); leftovers.sh names and stops what is left.
get_property(ALL_TESTS DIRECTORY PROPERTY TESTS)
if(BASH)
  add_test(NAME hygiene.start COMMAND ${BASH} ${CMAKE_SOURCE_DIR}/tests/leftovers.sh start ${CMAKE_BINARY_DIR})
  add_test(NAME hygiene.leftovers COMMAND ${BASH} ${CMAKE_SOURCE_DIR}/tests/leftovers.sh check ${CMAKE_BINARY_DIR})
  set_tests_properties(hygiene.start PROPERTIES FIXTURES_SETUP suite_run LABELS hygiene TIMEOUT 60
                                                ENVIRONMENT "${MIRZA_TEST_PROC_ENV}")
  set_tests_properties(hygiene.leftovers PROPERTIES FIXTURES_CLEANUP suite_run LABELS hygiene TIMEOUT 60
                                                    SKIP_RETURN_CODE 77 ENVIRONMENT "${MIRZA_TEST_PROC_ENV}")
  foreach(t ${ALL_TESTS})
    set_property(TEST ${t} APPEND PROPERTY FIXTURES_REQUIRED suite_run)
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "MIRZA_BUILD_DIR=${CMAKE_BINARY_DIR}" "MIRZA_TEST_NAME=${t}")
  endforeach()
endif()
