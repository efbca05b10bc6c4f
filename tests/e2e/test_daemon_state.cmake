# tests/e2e/test_daemon_state.cmake: the watch daemon's state folder, conflicts, outages and control
# socket (issues 12 and 13).
gs_add_e2e(test_daemon_state TIMEOUT 300)
