!> Example 15: online training without TorchScript.
!>
!> The emulator (model.py) is written as PyTorch code is written today: torch.jit.script refuses
!> it. `python -m ftorch export model.py:Emulator --input 64,3:float64 --train emulator_train.pt2`
!> compiles its forward, backward and training step with AOTInductor into a training package.
!> This program is the online-training program of example 6 with another file name: it learns a
!> physics scheme while a toy simulation runs (torch_train_step: MSE, Adam, a cosine schedule, here
!> the package's compiled step), seeds the dropout masks from Fortran, saves the trained package
!> and its state_dict, and predicts with the saved package in eval mode.
!> Usage: training_package <directory holding emulator_train.pt2> [steps]
program training_package
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch
  implicit none

  integer, parameter :: ncol = 64, wp = real64
  real(wp), target :: state(ncol, 3), heating(ncol, 1), predicted(ncol, 1)
  real(wp) :: loss, first_loss, error
  type(torch_model) :: emulator, trained
  type(torch_optim) :: optim
  type(torch_scheduler) :: schedule
  type(torch_tensor) :: inputs(1), target, outputs(1)
  type(torch_tensor), allocatable :: params(:)
  character(len=4096) :: dir, arg
  integer :: step, nsteps

  call get_command_argument(1, dir)
  nsteps = 600
  if (command_argument_count() >= 2) then
    call get_command_argument(2, arg)
    read(arg, *) nsteps
  end if

  call torch_manual_seed(2026)                  ! reproducible dropout masks
  call torch_model_load(emulator, trim(dir) // "/emulator_train.pt2", torch_kCPU, is_training=.true.)
  allocate(params(torch_model_parameter_count(emulator)))
  call torch_model_parameters(emulator, params)
  call torch_optim_Adam(optim, params, learning_rate=1.0e-2_wp)
  call torch_scheduler_cosine_annealing_lr(schedule, optim, T_max=nsteps, eta_min=1.0e-4_wp)
  print '(a,i0,a,i0,a)', "emulator with ", torch_model_num_parameters(emulator), " parameters in ", &
    size(params), " tensors"

  call torch_tensor_from_array(inputs(1), state, torch_kCPU)
  call torch_tensor_from_array(target, heating, torch_kCPU)
  do step = 1, nsteps
    call advance_simulation(0.01_wp * step, state)
    call physics_scheme(state, heating)
    call torch_train_step(emulator, optim, inputs, target, loss, scheduler=schedule, max_grad_norm=1.0_wp)
    if (step == 1) first_loss = loss
    if (mod(step, 200) == 0) print '(a,i5,a,es10.3)', "step", step, "  loss", loss
  end do

  ! The trained package (compiled code and the new state) and the state_dict for Python.
  call torch_model_save(emulator, trim(dir) // "/emulator_trained.pt2")
  call torch_model_save(emulator, trim(dir) // "/emulator_state.pt")

  ! Prediction with the saved package, in eval mode (no dropout), on states it has not seen.
  call torch_model_load(trained, trim(dir) // "/emulator_trained.pt2", torch_kCPU)
  call advance_simulation(123.456_wp, state)
  call physics_scheme(state, heating)
  call torch_tensor_from_array(outputs(1), predicted, torch_kCPU)
  call torch_model_forward(trained, inputs, outputs)
  error = sqrt(sum((predicted - heating)**2) / ncol)
  print '(a,es10.3,a,es10.3)', "training loss: first step", first_loss, ", last step", loss
  print '(a,es10.3,a,es10.3,a)', "RMS error on fresh states:", error, " (RMS heating", &
    sqrt(sum(heating**2) / ncol), ")"
  if (.not. (loss < 0.1_wp * first_loss)) error stop "example 15: the emulator did not learn"

  call torch_delete(params)
  call torch_delete(inputs); call torch_delete(outputs); call torch_delete(target)
  call torch_delete(optim); call torch_delete(schedule)
  call torch_delete(emulator); call torch_delete(trained)
  print '(a)', "wrote emulator_trained.pt2 and emulator_state.pt"
  print '(a)', "example 15 finished"

contains

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

  subroutine physics_scheme(s, q)
    real(wp), intent(in) :: s(ncol, 3)
    real(wp), intent(out) :: q(ncol, 1)
    q(:, 1) = 0.6_wp * tanh(3 * s(:, 2)) * (1 + s(:, 1)) / 2 - 0.3_wp * s(:, 3)**2 * s(:, 1)
  end subroutine physics_scheme
end program training_package
