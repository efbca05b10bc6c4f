# tests/e2e/test_watch.cmake: end-to-end tests of `gpusync watch` (issue 4), through the real CLI,
# the sandbox sshd and the WAN simulator.
# the test runs $GS_BUILD_DIR/cli/gpusync and tests/tools/wansim, so building it builds them
gs_add_e2e(test_watch TIMEOUT 400 LIBS wansim_harness)
add_dependencies(test_watch wansim)
