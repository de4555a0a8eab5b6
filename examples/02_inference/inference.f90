!> Example 2: run a TorchScript model on Fortran arrays inside a time loop.
!>
!> The model (written by write_model.py) maps a batch of column states state(ncol, nlev) to
!> tendencies of the same shape. Input and output tensors wrap the Fortran arrays once; each
!> forward reads the current state and writes the tendency straight into its array.
!> Usage: inference <directory holding parameterisation.pt>
program inference
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch
  implicit none

  integer, parameter :: ncol = 16, nlev = 8, nsteps = 5
  real(real64), parameter :: dt = 0.1_real64
  real(real64), target :: state(ncol, nlev), tendency(ncol, nlev)
  real(real64) :: expected(ncol, nlev)
  type(torch_model) :: model
  type(torch_tensor) :: inputs(1), outputs(1)
  character(len=4096) :: dir
  integer :: i, k, step, unit

  call get_command_argument(1, dir)
  call torch_model_load(model, trim(dir) // "/parameterisation.pt", torch_kCPU)

  do k = 1, nlev
    do i = 1, ncol
      state(i, k) = sin(0.1_real64 * i * k)
    end do
  end do

  ! Wrap once: the tensors alias state and tendency for the whole run.
  call torch_tensor_from_array(inputs(1), state, torch_kCPU)
  call torch_tensor_from_array(outputs(1), tendency, torch_kCPU)

  ! Check the first call against PyTorch's own output for the same input.
  call torch_model_forward(model, inputs, outputs)
  open(newunit=unit, file=trim(dir) // "/expected_tendency.txt", status="old", action="read")
  read(unit, *) expected
  close(unit)
  print '(a,es10.3)', "max |Fortran - PyTorch| = ", maxval(abs(tendency - expected))
  if (maxval(abs(tendency - expected)) > 1.0e-12_real64 * maxval(abs(expected))) error stop "mismatch with PyTorch"

  ! A toy time loop: the model's tendency drives the state.
  do step = 1, nsteps
    call torch_model_forward(model, inputs, outputs)
    state = state + dt * tendency
    print '(a,i2,a,f10.6)', "step", step, "  mean state =", sum(state) / size(state)
  end do

  call torch_delete(inputs)
  call torch_delete(outputs)
  call torch_delete(model)
  print '(a)', "example 2 finished"
end program inference
