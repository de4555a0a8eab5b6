!> PPO learning the tracking problem of example 17 (a point x follows a target t; x <- x + 0.2 u,
!> reward -(x - t)**2) through TorchFort's on-policy API: rollouts of 8 environments, 10 epochs of
!> minibatches per rollout, the rollout reset; prints the mean reward per step of the policy
!> (no noise) on fixed test episodes every 10 rollouts, then "mean reward per step: X".
program test_torchfort_ppo_learning
  use, intrinsic :: iso_fortran_env, only: real32, int64
  use torchfort
  implicit none
  integer, parameter :: n_envs = 8, episode_steps = 20, iterations = 60, test_episodes = 50, epochs = 10
  real(real32) :: state(2, n_envs), state_new(2, n_envs), action(1, n_envs), reward(n_envs), done(n_envs)
  real(real32) :: p_loss, q_loss
  character(len=512) :: config
  integer :: it, step, istat, k, t
  integer(int64) :: seed = 12345
  logical :: ready
  call get_command_argument(1, config)
  istat = torchfort_set_manual_seed(7)
  istat = torchfort_rl_on_policy_create_system("ppo", trim(config), TORCHFORT_DEVICE_CPU, TORCHFORT_DEVICE_CPU)
  if (istat /= 0) stop "torchfort_rl_on_policy_create_system failed"
  call reset(state)
  t = 0
  do it = 1, iterations
    do
      istat = torchfort_rl_on_policy_predict_explore("ppo", state, action)
      call advance(state, action(1, :), state_new, reward)
      t = t + 1
      done = merge(1.0, 0.0, mod(t, episode_steps) == 0)
      istat = torchfort_rl_on_policy_update_rollout_buffer("ppo", state, action, reward, done)
      if (istat /= 0) stop "torchfort_rl_on_policy_update_rollout_buffer failed"
      state = state_new
      if (mod(t, episode_steps) == 0) call reset(state)
      istat = torchfort_rl_on_policy_is_ready("ppo", ready)
      if (ready) exit
    end do
    do k = 1, epochs * 4
      istat = torchfort_rl_on_policy_train_step("ppo", p_loss, q_loss)
      if (istat /= 0) stop "train_step failed"
    end do
    istat = torchfort_rl_on_policy_reset_rollout_buffer("ppo")
    if (mod(it, 10) == 0) print '(a, i3, a, f9.4)', "rollout ", it, ": mean reward ", mean_reward("ppo")
  end do
  print '(a, f9.4)', "mean reward per step: ", mean_reward("ppo")
contains
  function uniform() result(r)
    real(real32) :: r
    seed = mod(seed * 48271_int64, 2147483647_int64)
    r = real(seed, real32) / 2147483647.0
  end function uniform
  subroutine reset(s)
    real(real32), intent(out) :: s(2, n_envs)
    integer :: e
    do e = 1, n_envs
      s(1, e) = 2 * uniform() - 1
      s(2, e) = 2 * uniform() - 1
    end do
  end subroutine reset
  subroutine advance(s, u, s_new, r)
    real(real32), intent(in) :: s(2, n_envs), u(n_envs)
    real(real32), intent(out) :: s_new(2, n_envs), r(n_envs)
    s_new(1, :) = s(1, :) + 0.2 * u
    s_new(2, :) = s(2, :)
    r = -(s_new(1, :) - s_new(2, :))**2
  end subroutine advance
  function mean_reward(system) result(mean)
    character(len=*), intent(in) :: system
    real(real32) :: mean, s(2, n_envs), s_new(2, n_envs), u(1, n_envs), r(n_envs)
    integer :: episode, step
    integer(int64) :: saved
    saved = seed
    seed = 999
    mean = 0
    do episode = 1, test_episodes
      call reset(s)
      do step = 1, episode_steps
        if (torchfort_rl_on_policy_predict(system, s, u) /= 0) stop "predict failed"
        call advance(s, u(1, :), s_new, r)
        mean = mean + sum(r)
        s = s_new
      end do
    end do
    mean = mean / (test_episodes * episode_steps * n_envs)
    seed = saved
  end function mean_reward
end program test_torchfort_ppo_learning
