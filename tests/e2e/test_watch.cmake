# tests/e2e/test_watch.cmake: end-to-end tests of `gpusync watch` (issue 4), through the real CLI,
# the sandbox sshd and the WAN simulator.
gs_add_test(test_watch LABEL e2e SOURCES test_watch.c
    LIBS gs_test_fixtures wansim_harness gs_common PkgConfig::CMOCKA PkgConfig::JANSSON
         Threads::Threads
    TIMEOUT 400)
# the test runs $GS_BUILD_DIR/cli/gpusync and tests/tools/wansim, so building it builds them
add_dependencies(test_watch gpusync wansim)
