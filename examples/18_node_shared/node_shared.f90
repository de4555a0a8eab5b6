!> Example 18: many ranks, one model per node. The ranks of an MPI simulation share one emulator
!> that a single rank of their node holds (on the node's GPU when there is one): every rank
!> trains it and runs it on its own columns, and FTorch gathers the columns of all the node's
!> ranks into one batch on that rank, runs the model once, and hands each rank its rows back.
!>
!> Each rank owns a different number of columns of a toy atmosphere (as a domain decomposition
!> that does not divide evenly). Phase 1 trains the emulator online on the physics of every rank
!> (one optimizer step per time step on all the node's columns); phase 2 replaces the physics by
!> the emulator and compares the two.
!>
!> Run: mpirun -np 3 ./node_shared <directory of emulator.pt> [steps]
!> (emulator.pt: example 10’s, from examples/10_data_parallel/write_model.py)
program node_shared
  use, intrinsic :: iso_fortran_env, only: real32, real64
  use mpi_f08
  use ftorch
  use ftorch_mpi, only: torch_comm_init_node
  implicit none
  integer, parameter :: NLEV = 16
  real(real32), parameter :: DT = 0.1
  type(torch_comm) :: node
  type(torch_model) :: emulator
  type(torch_optim) :: optim
  type(torch_tensor), allocatable :: params(:)
  type(torch_tensor) :: inputs(1), target, predicted(1)
  real(real32), allocatable, target :: state(:, :), tendency(:, :), emulated(:, :)
  real(real64) :: loss, first_loss, error, worst
  character(len=4096) :: dir, arg
  integer :: rank, ncol, ierr, step, steps, col, lev, device, gpu

  call MPI_Init(ierr)
  call get_command_argument(1, dir)
  steps = 300
  if (command_argument_count() > 1) then
    call get_command_argument(2, arg)
    read(arg, *) steps
  end if

  ! The ranks of this node (groups= would deal them out over several GPUs: gpu is then this
  ! rank's device index). The model lives on rank 0 of `node`, on the GPU if the node has one.
  call torch_comm_init_node(node, MPI_COMM_WORLD, group=gpu)
  rank = torch_comm_rank(node)
  device = torch_kCPU
  if (torch_device_available(torch_kCUDA)) device = torch_kCUDA
  call torch_model_load_shared(emulator, node, trim(dir) // "/emulator.pt", device, device_index=merge(gpu, -1, &
                               device == torch_kCUDA), is_training=.true.)
  ! The optimizer lives with the model, on the leader only.
  if (torch_model_is_leader(emulator)) then
    allocate(params(torch_model_parameter_count(emulator)))
    call torch_model_parameters(emulator, params)
    call torch_optim_Adam(optim, params, learning_rate=3.0d-3)
  end if

  ! This rank's columns: 16, 24, 32, ... of them, a different part of the globe on every rank.
  ncol = 16 + 8 * rank
  allocate(state(ncol, NLEV), tendency(ncol, NLEV), emulated(ncol, NLEV))
  do lev = 1, NLEV
    do col = 1, ncol
      state(col, lev) = sin(0.3 * (col + 100 * rank)) * cos(0.2 * lev)
    end do
  end do
  call torch_tensor_from_array(inputs(1), state, torch_kCPU)
  call torch_tensor_from_array(target, tendency, torch_kCPU)
  call torch_tensor_from_array(predicted(1), emulated, torch_kCPU)

  ! Phase 1: online training. Every rank calls torch_train_step with its own columns; the leader
  ! takes one step on the columns of all of them, and every rank gets the loss of that batch.
  do step = 1, steps
    call physics(state, step * DT, tendency)
    call torch_train_step(emulator, optim, inputs, target, loss=loss)
    if (step == 1) first_loss = loss
    if (rank == 0 .and. mod(step, 100) == 0) print '(a,i4,a,es11.4)', "step ", step, "  node loss ", loss
    state = state + DT * tendency
  end do
  if (loss >= first_loss) error stop "the emulator did not learn"

  ! Phase 2: the emulator in place of the physics, each rank on its own columns (one forward of
  ! all the node's columns on the leader).
  call torch_model_forward(emulator, inputs, predicted)
  call physics(state, (steps + 1) * DT, tendency)
  error = maxval(abs(emulated - tendency)) / maxval(abs(tendency))
  call MPI_Allreduce(error, worst, 1, MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(a,es10.3)', "largest relative error of the emulated tendency: ", worst
  if (worst > 0.2) error stop "the emulator is far from the physics"
  if (rank == 0) print '(a,i0,a)', "one model served ", torch_comm_size(node), " ranks; example 18 finished"

  if (allocated(params)) call torch_delete(params)
  call torch_delete(optim)
  call torch_delete(emulator)
  call torch_delete(inputs)
  call torch_delete(target)
  call torch_delete(predicted)
  call torch_delete(node)
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
end program node_shared
