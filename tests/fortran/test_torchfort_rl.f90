!> A TorchFort reinforcement-learning program (module torchfort, unchanged API): for each system
!> named in DIR/rl_configs.txt (DIR/<name>.yaml, and DIR/<name>.params: n_envs, the state shape
!> per sample (two extents, the second 1 for a vector), the action size, how many steps fill the
!> replay buffer and how many training steps follow), it saves the initial networks
!> (DIR/<name>_init), fills the buffer with transitions it writes to DIR/<name>.transitions, trains
!> (losses to DIR/<name>.losses), predicts, explores and evaluates (DIR/<name>.outputs) and saves
!> the final checkpoint (DIR/<name>_final): tests/test_torchfort_rl.py replays all of it in
!> Python. Then a second system resumes the midway checkpoint and must repeat the second half bit for
!> bit; the errors a user meets are checked last. Optional arguments 2 and 3: the networks' and the
!> buffers' devices (TORCHFORT_DEVICE_CPU, -1, by default; a GPU number).
program test_torchfort_rl
  use, intrinsic :: iso_fortran_env, only: real32, real64, int64
  use torchfort
  use testing, only: check, summary
  implicit none

  integer, parameter :: seed = 4321, seed2 = 77, nprobe = 5
  character(len=512) :: dir
  character(len=64) :: name
  character(len=16) :: arg
  integer :: u, ios, model_dev = TORCHFORT_DEVICE_CPU, rb_dev = TORCHFORT_DEVICE_CPU

  call get_command_argument(1, dir)
  if (command_argument_count() >= 3) then
    call get_command_argument(2, arg)
    read (arg, *) model_dev
    call get_command_argument(3, arg)
    read (arg, *) rb_dev
  end if
  open (newunit=u, file=trim(dir)//"/rl_configs.txt", status="old", action="read")
  do
    read (u, '(a)', iostat=ios) name
    if (ios /= 0) exit
    call run_system(trim(name))
  end do
  close (u)
  open (newunit=u, file=trim(dir)//"/ppo_configs.txt", status="old", action="read")
  do
    read (u, '(a)', iostat=ios) name
    if (ios /= 0) exit
    call run_ppo(trim(name))
  end do
  close (u)
  call errors()
  call summary()

contains

  function path(name, suffix) result(p)
    character(len=*), intent(in) :: name, suffix
    character(len=:), allocatable :: p
    p = trim(dir)//"/"//name//suffix
  end function path

  ! The transition data of step t, environment e (deterministic, with episode ends).
  elemental function state_value(t, e, i) result(v)
    integer, intent(in) :: t, e, i
    real(real64) :: v
    v = sin(0.3d0 * t + 0.7d0 * i + 1.1d0 * e)
  end function state_value

  subroutine run_system(name)
    character(len=*), intent(in) :: name
    integer :: n_envs, ns1, ns2, na, nfill, ksteps, pu, tu, lu, ou, t, e, i, j, k, res
    real(real64), allocatable :: s(:, :), sp(:, :), a(:, :), r(:), d(:), probe(:, :), act(:, :), q(:), act1(:)
    real(real64), allocatable :: s3(:, :, :), sp3(:, :, :), probe3(:, :, :)
    real(real32), allocatable :: s32(:, :), sp32(:, :), a32(:, :), probe32(:, :), act32(:, :)
    real(real64) :: losses(2, 200), resumed(2, 200)
    real(real64) :: pl, ql
    ! (one sample and a batch of five go through different matrix kernels: equal to rounding)
    real(real32) :: pl32, ql32, r32
    logical :: ready, single, float32
    character(len=:), allocatable :: name2

    open (newunit=pu, file=path(name, ".params"), status="old", action="read")
    read (pu, *) n_envs, ns1, ns2, na, nfill, ksteps
    close (pu)
    single = n_envs == 1
    float32 = index(name, "f4") == 1
    allocate (s(ns1 * ns2, n_envs), sp(ns1 * ns2, n_envs), a(na, n_envs), r(n_envs), d(n_envs))
    allocate (probe(ns1 * ns2, nprobe), act(na, nprobe), q(nprobe), act1(na))

    res = torchfort_rl_off_policy_create_system(name, path(name, ".yaml"), model_dev, rb_dev)
    call check(res == TORCHFORT_RESULT_SUCCESS, "create "//name)
    call check(torchfort_rl_off_policy_save_checkpoint(name, path(name, "_init")) == 0, "save initial "//name)
    call check(torchfort_rl_off_policy_is_ready(name, ready) == 0 .and. .not. ready, "empty buffer not ready "//name)

    ! Fill the buffer; every transition is written out as it was given.
    open (newunit=tu, file=path(name, ".transitions"), status="replace", action="write")
    do t = 1, nfill
      do e = 1, n_envs
        do i = 1, ns1 * ns2
          s(i, e) = state_value(t, e, i)
          sp(i, e) = state_value(t + 1, e, i)
        end do
        do j = 1, na
          a(j, e) = 0.8d0 * cos(0.5d0 * t + 0.9d0 * j + 0.4d0 * e)
        end do
        r(e) = 0.5d0 * sin(0.2d0 * t * e) + 0.1d0 * e
        d(e) = merge(1d0, 0d0, mod(t + 2 * e, 7) == 0)
        write (tu, '(*(es26.17e3))') s(:, e), a(:, e), sp(:, e), r(e), d(e)
      end do
      if (float32) then
        s32 = real(s, real32)
        sp32 = real(sp, real32)
        a32 = real(a, real32)
        if (single) then
          r32 = real(r(1), real32)
          res = torchfort_rl_off_policy_update_replay_buffer(name, s32(:, 1), a32(:, 1), sp32(:, 1), r32, d(1) > 0.5d0)
        else
          res = torchfort_rl_off_policy_update_replay_buffer(name, s32, a32, sp32, real(r, real32), real(d, real32))
        end if
      else if (ns2 > 1) then  ! states of rank 2 per sample
        s3 = reshape(s, [ns1, ns2, n_envs])
        sp3 = reshape(sp, [ns1, ns2, n_envs])
        if (single) then
          res = torchfort_rl_off_policy_update_replay_buffer(name, s3(:, :, 1), a(:, 1), sp3(:, :, 1), r(1), d(1) > 0.5d0)
        else
          res = torchfort_rl_off_policy_update_replay_buffer(name, s3, a, sp3, r, d)
        end if
      else if (single) then
        res = torchfort_rl_off_policy_update_replay_buffer(name, s(:, 1), a(:, 1), sp(:, 1), r(1), d(1) > 0.5d0)
      else
        res = torchfort_rl_off_policy_update_replay_buffer(name, s, a, sp, r, d)
      end if
      if (res /= 0) exit
    end do
    close (tu)
    call check(res == 0, "update_replay_buffer "//name)
    call check(torchfort_rl_off_policy_is_ready(name, ready) == 0 .and. ready, "buffer ready "//name)

    ! Train: the first half, a checkpoint, the second half.
    call check(torchfort_set_manual_seed(seed) == 0, "seed")
    do k = 1, ksteps
      if (k == ksteps / 2 + 1) then
        call check(torchfort_rl_off_policy_save_checkpoint(name, path(name, "_mid")) == 0, "save midway "//name)
      end if
      if (float32) then
        res = torchfort_rl_off_policy_train_step(name, pl32, ql32)
        pl = pl32
        ql = ql32
      else
        res = torchfort_rl_off_policy_train_step(name, pl, ql)
      end if
      if (res /= 0) exit
      losses(:, k) = [pl, ql]
    end do
    call check(res == 0, "train_step "//name)
    open (newunit=lu, file=path(name, ".losses"), status="replace", action="write")
    write (lu, '(2es26.17e3)') losses(:, :ksteps)
    close (lu)

    ! Predictions on probe states (a batch; one sample as rank-1 arrays too), then evaluation.
    do k = 1, nprobe
      do i = 1, ns1 * ns2
        probe(i, k) = 0.9d0 * cos(1.3d0 * k + 0.5d0 * i)
      end do
    end do
    open (newunit=ou, file=path(name, ".outputs"), status="replace", action="write")
    write (ou, '(*(es26.17e3))') probe
    if (float32) then
      probe32 = real(probe, real32)
      act32 = real(act, real32)
      call check(torchfort_rl_off_policy_predict(name, probe32, act32) == 0, "predict "//name)
      write (ou, '(*(es26.17e3))') real(act32, real64)
      call check(torchfort_rl_off_policy_predict_explore(name, probe32, act32) == 0, "predict_explore "//name)
      write (ou, '(*(es26.17e3))') real(act32, real64)
    else if (ns2 > 1) then
      probe3 = reshape(probe, [ns1, ns2, nprobe])
      call check(torchfort_rl_off_policy_predict(name, probe3, act) == 0, "predict "//name)
      write (ou, '(*(es26.17e3))') act
      call check(torchfort_rl_off_policy_predict(name, probe3(:, :, 2), act1) == 0, "predict one "//name)
      call check(all(abs(act1 - act(:, 2)) <= 1d-12 * abs(act(:, 2))), "one sample as in the batch "//name)
      call check(torchfort_rl_off_policy_predict_explore(name, probe3, act) == 0, "predict_explore "//name)
      write (ou, '(*(es26.17e3))') act
    else
      call check(torchfort_rl_off_policy_predict(name, probe, act) == 0, "predict "//name)
      write (ou, '(*(es26.17e3))') act
      call check(torchfort_rl_off_policy_predict(name, probe(:, 3), act1) == 0, "predict one "//name)
      call check(all(abs(act1 - act(:, 3)) <= 1d-12 * abs(act(:, 3))), "one sample as in the batch "//name)
      call check(torchfort_rl_off_policy_predict_explore(name, probe, act) == 0, "predict_explore "//name)
      write (ou, '(*(es26.17e3))') act
    end if
    do k = 1, nprobe
      act(:, k) = [(0.7d0 * sin(0.6d0 * k + j), j = 1, na)]
    end do
    if (ns2 > 1) then
      call check(torchfort_rl_off_policy_evaluate(name, reshape(probe, [ns1, ns2, nprobe]), act, q) == 0, &
                 "evaluate "//name)
    else if (float32) then
      block
        real(real32) :: q32(nprobe)
        call check(torchfort_rl_off_policy_evaluate(name, real(probe, real32), real(act, real32), q32) == 0, &
                   "evaluate "//name)
        q = q32
      end block
    else
      call check(torchfort_rl_off_policy_evaluate(name, probe, act, q) == 0, "evaluate "//name)
    end if
    write (ou, '(*(es26.17e3))') act
    write (ou, '(*(es26.17e3))') q
    close (ou)
    call check(torchfort_rl_off_policy_save_checkpoint(name, path(name, "_final")) == 0, "save final "//name)

    ! Resumed from the midway checkpoint (its random generators too), the second half repeats bit for bit.
    name2 = name//"_resumed"
    call check(torchfort_rl_off_policy_create_system(name2, path(name, ".yaml"), model_dev, rb_dev) == 0, &
               "create "//name2)
    ! (another random stream before the load: the checkpoint restores the generators)
    call check(torchfort_set_manual_seed(seed2) == 0, "seed 2")
    call check(torchfort_rl_off_policy_load_checkpoint(name2, path(name, "_mid")) == 0, "load_checkpoint "//name2)
    do k = ksteps / 2 + 1, ksteps
      res = torchfort_rl_off_policy_train_step(name2, pl, ql)
      resumed(:, k) = [pl, ql]
    end do
    if (float32) then  ! (the float32 system reported its losses through real32 arguments)
      call check(all(real(resumed(:, ksteps / 2 + 1:ksteps), real32) == real(losses(:, ksteps / 2 + 1:ksteps), real32)), &
                 "resumed losses equal "//name)
    else
      call check(all(resumed(:, ksteps / 2 + 1:ksteps) == losses(:, ksteps / 2 + 1:ksteps)), "resumed losses equal "//name)
    end if
  end subroutine run_system

  !> An on-policy (PPO) system: DIR/<name>.params holds n_envs, the state size, the action size,
  !> the rollout steps per environment and the training steps. The program gives the steps of one
  !> rollout (and one more, which closes it), trains, predicts and evaluates; every value goes to
  !> DIR/<name>.transitions, .losses and .outputs for tests/test_torchfort_rl.py to replay.
  subroutine run_ppo(name)
    character(len=*), intent(in) :: name
    integer :: n_envs, ns, na, steps, ksteps, pu, tu, lu, ou, t, e, i, j, k, res
    real(real64), allocatable :: s(:, :), a(:, :), r(:), d(:), probe(:, :), act(:, :), q(:)
    real(real32), allocatable :: s32(:, :), a32(:, :), probe32(:, :), act32(:, :), q32(:)
    real(real64) :: losses(2, 200), resumed(2, 200), pl, ql
    logical :: ready, float32
    character(len=:), allocatable :: name2

    open (newunit=pu, file=path(name, ".params"), status="old", action="read")
    read (pu, *) n_envs, ns, na, steps, ksteps
    close (pu)
    float32 = index(name, "f4") == 1
    allocate (s(ns, n_envs), a(na, n_envs), r(n_envs), d(n_envs), probe(ns, nprobe), act(na, nprobe), q(nprobe))
    res = torchfort_rl_on_policy_create_system(name, path(name, ".yaml"), model_dev, rb_dev)
    call check(res == TORCHFORT_RESULT_SUCCESS, "create "//name)
    call check(torchfort_rl_on_policy_save_checkpoint(name, path(name, "_init")) == 0, "save initial "//name)
    open (newunit=tu, file=path(name, ".transitions"), status="replace", action="write")
    do t = 1, steps + 1
      call check(torchfort_rl_on_policy_is_ready(name, ready) == 0 .and. .not. ready, "not ready yet "//name)
      do e = 1, n_envs
        s(:, e) = [(state_value(t, e, i), i = 1, ns)]
        a(:, e) = [(1.3d0 * cos(0.5d0 * t + 0.9d0 * j + 0.4d0 * e), j = 1, na)]
        r(e) = 0.5d0 * sin(0.2d0 * t * e) + 0.1d0 * e
        d(e) = merge(1d0, 0d0, mod(t + 2 * e, 5) == 0)
        write (tu, '(*(es26.17e3))') s(:, e), a(:, e), r(e), d(e)
      end do
      if (float32) then
        s32 = real(s, real32)
        a32 = real(a, real32)
        res = torchfort_rl_on_policy_update_rollout_buffer(name, s32, a32, real(r, real32), real(d, real32))
      else if (n_envs == 1) then
        res = torchfort_rl_on_policy_update_rollout_buffer(name, s(:, 1), a(:, 1), r(1), d(1) > 0.5d0)
      else
        res = torchfort_rl_on_policy_update_rollout_buffer(name, s, a, r, d)
      end if
      if (res /= 0) exit
    end do
    close (tu)
    call check(res == 0, "update_rollout_buffer "//name)
    call check(torchfort_rl_on_policy_is_ready(name, ready) == 0 .and. ready, "rollout closed "//name)

    call check(torchfort_set_manual_seed(seed) == 0, "seed")
    do k = 1, ksteps
      if (k == ksteps / 2 + 1) then
        call check(torchfort_rl_on_policy_save_checkpoint(name, path(name, "_mid")) == 0, "save midway "//name)
      end if
      res = torchfort_rl_on_policy_train_step(name, pl, ql)
      if (res /= 0) exit
      losses(:, k) = [pl, ql]
    end do
    call check(res == 0, "train_step "//name)
    open (newunit=lu, file=path(name, ".losses"), status="replace", action="write")
    write (lu, '(2es26.17e3)') losses(:, :ksteps)
    close (lu)

    do k = 1, nprobe
      probe(:, k) = [(0.9d0 * cos(1.3d0 * k + 0.5d0 * i), i = 1, ns)]
    end do
    open (newunit=ou, file=path(name, ".outputs"), status="replace", action="write")
    write (ou, '(*(es26.17e3))') probe
    if (float32) then
      probe32 = real(probe, real32)
      allocate (act32(na, nprobe), q32(nprobe))
      call check(torchfort_rl_on_policy_predict(name, probe32, act32) == 0, "predict "//name)
      write (ou, '(*(es26.17e3))') real(act32, real64)
      call check(torchfort_rl_on_policy_predict_explore(name, probe32, act32) == 0, "predict_explore "//name)
      write (ou, '(*(es26.17e3))') real(act32, real64)
      call check(torchfort_rl_on_policy_evaluate(name, probe32, act32, q32) == 0, "evaluate "//name)
      write (ou, '(*(es26.17e3))') real(act32, real64)
      write (ou, '(*(es26.17e3))') real(q32, real64)
    else
      call check(torchfort_rl_on_policy_predict(name, probe, act) == 0, "predict "//name)
      write (ou, '(*(es26.17e3))') act
      call check(torchfort_rl_on_policy_predict_explore(name, probe, act) == 0, "predict_explore "//name)
      write (ou, '(*(es26.17e3))') act
      call check(torchfort_rl_on_policy_evaluate(name, probe, act, q) == 0, "evaluate "//name)
      write (ou, '(*(es26.17e3))') act
      write (ou, '(*(es26.17e3))') q
    end if
    close (ou)
    call check(torchfort_rl_on_policy_save_checkpoint(name, path(name, "_final")) == 0, "save final "//name)
    call check(torchfort_rl_on_policy_reset_rollout_buffer(name) == 0, "reset "//name)
    call check(torchfort_rl_on_policy_is_ready(name, ready) == 0 .and. .not. ready, "not ready after reset "//name)
    res = torchfort_rl_on_policy_train_step(name, pl, ql)
    call check(res == TORCHFORT_RESULT_INVALID_USAGE, "no training after reset "//name)

    name2 = name//"_resumed"
    call check(torchfort_rl_on_policy_create_system(name2, path(name, ".yaml"), model_dev, rb_dev) == 0, &
               "create "//name2)
    ! (another random stream before the load: the checkpoint restores the generators)
    call check(torchfort_set_manual_seed(seed2) == 0, "seed 2")
    call check(torchfort_rl_on_policy_load_checkpoint(name2, path(name, "_mid")) == 0, "load_checkpoint "//name2)
    do k = ksteps / 2 + 1, ksteps
      res = torchfort_rl_on_policy_train_step(name2, pl, ql)
      resumed(:, k) = [pl, ql]
    end do
    call check(all(resumed(:, ksteps / 2 + 1:ksteps) == losses(:, ksteps / 2 + 1:ksteps)), "resumed losses equal "//name)
  end subroutine run_ppo

  subroutine errors()
    real(real64) :: s(3), a(2), s2(3, 4), a2(2, 4), r4(4), d4(4), pl, ql
    logical :: ready
    integer :: res
    s = 0
    a = 0
    res = torchfort_rl_off_policy_train_step("no_such_system", pl, ql)
    call check(res == TORCHFORT_RESULT_INVALID_USAGE, "unknown system")
    res = torchfort_rl_off_policy_create_system("bad", trim(dir)//"/rl_bad.yaml", TORCHFORT_DEVICE_CPU, &
                                                TORCHFORT_DEVICE_CPU)
    call check(res == TORCHFORT_RESULT_INVALID_USAGE, "bad configuration")
    res = torchfort_rl_off_policy_create_system("e", trim(dir)//"/rl_errors.yaml", TORCHFORT_DEVICE_CPU, &
                                                TORCHFORT_DEVICE_CPU)
    call check(res == 0, "create e")
    res = torchfort_rl_off_policy_create_system("e", trim(dir)//"/rl_errors.yaml", TORCHFORT_DEVICE_CPU, &
                                                TORCHFORT_DEVICE_CPU)
    call check(res == TORCHFORT_RESULT_INVALID_USAGE, "name taken")
    res = torchfort_rl_off_policy_train_step("e", pl, ql)
    call check(res == TORCHFORT_RESULT_INVALID_USAGE, "train before ready")
    ! one environment: a batch of 4 is refused
    s2 = 0
    a2 = 0
    r4 = 0
    d4 = 0
    res = torchfort_rl_off_policy_update_replay_buffer("e", s2, a2, s2, r4, d4)
    call check(res == TORCHFORT_RESULT_INVALID_USAGE, "environments")
    res = torchfort_rl_off_policy_update_replay_buffer("e", s, a, s, 1d0, .false.)
    call check(res == 0, "one transition")
    res = torchfort_rl_off_policy_update_replay_buffer("e", s(1:2), a, s(1:2), 1d0, .false.)
    call check(res == TORCHFORT_RESULT_INVALID_USAGE, "state shape changed")
    res = torchfort_rl_off_policy_update_replay_buffer("e", s, a, s(1:2), 1d0, .false.)
    call check(res == TORCHFORT_RESULT_INVALID_USAGE, "state_new shape")
    res = torchfort_rl_off_policy_predict("e", s2, a2(:, 1:3))
    call check(res == TORCHFORT_RESULT_INVALID_USAGE, "action array too small")
    call check(torchfort_rl_off_policy_is_ready("e", ready) == 0 .and. .not. ready, "not ready")
    res = torchfort_rl_off_policy_load_checkpoint("e", trim(dir)//"/no_such_checkpoint")
    call check(res == TORCHFORT_RESULT_INVALID_USAGE, "missing checkpoint")
  end subroutine errors

end program test_torchfort_rl
