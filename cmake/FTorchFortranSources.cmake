# The Fortran sources we ship: hand-written ones plus those generated from fypp templates and,
# ftorch_c_api, from the C interface's definition (src/capi).
# FTORCH_FORTRAN_SOURCES lists them in compilation (module dependency) order.
set(_src "${CMAKE_CURRENT_SOURCE_DIR}/src/fortran")
set(_gen "${CMAKE_CURRENT_BINARY_DIR}/fortran")
file(MAKE_DIRECTORY "${_gen}")

set(FTORCH_FORTRAN_SOURCES)
foreach(_name IN ITEMS ftorch_kinds ftorch_c_api ftorch_types ftorch_devices ftorch_errors ftorch_interop ftorch_runtime ftorch_tensor_type ftorch_callbacks ftorch_math
                       ftorch_autograd ftorch_tensor ftorch_function ftorch_saved_tensors ftorch_functional
                       ftorch_arglist ftorch_model ftorch_optim ftorch_loss ftorch_distributed ftorch_node_shared
                       ftorch_data_parallel ftorch_checkpoint ftorch_train ftorch_python
                       ftorch_test_utils ftorch torch_ftn torchfort)
  if(_name STREQUAL "ftorch_c_api")
    list(APPEND FTORCH_FORTRAN_SOURCES "${FTORCH_C_API_FORTRAN}")  # (cmake/FTorchCAPI.cmake)
  elseif(EXISTS "${_src}/${_name}.fypp")
    add_custom_command(
      OUTPUT "${_gen}/${_name}.f90"
      # Written only when the text changes (see the C headers in CMakeLists.txt).
      COMMAND "${Python_EXECUTABLE}" -m fypp -I "${_src}" "${_src}/${_name}.fypp" "${_gen}/${_name}.f90.new"
      COMMAND "${CMAKE_COMMAND}" -E copy_if_different "${_gen}/${_name}.f90.new" "${_gen}/${_name}.f90"
      DEPENDS "${_src}/${_name}.fypp" "${_src}/ftorch_common.fypp" "${_src}/ftorch_enums.fypp" "${_src}/ftorch_handles.fypp"
              "${_src}/ftorch_callback_kinds.fypp" "${_src}/torchfort_rl.fypp"
      COMMENT "fypp ${_name}.fypp"
      VERBATIM)
    list(APPEND FTORCH_FORTRAN_SOURCES "${_gen}/${_name}.f90")
  else()
    list(APPEND FTORCH_FORTRAN_SOURCES "${_src}/${_name}.f90")
  endif()
endforeach()
add_custom_target(ftorch_fortran_sources ALL DEPENDS ${FTORCH_FORTRAN_SOURCES})

# File names (no directories), in order, for the CMake config and the pkg-config file.
set(FTORCH_FORTRAN_SOURCE_NAMES)
foreach(_f IN LISTS FTORCH_FORTRAN_SOURCES)
  get_filename_component(_n "${_f}" NAME)
  list(APPEND FTORCH_FORTRAN_SOURCE_NAMES "${_n}")
endforeach()
