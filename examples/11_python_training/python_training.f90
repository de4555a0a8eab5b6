!> Example 11: a Fortran simulation trains a PyTorch model written in Python (trainer.py) while it
!> runs. Each time step hands its state and the tendency it computed to trainer.train_step (the
!> Python code sees the Fortran arrays themselves, no copy), then the learned tendency replaces
!> the physics for the last steps. Usage: python_training WORK_DIR
program python_training
  use, intrinsic :: iso_fortran_env, only: real64
  use ftorch
  implicit none
  integer, parameter :: n = 64, n_train = 150, n_emulate = 20
  real(real64), parameter :: dt = 0.01d0, pi = acos(-1d0)
  real(real64), target :: state(n), tendency(n), learned(n)
  type(torch_pymodule) :: trainer
  type(torch_tensor) :: state_t, tendency_t, learned_t
  type(torch_arglist) :: args, result
  character(len=1024) :: work_dir, here
  real(real64) :: loss
  integer :: step, i

  call get_command_argument(1, work_dir)
  call get_command_argument(0, here)
  ! trainer.py sits next to this source; the build copies it next to the executable.
  call torch_pymodule_load(trainer, dirname(trim(here)) // "/trainer.py")

  state = [(sin(2 * pi * (i - 1) / n), i = 1, n)]
  call torch_tensor_from_array(state_t, state, torch_kCPU)
  call torch_tensor_from_array(tendency_t, tendency, torch_kCPU)
  call torch_tensor_from_array(learned_t, learned, torch_kCPU)
  call torch_arglist_add(args, state_t)
  call torch_arglist_add(args, tendency_t)

  do step = 1, n_train
    tendency = -state**3 + 0.5d0 * state        ! the physics the model learns
    call torch_pymodule_call(trainer, "train_step", args, result)
    call torch_arglist_get(result, 1, loss)
    if (mod(step, 30) == 0) print '(a, i4, a, es10.3)', "step ", step, "  loss ", loss
    state = state + dt * tendency
  end do

  ! Emulate: the learned tendency drives the last steps (written into `learned` by Python).
  do step = 1, n_emulate
    call predict_into(trainer, state_t, learned_t)
    state = state + dt * learned
  end do
  tendency = -state**3 + 0.5d0 * state
  print '(a, es10.3)', "max |learned - physics| after emulation: ", maxval(abs(learned - tendency))

  call torch_arglist_clear(args)
  call torch_arglist_add(args, trim(work_dir) // "/trainer_state.pt")
  call torch_pymodule_call(trainer, "save", args)
  print '(a)', "example 11 finished"

contains

  subroutine predict_into(trainer, state_t, learned_t)
    type(torch_pymodule), intent(in) :: trainer
    type(torch_tensor), intent(in) :: state_t, learned_t
    type(torch_arglist) :: a
    call torch_arglist_add(a, state_t)
    call torch_arglist_add(a, learned_t)
    call torch_pymodule_call(trainer, "predict", a)
    call torch_arglist_delete(a)
  end subroutine predict_into

  function dirname(path) result(dir)
    character(len=*), intent(in) :: path
    character(len=:), allocatable :: dir
    integer :: k
    k = index(path, "/", back=.true.)
    dir = "."
    if (k > 1) dir = path(1:k - 1)
  end function dirname
end program python_training
