!> Minimal test harness for the Fortran test programs: checks, and the final
!> "N passed, M failed" line that pytest reads.
module testing
  use, intrinsic :: iso_fortran_env, only: real32, real64, int64, output_unit
  implicit none
  private
  public :: check, check_close, summary, read_values, data_path, rss_kib

  integer :: n_pass = 0, n_fail = 0

  interface check_close
    module procedure check_close_r32, check_close_r64
  end interface check_close

contains

  subroutine check(condition, name)
    logical, intent(in) :: condition
    character(len=*), intent(in) :: name
    if (condition) then
      n_pass = n_pass + 1
      write(output_unit, '(a)') "ok   " // name
    else
      n_fail = n_fail + 1
      write(output_unit, '(a)') "FAIL " // name
    end if
  end subroutine check

  subroutine check_close_r64(got, expect, rtol, name)
    real(real64), intent(in) :: got(:), expect(:)
    real(real64), intent(in) :: rtol
    character(len=*), intent(in) :: name
    logical :: ok
    ok = size(got) == size(expect)
    if (ok) ok = all(abs(got - expect) <= rtol * max(abs(expect), tiny(1.0_real64)))
    if (.not. ok) then
      write(output_unit, *) "  got:    ", got
      write(output_unit, *) "  expect: ", expect
    end if
    call check(ok, name)
  end subroutine check_close_r64

  subroutine check_close_r32(got, expect, rtol, name)
    real(real32), intent(in) :: got(:), expect(:)
    real(real32), intent(in) :: rtol
    character(len=*), intent(in) :: name
    logical :: ok
    ok = size(got) == size(expect)
    if (ok) ok = all(abs(got - expect) <= rtol * max(abs(expect), tiny(1.0_real32)))
    if (.not. ok) then
      write(output_unit, *) "  got:    ", got
      write(output_unit, *) "  expect: ", expect
    end if
    call check(ok, name)
  end subroutine check_close_r32

  !> Print the summary line; a non-zero exit status when anything failed.
  subroutine summary()
    write(output_unit, '(i0,a,i0,a)') n_pass, " passed, ", n_fail, " failed"
    flush(output_unit)
    if (n_fail > 0) error stop 1
  end subroutine summary

  !> Directory of models and reference data: the first command-line argument.
  function data_path(name) result(path)
    character(len=*), intent(in) :: name
    character(len=:), allocatable :: path
    character(len=4096) :: dir
    call get_command_argument(1, dir)
    path = trim(dir) // "/" // name
  end function data_path

  !> Values written by tests/models.py (count, then one value per line, Fortran order).
  subroutine read_values(name, values)
    character(len=*), intent(in) :: name
    real(real64), allocatable, intent(out) :: values(:)
    integer :: unit, n
    open(newunit=unit, file=data_path(name), status="old", action="read")
    read(unit, *) n
    allocate(values(n))
    read(unit, *) values
    close(unit)
  end subroutine read_values

  !> Resident set size of this process in KiB (Linux /proc); -1 when not measured.
  function rss_kib() result(kib)
    integer(int64) :: kib
    integer :: unit, ios
    character(len=256) :: line
    kib = -1
    ! Under AddressSanitizer freed memory stays in its quarantine: RSS says nothing about leaks
    ! there (LeakSanitizer checks them instead), so tests/test_sanitizers.py turns this off.
    call get_environment_variable("FTORCH_NO_RSS", line, status=ios)
    if (ios == 0 .and. line == "1") return
    open(newunit=unit, file="/proc/self/status", status="old", action="read", iostat=ios)
    if (ios /= 0) return
    do
      read(unit, '(a)', iostat=ios) line
      if (ios /= 0) exit
      if (line(1:6) == "VmRSS:") then
        read(line(7:), *) kib
        exit
      end if
    end do
    close(unit)
  end function rss_kib
end module testing
