# tests/e2e/test_fence.cmake: end-to-end tests of one writer per remote root (issue 11): a stalled
# session fenced out, a killed upload's temporary swept, push and watch sharing a project.
find_package(Threads REQUIRED)

gs_add_test(test_fence LABEL e2e SOURCES test_fence.c
    LIBS gs_test_fixtures gs_common PkgConfig::CMOCKA PkgConfig::JANSSON Threads::Threads
    TIMEOUT 400)
# the test runs $GS_BUILD_DIR/cli/gpusync, which uploads the agent built beside it
if(TARGET gpusync)
    add_dependencies(test_fence gpusync)
endif()
if(TARGET gpusync-agent)
    add_dependencies(test_fence gpusync-agent)
endif()
