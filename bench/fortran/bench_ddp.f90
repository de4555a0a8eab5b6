!> Data-parallel training step time (bench/distributed.py): every rank trains the same MLP on its
!> own local batch; gradients are averaged with torch_ddp. Then the same loop again with the
!> data-parallel wrapper deleted and the averaging replaced by a plain MPI_Allreduce (sum, in
!> place) of as many float32 values as the gradients hold, in the same place of the step: the
!> floor of the averaging, measured in the same context (after backward, caches as cold). Then
!> once more with no exchange at all (each rank trains alone at its own pace, the ranks only start
!> together): what the ranks cost each other by sharing the machine alone; and with nothing but
!> an MPI_Barrier in the averaging's place (what keeping the ranks in step costs). Rank 0 prints
!>   RESULT <ms per step> <ms compute (forward+backward)> <ms gradient averaging> <ms update>
!>          <ms per step with the plain all-reduce> <ms of that plain all-reduce>
!>          <ms per step with no exchange> <ms per step with a barrier only>
!> Usage: mpirun -np N bench_ddp <model.pt> <features> <batch> <warm-up steps> <timed steps>
program bench_ddp
  use, intrinsic :: iso_fortran_env, only: real32, real64
  use mpi_f08
  use ftorch
  use ftorch_mpi, only: torch_comm_init
  implicit none
  type(torch_comm) :: comm
  type(torch_model) :: model
  type(torch_optim) :: optim
  type(torch_ddp) :: ddp
  type(torch_tensor), allocatable :: params(:)
  type(torch_tensor) :: tx, ty, out(1), loss
  real(real32), allocatable, target :: x(:, :), y(:, :), pred(:, :)
  real(real32), allocatable :: wire(:)
  real(real32), target :: loss_value(1)
  real(real64) :: ddp_times(4), plain_times(4), alone_times(4), barrier_times(4)
  character(len=4096) :: arg, file
  integer :: features, batch, warmup, steps, ierr, rank, i, j, n_values
  integer, parameter :: EXCHANGE_DDP = 1, EXCHANGE_PLAIN = 2, EXCHANGE_NONE = 3, EXCHANGE_BARRIER = 4

  call MPI_Init(ierr)
  call get_command_argument(1, file)
  call get_command_argument(2, arg); read(arg, *) features
  call get_command_argument(3, arg); read(arg, *) batch
  call get_command_argument(4, arg); read(arg, *) warmup
  call get_command_argument(5, arg); read(arg, *) steps
  call torch_comm_init(comm, MPI_COMM_WORLD)
  rank = torch_comm_rank(comm)
  allocate(x(batch, features), y(batch, features), pred(batch, features))
  do j = 1, features
    do i = 1, batch
      x(i, j) = sin(0.01 * i * j + rank)
      y(i, j) = cos(0.02 * i + 0.03 * j + rank)
    end do
  end do
  call torch_model_load(model, trim(file), torch_kCPU, is_training=.true.)
  allocate(params(torch_model_parameter_count(model)))
  call torch_model_parameters(model, params)
  n_values = 0
  do i = 1, size(params)
    n_values = n_values + product(params(i)%get_shape())
  end do
  allocate(wire(n_values))
  wire = 1
  call torch_optim_SGD(optim, params, learning_rate=1d-3, momentum=0.9d0)
  call torch_ddp_init(ddp, comm, model, optim)
  call torch_tensor_from_array(tx, x, torch_kCPU)
  call torch_tensor_from_array(ty, y, torch_kCPU)
  call torch_tensor_from_array(out(1), pred, torch_kCPU)
  call torch_tensor_from_array(loss, loss_value, torch_kCPU)

  ddp_times = timed_steps(EXCHANGE_DDP)
  call torch_delete(ddp)  ! the optimizer no longer averages
  plain_times = timed_steps(EXCHANGE_PLAIN)
  alone_times = timed_steps(EXCHANGE_NONE)
  barrier_times = timed_steps(EXCHANGE_BARRIER)
  if (rank == 0) print '(a,8(1x,f0.4))', "RESULT", ddp_times, plain_times(1), plain_times(3), alone_times(1), &
    barrier_times(1)
  call torch_delete(tx)
  call torch_delete(ty)
  call torch_delete(loss)
  call torch_delete(out)
  call torch_delete(params)
  call torch_delete(optim)
  call torch_delete(model)
  call torch_delete(comm)
  call MPI_Finalize(ierr)

contains

  !> Milliseconds per step: total, compute, averaging (torch_ddp, the plain all-reduce, a barrier or
  !> nothing), update.
  function timed_steps(exchange) result(ms)
    integer, intent(in) :: exchange
    real(real64) :: ms(4)
    real(real64) :: t0, t1, t2, t3, compute, comm_time, update, start
    integer :: step
    compute = 0
    comm_time = 0
    update = 0
    start = 0
    do step = 1, warmup + steps
      if (step == warmup + 1) then
        call torch_barrier(comm)
        compute = 0
        comm_time = 0
        update = 0
        start = MPI_Wtime()
      end if
      t0 = MPI_Wtime()
      call torch_optim_zero_grad(optim)
      call torch_model_forward(model, [tx], out, requires_grad=.true.)
      call torch_loss_mse(loss, out(1), ty)
      call torch_tensor_backward(loss)
      t1 = MPI_Wtime()
      select case (exchange)
      case (EXCHANGE_DDP)
        call torch_ddp_sync_gradients(ddp)
      case (EXCHANGE_PLAIN)
        call MPI_Allreduce(MPI_IN_PLACE, wire, n_values, MPI_REAL, MPI_SUM, MPI_COMM_WORLD, ierr)
      case (EXCHANGE_BARRIER)
        call MPI_Barrier(MPI_COMM_WORLD, ierr)
      end select
      t2 = MPI_Wtime()
      call torch_optim_step(optim)
      t3 = MPI_Wtime()
      compute = compute + (t1 - t0)
      comm_time = comm_time + (t2 - t1)
      update = update + (t3 - t2)
    end do
    ms = 1d3 * [MPI_Wtime() - start, compute, comm_time, update] / steps
  end function timed_steps
end program bench_ddp
