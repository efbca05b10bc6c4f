# tests/e2e/json_contract.cmake: test_json_contract, the JSON contract of docs/json-contract.md
# checked against the built gpusync and the sandbox sshd (label e2e). Include it from
# tests/e2e/CMakeLists.txt:  include(${CMAKE_CURRENT_SOURCE_DIR}/json_contract.cmake)
find_package(Threads REQUIRED)

gs_add_test(test_json_contract LABEL e2e SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_json_contract.c
    LIBS gs_test_fixtures gs_common PkgConfig::CMOCKA PkgConfig::JANSSON Threads::Threads
    TIMEOUT 300)
# the test runs $GS_BUILD_DIR/cli/gpusync (and the agent it installs), so build those first
foreach(dep gpusync gpusync-agent)
    if(TARGET ${dep})
        add_dependencies(test_json_contract ${dep})
    endif()
endforeach()
