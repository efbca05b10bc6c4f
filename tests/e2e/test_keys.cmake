# tests/e2e/test_keys.cmake: end-to-end tests of keys and hosts (issue 13): gpusync's key tried by
# default and installed once, `hosts add` preparing a second node, one index per node however it is
# written, and the authentication errors, against two password sandboxes.
gs_add_e2e(test_keys TIMEOUT 300)
