# Locate the torch Python package the C++ layer is built against and its LibTorch CMake package.
# Sets FTORCH_TORCH_VERSION (e.g. 2.13.0+cpu), FTORCH_TORCH_ROOT (the torch package dir) and
# FTORCH_TORCH_CUDA (torch's CUDA release, empty for a CPU build).
find_package(Python COMPONENTS Interpreter REQUIRED)
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import os, torch; print(torch.__version__); print(os.path.dirname(torch.__file__)); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE _torch_info
  RESULT_VARIABLE _torch_rc
  ERROR_VARIABLE _torch_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "FTorch needs the torch Python package in the build environment "
    "(${Python_EXECUTABLE}): ${_torch_err}\nInstall it (pip install torch==2.13.0) and build with "
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

find_package(Torch CONFIG REQUIRED PATHS "${FTORCH_TORCH_ROOT}/share/cmake/Torch" NO_DEFAULT_PATH)

# LibTorch's headers need C++20 from torch 2.14 on (C++17 before), but its CMake package only sets
# CXX_STANDARD on the torch target itself: make it a requirement of everything compiled against it.
string(REGEX MATCH "^[0-9]+\\.[0-9]+" _torch_release "${FTORCH_TORCH_VERSION}")
if(_torch_release VERSION_GREATER_EQUAL 2.14)
  set_property(TARGET torch APPEND PROPERTY INTERFACE_COMPILE_FEATURES cxx_std_20)
endif()
