# tests/e2e/test_daemon_state.cmake: the watch daemon's state folder, conflicts, outages and control
# socket (issues 12 and 13).
find_package(Threads REQUIRED)

gs_add_test(test_daemon_state LABEL e2e SOURCES test_daemon_state.c
    LIBS gs_test_fixtures gs_common PkgConfig::CMOCKA PkgConfig::JANSSON Threads::Threads
    TIMEOUT 300)
if(TARGET gpusync)
    add_dependencies(test_daemon_state gpusync)
endif()
if(TARGET gpusync-agent)
    add_dependencies(test_daemon_state gpusync-agent)
endif()
