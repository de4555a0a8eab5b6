# Locate the torch Python package the C++ layer is built against and its LibTorch CMake package.
# Sets FTORCH_TORCH_VERSION (e.g. X.Y.Z+cpu), FTORCH_TORCH_ROOT (the torch package dir) and
# FTORCH_TORCH_CUDA (torch's CUDA release, empty for a CPU build).
find_package(Python COMPONENTS Interpreter REQUIRED)
# The project's one torch pin (pyproject.toml's build requirements), for the messages below.
file(STRINGS "${CMAKE_CURRENT_SOURCE_DIR}/pyproject.toml" _ftorch_pin_line REGEX "\"torch==[^\"]+\"")
string(REGEX REPLACE ".*\"(torch==[^\"]+)\".*" "\\1" FTORCH_TORCH_PIN "${_ftorch_pin_line}")
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import os, torch; print(torch.__version__); print(os.path.dirname(torch.__file__)); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE _torch_info
  RESULT_VARIABLE _torch_rc
  ERROR_VARIABLE _torch_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "FTorch needs the torch Python package in the build environment "
    "(${Python_EXECUTABLE}): ${_torch_err}\nInstall it (pip install ${FTORCH_TORCH_PIN}) and build with "
    "pip install --no-build-isolation .")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 FTORCH_TORCH_VERSION)
list(GET _torch_info 1 FTORCH_TORCH_ROOT)
# The CUDA release of a CUDA build of torch, empty for a CPU build.
set(FTORCH_TORCH_CUDA "")
list(LENGTH _torch_info _torch_info_n)
if(_torch_info_n GREATER 2)
  list(GET _torch_info 2 FTORCH_TORCH_CUDA)
endif()
file(TO_CMAKE_PATH "${FTORCH_TORCH_ROOT}" FTORCH_TORCH_ROOT)
message(STATUS "FTorch: building against torch ${FTORCH_TORCH_VERSION} at ${FTORCH_TORCH_ROOT}")

# PyPI's Linux torch is a CUDA build, and LibTorch's CMake package then looks for a CUDA toolkit
# (nvcc) to define the CUDA runtime target its libraries link to (torch::cudart), even on a machine
# without a GPU. Compiling C++ against LibTorch needs no nvcc: only the CUDA runtime's headers and
# library, which torch's wheel brings along (NVIDIA's packages in site-packages, of torch's own CUDA
# release). Unless a CUDA toolkit is named (CMAKE_CUDA_COMPILER, CUDA_TOOLKIT_ROOT_DIR), the target
# is defined from those, and LibTorch's package skips its own search (cuda.cmake returns when the
# target exists).
if(FTORCH_TORCH_CUDA AND NOT TARGET torch::cudart AND NOT DEFINED CMAKE_CUDA_COMPILER
   AND NOT DEFINED CUDA_TOOLKIT_ROOT_DIR)
  get_filename_component(_nvidia "${FTORCH_TORCH_ROOT}/../nvidia" ABSOLUTE)
  string(REGEX MATCH "^[0-9]+" _cuda_major "${FTORCH_TORCH_CUDA}")
  file(GLOB _cuda_includes LIST_DIRECTORIES true "${_nvidia}/cu${_cuda_major}/include" "${_nvidia}/*/include")
  find_path(FTORCH_CUDART_INCLUDE_DIR cuda_runtime_api.h PATHS ${_cuda_includes} NO_DEFAULT_PATH)
  find_library(FTORCH_CUDART_LIBRARY NAMES cudart "libcudart.so.${_cuda_major}"
               PATHS "${_nvidia}/cu${_cuda_major}/lib" "${_nvidia}/cuda_runtime/lib" NO_DEFAULT_PATH)
  if(FTORCH_CUDART_INCLUDE_DIR AND FTORCH_CUDART_LIBRARY)
    message(STATUS "FTorch: CUDA ${FTORCH_TORCH_CUDA} runtime of torch's wheel: ${FTORCH_CUDART_LIBRARY}")
    add_library(torch::cudart INTERFACE IMPORTED)
    set_target_properties(torch::cudart PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_cuda_includes}"
                                                   INTERFACE_LINK_LIBRARIES "${FTORCH_CUDART_LIBRARY}")
    # LibTorch's CUDA API (the CUDA-graph steps) includes cuda_runtime.h and cuda_fp16.h, which need
    # the runtime's crt/ headers and (CUDA 13) CCCL's nv/target: in a CUDA toolkit, or NVIDIA's
    # nvidia-cuda-crt and nvidia-cuda-cccl packages, not in what torch's wheel depends on. Taken from
    # next to torch's runtime, else from a CUDA toolkit of the same major release on this machine
    # (CUDA_HOME, CUDA_PATH, nvcc's, /usr/local/cuda; after torch's own headers, which win). Without
    # them those steps are left out (they then say how to get them).
    set(_cuda_extra "")
    find_path(FTORCH_CUDA_CRT_DIR crt/host_config.h PATHS ${_cuda_includes} NO_DEFAULT_PATH)
    find_path(FTORCH_CUDA_WHEEL_NV_TARGET_DIR nv/target PATHS ${_cuda_includes} NO_DEFAULT_PATH PATH_SUFFIXES "" cccl)
    if(NOT FTORCH_CUDA_CRT_DIR OR (NOT FTORCH_CUDA_WHEEL_NV_TARGET_DIR AND _cuda_major GREATER_EQUAL 13))
      find_program(FTORCH_NVCC nvcc PATHS "$ENV{CUDA_HOME}/bin" "$ENV{CUDA_PATH}/bin" /usr/local/cuda/bin)
      if(FTORCH_NVCC)
        get_filename_component(FTORCH_NVCC_REAL "${FTORCH_NVCC}" REALPATH)
      endif()
      set(_toolkits "$ENV{CUDA_HOME}/include" "$ENV{CUDA_PATH}/include")
      if(FTORCH_NVCC)
        get_filename_component(_nvcc_bin "${FTORCH_NVCC_REAL}" DIRECTORY)
        list(APPEND _toolkits "${_nvcc_bin}/../include" "${_nvcc_bin}/../targets/${CMAKE_SYSTEM_PROCESSOR}-linux/include")
      endif()
      list(APPEND _toolkits /usr/local/cuda/include "/usr/local/cuda/targets/${CMAKE_SYSTEM_PROCESSOR}-linux/include")
      foreach(_dir IN LISTS _toolkits)
        if(NOT _cuda_extra AND EXISTS "${_dir}/crt/host_config.h" AND EXISTS "${_dir}/cuda_runtime_api.h")
          file(STRINGS "${_dir}/cuda_runtime_api.h" _cudart_version REGEX "#define[ \t]+CUDART_VERSION[ \t]+[0-9]+")
          string(REGEX MATCH "[0-9]+$" _cudart_version "${_cudart_version}")
          if(_cudart_version)
            math(EXPR _toolkit_major "${_cudart_version} / 1000")
            if(_toolkit_major EQUAL _cuda_major)
              get_filename_component(_dir "${_dir}" ABSOLUTE)
              set(_cuda_extra "${_dir}")
              if(IS_DIRECTORY "${_dir}/cccl")
                list(APPEND _cuda_extra "${_dir}/cccl")
              endif()
              message(STATUS "FTorch: the CUDA runtime's crt/ headers from the CUDA ${_toolkit_major} toolkit at ${_dir}")
            endif()
          endif()
        endif()
      endforeach()
    endif()
    find_path(FTORCH_CUDA_NV_TARGET_DIR nv/target PATHS ${_cuda_includes} ${_cuda_extra} NO_DEFAULT_PATH
              PATH_SUFFIXES "" cccl)
    if(NOT FTORCH_CUDA_CRT_DIR AND NOT _cuda_extra)
      set(FTORCH_CUDA_GRAPHS_MISSING TRUE)
      message(STATUS "FTorch: no crt/host_config.h next to torch's CUDA runtime and no CUDA ${_cuda_major} toolkit: "
                     "CUDA graphs left out (pip install nvidia-cuda-crt==${FTORCH_TORCH_CUDA}.* "
                     "nvidia-cuda-cccl==${FTORCH_TORCH_CUDA}.* and rebuild to have them)")
    elseif(NOT FTORCH_CUDA_NV_TARGET_DIR AND _cuda_major GREATER_EQUAL 13)
      set(FTORCH_CUDA_GRAPHS_MISSING TRUE)
      message(STATUS "FTorch: no nv/target (CCCL) next to torch's CUDA runtime: CUDA graphs left out "
                     "(pip install nvidia-cuda-cccl==${FTORCH_TORCH_CUDA}.* and rebuild to have them)")
    endif()
    set(_cuda_all_includes ${_cuda_includes} ${_cuda_extra})
    if(FTORCH_CUDA_NV_TARGET_DIR)
      list(APPEND _cuda_all_includes "${FTORCH_CUDA_NV_TARGET_DIR}")  # (found under a cccl/ folder: added too)
    endif()
    set_target_properties(torch::cudart PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_cuda_all_includes}")
  else()
    message(STATUS "FTorch: torch is a CUDA ${FTORCH_TORCH_CUDA} build without NVIDIA's runtime packages next "
                   "to it: LibTorch's CMake package looks for a CUDA toolkit")
  endif()
endif()

find_package(Torch CONFIG REQUIRED PATHS "${FTORCH_TORCH_ROOT}/share/cmake/Torch" NO_DEFAULT_PATH)

# LibTorch's headers need C++20 from torch 2.14 on (C++17 before), but its CMake package only sets
# CXX_STANDARD on the torch target itself: make it a requirement of everything compiled against it.
string(REGEX MATCH "^[0-9]+\\.[0-9]+" _torch_release "${FTORCH_TORCH_VERSION}")
if(_torch_release VERSION_GREATER_EQUAL 2.14)
  set_property(TARGET torch APPEND PROPERTY INTERFACE_COMPILE_FEATURES cxx_std_20)
endif()
