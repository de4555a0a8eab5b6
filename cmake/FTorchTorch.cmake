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
    # LibTorch's CUDA API (the CUDA-graph training step) includes cuda_runtime.h, which needs the
    # runtime's crt/ headers: in a CUDA toolkit, or NVIDIA's nvidia-cuda-crt package, not in what
    # torch's wheel depends on. Without them that step is left out (it then says how to get it).
    find_path(FTORCH_CUDA_CRT_DIR crt/host_config.h PATHS ${_cuda_includes} NO_DEFAULT_PATH)
    if(NOT FTORCH_CUDA_CRT_DIR)
      set(FTORCH_CUDA_GRAPHS_MISSING TRUE)
      message(STATUS "FTorch: no crt/host_config.h next to torch's CUDA runtime: CUDA-graph training steps left out "
                     "(pip install nvidia-cuda-crt==${FTORCH_TORCH_CUDA}.* and rebuild to have them)")
    endif()
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
