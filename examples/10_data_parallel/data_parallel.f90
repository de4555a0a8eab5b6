!> Example 10: an MPI simulation trains one emulator online, data-parallel across its ranks.
!>
!> Each rank owns its own columns of a toy atmosphere (temperature-like state on NLEV levels).
!> At every time step the "physics" computes each column's tendency; the ranks train one shared
!> emulator of that physics on their own columns: gradients are averaged across ranks by FTorch
!> (torch_ddp), so every rank holds the same model, trained on the data of all ranks. Rank 0
!> prints the global loss and writes the checkpoint.
!>
!> Run: mpirun -np 2 ./data_parallel <directory of emulator.pt> [steps]
program data_parallel
  use, intrinsic :: iso_fortran_env, only: real32, real64
  use mpi_f08
  use ftorch
  use ftorch_mpi, only: torch_comm_init
  implicit none
  integer, parameter :: NLEV = 16, NCOL = 24
  real(real32), parameter :: DT = 0.1
  type(torch_comm) :: comm
  type(torch_model) :: emulator
  type(torch_optim) :: optim
  type(torch_ddp) :: ddp
  type(torch_tensor), allocatable :: params(:)
  type(torch_tensor) :: inputs(1), target
  real(real32), target :: state(NCOL, NLEV), tendency(NCOL, NLEV)
  real(real64) :: loss, first_loss
  character(len=4096) :: dir, arg
  integer :: rank, nranks, ierr, step, steps, col, lev

  call MPI_Init(ierr)
  call get_command_argument(1, dir)
  steps = 300
  if (command_argument_count() > 1) then
    call get_command_argument(2, arg)
    read(arg, *) steps
  end if

  ! FTorch's communicator over the program's MPI_COMM_WORLD.
  call torch_comm_init(comm, MPI_COMM_WORLD)
  rank = torch_comm_rank(comm)
  nranks = torch_comm_size(comm)

  ! Every rank loads the same emulator; torch_ddp_init checks that and broadcasts rank 0's
  ! parameters, so the ranks start identical.
  call torch_model_load(emulator, trim(dir) // "/emulator.pt", torch_kCPU, is_training=.true.)
  allocate(params(torch_model_parameter_count(emulator)))
  call torch_model_parameters(emulator, params)
  call torch_optim_Adam(optim, params, learning_rate=3.0d-3)
  call torch_ddp_init(ddp, comm, emulator, optim)

  ! This rank's columns: a different part of the globe on every rank.
  do lev = 1, NLEV
    do col = 1, NCOL
      state(col, lev) = sin(0.3 * (col + rank * NCOL)) * cos(0.2 * lev)
    end do
  end do
  call torch_tensor_from_array(inputs(1), state, torch_kCPU)
  call torch_tensor_from_array(target, tendency, torch_kCPU)

  do step = 1, steps
    call physics(state, step * DT, tendency)
    ! One training step on this rank's columns; the gradients (and the loss) are averaged over
    ! all ranks before the update, so `loss` is the global loss.
    call torch_train_step(emulator, optim, inputs, target, loss=loss)
    if (step == 1) first_loss = loss
    if (rank == 0 .and. mod(step, 50) == 0) print '(a,i4,a,es11.4)', "step ", step, "  global loss ", loss
    state = state + DT * tendency   ! the simulation goes on
  end do

  ! Rank 0 writes; every rank returns when the file is complete.
  call torch_checkpoint_save(trim(dir) // "/emulator.ckpt", emulator, optim, step=steps, comm=comm)
  if (loss >= first_loss) error stop "the emulator did not learn"
  if (rank == 0) print '(a,i0,a)', "trained on ", nranks, " ranks; example 10 finished"

  call torch_delete(ddp)
  call torch_delete(params)
  call torch_delete(optim)
  call torch_delete(emulator)
  call torch_delete(inputs)
  call torch_delete(target)
  call torch_delete(comm)
  call MPI_Finalize(ierr)

contains

  ! Toy column physics: relaxation towards a slowly moving profile, a nonlinear damping and an
  ! exchange between levels.
  subroutine physics(s, time, t)
    real(real32), intent(in) :: s(:, :), time
    real(real32), intent(out) :: t(:, :)
    integer :: k
    do k = 1, size(s, 2)
      t(:, k) = -0.5 * (s(:, k) - 0.8 * cos(0.2 * k + 0.3 * time)) - 0.2 * s(:, k)**3
      if (k > 1) t(:, k) = t(:, k) + 0.1 * (s(:, k - 1) - s(:, k))
    end do
  end subroutine physics
end program data_parallel
