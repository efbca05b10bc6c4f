# tests/e2e/test_journey.cmake: a new user's first session against an AutoDL-like setup, step by step
# (issue 13).
gs_add_e2e(test_journey TIMEOUT 600)
