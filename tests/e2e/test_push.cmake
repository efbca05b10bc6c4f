# tests/e2e/test_push.cmake: end-to-end tests of `gpusync push`, `pull` and `status` against the
# sandbox sshd, with the WAN simulator for the kill-mid-transfer cases (issue 3).
# the test runs $GS_BUILD_DIR/cli/gpusync and tests/tools/wansim, so building it builds them too
gs_add_e2e(test_push TIMEOUT 400 LIBS wansim_harness)
add_dependencies(test_push wansim)
