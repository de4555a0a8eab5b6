! Inference in pytorch-fortran style: a row-major model on Fortran arrays (axis order reversed),
! inference mode, results through a Fortran pointer, scalar arguments, and a wrapped array that
! changes between calls. Usage: ftn_inference MODEL_DIR OUT_FILE
program ftn_inference
  use, intrinsic :: iso_fortran_env, only: int64, real32, real64
  use torch_ftn
  use ftorch, only: ftorch_live_handles
  implicit none
  type(torch_module) :: net, scaled
  type(torch_tensor_wrap) :: inputs, scalar_inputs
  type(torch_tensor) :: out_tensor, in_tensor
  real(real32) :: x(4, 3)            ! no target attribute, as pytorch-fortran programs write it
  real(real32), pointer :: y(:, :)
  real(real64) :: z(5)
  real(real64), pointer :: w(:)
  character(len=1024) :: dir, out_file
  integer :: i, u
  integer(int64) :: before

  call get_command_argument(1, dir)
  call get_command_argument(2, out_file)
  open(newunit=u, file=trim(out_file), status="replace")

  x = reshape([(real(i, real32) / 10, i = 1, 12)], [4, 3])
  call net%load(trim(dir) // "/ftn_linear.pt")
  write(u, '(i0)') merge(1, 0, net%model%is_training())   ! kept as saved (train mode)
  call inputs%create()
  call inputs%add_array(x)
  call net%forward(inputs, out_tensor, flags=module_use_inference_mode)
  call out_tensor%to_array(y)
  write(u, '(*(i0, 1x))') shape(y)
  write(u, '(*(es24.16e3, 1x))') y

  ! The wrap refers to x: the next call sees its new values.
  x = -x
  call net%forward(inputs, out_tensor)
  call out_tensor%to_array(y)
  write(u, '(*(es24.16e3, 1x))') y

  ! A tensor made by from_array, passed with add_tensor.
  call in_tensor%from_array(x)
  call inputs%clear()
  call inputs%add_tensor(in_tensor)
  call net%forward(inputs, out_tensor)
  call out_tensor%to_array(y)
  write(u, '(*(es24.16e3, 1x))') y

  ! Scalars: forward(x, scale: float, n: int, flag: bool) without the bool (a default) is not
  ! possible in TorchScript, so the model here takes (x, scale, n).
  z = [1d0, 2d0, 3d0, 4d0, 5d0]
  call scaled%load(trim(dir) // "/ftn_scaled.pt")
  call scalar_inputs%create()
  call scalar_inputs%add_array(z)
  call scalar_inputs%add_scalar(0.5_real64)
  call scalar_inputs%add_scalar(3)
  call scaled%forward(scalar_inputs, out_tensor)
  call out_tensor%to_array(w)
  write(u, '(*(es24.16e3, 1x))') w

  ! Forward in a time loop: handles stay flat, with and without inference mode.
  before = ftorch_live_handles()
  do i = 1, 1000
    call net%forward(inputs, out_tensor)
    call net%forward(inputs, out_tensor, flags=module_use_inference_mode)
  end do
  write(u, '(i0)') ftorch_live_handles() - before
  close(u)
end program ftn_inference
