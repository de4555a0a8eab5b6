! Training in pytorch-fortran style, after its polynomial-fitting example: a TorchScript model
! trained with torch_module%train (SGD on the MSE loss) on Fortran arrays, then saved.
! Usage: ftn_polynomial MODEL_DIR OUT_FILE
program ftn_polynomial
  use, intrinsic :: iso_fortran_env, only: real32
  use torch_ftn
  implicit none
  integer, parameter :: batch = 32, steps = 50
  type(torch_module) :: model
  type(torch_tensor_wrap) :: inputs
  type(torch_tensor) :: target_tensor
  real(real32) :: features(3, batch), target(1, batch), loss, xs
  character(len=1024) :: dir, out_file
  integer :: i, step, u

  call get_command_argument(1, dir)
  call get_command_argument(2, out_file)
  do i = 1, batch
    xs = -1.0 + 2.0 * real(i - 1) / real(batch - 1)
    features(:, i) = [xs, xs**2, xs**3]
    target(1, i) = 0.5 - 1.5 * xs + 0.25 * xs**2 + 2.0 * xs**3
  end do

  call model%load(trim(dir) // "/ftn_poly.pt")
  call model%create_optimizer_sgd(0.1)
  call inputs%create()
  call inputs%add_array(features)
  call target_tensor%from_array(target)
  open(newunit=u, file=trim(out_file), status="replace")
  do step = 1, steps
    call model%train(inputs, target_tensor, loss)
    write(u, '(es16.8e2)') loss
  end do
  close(u)
  call model%save(trim(dir) // "/ftn_poly_trained.pt")
end program ftn_polynomial
