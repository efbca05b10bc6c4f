# tests/e2e/test_shell_noise.cmake: a server whose login shell prints before every command (issue
# 13): push, run, pull, exec and the daemon read past it; doctor names the file; SFTP fails clearly.
find_package(Threads REQUIRED)

gs_add_test(test_shell_noise LABEL e2e SOURCES test_shell_noise.c
    LIBS gs_test_fixtures gs_common PkgConfig::CMOCKA PkgConfig::JANSSON Threads::Threads
    TIMEOUT 300)
if(TARGET gpusync)
    add_dependencies(test_shell_noise gpusync)
endif()
if(TARGET gpusync-agent)
    add_dependencies(test_shell_noise gpusync-agent)
endif()
