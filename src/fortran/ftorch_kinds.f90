!> Kind parameters and the standard units, for the other FTorch modules. They come from
!> `iso_c_binding` (the same values as `iso_fortran_env`’s with every supported compiler), so that
!> no FTorch source uses `iso_fortran_env`: flang warns about any use of it when a consumer compiles
!> with `-fdefault-real-8`, and FTorch’s sources must stay quiet under the consumer’s flags.
!> Not re-exported by `ftorch`: programs take these names from `iso_fortran_env` as usual.
module ftorch_kinds
  use, intrinsic :: iso_c_binding, only: c_int8_t, c_int16_t, c_int32_t, c_int64_t, c_float, c_double
  implicit none
  private
  public :: int8, int16, int32, int64, real32, real64, output_unit, error_unit

  !> Integer kinds of 8, 16, 32 and 64 bits.
  integer, parameter :: int8 = c_int8_t
  !> See `int8`.
  integer, parameter :: int16 = c_int16_t
  !> See `int8`.
  integer, parameter :: int32 = c_int32_t
  !> See `int8`.
  integer, parameter :: int64 = c_int64_t
  !> Real kinds of 32 and 64 bits (C’s float and double).
  integer, parameter :: real32 = c_float
  !> See `real32`.
  integer, parameter :: real64 = c_double
  !> Preconnected units of standard output and standard error (6 and 0 with gfortran, flang,
  !> Intel, NVIDIA and Cray Fortran).
  integer, parameter :: output_unit = 6
  !> See `output_unit`.
  integer, parameter :: error_unit = 0
end module ftorch_kinds
