! Where pytorch-fortran would crash, a clean error stop with the reason; inside a catch scope
! (case caught_in_scope), the failure is kept like any FTorch failure and the program goes on.
! Usage: ftn_errors CASE ARG
program ftn_errors
  use, intrinsic :: iso_fortran_env, only: real32
  use torch_ftn
  use ftorch, only: torch_catch_begin, torch_catch_end
  implicit none
  type(torch_module) :: model
  type(torch_pymodule) :: script
  type(torch_tensor_wrap) :: inputs
  type(torch_tensor) :: out_tensor
  real(real32) :: x(2, 2), loss
  character(len=1024) :: what, arg
  logical :: done
  integer :: stat
  character(len=256) :: msg

  call get_command_argument(1, what)
  call get_command_argument(2, arg)
  x = 1
  call inputs%create()
  call inputs%add_array(x)
  select case (trim(what))
  case ("missing_model")
    call model%load(trim(arg))
  case ("train_without_optimizer")
    call model%load(trim(arg))
    call model%train(inputs, out_tensor, loss)
  case ("python_exception")
    call script%load(trim(arg))
    call out_tensor%from_array(x)
    done = script%train(inputs, out_tensor, loss)
  case ("unconstructed_target")
    call script%load(trim(arg))
    done = script%train(inputs, out_tensor, loss)
  case ("caught_in_scope")
    call model%load(trim(arg))
    call torch_catch_begin()
    call model%train(inputs, out_tensor, loss)
    call torch_catch_end(stat, msg)
    print '(a, i0, a, a)', "caught ", stat, ": ", trim(msg)
  end select
end program ftn_errors
