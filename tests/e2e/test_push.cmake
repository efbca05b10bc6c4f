# tests/e2e/test_push.cmake: end-to-end tests of `gpusync push`, `pull` and `status` against the
# sandbox sshd, with the WAN simulator for the kill-mid-transfer cases (issue 3).
find_package(Threads REQUIRED)

gs_add_test(test_push LABEL e2e SOURCES test_push.c
    LIBS gs_test_fixtures wansim_harness gs_common PkgConfig::CMOCKA PkgConfig::JANSSON
         Threads::Threads
    TIMEOUT 400)
# the test runs $GS_BUILD_DIR/cli/gpusync and tests/tools/wansim, so building it builds them too
if(TARGET gpusync)
    add_dependencies(test_push gpusync)
endif()
if(TARGET wansim)
    add_dependencies(test_push wansim)
endif()
