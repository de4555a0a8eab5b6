!> The one error path of FTorch. Procedures that can fail take optional `stat` and `errmsg`:
!> with `stat` present a failure returns its status and message, otherwise the program stops
!> with `error stop "[procedure] reason"` -- unless the failure happens inside a catch scope
!> (`torch_catch_begin` ... `torch_catch_end(stat, errmsg)`), which is how a caller recovers
!> from failures of functions and operators (`torch_reshape`, `a + b`), which cannot take `stat`:
!> the first failure in the scope is kept and returned by `torch_catch_end`, the failing
!> function returns an unconstructed tensor, and later failures in the scope (often caused by
!> the first) are ignored. Scopes are per thread and nest.
module ftorch_errors
  use, intrinsic :: iso_c_binding, only: c_int, c_int64_t, c_char
  implicit none
  private

  public :: ftorch_check, ftorch_fail, ftorch_last_error
  public :: torch_catch_begin, torch_catch_end

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
    subroutine ftc_catch_begin() bind(c, name="ftc_catch_begin")
    end subroutine ftc_catch_begin
    function ftc_catch_end(status) result(open) bind(c, name="ftc_catch_end")
      import :: c_int
      integer(c_int), intent(out) :: status
      integer(c_int) :: open
    end function ftc_catch_end
    function ftc_catch_record(status, msg, msglen) result(caught) bind(c, name="ftc_catch_record")
      import :: c_int, c_int64_t, c_char
      integer(c_int), value :: status
      character(kind=c_char), intent(in) :: msg(*)
      integer(c_int64_t), value :: msglen
      integer(c_int) :: caught
    end function ftc_catch_record
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
    character(len=:), allocatable :: message
    message = "[" // procedure // "] " // reason
    if (present(stat)) then
      stat = status
      if (present(errmsg)) errmsg = message
      return
    end if
    if (ftc_catch_record(int(status, c_int), message, len(message, kind=c_int64_t)) /= 0) return
    error stop message
  end subroutine ftorch_fail

  !> Begin a catch scope on this thread: failures of procedures called without `stat` are kept
  !> instead of stopping the program (see the module's description).
  subroutine torch_catch_begin()
    call ftc_catch_begin()
  end subroutine torch_catch_begin

  !> End the innermost catch scope: `stat` is the first failure's status (0 if none) and `errmsg`
  !> its message "[procedure] reason". Ending a scope that was never begun is an error.
  subroutine torch_catch_end(stat, errmsg)
    integer, intent(out) :: stat
    character(len=*), intent(inout), optional :: errmsg
    integer(c_int) :: status
    if (ftc_catch_end(status) == 0) then
      call ftorch_fail(1, "torch_catch_end", "no catch scope is open on this thread", stat, errmsg)
      return
    end if
    stat = int(status)
    if (stat /= 0 .and. present(errmsg)) errmsg = ftorch_last_error()
  end subroutine torch_catch_end
end module ftorch_errors
