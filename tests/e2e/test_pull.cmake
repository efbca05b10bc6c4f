# tests/e2e/test_pull.cmake: pull keeps unsynced local edits and refuses a listing that lies (issue 12).
find_package(Threads REQUIRED)

gs_add_test(test_pull LABEL e2e SOURCES test_pull.c
    LIBS gs_test_fixtures gs_common PkgConfig::CMOCKA PkgConfig::JANSSON Threads::Threads
    TIMEOUT 300)
if(TARGET gpusync)
    add_dependencies(test_pull gpusync)
endif()
if(TARGET gpusync-agent)
    add_dependencies(test_pull gpusync-agent)
endif()
