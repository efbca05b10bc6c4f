# tests/e2e/test_runs.cmake: end-to-end tests of `gpusync run/logs/ps/stop` (issue 6), multi-node
# runs included, through the real CLI, the sandbox sshd and the WAN simulator (label e2e).
# the test runs $GS_BUILD_DIR/cli/gpusync (which installs the agent) and tests/tools/wansim
gs_add_e2e(test_runs TIMEOUT 400 LIBS wansim_harness)
add_dependencies(test_runs wansim)
