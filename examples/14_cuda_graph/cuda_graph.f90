!> Example 14: training steps captured as a CUDA graph.
!>
!> The emulator of example 6 (emulator.pt, written by 06_online_training/write_model.py) learns
!> a toy physics scheme. The batch lives in two device tensors made once; each time step writes
!> the new states and heating rates into them, and torch_train_step(..., cuda_graph=.true.)
!> replays the captured step (forward, loss, backward, clipping, Adam) on them: one launch per step
!> instead of hundreds. A second emulator takes the same steps without graphs, for comparison.
!>
!> On a GPU the first run uses CUDA graphs. Without one it runs on the CPU: with
!> FTORCH_CUDA_GRAPHS=eager in the environment the graph steps run the captured work uncaptured
!> (the suite runs it so); otherwise both emulators take ordinary steps.
!> Usage: cuda_graph <directory holding emulator.pt> [steps]
program cuda_graph
  use, intrinsic :: iso_c_binding, only: c_int
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch
  implicit none

  integer, parameter :: ncol = 64, wp = real64
  real(wp), target :: state(ncol, 3), heating(ncol, 1)
  real(wp) :: loss_graph, loss_plain, largest
  type(torch_model) :: graphed, plain
  type(torch_optim) :: optim_graphed, optim_plain
  type(torch_tensor) :: inputs(1), target
  integer(c_int) :: device
  character(len=4096) :: dir, arg
  character(len=16) :: mode
  logical :: use_graph
  integer :: step, nsteps

  call get_command_argument(1, dir)
  nsteps = 200
  if (command_argument_count() >= 2) then
    call get_command_argument(2, arg)
    read(arg, *) nsteps
  end if
  call get_environment_variable("FTORCH_CUDA_GRAPHS", mode)
  device = torch_kCPU
  if (torch_device_available(torch_kCUDA)) device = torch_kCUDA
  use_graph = device == torch_kCUDA .or. mode == "eager"
  if (device == torch_kCUDA) then
    print '(a)', "on the GPU: steps captured as a CUDA graph"
  else if (use_graph) then
    print '(a)', "on the CPU: the captured work, uncaptured (FTORCH_CUDA_GRAPHS=eager)"
  else
    print '(a)', "on the CPU: ordinary steps (no GPU; FTORCH_CUDA_GRAPHS=eager runs the captured work)"
  end if

  call load(graphed, optim_graphed)
  call load(plain, optim_plain)
  ! The batch: device tensors made once (on the CPU, tensors over the arrays), written every step.
  call new_batch(0)
  call torch_tensor_from_array(inputs(1), state, device)
  call torch_tensor_from_array(target, heating, device)

  largest = 0
  do step = 1, nsteps
    call new_batch(step)
    if (device == torch_kCUDA) then   ! the new batch into the same device memory
      call copy_into(inputs(1), state)
      call copy_into(target, heating)
    end if
    call torch_train_step(graphed, optim_graphed, inputs, target, loss_graph, max_grad_norm=1.0_wp, &
                          cuda_graph=use_graph)
    call torch_train_step(plain, optim_plain, inputs, target, loss_plain, max_grad_norm=1.0_wp)
    largest = max(largest, abs(loss_graph - loss_plain) / loss_plain)
    if (mod(step, nsteps / 4) == 0) print '(a,i5,a,es11.4)', "step", step, "  loss", loss_graph
  end do
  print '(a,es9.2)', "largest relative difference of the losses, with and without graphs:", largest

  call torch_delete(inputs)
  call torch_delete(target)
  call torch_delete(optim_graphed)
  call torch_delete(optim_plain)
  call torch_delete(graphed)
  call torch_delete(plain)
  print '(a)', "example 14 finished"
contains

  subroutine load(model, optim)
    type(torch_model), intent(inout) :: model
    type(torch_optim), intent(inout) :: optim
    type(torch_tensor), allocatable :: params(:)
    call torch_model_load(model, trim(dir) // "/emulator.pt", device, is_training=.true.)
    allocate(params(torch_model_parameter_count(model)))
    call torch_model_parameters(model, params)
    call torch_optim_Adam(optim, params, learning_rate=1.0e-2_wp)
    call torch_delete(params)
  end subroutine load

  ! The states of the columns at a time step and the heating rates the physics scheme gives them.
  subroutine new_batch(step)
    integer, intent(in) :: step
    integer :: i
    do i = 1, ncol
      state(i, 1) = sin(0.1_wp * i + 0.05_wp * step)        ! temperature anomaly
      state(i, 2) = 0.5_wp + 0.4_wp * cos(0.07_wp * i * step / nsteps)  ! humidity
      state(i, 3) = cos(0.2_wp * i - 0.03_wp * step)        ! wind
      heating(i, 1) = state(i, 2) * tanh(2 * state(i, 1)) - 0.1_wp * state(i, 3)**2
    end do
  end subroutine new_batch

  ! Host values into a device tensor's memory (=, which copies across devices).
  subroutine copy_into(t, values)
    type(torch_tensor), intent(inout) :: t
    real(wp), intent(in), target, contiguous :: values(:, :)
    type(torch_tensor) :: host
    call torch_tensor_from_array(host, values, torch_kCPU)
    t = host
    call torch_delete(host)
  end subroutine copy_into
end program cuda_graph
