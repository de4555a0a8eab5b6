!> Inference of many ranks with one model (bench/node_shared.py): every rank runs the model on its
!> own batch of columns, either through a node-shared model held by rank 0 of the node (`shared`:
!> the batches gathered there, one forward, the rows scattered back) or with a model of its own
!> (`local`). The model sits on `device` (cpu or cuda: with `local` every rank then holds its own
!> CUDA context and, as FTorch's GPU idiom does, copies its input to the device at every call and
!> gets the output in its host array; `shared` gathers the host arrays). Each rank times its calls; rank 0 prints the slowest rank's mean:
!>   RESULT <ms per forward> <columns per second over all ranks>
!> Usage: mpirun -np N bench_node_shared <model.pt> <features> <batch per rank> <cpu|cuda>
!>        <shared|local> <warm-up calls> <timed calls>
program bench_node_shared
  use, intrinsic :: iso_fortran_env, only: real32, real64
  use mpi_f08
  use ftorch
  use ftorch_mpi, only: torch_comm_init_node
  implicit none
  type(torch_comm) :: node
  type(torch_model) :: model
  type(torch_tensor) :: tx(1), ty(1)
  real(real32), allocatable, target :: x(:, :), y(:, :)
  character(len=4096) :: file, arg, where, mode
  integer :: features, batch, warmup, steps, ierr, rank, nranks, i, device
  real(real64) :: start, mine, slowest

  call MPI_Init(ierr)
  call get_command_argument(1, file)
  call get_command_argument(2, arg); read(arg, *) features
  call get_command_argument(3, arg); read(arg, *) batch
  call get_command_argument(4, where)
  call get_command_argument(5, mode)
  call get_command_argument(6, arg); read(arg, *) warmup
  call get_command_argument(7, arg); read(arg, *) steps
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  device = torch_kCPU
  if (trim(where) == "cuda") device = torch_kCUDA

  allocate(x(batch, features), y(batch, features))
  call random_number(x)
  call torch_tensor_from_array(tx(1), x, torch_kCPU)
  call torch_tensor_from_array(ty(1), y, torch_kCPU)
  if (trim(mode) == "shared") then
    call torch_comm_init_node(node, MPI_COMM_WORLD)
    call torch_model_load_shared(model, node, trim(file), device)
  else
    call torch_model_load(model, trim(file), device)
  end if

  do i = 1, warmup
    call forward()
  end do
  call MPI_Barrier(MPI_COMM_WORLD, ierr)
  start = MPI_Wtime()
  do i = 1, steps
    call forward()
  end do
  mine = (MPI_Wtime() - start) / steps
  call MPI_Reduce(mine, slowest, 1, MPI_DOUBLE_PRECISION, MPI_MAX, 0, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(a,2es14.6)', "RESULT ", 1d3 * slowest, nranks * batch / slowest

  call torch_delete(tx)
  call torch_delete(ty)
  call torch_delete(model)
  if (trim(mode) == "shared") call torch_delete(node)
  call MPI_Finalize(ierr)

contains

  ! One forward of this rank's columns (a model of its own on the GPU: the input copied there first).
  subroutine forward()
    if (trim(mode) == "local" .and. device == torch_kCUDA) then
      call torch_tensor_from_array(tx(1), x, torch_kCUDA)
    end if
    call torch_model_forward(model, tx, ty)
  end subroutine forward
end program bench_node_shared
