!> Example 6: online training inside a running Fortran simulation.
!>
!> A toy model of the atmosphere advances ncol columns in time. Each column has a temperature,
!> a humidity and a wind; an "expensive" physics scheme computes a heating rate from them. An MLP
!> (written untrained by write_model.py) learns that scheme *while the simulation runs*: at each
!> time step the current states and the scheme's output are one training batch, fed to
!> torch_train_step (Adam, cosine learning-rate schedule, gradient clipping, a progress line every
!> 100 steps). At the end: a checkpoint (model + optimizer + scheduler) and the trained
!> TorchScript model, and the emulator's error on fresh states.
!> Usage: online_training <directory holding emulator.pt> [steps]
program online_training
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch
  implicit none

  integer, parameter :: ncol = 64, wp = real64
  real(wp), target :: state(ncol, 3), heating(ncol, 1), predicted(ncol, 1)
  real(wp) :: loss, first_loss, error, time
  type(torch_model) :: emulator
  type(torch_optim) :: optim
  type(torch_scheduler) :: schedule
  type(torch_tensor) :: inputs(1), target, outputs(1)
  type(torch_tensor), allocatable :: params(:)
  character(len=4096) :: dir, arg
  integer :: step, nsteps, log

  call get_command_argument(1, dir)
  nsteps = 2000
  if (command_argument_count() >= 2) then
    call get_command_argument(2, arg)
    read(arg, *) nsteps
  end if

  call torch_model_load(emulator, trim(dir) // "/emulator.pt", torch_kCPU, is_training=.true.)
  allocate(params(torch_model_parameter_count(emulator)))
  call torch_model_parameters(emulator, params)
  call torch_optim_Adam(optim, params, learning_rate=1.0e-2_wp)
  call torch_scheduler_cosine_annealing_lr(schedule, optim, T_max=nsteps, eta_min=1.0e-4_wp)
  print '(a,i0,a)', "emulator with ", torch_model_num_parameters(emulator), " parameters"

  ! The tensors wrap the simulation's arrays once; every step sees the current values.
  call torch_tensor_from_array(inputs(1), state, torch_kCPU)
  call torch_tensor_from_array(target, heating, torch_kCPU)
  open(newunit=log, file=trim(dir) // "/training.log", status="replace", action="write")

  do step = 1, nsteps
    time = 0.01_wp * step
    call advance_simulation(time, state)
    call physics_scheme(state, heating)          ! the expensive truth, this time step
    call torch_train_step(emulator, optim, inputs, target, loss, scheduler=schedule, max_grad_norm=1.0_wp, &
                          log_every=100, log_unit=log)
    if (step == 1) first_loss = loss
    if (mod(step, 500) == 0) print '(a,i5,a,es10.3,a,es10.3)', "step", step, "  loss", loss, "  lr", &
      torch_optim_get_learning_rate(optim)
  end do
  close(log)

  call torch_checkpoint_save(trim(dir) // "/emulator.ckpt", emulator, optim, schedule, step=nsteps)
  call torch_model_save(emulator, trim(dir) // "/emulator_trained.pt")

  ! How good is the emulator on states it has not seen?
  call advance_simulation(123.456_wp, state)
  call physics_scheme(state, heating)
  call torch_tensor_from_array(outputs(1), predicted, torch_kCPU)
  call torch_model_forward(emulator, inputs, outputs)
  error = sqrt(sum((predicted - heating)**2) / ncol)
  print '(a,es10.3,a,es10.3)', "training loss: first step", first_loss, ", last step", loss
  print '(a,es10.3,a,es10.3,a)', "RMS error on fresh states:", error, " (RMS heating", sqrt(sum(heating**2) / ncol), ")"
  print '(a)', "wrote emulator.ckpt, emulator_trained.pt and training.log"
  if (.not. (loss < 0.05_wp * first_loss)) error stop "example 6: the emulator did not learn"

  call torch_delete(params)
  call torch_delete(inputs); call torch_delete(outputs); call torch_delete(target)
  call torch_delete(optim); call torch_delete(schedule); call torch_delete(emulator)
  print '(a)', "example 6 finished"

contains

  ! Column states drifting in time: temperature, humidity and wind anomalies in [-1, 1].
  subroutine advance_simulation(t, s)
    real(wp), intent(in) :: t
    real(wp), intent(out) :: s(ncol, 3)
    integer :: i
    do i = 1, ncol
      s(i, 1) = sin(0.7_wp * t + 0.31_wp * i)
      s(i, 2) = cos(1.3_wp * t - 0.17_wp * i) * 0.8_wp
      s(i, 3) = sin(0.5_wp * t * (1 + mod(i, 3)) + 0.05_wp * i**2)
    end do
  end subroutine advance_simulation

  ! The scheme to emulate: heating from condensation and mixing.
  subroutine physics_scheme(s, q)
    real(wp), intent(in) :: s(ncol, 3)
    real(wp), intent(out) :: q(ncol, 1)
    q(:, 1) = 0.6_wp * tanh(3 * s(:, 2)) * (1 + s(:, 1)) / 2 - 0.3_wp * s(:, 3)**2 * s(:, 1)
  end subroutine physics_scheme
end program online_training
