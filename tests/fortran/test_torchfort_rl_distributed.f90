!> TorchFort's distributed reinforcement-learning systems
!> (torchfort_rl_off_policy_create_distributed_system, torchfort_rl_on_policy_create_distributed_system,
!> both communicator forms) on 2 MPI ranks, each rank feeding its own buffer:
!>  - DDPG whose ranks each hold one repeated transition: after one step the critic is the mean of
!>    the critics of two single-process systems fed one transition each (checked by the Python
!>    test from the checkpoints: SGD, so the mean of the gradients gives the mean of the weights);
!>  - every rank returns the same losses and keeps the same networks while training, and a
!>    checkpoint (rank 0 writes the directory, rank r its own buffer and state under rank_r)
!>    resumes bit for bit on every rank;
!>  - PPO and SAC with built-in networks drawn with another seed on each rank start from rank 0
!>    (SAC: the Python test compares the tuned alpha of the ranks);
!>  - a rank whose buffer is not ready, whose loss is not finite, or whose checkpoint files are
!>    missing makes every rank return an error (no rank waits), and nothing changes.
!> Argument: a directory with ddpg.yaml, ppo.yaml and sac.yaml. Preprocessed: with FTORCH_TEST_MPIF_H the
!> program uses mpif.h (integer handles) only.
program test_torchfort_rl_distributed
  use, intrinsic :: iso_fortran_env, only: real32, real64
  use torchfort
  use testing, only: check, summary
#ifndef FTORCH_TEST_MPIF_H
  use mpi_f08
#endif
  implicit none
#ifdef FTORCH_TEST_MPIF_H
  include 'mpif.h'
#endif
  integer, parameter :: nresume = 3
  character(len=512) :: dir
  integer :: rank, nranks, ierr, i, e, istat, comm_int
  real(real64) :: s(2), sp(2), a(1), r, probe(2), act(1), act0(1), first(nresume), again(nresume)
  real(real64) :: s4(2), a4(1), act4(1), act4b(1), s2(2, 2), a2(1, 2), r2(2)
  real(real32) :: p_loss, q_loss, qa, qb, pa, pb, lq(nresume), lq2(nresume)
  logical :: ready

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  call get_command_argument(1, dir)
  probe = [0.25d0, -0.5d0]

  ! ---- DDPG: rank r holds transition r only
  call transition(rank, s, a, r, sp)
  ! (the critics are drawn at creation: every system of this part from the same seed)
  call check(torchfort_set_manual_seed(7) == 0, "seed")
  call check(torchfort_rl_off_policy_create_distributed_system("d", trim(dir)//"/ddpg.yaml", MPI_COMM_WORLD, &
             TORCHFORT_DEVICE_CPU, TORCHFORT_DEVICE_CPU) == TORCHFORT_RESULT_SUCCESS, "create distributed ddpg")
  do i = 1, 8
    istat = torchfort_rl_off_policy_update_replay_buffer("d", s, a, sp, r, .false.)
  end do
  call check(torchfort_rl_off_policy_is_ready("d", ready) == TORCHFORT_RESULT_SUCCESS, "is_ready")
  call check(ready, "ready")
  if (rank == 0) then
    ! the single-process systems of each transition
    call fill("a", 0)
    call fill("b", 1)
  end if
  call check(torchfort_rl_off_policy_train_step("d", p_loss, q_loss) == TORCHFORT_RESULT_SUCCESS, "train d")
  call same_on_all_ranks([real(p_loss, real64), real(q_loss, real64)], "the losses of a step")
  if (rank == 0) then
    call check(torchfort_rl_off_policy_train_step("a", pa, qa) == TORCHFORT_RESULT_SUCCESS, "train a")
    call check(torchfort_rl_off_policy_train_step("b", pb, qb) == TORCHFORT_RESULT_SUCCESS, "train b")
    ! float32 results of float64 losses: one rounding each
    call check(abs(q_loss - (qa + qb) / 2) <= 1e-6 * abs(q_loss), "the critic loss is the mean over the ranks")
    call check(torchfort_rl_off_policy_save_checkpoint("a", trim(dir)//"/ckpt_a") == 0, "save a")
    call check(torchfort_rl_off_policy_save_checkpoint("b", trim(dir)//"/ckpt_b") == 0, "save b")
  end if
  call check(torchfort_rl_off_policy_save_checkpoint("d", trim(dir)//"/ckpt_d") == 0, "save d (every rank)")

  ! ---- training together: the same losses and networks on every rank
  do i = 1, 5
    call check(torchfort_rl_off_policy_train_step("d", p_loss, q_loss) == TORCHFORT_RESULT_SUCCESS, "train d")
    call same_on_all_ranks([real(p_loss, real64), real(q_loss, real64)], "the losses of a step")
  end do
  call check(torchfort_rl_off_policy_predict("d", probe, act) == TORCHFORT_RESULT_SUCCESS, "predict d")
  call same_on_all_ranks(act, "the policy after training")
  ! resume bit for bit: every rank reads its own buffer and generators back
  call check(torchfort_rl_off_policy_save_checkpoint("d", trim(dir)//"/ckpt_resume") == 0, "save for resume")
  do i = 1, nresume
    call check(torchfort_rl_off_policy_train_step("d", p_loss, lq(i)) == 0, "train")
    istat = torchfort_rl_off_policy_predict("d", probe, act)
    first(i) = act(1)
  end do
  call check(torchfort_rl_off_policy_load_checkpoint("d", trim(dir)//"/ckpt_resume") == 0, "load for resume")
  do i = 1, nresume
    call check(torchfort_rl_off_policy_train_step("d", p_loss, lq2(i)) == 0, "train")
    istat = torchfort_rl_off_policy_predict("d", probe, act)
    again(i) = act(1)
  end do
  call check(all(lq == lq2) .and. all(first == again), "a resumed distributed system repeats its steps exactly")

  ! a checkpoint without this rank files: every rank fails, nothing changes
  call check(torchfort_rl_off_policy_predict("d", probe, act0) == 0, "predict")
  istat = torchfort_rl_off_policy_load_checkpoint("d", trim(dir)//"/ckpt_a")
  if (rank == 0) then
    call check(istat == TORCHFORT_RESULT_MPI_ERROR, "load on rank 0: another rank failed")
  else
    call check(istat == TORCHFORT_RESULT_INVALID_USAGE, "load on rank 1: no files of this rank")
  end if
  call check(torchfort_rl_off_policy_predict("d", probe, act) == 0, "predict")
  call check(all(act == act0), "a failed load changes nothing")

  ! ---- PPO, the built-in network drawn with another seed on each rank: rank 0 network everywhere
  call check(torchfort_set_manual_seed(100 + rank) == 0, "seed")
#ifdef FTORCH_TEST_MPIF_H
  comm_int = MPI_COMM_WORLD
#else
  comm_int = MPI_COMM_WORLD%MPI_VAL
#endif
  call check(torchfort_rl_on_policy_create_distributed_system("p", trim(dir)//"/ppo.yaml", comm_int, &
             TORCHFORT_DEVICE_CPU, TORCHFORT_DEVICE_CPU) == 0, "create distributed ppo (integer communicator)")
  call check(torchfort_rl_on_policy_predict("p", probe, act) == 0, "predict p")
  call same_on_all_ranks(act, "the PPO network at creation")
  do i = 1, 20
    s4 = [sin(0.3d0 * i + rank), cos(0.2d0 * i)]
    a4 = [0.5d0 * sin(0.7d0 * i - rank)]
    istat = torchfort_rl_on_policy_update_rollout_buffer("p", s4, a4, real(-s4(1)**2, real64), mod(i, 7) == 0)
    istat = torchfort_rl_on_policy_is_ready("p", ready)
    if (ready) exit
  end do
  call check(ready, "the rollouts are ready")
  do i = 1, 4
    call check(torchfort_rl_on_policy_train_step("p", p_loss, q_loss) == 0, "train p")
    call same_on_all_ranks([real(p_loss, real64), real(q_loss, real64)], "the PPO losses")
  end do
  call check(torchfort_rl_on_policy_predict("p", probe, act4) == 0, "predict p")
  call same_on_all_ranks(act4, "the PPO network after training")
  call check(abs(act4(1) - act(1)) > 0, "PPO trained")
  call check(torchfort_rl_on_policy_save_checkpoint("p", trim(dir)//"/ckpt_p") == 0, "save p")
  call check(torchfort_rl_on_policy_train_step("p", p_loss, q_loss) == 0, "train p")
  call check(torchfort_rl_on_policy_load_checkpoint("p", trim(dir)//"/ckpt_p") == 0, "load p")
  call check(torchfort_rl_on_policy_predict("p", probe, act4b) == 0, "predict p")
  call check(all(act4b == act4), "PPO resumed")

  ! ---- PPO's advantages normalized over every rank's rollout, as one process over all of them:
  ! rank r feeds environment r (rewards of another scale on each); after one step on the whole
  ! rollout, the network is that of one process fed both environments (its rollout the batch)
  call check(torchfort_set_manual_seed(300) == 0, "seed")
  call check(torchfort_rl_on_policy_create_distributed_system("g", trim(dir)//"/ppo_one.yaml", comm_int, &
             TORCHFORT_DEVICE_CPU, TORCHFORT_DEVICE_CPU) == 0, "create distributed g")
  if (rank == 0) then
    call check(torchfort_set_manual_seed(300) == 0, "seed")
    call check(torchfort_rl_on_policy_create_system("h", trim(dir)//"/ppo_two.yaml", TORCHFORT_DEVICE_CPU, &
               TORCHFORT_DEVICE_CPU) == 0, "create h")
  end if
  do i = 1, 9
    call ppo_transition(i, rank, s4, a4, r)
    call check(torchfort_rl_on_policy_update_rollout_buffer("g", s4, a4, r, .false.) == 0, "update g")
    if (rank == 0) then
      do e = 1, 2
        call ppo_transition(i, e - 1, s2(:, e), a2(:, e), r2(e))
      end do
      call check(torchfort_rl_on_policy_update_rollout_buffer("h", s2, a2, r2, [0d0, 0d0]) == 0, "update h")
    end if
  end do
  call check(torchfort_rl_on_policy_save_checkpoint("g", trim(dir)//"/ckpt_g") == 0, "save g before its first step")
  call check(torchfort_rl_on_policy_train_step("g", p_loss, q_loss) == 0, "train g")
  call check(torchfort_rl_on_policy_predict("g", probe, act4) == 0, "predict g")
  if (rank == 0) then
    call check(torchfort_rl_on_policy_train_step("h", pa, qa) == 0, "train h")
    call check(torchfort_rl_on_policy_predict("h", probe, act4b) == 0, "predict h")
    ! float32 networks: the same sums in another order (two ranks, then their mean)
    call check(abs(p_loss - pa) <= 1e-5 * max(abs(pa), 1.0) .and. abs(q_loss - qa) <= 1e-5 * max(abs(qa), 1.0), &
               "the distributed PPO losses are those of one process over both rollouts")
    call check(abs(act4(1) - act4b(1)) <= 1e-5 * max(abs(act4b(1)), 1d0), &
               "the distributed PPO network is that of one process over both rollouts")
    ! One process resuming that checkpoint (rank 0's rollout, its advantages not yet normalized)
    ! trains as one process fed the same transitions
    call check(torchfort_set_manual_seed(300) == 0, "seed")
    call check(torchfort_rl_on_policy_create_system("k", trim(dir)//"/ppo_one.yaml", TORCHFORT_DEVICE_CPU, &
               TORCHFORT_DEVICE_CPU) == 0, "create k")
    do i = 1, 9
      call ppo_transition(i, 0, s4, a4, r)
      call check(torchfort_rl_on_policy_update_rollout_buffer("k", s4, a4, r, .false.) == 0, "update k")
    end do
    call check(torchfort_rl_on_policy_train_step("k", pa, qa) == 0, "train k")
    call check(torchfort_rl_on_policy_create_system("l", trim(dir)//"/ppo_one.yaml", TORCHFORT_DEVICE_CPU, &
               TORCHFORT_DEVICE_CPU) == 0, "create l")
    call check(torchfort_rl_on_policy_load_checkpoint("l", trim(dir)//"/ckpt_g") == 0, "load ckpt_g in one process")
    call check(torchfort_rl_on_policy_train_step("l", pb, qb) == 0, "train l")
    call check(pa == pb .and. qa == qb, "one process resuming a distributed rollout normalizes its advantages")
  end if

  ! ---- SAC with alpha tuned, built-in networks drawn with another seed on each rank
  call check(torchfort_set_manual_seed(200 + rank) == 0, "seed")
  call check(torchfort_rl_off_policy_create_distributed_system("sac", trim(dir)//"/sac.yaml", MPI_COMM_WORLD, &
             TORCHFORT_DEVICE_CPU, TORCHFORT_DEVICE_CPU) == 0, "create distributed sac")
  call check(torchfort_rl_off_policy_predict("sac", probe, act) == 0, "predict sac")
  call same_on_all_ranks(act, "the SAC policy at creation")
  do i = 1, 12
    s4 = [sin(0.3d0 * i + rank), cos(0.2d0 * i)]
    a4 = [0.5d0 * sin(0.7d0 * i - rank)]
    istat = torchfort_rl_off_policy_update_replay_buffer("sac", s4, a4, [cos(0.3d0 * i + 0.3d0 + rank), 0.1d0], &
                                                         real(-s4(1)**2, real64), .false.)
  end do
  do i = 1, 4
    call check(torchfort_rl_off_policy_train_step("sac", p_loss, q_loss) == 0, "train sac")
    call same_on_all_ranks([real(p_loss, real64), real(q_loss, real64)], "the SAC losses")
  end do
  call check(torchfort_rl_off_policy_predict("sac", probe, act4) == 0, "predict sac")
  call same_on_all_ranks(act4, "the SAC policy after training")
  call check(torchfort_rl_off_policy_save_checkpoint("sac", trim(dir)//"/ckpt_sac") == 0, "save sac")

  ! ---- a rank that is not ready: every rank fails
  call check(torchfort_rl_off_policy_create_distributed_system("n", trim(dir)//"/ddpg.yaml", MPI_COMM_WORLD, &
             TORCHFORT_DEVICE_CPU, TORCHFORT_DEVICE_CPU) == 0, "create n")
  if (rank == 0) then
    do i = 1, 8
      istat = torchfort_rl_off_policy_update_replay_buffer("n", s, a, sp, r, .false.)
    end do
  end if
  istat = torchfort_rl_off_policy_train_step("n", p_loss, q_loss)
  if (rank == 0) then
    call check(istat == TORCHFORT_RESULT_MPI_ERROR, "train on rank 0: another rank is not ready")
  else
    call check(istat == TORCHFORT_RESULT_INVALID_USAGE, "train on rank 1: not ready")
  end if

  ! ---- a loss that is not finite on one rank: every rank fails, no network changes
  call check(torchfort_rl_off_policy_create_distributed_system("z", trim(dir)//"/ddpg.yaml", MPI_COMM_WORLD, &
             TORCHFORT_DEVICE_CPU, TORCHFORT_DEVICE_CPU) == 0, "create z")
  ! (A reward the buffer takes, finite, whose square is not: rank 1’s critic loss; rank 0 has run
  ! its backward when it learns of the failure.)
  if (rank == 1) r = 1.0d200
  do i = 1, 8
    call check(torchfort_rl_off_policy_update_replay_buffer("z", s, a, sp, r, .false.) == 0, "update z")
  end do
  call check(torchfort_rl_off_policy_predict("z", probe, act0) == 0, "predict z")
  istat = torchfort_rl_off_policy_train_step("z", p_loss, q_loss)
  if (rank == 0) then
    call check(istat == TORCHFORT_RESULT_MPI_ERROR, "train on rank 0: another rank failed")
  else
    call check(istat /= TORCHFORT_RESULT_SUCCESS .and. istat /= TORCHFORT_RESULT_MPI_ERROR, &
               "train on rank 1: its loss is not finite")
  end if
  call check(torchfort_rl_off_policy_predict("z", probe, act) == 0, "predict z")
  call check(all(act == act0), "nothing changed")
  call same_on_all_ranks(act, "the policy after a failed step")

  call summary()
  call MPI_Finalize(ierr)

contains

  !> PPO transition k of environment e (rewards of another scale and offset per environment).
  subroutine ppo_transition(k, e, s, a, r)
    integer, intent(in) :: k, e
    real(real64), intent(out) :: s(2), a(1), r
    s = [sin(0.3d0 * k + e), cos(0.2d0 * k - e)]
    a = [0.5d0 * sin(0.7d0 * k - e)]
    r = (1 + 9 * e) * (s(1) - 0.3d0 * s(2)**2) + 2 * e
  end subroutine ppo_transition

  !> Transition k: a state, an action, a reward and the next state.
  subroutine transition(k, s, a, r, sp)
    integer, intent(in) :: k
    real(real64), intent(out) :: s(2), a(1), r, sp(2)
    s = [0.3d0 + 0.4d0 * k, -0.2d0 + 0.1d0 * k]
    a = [0.5d0 - 0.8d0 * k]
    r = 1.0d0 - 1.5d0 * k
    sp = [0.1d0 - 0.3d0 * k, 0.6d0 * k]
  end subroutine transition

  !> A single-process system `name` holding transition k only.
  subroutine fill(name, k)
    character(len=*), intent(in) :: name
    integer, intent(in) :: k
    real(real64) :: s(2), a(1), r, sp(2)
    integer :: j
    call transition(k, s, a, r, sp)
    call check(torchfort_set_manual_seed(7) == 0, "seed")
    call check(torchfort_rl_off_policy_create_system(name, trim(dir)//"/ddpg.yaml", TORCHFORT_DEVICE_CPU, &
               TORCHFORT_DEVICE_CPU) == 0, "create "//name)
    do j = 1, 8
      call check(torchfort_rl_off_policy_update_replay_buffer(name, s, a, sp, r, .false.) == 0, "update "//name)
    end do
  end subroutine fill

  !> Checks that x holds the same values on every rank.
  subroutine same_on_all_ranks(x, what)
    real(real64), intent(in) :: x(:)
    character(len=*), intent(in) :: what
    real(real64) :: hi(size(x)), lo(size(x))
    integer :: e
    call MPI_Allreduce(x, hi, size(x), MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD, e)
    call MPI_Allreduce(x, lo, size(x), MPI_DOUBLE_PRECISION, MPI_MIN, MPI_COMM_WORLD, e)
    call check(all(hi == lo), what//" are the same on every rank")
  end subroutine same_on_all_ranks
end program test_torchfort_rl_distributed
