!> Example 16: a program written for TorchFort (use torchfort, a YAML configuration), unchanged.
!> A periodic field is advected by one cell per time step; the simulation trains TorchFort's
!> built-in MLP online to predict the next state from the current one, checkpoints it, resumes
!> from the checkpoint into a second model, and then lets the model run the simulation alone.
program torchfort_simulation
  use, intrinsic :: iso_fortran_env, only: real32, int64
  use torchfort
  implicit none

  integer, parameter :: n = 32, batch = 16, nsteps = 800, rollout = 20
  real(real32), parameter :: pi = 3.14159265358979_real32
  real(real32) :: u(n, batch), u_next(n, batch), state(n, 1), predicted(n, 1), exact(n, 1), loss
  character(len=512) :: work, exe, config
  integer :: step, i, istat, cut
  integer(int64) :: step_train, step_inference

  call get_command_argument(1, work)
  if (len_trim(work) == 0) work = "."
  ! The configuration sits next to the executable (the build copies it there).
  call get_command_argument(0, exe)
  cut = index(exe, "/", back=.true.)
  config = exe(1:cut) // "config.yaml"

  istat = torchfort_set_manual_seed(42)
  istat = torchfort_create_model("advection", trim(config), TORCHFORT_DEVICE_CPU)
  if (istat /= TORCHFORT_RESULT_SUCCESS) stop "torchfort_create_model failed"

  ! Online training: each step the simulation produces a batch of states and their successors.
  do step = 1, nsteps
    call waves(step, u)
    u_next = cshift(u, shift=-1, dim=1)  ! the exact time step: advection by one cell
    istat = torchfort_train("advection", u, u_next, loss)
    if (istat /= TORCHFORT_RESULT_SUCCESS) stop "torchfort_train failed"
    if (step == nsteps / 2) then
      istat = torchfort_save_checkpoint("advection", trim(work) // "/advection_checkpoint")
      if (istat /= TORCHFORT_RESULT_SUCCESS) stop "torchfort_save_checkpoint failed"
    end if
  end do
  print '(a, es10.3)', "final training loss: ", loss

  ! A restart: a second model resumes the checkpoint and trains the second half again.
  istat = torchfort_create_model("restarted", trim(config), TORCHFORT_DEVICE_CPU)
  istat = torchfort_load_checkpoint("restarted", trim(work) // "/advection_checkpoint", step_train, step_inference)
  if (istat /= TORCHFORT_RESULT_SUCCESS) stop "torchfort_load_checkpoint failed"
  print '(a, i0)', "resumed at training step ", step_train
  do step = int(step_train) + 1, nsteps
    call waves(step, u)
    u_next = cshift(u, shift=-1, dim=1)
    istat = torchfort_train("restarted", u, u_next, loss)
  end do
  print '(a, es10.3)', "final training loss after the restart: ", loss

  ! The model runs the simulation: 20 steps from a wave it has not seen.
  do i = 1, n
    state(i, 1) = sin(2 * pi * 3 * real(i, real32) / n + 0.5_real32)
  end do
  exact = state
  do step = 1, rollout
    istat = torchfort_inference("advection", state, predicted)
    if (istat /= TORCHFORT_RESULT_SUCCESS) stop "torchfort_inference failed"
    state = predicted
    exact = cshift(exact, shift=-1, dim=1)
  end do
  print '(a, i0, a, es10.3)', "largest error after ", rollout, " predicted steps: ", maxval(abs(state - exact))

  istat = torchfort_save_model("advection", trim(work) // "/advection_model.pt")
  if (istat /= TORCHFORT_RESULT_SUCCESS) stop "torchfort_save_model failed"
  print '(a)', "example 16 finished"

contains

  !> A batch of sine waves of wave numbers 1 to 4 with phases that change every step.
  subroutine waves(step, u)
    integer, intent(in) :: step
    real(real32), intent(out) :: u(:, :)
    integer :: i, b
    do b = 1, size(u, 2)
      do i = 1, size(u, 1)
        u(i, b) = sin(2 * pi * (1 + mod(b, 4)) * real(i, real32) / size(u, 1) + 0.37_real32 * step + 0.11_real32 * b)
      end do
    end do
  end subroutine waves

end program torchfort_simulation
