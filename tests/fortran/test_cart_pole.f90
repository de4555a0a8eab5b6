!> TorchFort's cart-pole problem, written in Fortran, learned by TD3 through module torchfort with
!> TorchFort's own configuration and training schedule (tests/test_cart_pole.py writes the
!> configuration and the TorchScript policy and critic). The environment: a pole hinged on a cart
!> (gravity 9.81, cart 1.0, pole 0.1, half-length 0.5), force 20 times the action in [-1, 1],
!> explicit Euler steps of 0.02 s; an episode ends when |x| > 5 or |theta| > 20 degrees (or after
!> 2500 steps); the reward of a step is (sign(r2) 100 r2**2 - 4 x**2) / 1000 with
!> r2 = 1 - |theta| / 5 degrees, minus 20 when the episode ends there. One training step after
!> each exploring episode once the replay buffer is ready; every 25th episode runs the policy
!> without noise, and training stops when such an episode lasts 470 steps.
!> Usage: test_cart_pole <config.yaml> <max episodes> [<torch seed>]. Prints each evaluation and, last,
!> "solved at episode N" or "not solved after N episodes".
program test_cart_pole
  use, intrinsic :: iso_fortran_env, only: real32, real64, int64
  use torchfort
  implicit none
  integer, parameter :: max_steps = 2500, eval_every = 25, target_steps = 470
  real(real64), parameter :: pi = 3.14159265358979323846_real64
  real(real32), parameter :: gravity = 9.81, mass_cart = 1.0, mass_pole = 0.1, half_length = 0.5, &
                             force_scale = 20.0, dt = 0.02, x_limit = 5.0, penalty = 20.0
  real(real32), parameter :: theta_limit = real(20 * 2 * pi / 360, real32)
  real(real32) :: state(4, 1), state_new(4, 1), action(1, 1), reward, p_loss, q_loss
  character(len=512) :: config, text
  integer :: episode, max_episodes, step, istat, steps, torch_seed
  integer(int64) :: seed = 20240611_int64
  logical :: evaluating, ended, ready, solved

  call get_command_argument(1, config)
  call get_command_argument(2, text)
  read(text, *) max_episodes
  torch_seed = 333
  call get_command_argument(3, text)
  if (len_trim(text) > 0) read(text, *) torch_seed
  istat = torchfort_set_manual_seed(torch_seed)
  istat = torchfort_rl_off_policy_create_system("cart_pole", trim(config), TORCHFORT_DEVICE_CPU, TORCHFORT_DEVICE_CPU)
  if (istat /= TORCHFORT_RESULT_SUCCESS) stop "torchfort_rl_off_policy_create_system failed"

  solved = .false.
  do episode = 0, max_episodes - 1
    call reset(state(:, 1))
    evaluating = mod(episode, eval_every) == 0
    steps = max_steps
    do step = 1, max_steps
      if (evaluating) then
        istat = torchfort_rl_off_policy_predict("cart_pole", state, action)
      else
        istat = torchfort_rl_off_policy_predict_explore("cart_pole", state, action)
      end if
      if (istat /= TORCHFORT_RESULT_SUCCESS) stop "predict failed"
      call advance(state(:, 1), action(1, 1), state_new(:, 1), reward, ended)
      istat = torchfort_rl_off_policy_update_replay_buffer("cart_pole", state(:, 1), action(:, 1), &
                                                           state_new(:, 1), reward, ended)
      if (istat /= TORCHFORT_RESULT_SUCCESS) stop "torchfort_rl_off_policy_update_replay_buffer failed"
      state = state_new
      if (ended) then
        steps = step
        exit
      end if
    end do
    if (evaluating) then
      print '(a, i5, a, i5, a)', "episode ", episode, ": the policy balanced ", steps, " steps"
      if (steps >= target_steps) then
        solved = .true.
        exit
      end if
    else
      istat = torchfort_rl_off_policy_is_ready("cart_pole", ready)
      if (ready) then
        istat = torchfort_rl_off_policy_train_step("cart_pole", p_loss, q_loss)
        if (istat /= TORCHFORT_RESULT_SUCCESS) stop "torchfort_rl_off_policy_train_step failed"
      end if
    end if
  end do
  if (solved) then
    print '(a, i0)', "solved at episode ", episode
  else
    print '(a, i0, a)', "not solved after ", max_episodes, " episodes"
  end if

contains

  !> A pseudo-random number in [-1, 1) (the same sequence with every compiler).
  function uniform() result(r)
    real(real32) :: r
    seed = mod(seed * 48271_int64, 2147483647_int64)
    r = 2 * real(real(seed, real64) / 2147483647.0_real64, real32) - 1
  end function uniform

  !> A new episode: x in [-1.5, 1.5], x' and theta' in [-0.2, 0.2], theta within 6 degrees.
  subroutine reset(s)
    real(real32), intent(out) :: s(4)
    s(1) = 0.3 * x_limit * uniform()
    s(2) = 0.2 * uniform()
    s(3) = 0.3 * theta_limit * uniform()
    s(4) = 0.2 * uniform()
  end subroutine reset

  !> One explicit Euler step of the cart-pole under force 20 u; its reward and whether it ends.
  subroutine advance(s, u, s_new, r, ends)
    real(real32), intent(in) :: s(4), u
    real(real32), intent(out) :: s_new(4), r
    logical, intent(out) :: ends
    real(real32) :: c, sn, common, theta_acc, x_acc, r2, total_mass, pole_moment
    total_mass = mass_cart + mass_pole
    pole_moment = mass_pole * half_length
    c = cos(s(3))
    sn = sin(s(3))
    common = (force_scale * u + pole_moment * s(4)**2 * sn) / total_mass
    theta_acc = (gravity * sn - c * common) / (half_length * (4.0 / 3.0 - mass_pole * c**2 / total_mass))
    x_acc = common - pole_moment * theta_acc * c / total_mass
    s_new(1) = s(1) + dt * s(2)
    s_new(2) = s(2) + dt * x_acc
    s_new(3) = s(3) + dt * s(4)
    s_new(4) = s(4) + dt * theta_acc
    ends = s_new(1) < -x_limit .or. s_new(1) > x_limit .or. s_new(3) < -theta_limit .or. s_new(3) > theta_limit
    r2 = (theta_limit / 4 - abs(s_new(3))) / (theta_limit / 4)
    r = (sign(1.0, r2) * 100 * r2**2 - 4 * s_new(1)**2) / 1000
    if (ends) r = r - penalty
  end subroutine advance

end program test_cart_pole
