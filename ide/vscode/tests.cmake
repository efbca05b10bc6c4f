# ide/vscode/tests.cmake: registers the VS Code extension's tests (ide/vscode/test.sh: node --test
# against a fake `vscode` module driving the real gpusync, then the .vsix packaging) as an e2e
# test. Include it from a CMakeLists.txt that has the gpusync target, e.g. the top level:
#   include(ide/vscode/tests.cmake)
find_program(GS_NODE node)
find_program(GS_NPM npm)
if(GS_NODE AND GS_NPM)
    add_test(NAME test_ide_vscode COMMAND sh ${GS_ROOT}/ide/vscode/test.sh)
    set_tests_properties(test_ide_vscode PROPERTIES LABELS e2e TIMEOUT 600
        ENVIRONMENT "GPUSYNC_BIN=$<TARGET_FILE:gpusync>;GS_BUILD_DIR=${PROJECT_BINARY_DIR};GS_SOURCE_DIR=${GS_ROOT}")
else()
    message(STATUS "node/npm not found: test_ide_vscode is not registered")
endif()
