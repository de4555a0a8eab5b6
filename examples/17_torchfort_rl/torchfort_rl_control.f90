!> Example 17: reinforcement learning in a Fortran simulation with TorchFort's API (use torchfort,
!> a YAML configuration), unchanged. Four environments run side by side: a point x must follow a
!> target t that changes every episode; the action u (in [-1, 1]) moves it, x <- x + 0.2 u, and the
!> reward is -(x - t)**2 after the move. A TD3 system learns the policy online from the
!> transitions the simulation hands it; the trained networks are saved, loaded into a second
!> system (as a deployed policy would be), and both policies are compared with doing nothing.
!> Each episode's mean reward goes to the wandb hook (config.yaml enables it): with TORCHFORT_LOGDIR
!> set, `python -m ftorch plot-metrics $TORCHFORT_LOGDIR/torchfort.log -m episode_reward` draws the
!> learning curve.
program torchfort_rl_control
  use, intrinsic :: iso_fortran_env, only: real32, int64
  use torchfort
  implicit none

  integer, parameter :: n_envs = 4, episode_steps = 20, episodes = 200, test_episodes = 50
  real(real32) :: state(2, n_envs), state_new(2, n_envs), action(1, n_envs), reward(n_envs), done(n_envs)
  real(real32) :: p_loss, q_loss, trained, deployed, nothing, episode_reward
  character(len=512) :: work, exe, config
  integer :: episode, step, istat, cut
  integer(int64) :: seed = 12345
  logical :: ready

  call get_command_argument(1, work)
  if (len_trim(work) == 0) work = "."
  ! The configuration: the second argument, or rl_config.yaml next to the executable (the build
  ! copies this example's config.yaml there).
  call get_command_argument(2, config)
  if (len_trim(config) == 0) then
    call get_command_argument(0, exe)
    cut = index(exe, "/", back=.true.)
    config = exe(1:cut) // "rl_config.yaml"
  end if

  istat = torchfort_set_manual_seed(7)
  istat = torchfort_rl_off_policy_create_system("tracker", trim(config), TORCHFORT_DEVICE_CPU, TORCHFORT_DEVICE_CPU)
  if (istat /= TORCHFORT_RESULT_SUCCESS) stop "torchfort_rl_off_policy_create_system failed"

  do episode = 1, episodes
    call reset(state)
    episode_reward = 0
    do step = 1, episode_steps
      ! explore, step the environments, hand the transitions over, train once the buffer is ready
      istat = torchfort_rl_off_policy_predict_explore("tracker", state, action)
      if (istat /= TORCHFORT_RESULT_SUCCESS) stop "torchfort_rl_off_policy_predict_explore failed"
      call advance(state, action(1, :), state_new, reward)
      episode_reward = episode_reward + sum(reward) / (n_envs * episode_steps)
      done = merge(1.0, 0.0, step == episode_steps)
      istat = torchfort_rl_off_policy_update_replay_buffer("tracker", state, action, state_new, reward, done)
      if (istat /= TORCHFORT_RESULT_SUCCESS) stop "torchfort_rl_off_policy_update_replay_buffer failed"
      istat = torchfort_rl_off_policy_is_ready("tracker", ready)
      if (ready) then
        istat = torchfort_rl_off_policy_train_step("tracker", p_loss, q_loss)
        if (istat /= TORCHFORT_RESULT_SUCCESS) stop "torchfort_rl_off_policy_train_step failed"
      end if
      state = state_new
    end do
    ! the learning curve: the mean reward per step while exploring
    istat = torchfort_rl_off_policy_wandb_log("tracker", "episode_reward", int(episode, int64), episode_reward)
    if (istat /= TORCHFORT_RESULT_SUCCESS) stop "torchfort_rl_off_policy_wandb_log failed"
    if (mod(episode, 25) == 0) print '(a, i4, a, f9.4)', "episode ", episode, &
                                      ": mean reward of the trained policy ", mean_reward("tracker")
  end do

  ! Deploy: the networks of a checkpoint loaded into a second system of the same configuration.
  istat = torchfort_rl_off_policy_save_checkpoint("tracker", trim(work) // "/tracker_checkpoint")
  if (istat /= TORCHFORT_RESULT_SUCCESS) stop "torchfort_rl_off_policy_save_checkpoint failed"
  istat = torchfort_rl_off_policy_create_system("deployed", trim(config), TORCHFORT_DEVICE_CPU, TORCHFORT_DEVICE_CPU)
  istat = torchfort_rl_off_policy_load_model("deployed", trim(work) // "/tracker_checkpoint")
  if (istat /= TORCHFORT_RESULT_SUCCESS) stop "torchfort_rl_off_policy_load_model failed"

  seed = 999  ! the same test episodes for each policy
  trained = mean_reward("tracker")
  seed = 999
  deployed = mean_reward("deployed")
  seed = 999
  nothing = mean_reward("")
  print '(a, f9.4)', "mean reward per step, trained policy: ", trained
  print '(a, f9.4)', "mean reward per step, deployed policy: ", deployed
  print '(a, f9.4)', "mean reward per step, doing nothing: ", nothing
  print '(a)', "example 17 finished"

contains

  !> A pseudo-random number in [0, 1) (the same sequence with every compiler).
  function uniform() result(r)
    real(real32) :: r
    seed = mod(seed * 48271_int64, 2147483647_int64)
    r = real(seed, real32) / 2147483647.0
  end function uniform

  !> New episodes: positions and targets in [-1, 1].
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

  !> The mean reward per step of a system's policy (no noise) over test episodes; "" does nothing.
  function mean_reward(system) result(mean)
    character(len=*), intent(in) :: system
    real(real32) :: mean, s(2, n_envs), s_new(2, n_envs), u(1, n_envs), r(n_envs)
    integer :: episode, step
    mean = 0
    do episode = 1, test_episodes
      call reset(s)
      do step = 1, episode_steps
        u = 0
        if (len(system) > 0) then
          if (torchfort_rl_off_policy_predict(system, s, u) /= TORCHFORT_RESULT_SUCCESS) stop "predict failed"
        end if
        call advance(s, u(1, :), s_new, r)
        mean = mean + sum(r)
        s = s_new
      end do
    end do
    mean = mean / (test_episodes * episode_steps * n_envs)
  end function mean_reward

end program torchfort_rl_control
