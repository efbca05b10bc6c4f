# tests/e2e/test_faults.cmake: the randomised fault test of `gpusync watch` (issue 11): seeded
# operations with client, daemon, sshd and link faults, through the sandbox sshd and the WAN
# simulator. CI runs a few sequences; scripts/bench/faults.sh runs hundreds.
gs_add_test(test_faults LABEL e2e SOURCES test_faults.c
    LIBS gs_test_fixtures wansim_harness gs_common PkgConfig::CMOCKA PkgConfig::JANSSON
    TIMEOUT 600)
# the test runs $GS_BUILD_DIR/cli/gpusync (which installs the agent) and tests/tools/wansim
add_dependencies(test_faults gpusync gpusync-agent wansim)
