!> TorchFort's distributed models (torchfort_create_distributed_model, both communicator forms) on
!> MPI ranks: each rank trains on its columns of a global batch; losses and the trained model equal
!> one process training on the whole batch (same initial weights: rank 0's, broadcast); rank 0
!> writes checkpoints and every rank learns the outcome; a step that fails on one rank within an
!> accumulation cycle leaves no rank with its gradients. Argument: a directory with dist.yaml and
!> accum.yaml.
!> Preprocessed: with FTORCH_TEST_MPIF_H the program uses mpif.h (integer handles) only.
program test_torchfort_distributed
  use, intrinsic :: iso_fortran_env, only: real32, int64
  use torchfort
  use testing, only: check, summary
#ifndef FTORCH_TEST_MPIF_H
  use mpi_f08
#endif
  implicit none
#ifdef FTORCH_TEST_MPIF_H
  include 'mpif.h'
#endif
  integer, parameter :: nglobal = 12, nsteps = 6
  character(len=512) :: dir
  real(real32) :: x(4, nglobal), y(3, nglobal), out_d(3, nglobal), out_s(3, nglobal), loss_d, loss_s
  real(real32) :: worst, y_bad(3, nglobal), out_r(3, nglobal)
  integer :: rank, nranks, ierr, nb, lo, i, j, b, comm_int, istat
  logical :: written
  integer(int64) :: step_train, step_inference

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  call get_command_argument(1, dir)
  do b = 1, nglobal
    do i = 1, 4
      x(i, b) = real(mod(i * 7 + b * 3, 11) - 5, real32) / 8.0
    end do
    do j = 1, 3
      y(j, b) = real(mod(j * 5 + b * 2, 7) - 3, real32) / 4.0
    end do
  end do
  nb = nglobal / nranks
  lo = rank * nb + 1

  ! Each rank draws other initial weights: the distributed model starts from rank 0 (broadcast).
  call check(torchfort_set_manual_seed(100 + rank) == 0, "seed")
#ifdef FTORCH_TEST_MPIF_H
  call check(torchfort_create_distributed_model("d", trim(dir)//"/dist.yaml", MPI_COMM_WORLD, &
                                                TORCHFORT_DEVICE_CPU) == 0, "create (integer communicator)")
#else
  call check(torchfort_create_distributed_model("d", trim(dir)//"/dist.yaml", MPI_COMM_WORLD, &
                                                TORCHFORT_DEVICE_CPU) == 0, "create (mpi_f08 communicator)")
  comm_int = MPI_COMM_WORLD%MPI_VAL
  call check(torchfort_create_distributed_model("d_int", trim(dir)//"/dist.yaml", comm_int, &
                                                TORCHFORT_DEVICE_CPU) == 0, "create (integer communicator)")
#endif
  ! The single-process reference on every rank: rank 0's initial weights.
  call check(torchfort_set_manual_seed(100) == 0, "seed")
  call check(torchfort_create_model("s", trim(dir)//"/dist.yaml", TORCHFORT_DEVICE_CPU) == 0, "create single")

  worst = 0
  do i = 1, nsteps
    call check(torchfort_train("d", x(:, lo:lo + nb - 1), y(:, lo:lo + nb - 1), loss_d) == 0, "train distributed")
    call check(torchfort_train("s", x, y, loss_s) == 0, "train single")
    worst = max(worst, abs(loss_d - loss_s) / abs(loss_s))
  end do
  ! float32 sums in another order (per-rank means averaged): a few roundings of 6e-8.
  call check(worst <= 1e-5, "the averaged loss equals the loss of the whole batch")
  call check(torchfort_inference("d", x, out_d) == 0, "inference distributed")
  call check(torchfort_inference("s", x, out_s) == 0, "inference single")
  call check(maxval(abs(out_d - out_s)) <= 1e-5, "the distributed model equals the single-process one")

  ! As TorchFort's programs do: rank 0 alone saves (not a collective call).
  if (rank == 0) then
    call check(torchfort_save_checkpoint("d", trim(dir)//"/ckpt_dist") == 0, "save_checkpoint on rank 0")
    inquire (file=trim(dir)//"/ckpt_dist/state.pt", exist=written)
    call check(written, "the checkpoint is written")
  end if
  call MPI_Barrier(MPI_COMM_WORLD, ierr)
  ! Every rank resumes from it (every rank reads the files).
  call check(torchfort_load_checkpoint("d", trim(dir)//"/ckpt_dist", step_train, step_inference) == 0, &
             "load_checkpoint on every rank")
  call check(step_train == nsteps, "the step counter")

  ! A step that fails on rank 1 (a loss that overflows) in the middle of an accumulation cycle of
  ! two: rank 0 has already run its backward when it learns of it, and must drop that step’s
  ! gradients too. Retrying the step then gives every rank the model of a run without the failure.
  y_bad = y
  if (rank == 1) y_bad = huge(1.0_real32)
  call check(torchfort_set_manual_seed(7) == 0, "seed")
  call check(torchfort_create_distributed_model("a", trim(dir)//"/accum.yaml", MPI_COMM_WORLD, &
                                                TORCHFORT_DEVICE_CPU) == 0, "create (accumulating)")
  call check(torchfort_set_manual_seed(7) == 0, "seed")
  call check(torchfort_create_distributed_model("r", trim(dir)//"/accum.yaml", MPI_COMM_WORLD, &
                                                TORCHFORT_DEVICE_CPU) == 0, "create (reference)")
  do i = 1, 2
    call check(torchfort_train("a", x(:, lo:lo + nb - 1), y(:, lo:lo + nb - 1), loss_d) == 0, "train (accumulating)")
    call check(torchfort_train("r", x(:, lo:lo + nb - 1), y(:, lo:lo + nb - 1), loss_s) == 0, "train (reference)")
  end do
  call check(torchfort_train("a", x(:, lo:lo + nb - 1), y(:, lo:lo + nb - 1), loss_d) == 0, "the cycle’s first step")
  istat = torchfort_train("a", x(:, lo:lo + nb - 1), y_bad(:, lo:lo + nb - 1), loss_d)
  if (rank == 0) then
    call check(istat == TORCHFORT_RESULT_MPI_ERROR, "the cycle’s second step: rank 1 failed")
  else
    call check(istat /= TORCHFORT_RESULT_SUCCESS .and. istat /= TORCHFORT_RESULT_MPI_ERROR, &
               "the cycle’s second step: this rank’s loss is not finite")
  end if
  call check(torchfort_train("a", x(:, lo:lo + nb - 1), y(:, lo:lo + nb - 1), loss_d) == 0, "the second step again")
  call check(torchfort_train("r", x(:, lo:lo + nb - 1), y(:, lo:lo + nb - 1), loss_s) == 0, "train (reference)")
  call check(torchfort_train("r", x(:, lo:lo + nb - 1), y(:, lo:lo + nb - 1), loss_s) == 0, "train (reference)")
  call check(torchfort_inference("a", x, out_d) == 0 .and. torchfort_inference("r", x, out_r) == 0, "inference")
  call check(all(out_d == out_r), "after the failed step, every rank holds the model of a run without it")
  call summary()
  call MPI_Finalize(ierr)
end program test_torchfort_distributed
