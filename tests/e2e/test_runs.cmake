# tests/e2e/test_runs.cmake: end-to-end tests of `gpusync run/logs/ps/stop` (issue 6), multi-node
# runs included, through the real CLI, the sandbox sshd and the WAN simulator (label e2e).
find_package(Threads REQUIRED)
gs_add_test(test_runs LABEL e2e SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_runs.c
    LIBS gs_test_fixtures wansim_harness gs_common PkgConfig::CMOCKA PkgConfig::JANSSON
         Threads::Threads
    TIMEOUT 400)
# the test runs $GS_BUILD_DIR/cli/gpusync (which installs the agent) and tests/tools/wansim
add_dependencies(test_runs gpusync gpusync-agent wansim)
