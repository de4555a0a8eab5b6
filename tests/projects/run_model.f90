!> Run a TorchScript model on Fortran arrays: the program of the fpm and Makefile consumer projects.
!> Usage: run_model <data dir>
program run_model
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch
  use ftorch_test_utils, only: allclose
  implicit none
  type(torch_model) :: model
  type(torch_tensor) :: inputs(1), outputs(1)
  real(real64), target :: x(5), y(5)
  real(real64), allocatable :: x_ref(:), y_ref(:)
  character(len=4096) :: dir
  logical :: ok

  call get_command_argument(1, dir)
  call read_values(trim(dir) // "/simplenet_f64_in.txt", x_ref)
  call read_values(trim(dir) // "/simplenet_f64_out.txt", y_ref)
  x = x_ref
  call torch_model_load(model, trim(dir) // "/simplenet_f64.pt", torch_kCPU)
  call torch_tensor_from_array(inputs(1), x, torch_kCPU)
  call torch_tensor_from_array(outputs(1), y, torch_kCPU)
  call torch_model_forward(model, inputs, outputs)
  ok = allclose(y, y_ref, "forward equals PyTorch", rtol=1.0e-12_real64)
  call torch_delete(inputs)
  call torch_delete(outputs)
  call torch_delete(model)
  if (ok) then
    print '(a)', "1 passed, 0 failed"
  else
    print '(a)', "0 passed, 1 failed"
    error stop 1
  end if

contains

  subroutine read_values(path, values)
    character(len=*), intent(in) :: path
    real(real64), allocatable, intent(out) :: values(:)
    integer :: unit, n
    open(newunit=unit, file=path, status="old", action="read")
    read(unit, *) n
    allocate(values(n))
    read(unit, *) values
    close(unit)
  end subroutine read_values
end program run_model
