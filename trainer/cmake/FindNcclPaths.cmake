# gt_find_nccl(): locate nccl.h and libnccl where GPU servers really have them, in this order:
# the CUDA toolkit, system paths, then the nvidia/nccl folder of a pip-installed PyTorch
# (nvidia-nccl-cu12 / -cu13). Sets GT_NCCL_INCLUDE, GT_NCCL_LIB and GT_NCCL_FROM in the caller.

function(gt_nccl_pip_dirs out)
    set(dirs "")
    find_program(GT_PYTHON3 NAMES python3 python)
    if(GT_PYTHON3)
        execute_process(
            COMMAND ${GT_PYTHON3} -c
                "import site,sys; print(';'.join(site.getsitepackages()+[site.getusersitepackages()]))"
            OUTPUT_VARIABLE py_sites OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
            RESULT_VARIABLE py_rc TIMEOUT 20)
        if(py_rc EQUAL 0)
            list(APPEND dirs ${py_sites})
        endif()
    endif()
    # Common places when the python that has torch is not the first on PATH (venvs, conda).
    file(GLOB globbed
        $ENV{HOME}/.local/lib/python3*/site-packages
        $ENV{VIRTUAL_ENV}/lib/python3*/site-packages
        $ENV{CONDA_PREFIX}/lib/python3*/site-packages
        /usr/local/lib/python3*/dist-packages /usr/lib/python3/dist-packages
        /opt/conda/lib/python3*/site-packages)
    list(APPEND dirs ${globbed})
    set(result "")
    foreach(d IN LISTS dirs)
        if(EXISTS "${d}/nvidia/nccl/include/nccl.h")
            list(APPEND result "${d}/nvidia/nccl")
        endif()
    endforeach()
    set(${out} "${result}" PARENT_SCOPE)
endfunction()

function(gt_find_nccl)
    set(tk_inc ${CUDAToolkit_INCLUDE_DIRS})
    set(tk_lib ${CUDAToolkit_LIBRARY_DIR})
    find_path(inc nccl.h PATHS ${tk_inc} NO_DEFAULT_PATH)
    find_library(lib NAMES nccl PATHS ${tk_lib} NO_DEFAULT_PATH)
    set(from "the CUDA toolkit")
    if(NOT inc OR NOT lib)
        unset(inc CACHE)
        unset(lib CACHE)
        find_path(inc nccl.h)
        find_library(lib NAMES nccl)
        set(from "system paths")
    endif()
    if(NOT inc OR NOT lib)
        unset(inc CACHE)
        unset(lib CACHE)
        gt_nccl_pip_dirs(pip_dirs)
        foreach(d IN LISTS pip_dirs)
            # pip wheels ship only libnccl.so.2, without the unversioned link.
            file(GLOB pip_libs "${d}/lib/libnccl.so*")
            if(pip_libs)
                list(GET pip_libs 0 lib)
                set(inc "${d}/include")
                set(from "pip PyTorch (${d})")
                break()
            endif()
        endforeach()
    endif()
    if(inc AND lib)
        set(GT_NCCL_INCLUDE "${inc}" PARENT_SCOPE)
        set(GT_NCCL_LIB "${lib}" PARENT_SCOPE)
        set(GT_NCCL_FROM "${from}" PARENT_SCOPE)
    endif()
    unset(inc CACHE)
    unset(lib CACHE)
endfunction()
