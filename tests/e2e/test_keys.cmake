# tests/e2e/test_keys.cmake: end-to-end tests of keys and hosts (issue 13): gpusync's key tried by
# default and installed once, `hosts add` preparing a second node, one index per node however it is
# written, and the authentication errors, against two password sandboxes.
find_package(Threads REQUIRED)

gs_add_test(test_keys LABEL e2e SOURCES test_keys.c
    LIBS gs_test_fixtures gs_common PkgConfig::CMOCKA PkgConfig::JANSSON Threads::Threads
    TIMEOUT 300)
# the test runs $GS_BUILD_DIR/cli/gpusync, which uploads the agent built beside it
if(TARGET gpusync)
    add_dependencies(test_keys gpusync)
endif()
if(TARGET gpusync-agent)
    add_dependencies(test_keys gpusync-agent)
endif()
