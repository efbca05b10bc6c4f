# tests/integration/launch.cmake: registers the run supervisor's integration test (`gpusync-agent
# launch|tail|ps|stop` run locally against a temporary project; no sshd); included from
# tests/integration/CMakeLists.txt. Sources are absolute so any includer works. The test finds
# the agent as $GS_BUILD_DIR/agent/gpusync-agent ($GS_AGENT overrides).
gs_add_test(test_launch LABEL integration
    SOURCES ${GS_ROOT}/tests/integration/test_launch.c
    LIBS PkgConfig::JANSSON PkgConfig::CMOCKA
    TIMEOUT 180)
if(TARGET gpusync-agent)
    add_dependencies(test_launch gpusync-agent)
endif()
