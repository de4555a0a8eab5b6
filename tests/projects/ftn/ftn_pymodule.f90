! An embedded Python training script in pytorch-fortran style: forward, train (a logical
! function, until the script says it is done) and save, with array and scalar inputs.
! Usage: ftn_pymodule SCRIPT OUT_FILE SAVE_FILE
program ftn_pymodule
  use, intrinsic :: iso_fortran_env, only: real32, real64
  use torch_ftn
  implicit none
  integer, parameter :: batch = 16
  type(torch_pymodule) :: script
  type(torch_tensor_wrap) :: inputs
  type(torch_tensor) :: target_tensor, out_tensor
  real(real64) :: x(3, batch), target(1, batch)
  real(real64), pointer :: y(:, :)
  real(real32) :: loss
  character(len=1024) :: script_file, out_file, save_file
  integer :: i, u, n

  call get_command_argument(1, script_file)
  call get_command_argument(2, out_file)
  call get_command_argument(3, save_file)
  do i = 1, batch
    x(:, i) = [real(mod(i, 5), real64) / 4, real(mod(3 * i, 7), real64) / 6, real(i, real64) / batch]
    target(1, i) = x(1, i) - 2 * x(2, i) + 0.5d0 * x(3, i)
  end do

  call script%load(trim(script_file))
  call inputs%create()
  call inputs%add_array(x)
  call inputs%add_scalar(2.0_real64)
  call target_tensor%from_array(target)
  open(newunit=u, file=trim(out_file), status="replace")
  n = 0
  do
    n = n + 1
    if (script%train(inputs, target_tensor, loss)) exit
    write(u, '(es16.8e2)') loss
  end do
  write(u, '(es16.8e2)') loss
  call script%forward(inputs, out_tensor)
  call out_tensor%to_array(y)
  write(u, '(*(i0, 1x))') shape(y)
  write(u, '(*(es24.16e3, 1x))') y
  close(u)
  call script%save(trim(save_file))
  print '(a, i0, a)', "trained for ", n, " steps"
end program ftn_pymodule
