# gs_add_test(NAME LABEL <unit|integration|e2e|gpu> SOURCES ... [LIBS ...] [TIMEOUT s])
# Builds one test executable and registers it with ctest under its label, so every module's
# tests are declared the same way and `ctest -L unit` selects a layer.
function(gs_add_test name)
    cmake_parse_arguments(T "" "LABEL;TIMEOUT" "SOURCES;LIBS" ${ARGN})
    add_executable(${name} ${T_SOURCES})
    target_link_libraries(${name} PRIVATE ${T_LIBS})
    target_include_directories(${name} PRIVATE ${GS_ROOT} ${GS_ROOT}/tests)
    add_test(NAME ${name} COMMAND ${name})
    if(NOT T_TIMEOUT)
        set(T_TIMEOUT 300)
    endif()
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABEL}" TIMEOUT ${T_TIMEOUT}
        ENVIRONMENT "GS_BUILD_DIR=${PROJECT_BINARY_DIR};GS_SOURCE_DIR=${GS_ROOT}")
endfunction()
