# tests/integration/sftp_ops.cmake: registers the SFTP transport's integration test (real sshd);
# included from tests/integration/CMakeLists.txt. Sources are absolute so any includer works.
gs_add_test(test_sftp_ops LABEL integration
    SOURCES ${GS_ROOT}/tests/integration/test_sftp_ops.c
    LIBS gs_remote gs_common gs_test_fixtures PkgConfig::CMOCKA
    TIMEOUT 120)
