# tests/list.cmake: every test of gpusync in one table, each registered by gs_add_test
# (cmake/GsTest.cmake) with its label, timeout, sources, libraries and the programs it runs.
# Labels: unit (one module, no server), integration (a real sshd or the built agent, no CLI),
# e2e (the built gpusync driven as a user would, against the sandbox sshd). What each test covers
# is said at the top of its source file. Included from tests/CMakeLists.txt, so sources are
# relative to tests/.
#
# Not here: the agent's own tests (test_agent_proto, test_agent_jsonw, test_agent_serve,
# test_agent_fuzz), still registered in agent/CMakeLists.txt, and the trainer's, registered in
# trainer/tests/CMakeLists.txt because the trainer also builds alone on a server, without this
# file (they are named trainer.*).
find_package(Threads REQUIRED)

# Libraries, by what a test drives.
set(common_libs gs_common PkgConfig::CMOCKA)
set(remote_libs gs_remote gs_common PkgConfig::CMOCKA)
set(syncd_libs gs_syncd PkgConfig::CMOCKA)
set(cli_libs gs_test_fixtures gs_common PkgConfig::CMOCKA PkgConfig::JANSSON Threads::Threads)
set(wan_libs ${cli_libs} wansim_harness)
# Programs an end-to-end test runs: the CLI, and the agent it installs on the server.
set(cli_runs gpusync gpusync-agent)

# ---- unit -------------------------------------------------------------------------------------
gs_add_test(test_common     LABEL unit TIMEOUT 300 SOURCES unit/test_common.c   LIBS ${common_libs})
gs_add_test(test_config     LABEL unit TIMEOUT 300 SOURCES unit/test_config.c   LIBS ${common_libs})
gs_add_test(test_shell      LABEL unit TIMEOUT 300 SOURCES unit/test_shell.c
    LIBS gs_test_fixtures ${common_libs})
gs_add_test(test_quote      LABEL unit TIMEOUT 120 SOURCES unit/test_quote.c
    LIBS gs_test_fixtures ${common_libs})
gs_add_test(test_hostkey    LABEL unit TIMEOUT 300 SOURCES unit/test_hostkey.c
    LIBS gs_remote gs_common PkgConfig::LIBSSH2 PkgConfig::CMOCKA)
gs_add_test(test_target     LABEL unit TIMEOUT 300 SOURCES unit/test_target.c   LIBS ${remote_libs})
gs_add_test(test_auth       LABEL unit TIMEOUT 300 SOURCES unit/test_auth.c     LIBS ${remote_libs})
gs_add_test(test_delta_unit LABEL unit TIMEOUT 120 SOURCES unit/test_delta.c   LIBS ${remote_libs}
    ${GS_RSYNC_LIB})
gs_add_test(test_run_stream LABEL unit TIMEOUT 300 SOURCES unit/test_run_stream.c
    LIBS ${remote_libs})
gs_add_test(test_hash       LABEL unit TIMEOUT 120 SOURCES unit/test_hash.c     LIBS ${syncd_libs})
gs_add_test(test_ignore     LABEL unit TIMEOUT 120 SOURCES unit/test_ignore.c   LIBS ${syncd_libs})
gs_add_test(test_scan       LABEL unit TIMEOUT 120 SOURCES unit/test_scan.c     LIBS ${syncd_libs})
gs_add_test(test_linked     LABEL unit TIMEOUT 120 SOURCES unit/test_linked.c   LIBS ${syncd_libs})
gs_add_test(test_index      LABEL unit TIMEOUT 120 SOURCES unit/test_index.c    LIBS ${syncd_libs})
gs_add_test(test_verify     LABEL unit TIMEOUT 120 SOURCES unit/test_verify.c   LIBS ${syncd_libs})
gs_add_test(test_plan       LABEL unit TIMEOUT 120 SOURCES unit/test_plan.c     LIBS ${syncd_libs})
gs_add_test(test_watcher    LABEL unit TIMEOUT 120 SOURCES unit/test_watcher.c  LIBS ${syncd_libs})
gs_add_test(test_control    LABEL unit TIMEOUT 120 SOURCES unit/test_control.c  LIBS ${syncd_libs})
gs_add_test(test_resident_memory LABEL unit TIMEOUT 120 SOURCES unit/test_resident_memory.c
    LIBS ${syncd_libs})
gs_add_test(test_agent_proto LABEL unit TIMEOUT 300 SOURCES unit/test_agent_proto.c
    LIBS gs_agent_proto PkgConfig::CMOCKA)
gs_add_test(test_zframes    LABEL unit TIMEOUT 120 SOURCES unit/test_zframes.c  LIBS ${remote_libs})
gs_add_test(test_agent_jsonw LABEL unit TIMEOUT 300
    SOURCES unit/test_agent_jsonw.c ${GS_ROOT}/agent/jsonw.c ${GS_ROOT}/agent/wrapper.c
    LIBS PkgConfig::CMOCKA)

# ---- integration ------------------------------------------------------------------------------
gs_add_test(test_ssh         LABEL integration TIMEOUT 240 SOURCES integration/test_ssh.c
    LIBS gs_test_fixtures gs_remote gs_common PkgConfig::LIBSSH2 PkgConfig::CMOCKA Threads::Threads)
gs_add_test(test_sftp_ops    LABEL integration TIMEOUT 120 SOURCES integration/test_sftp_ops.c
    LIBS gs_remote gs_common gs_test_fixtures PkgConfig::CMOCKA)
gs_add_test(test_agent_client LABEL integration TIMEOUT 300 SOURCES integration/test_agent_client.c
    LIBS gs_remote gs_common gs_test_fixtures wansim_harness PkgConfig::CMOCKA PkgConfig::XXHASH
    DEPENDS gpusync-agent gpusync-agent-plain wansim)
gs_add_test(test_delta       LABEL integration TIMEOUT 120 SOURCES integration/test_delta.c
    LIBS gs_remote gs_common gs_test_fixtures PkgConfig::CMOCKA PkgConfig::XXHASH
    DEPENDS gpusync-agent gpusync-agent-plain)
gs_add_test(test_launch      LABEL integration TIMEOUT 180 SOURCES integration/test_launch.c
    LIBS PkgConfig::JANSSON PkgConfig::CMOCKA DEPENDS gpusync-agent)
gs_add_test(test_agent_serve LABEL integration TIMEOUT 180
    SOURCES integration/test_agent_serve.c integration/agent_harness.c
    LIBS gs_agent_proto PkgConfig::CMOCKA DEPENDS gpusync-agent)
gs_add_test(test_agent_fuzz  LABEL integration TIMEOUT 240 SKIP_RETURN_CODE 77
    COMMAND sh ${GS_ROOT}/agent/fuzz/run_fuzz.sh ${GS_ROOT} ${PROJECT_BINARY_DIR}/agent/fuzz 20)
gs_add_test(test_wansim      LABEL integration TIMEOUT 60 SOURCES tools/test_wansim.c
    LIBS wansim_harness PkgConfig::CMOCKA Threads::Threads DEPENDS wansim)

# ---- e2e --------------------------------------------------------------------------------------
gs_add_test(test_cli_basic     LABEL e2e TIMEOUT 300 SOURCES e2e/test_cli_basic.c
    LIBS ${cli_libs} DEPENDS gpusync)
gs_add_test(test_json_contract LABEL e2e TIMEOUT 300 SOURCES e2e/test_json_contract.c
    LIBS ${cli_libs} DEPENDS ${cli_runs})
gs_add_test(test_push          LABEL e2e TIMEOUT 400 SOURCES e2e/test_push.c
    LIBS ${wan_libs} DEPENDS ${cli_runs} wansim)
gs_add_test(test_pull          LABEL e2e TIMEOUT 300 SOURCES e2e/test_pull.c
    LIBS ${wan_libs} DEPENDS ${cli_runs} wansim)
gs_add_test(test_watch         LABEL e2e TIMEOUT 900 SOURCES e2e/test_watch.c
    LIBS ${wan_libs} DEPENDS ${cli_runs} wansim)
gs_add_test(test_editor_saves  LABEL e2e TIMEOUT 400 SOURCES e2e/test_editor_saves.c
    LIBS ${cli_libs} PkgConfig::XXHASH DEPENDS ${cli_runs})
gs_add_test(test_runs          LABEL e2e TIMEOUT 400 SOURCES e2e/test_runs.c
    LIBS ${wan_libs} DEPENDS ${cli_runs} wansim)
gs_add_test(test_top           LABEL e2e TIMEOUT 300 SOURCES e2e/test_top.c
    LIBS ${cli_libs} DEPENDS ${cli_runs})
gs_add_test(test_gpus          LABEL e2e TIMEOUT 300 SOURCES e2e/test_gpus.c
    LIBS ${cli_libs} DEPENDS ${cli_runs})
gs_add_test(test_nodes         LABEL e2e TIMEOUT 300 SOURCES e2e/test_nodes.c
    LIBS ${cli_libs} DEPENDS ${cli_runs})
# a real single-host Slurm (tests/fixtures/slurm-cluster.sh); exits 77 where it cannot start
gs_add_test(test_slurm         LABEL slurm TIMEOUT 300 SKIP_RETURN_CODE 77
    SOURCES e2e/test_slurm.c LIBS ${cli_libs} DEPENDS ${cli_runs})
gs_add_test(test_fence         LABEL e2e TIMEOUT 400 SOURCES e2e/test_fence.c
    LIBS ${cli_libs} DEPENDS ${cli_runs})
# Alone: it kills the listener that every test's pushes share (one per agent build on the
# sandbox server, which is this machine's root) and expects the next push to find none.
gs_add_test(test_resident      LABEL e2e TIMEOUT 300 SOURCES e2e/test_resident.c
    LIBS ${cli_libs} DEPENDS ${cli_runs} SERIAL)
gs_add_test(test_faults        LABEL e2e TIMEOUT 600 SOURCES e2e/test_faults.c
    LIBS ${wan_libs} DEPENDS ${cli_runs} wansim)
gs_add_test(test_server_check  LABEL e2e TIMEOUT 300 SOURCES e2e/test_server_check.c
    LIBS ${cli_libs} DEPENDS ${cli_runs})
gs_add_test(test_daemon_state  LABEL e2e TIMEOUT 300 SOURCES e2e/test_daemon_state.c
    LIBS ${cli_libs} DEPENDS ${cli_runs})
gs_add_test(test_status        LABEL e2e TIMEOUT 300 SOURCES e2e/test_status.c
    LIBS ${wan_libs} DEPENDS ${cli_runs} wansim)
gs_add_test(test_keys          LABEL e2e TIMEOUT 300 SOURCES e2e/test_keys.c
    LIBS ${cli_libs} DEPENDS ${cli_runs})
gs_add_test(test_shell_noise   LABEL e2e TIMEOUT 300 SOURCES e2e/test_shell_noise.c
    LIBS ${cli_libs} DEPENDS ${cli_runs})
gs_add_test(test_journey       LABEL e2e TIMEOUT 600 SOURCES e2e/test_journey.c
    LIBS ${cli_libs} DEPENDS ${cli_runs})

# ---- e2e: the editor integrations (ide/), scripts that start their own sandbox sshd ----------
# Each exits 77 (skipped) when its editor is missing; VS Code's needs node and npm to be found.
set(ide_env "GPUSYNC_BIN=$<TARGET_FILE:gpusync>")
foreach(editor nvim emacs jetbrains)
    gs_add_test(ide_${editor}  LABEL e2e TIMEOUT 400 COMMAND ${GS_ROOT}/ide/${editor}/test.sh
        ENV ${ide_env} SKIP_RETURN_CODE 77)
endforeach()
find_program(GS_NODE node)
find_program(GS_NPM npm)
if(GS_NODE AND GS_NPM)
    gs_add_test(test_ide_vscode LABEL e2e TIMEOUT 600 COMMAND sh ${GS_ROOT}/ide/vscode/test.sh
        ENV ${ide_env})
    # The extension in a real VS Code (code-server) and headless Chromium: ~30 s, plus ~1 min to
    # install them on a fresh machine. Its own label too, so `ctest -LE vscode_real` leaves it out.
    gs_add_test(test_ide_vscode_real LABEL e2e TIMEOUT 600
        COMMAND ${GS_ROOT}/ide/vscode/test-real.sh ENV ${ide_env} SKIP_RETURN_CODE 77)
    set_tests_properties(test_ide_vscode_real PROPERTIES LABELS "e2e;vscode_real")
    # Both install into ide/vscode/node_modules: never at the same time.
    set_tests_properties(test_ide_vscode test_ide_vscode_real PROPERTIES
        RESOURCE_LOCK ide_vscode_node_modules)
else()
    message(STATUS "node/npm not found: test_ide_vscode is not registered")
endif()
