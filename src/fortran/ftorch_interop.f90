!> Conversions between Fortran and C values shared by the FTorch modules (not part of the API).
module ftorch_interop
  use, intrinsic :: iso_c_binding, only: c_associated, c_char, c_f_pointer, c_int, c_intptr_t, c_null_char, c_ptr
  implicit none
  private
  public :: c_flag, c_device_index, c_string, f_string, c_given

contains

  !> 1 for a present .true., 0 otherwise.
  integer(c_int) function c_flag(value)
    !> An optional flag; absent counts as .false.
    logical, intent(in), optional :: value
    c_flag = 0
    if (present(value)) then
      if (value) c_flag = 1
    end if
  end function c_flag

  !> The handle of an object passed as an optional argument that is given: its own handle, or,
  !> when it is not constructed, the C layer’s "unconstructed" value (-1), which a C call rejects
  !> as an error after releasing any expression arguments -- never mistaken for "absent" (null).
  type(c_ptr) function c_given(p)
    !> The object’s handle (null when not constructed).
    type(c_ptr), intent(in) :: p
    c_given = p
    if (.not. c_associated(p)) c_given = transfer(-1_c_intptr_t, p)
  end function c_given

  !> The device index, or -1 (the device type’s default) when absent.
  integer(c_int) function c_device_index(device_index)
    !> Index of the device (0-based, as in PyTorch), optional.
    integer, intent(in), optional :: device_index
    c_device_index = -1
    if (present(device_index)) c_device_index = int(device_index, c_int)
  end function c_device_index

  !> A NUL-terminated copy of `text` without leading and trailing blanks. The result’s length is
  !> a specification expression, not deferred: gfortran 12 keeps the length of a deferred-length
  !> result in a static variable, which threads calling at the same time would overwrite.
  function c_string(text) result(s)
    !> The Fortran string to pass to C.
    character(len=*), intent(in) :: text
    character(kind=c_char, len=len_trim(adjustl(text)) + 1) :: s
    s = trim(adjustl(text)) // c_null_char
  end function c_string

  !> A Fortran copy of the NUL-terminated string at `p` ("" for a null pointer). A subroutine: the
  !> caller of a function with a deferred-length result keeps its length in a static variable
  !> (gfortran), which threads calling at once overwrite.
  subroutine f_string(p, s)
    !> C pointer to a NUL-terminated string owned by the C side (not freed here), or null.
    type(c_ptr), intent(in) :: p
    !> The copy.
    character(len=:), allocatable, intent(out) :: s
    character(kind=c_char), pointer :: chars(:)
    integer :: n, i
    if (.not. c_associated(p)) then
      s = ""
      return
    end if
    call c_f_pointer(p, chars, [huge(0)])
    n = 0
    do while (chars(n + 1) /= c_null_char)
      n = n + 1
    end do
    allocate(character(len=n) :: s)
    do i = 1, n
      s(i:i) = chars(i)
    end do
  end subroutine f_string
end module ftorch_interop
