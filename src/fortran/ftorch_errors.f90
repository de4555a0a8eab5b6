!> The one error path of FTorch. Procedures that can fail take optional `stat` and `errmsg`:
!> with `stat` present a failure returns its status and message, otherwise the program stops
!> with `error stop "[procedure] reason"`.
module ftorch_errors
  use, intrinsic :: iso_c_binding, only: c_int, c_int64_t, c_char
  implicit none
  private

  public :: ftorch_check, ftorch_fail, ftorch_last_error

  !> Status codes returned through `stat` (0 on success).
  integer, parameter, public :: FTORCH_OK = 0
  integer, parameter, public :: FTORCH_ERR_INVALID_ARGUMENT = 1
  integer, parameter, public :: FTORCH_ERR_NULL_HANDLE = 2
  integer, parameter, public :: FTORCH_ERR_DTYPE = 3
  integer, parameter, public :: FTORCH_ERR_DEVICE = 4
  integer, parameter, public :: FTORCH_ERR_IO = 5
  integer, parameter, public :: FTORCH_ERR_TORCH = 6
  integer, parameter, public :: FTORCH_ERR_VERSION = 7
  integer, parameter, public :: FTORCH_ERR_INTERNAL = 99

  interface
    function ftc_last_error_length() result(n) bind(c, name="ftc_last_error_length")
      import :: c_int64_t
      integer(c_int64_t) :: n
    end function ftc_last_error_length
    subroutine ftc_last_error_copy(buf, buflen) bind(c, name="ftc_last_error_copy")
      import :: c_char, c_int64_t
      character(kind=c_char), intent(out) :: buf(*)
      integer(c_int64_t), value :: buflen
    end subroutine ftc_last_error_copy
  end interface

contains

  !> Message of the last failed C call on this thread.
  function ftorch_last_error() result(msg)
    character(len=:), allocatable :: msg
    character(kind=c_char), allocatable :: buf(:)
    integer(c_int64_t) :: n
    integer :: i
    n = ftc_last_error_length()
    allocate(buf(max(n, 1_c_int64_t)))
    call ftc_last_error_copy(buf, n)
    allocate(character(len=n) :: msg)
    do i = 1, int(n)
      msg(i:i) = buf(i)
    end do
  end function ftorch_last_error

  !> Handle the status of a C call made by `procedure`.
  subroutine ftorch_check(status, procedure, stat, errmsg)
    integer(c_int), intent(in) :: status
    character(len=*), intent(in) :: procedure
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    if (status == 0) then
      if (present(stat)) stat = 0
      return
    end if
    call ftorch_fail(int(status), procedure, ftorch_last_error(), stat, errmsg)
  end subroutine ftorch_check

  !> Report a failure detected in `procedure`: return it through `stat` or stop.
  subroutine ftorch_fail(status, procedure, reason, stat, errmsg)
    integer, intent(in) :: status
    character(len=*), intent(in) :: procedure, reason
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    if (present(stat)) then
      stat = status
      if (present(errmsg)) errmsg = "[" // procedure // "] " // reason
      return
    end if
    error stop "[" // procedure // "] " // reason
  end subroutine ftorch_fail
end module ftorch_errors
