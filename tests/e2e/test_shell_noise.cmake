# tests/e2e/test_shell_noise.cmake: a server whose login shell prints before every command (issue
# 13): push, run, pull, exec and the daemon read past it; doctor names the file; SFTP fails clearly.
gs_add_e2e(test_shell_noise TIMEOUT 300)
