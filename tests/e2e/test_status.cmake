# tests/e2e/test_status.cmake: status, flush and events around a troubled watch daemon (issue 13),
# through the real CLI, the sandbox sshd and the WAN simulator.
gs_add_e2e(test_status TIMEOUT 300 LIBS wansim_harness)
add_dependencies(test_status wansim)
