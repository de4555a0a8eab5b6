!> Benchmark of TorchFort's reinforcement-learning train steps (through module torchfort). Usage:
!>   bench_rl off|on <config.yaml> <state size> <action size> <iterations>
!> off: an off-policy system (TD3): its replay buffer filled until ready, then <iterations>
!> train steps timed. on: an on-policy system (PPO): a rollout closed, then <iterations> minibatch
!> train steps timed (the rollout is kept: epochs follow each other). Prints "seconds <total>".
program bench_rl
  use, intrinsic :: iso_fortran_env, only: int64, real32, real64
  use torchfort
  implicit none
  character(len=512) :: mode, config, arg
  integer :: ns, na, iterations, i, t, istat
  integer(int64) :: t0, t1, rate
  real(real32), allocatable :: s(:), sp(:), a(:)
  real(real32) :: r, p_loss, q_loss
  logical :: ready

  call get_command_argument(1, mode)
  call get_command_argument(2, config)
  call get_command_argument(3, arg)
  read (arg, *) ns
  call get_command_argument(4, arg)
  read (arg, *) na
  call get_command_argument(5, arg)
  read (arg, *) iterations
  allocate (s(ns), sp(ns), a(na))
  istat = torchfort_set_manual_seed(1)
  if (mode == "off") then
    istat = torchfort_rl_off_policy_create_system("bench", trim(config), TORCHFORT_DEVICE_CPU, TORCHFORT_DEVICE_CPU)
  else
    istat = torchfort_rl_on_policy_create_system("bench", trim(config), TORCHFORT_DEVICE_CPU, TORCHFORT_DEVICE_CPU)
  end if
  if (istat /= TORCHFORT_RESULT_SUCCESS) stop "create_system failed"
  t = 0
  do
    t = t + 1
    s = [(sin(0.1 * t + i), i = 1, ns)]
    sp = [(sin(0.1 * (t + 1) + i), i = 1, ns)]
    a = [(cos(0.3 * t + i), i = 1, na)]
    r = -sum(s**2)
    if (mode == "off") then
      istat = torchfort_rl_off_policy_update_replay_buffer("bench", s, a, sp, r, mod(t, 50) == 0)
      istat = torchfort_rl_off_policy_is_ready("bench", ready)
    else
      istat = torchfort_rl_on_policy_update_rollout_buffer("bench", s, a, r, mod(t, 50) == 0)
      istat = torchfort_rl_on_policy_is_ready("bench", ready)
    end if
    if (istat /= TORCHFORT_RESULT_SUCCESS) stop "update failed"
    if (ready) exit
  end do
  call system_clock(t0, rate)
  do i = 1, iterations
    if (mode == "off") then
      istat = torchfort_rl_off_policy_train_step("bench", p_loss, q_loss)
    else
      istat = torchfort_rl_on_policy_train_step("bench", p_loss, q_loss)
    end if
  end do
  call system_clock(t1)
  if (istat /= TORCHFORT_RESULT_SUCCESS) stop "train_step failed"
  print '(a,es16.8)', "seconds ", real(t1 - t0, real64) / real(rate, real64)
end program bench_rl
