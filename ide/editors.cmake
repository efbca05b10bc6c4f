# ide/editors.cmake: registers the end-to-end tests of the editor integrations (Neovim, Emacs,
# JetBrains External Tools). Each is a shell script that starts its own sandbox server, drives the
# real editor (or the tools' command lines) with the gpusync built here, and stops the server.
# Include it from the top-level CMakeLists.txt after the cli/ folder: include(ide/editors.cmake).
# A script exits 77 (skipped) when its editor is not installed.
foreach(gs_editor nvim emacs jetbrains)
    add_test(NAME ide_${gs_editor} COMMAND ${CMAKE_CURRENT_LIST_DIR}/${gs_editor}/test.sh)
    set_tests_properties(ide_${gs_editor} PROPERTIES
        LABELS e2e
        TIMEOUT 400
        SKIP_RETURN_CODE 77
        ENVIRONMENT "GPUSYNC_BIN=$<TARGET_FILE:gpusync>;GS_BUILD_DIR=${PROJECT_BINARY_DIR}")
endforeach()
