# tests/e2e/test_journey.cmake: a new user's first session against an AutoDL-like setup, step by step
# (issue 13).
find_package(Threads REQUIRED)

gs_add_test(test_journey LABEL e2e SOURCES test_journey.c
    LIBS gs_test_fixtures gs_common PkgConfig::CMOCKA PkgConfig::JANSSON Threads::Threads
    TIMEOUT 600)
if(TARGET gpusync)
    add_dependencies(test_journey gpusync)
endif()
if(TARGET gpusync-agent)
    add_dependencies(test_journey gpusync-agent)
endif()
