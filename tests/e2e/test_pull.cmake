# tests/e2e/test_pull.cmake: pull keeps unsynced local edits and refuses a listing that lies (issue
# 12).
gs_add_e2e(test_pull TIMEOUT 300)
