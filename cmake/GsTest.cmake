# gs_add_test: the one way a gpusync test is registered (tests/list.cmake calls it for every test,
# as libuv's test/test-list.h lists its tests for one runner).
#
#   gs_add_test(NAME LABEL <unit|integration|e2e|gpu> [TIMEOUT s]
#               SOURCES file.c ... [LIBS ...] [DEPENDS target ...]
#             | COMMAND program args ...
#               [ENV "K=V" ...] [SKIP_RETURN_CODE n] [SERIAL])
#
# SOURCES builds a test executable NAME, placed in the build tree beside its first source's folder
# (tests/unit/test_x.c -> build/tests/unit/test_x); DEPENDS names the programs it runs, so building
# the test builds them. COMMAND registers a script or program instead. Every test gets
# GS_BUILD_DIR and GS_SOURCE_DIR in its environment, ENV adds more; TIMEOUT defaults to 300.
# SERIAL: ctest runs it alone, never beside another test (scripts/test.sh runs the others two at a
# time): for a test that kills or counts what every test on the sandbox server shares.
function(gs_add_test name)
    cmake_parse_arguments(T "SERIAL" "LABEL;TIMEOUT;SKIP_RETURN_CODE" "SOURCES;LIBS;DEPENDS;COMMAND;ENV"
        ${ARGN})
    if(T_SOURCES)
        gs_add_test_executable(${name} "${T_SOURCES}" "${T_LIBS}" "${T_DEPENDS}")
        add_test(NAME ${name} COMMAND ${name})
    else()
        add_test(NAME ${name} COMMAND ${T_COMMAND})
    endif()
    if(NOT T_TIMEOUT)
        set(T_TIMEOUT 300)
    endif()
    set(env GS_BUILD_DIR=${PROJECT_BINARY_DIR} GS_SOURCE_DIR=${GS_ROOT} ${T_ENV})
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABEL}" TIMEOUT ${T_TIMEOUT}
        ENVIRONMENT "${env}")
    if(DEFINED T_SKIP_RETURN_CODE)
        set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE ${T_SKIP_RETURN_CODE})
    endif()
    if(T_SERIAL)
        set_tests_properties(${name} PROPERTIES RUN_SERIAL TRUE)
    endif()
endfunction()

# The executable of a SOURCES test: sources relative to the calling folder, the repository root
# and tests/ on the include path, built into the build tree's mirror of its first source's folder.
function(gs_add_test_executable name sources libs depends)
    add_executable(${name} ${sources})
    target_link_libraries(${name} PRIVATE ${libs})
    target_include_directories(${name} PRIVATE ${GS_ROOT} ${GS_ROOT}/tests)
    list(GET sources 0 first)
    get_filename_component(first ${first} ABSOLUTE)
    get_filename_component(first_dir ${first} DIRECTORY)
    file(RELATIVE_PATH out_dir ${GS_ROOT} ${first_dir})
    set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY
        ${PROJECT_BINARY_DIR}/${out_dir})
    if(depends)
        add_dependencies(${name} ${depends})
    endif()
endfunction()
