!> Data-parallel training step time (bench/distributed.py): every rank trains the same MLP on its
!> own local batch; gradients are averaged with torch_ddp. Rank 0 prints
!>   RESULT <ms per step> <ms compute (forward+backward)> <ms gradient averaging> <ms update>
!>          <ms of a plain MPI_Allreduce (sum, in place) of as many float32 values as the gradients>
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
  real(real32), target :: loss_value(1)
  real(real64) :: t0, t1, t2, t3, compute, comm_time, update, total, start, plain
  real(real32), allocatable :: wire(:)
  integer :: n_values
  character(len=4096) :: arg, file
  integer :: features, batch, warmup, steps, step, ierr, rank, i, j

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
  call torch_optim_SGD(optim, params, learning_rate=1d-3, momentum=0.9d0)
  call torch_ddp_init(ddp, comm, model, optim)
  call torch_tensor_from_array(tx, x, torch_kCPU)
  call torch_tensor_from_array(ty, y, torch_kCPU)
  call torch_tensor_from_array(out(1), pred, torch_kCPU)
  call torch_tensor_from_array(loss, loss_value, torch_kCPU)

  compute = 0
  comm_time = 0
  update = 0
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
    call torch_ddp_sync_gradients(ddp)
    t2 = MPI_Wtime()
    call torch_optim_step(optim)
    t3 = MPI_Wtime()
    compute = compute + (t1 - t0)
    comm_time = comm_time + (t2 - t1)
    update = update + (t3 - t2)
  end do
  total = MPI_Wtime() - start
  ! The floor of the averaging: MPI alone, on the same number of bytes, in the same run.
  n_values = 0
  do i = 1, size(params)
    n_values = n_values + product(params(i)%get_shape())
  end do
  allocate(wire(n_values))
  wire = 1
  call MPI_Allreduce(MPI_IN_PLACE, wire, n_values, MPI_REAL, MPI_SUM, MPI_COMM_WORLD, ierr)
  call torch_barrier(comm)
  t0 = MPI_Wtime()
  do step = 1, steps
    call MPI_Allreduce(MPI_IN_PLACE, wire, n_values, MPI_REAL, MPI_SUM, MPI_COMM_WORLD, ierr)
  end do
  plain = MPI_Wtime() - t0
  if (rank == 0) print '(a,5(1x,f0.4))', "RESULT", 1d3 * total / steps, 1d3 * compute / steps, &
                                           1d3 * comm_time / steps, 1d3 * update / steps, 1d3 * plain / steps
  call torch_delete(ddp)
  call torch_delete(tx)
  call torch_delete(ty)
  call torch_delete(loss)
  call torch_delete(out)
  call torch_delete(params)
  call torch_delete(optim)
  call torch_delete(model)
  call torch_delete(comm)
  call MPI_Finalize(ierr)
end program bench_ddp
