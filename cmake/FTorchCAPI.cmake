# The C interface from its one definition (src/capi/*.capi, read by src/capi/generate.py): the C
# headers (FTORCH_C_HEADERS, in the build's include/) and the Fortran module of bind(c) interfaces
# (FTORCH_C_API_FORTRAN). Files are rewritten only when their text changes (ninja's restat then
# rebuilds nothing that includes them).
file(GLOB _ftorch_capi_defs CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/src/capi/*.capi")
set(FTORCH_C_HEADER_DIR "${CMAKE_CURRENT_BINARY_DIR}/include")
set(FTORCH_C_API_FORTRAN "${CMAKE_CURRENT_BINARY_DIR}/fortran/ftorch_c_api.f90")
set(FTORCH_C_HEADERS "${FTORCH_C_HEADER_DIR}/ftorch_c.h")
foreach(_def IN LISTS _ftorch_capi_defs)
  get_filename_component(_concern "${_def}" NAME_WE)
  if(_concern MATCHES "^torchfort")
    # an API of another project under its own header names (generate.py: FOREIGN_PREFIXES)
    list(APPEND FTORCH_C_HEADERS "${FTORCH_C_HEADER_DIR}/${_concern}.h")
  else()
    list(APPEND FTORCH_C_HEADERS "${FTORCH_C_HEADER_DIR}/ftorch_c_${_concern}.h")
  endif()
endforeach()
add_custom_command(
  OUTPUT ${FTORCH_C_HEADERS} "${FTORCH_C_API_FORTRAN}"
  COMMAND "${Python_EXECUTABLE}" "${CMAKE_CURRENT_SOURCE_DIR}/src/capi/generate.py"
          "${CMAKE_CURRENT_SOURCE_DIR}/src/capi" "${FTORCH_C_HEADER_DIR}" "${FTORCH_C_API_FORTRAN}"
  DEPENDS ${_ftorch_capi_defs} "${CMAKE_CURRENT_SOURCE_DIR}/src/capi/generate.py"
  COMMENT "src/capi: C headers and the Fortran module ftorch_c_api"
  VERBATIM)
add_custom_target(ftorch_c_api ALL DEPENDS ${FTORCH_C_HEADERS} "${FTORCH_C_API_FORTRAN}")
