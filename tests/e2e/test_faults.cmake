# tests/e2e/test_faults.cmake: the randomised fault test of `gpusync watch` (issue 11): seeded
# operations with client, daemon, sshd and link faults, through the sandbox sshd and the WAN
# simulator. CI runs a few sequences; scripts/bench/faults.sh runs hundreds.
# the test runs $GS_BUILD_DIR/cli/gpusync (which installs the agent) and tests/tools/wansim
gs_add_e2e(test_faults TIMEOUT 600 LIBS wansim_harness)
add_dependencies(test_faults wansim)
