# tests/e2e/test_fence.cmake: end-to-end tests of one writer per remote root (issue 11): a stalled
# session fenced out, a killed upload's temporary swept, push and watch sharing a project.
# the test runs $GS_BUILD_DIR/cli/gpusync, which uploads the agent built beside it
gs_add_e2e(test_fence TIMEOUT 400)
