# tests/integration/agent_client.cmake: registers the agent client's integration test (real sshd,
# the built agent); included from tests/integration/CMakeLists.txt.
gs_add_test(test_agent_client LABEL integration
    SOURCES ${GS_ROOT}/tests/integration/test_agent_client.c
    LIBS gs_remote gs_common gs_test_fixtures PkgConfig::CMOCKA PkgConfig::XXHASH
    TIMEOUT 120)
add_dependencies(test_agent_client gpusync-agent)
